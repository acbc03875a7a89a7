"""The publish markers' pairing check (:mod:`fourfold.apps.publish` renders the blocks between them):
every ``<!-- publish:NAME -->`` of a published document has its ``<!-- /publish:NAME -->`` after
it, and the other way round. Plain text in; nothing here runs a model.
"""

from __future__ import annotations

import re

from fourfold.errors import DataError

OPEN = re.compile(r"<!-- (?P<end>/?)publish:(?P<name>[a-z-]+) -->")
"""A start or end marker."""


def check_markers(text: str, where: str) -> None:
    """Every ``<!-- publish:NAME -->`` has its ``<!-- /publish:NAME -->`` after it, and the other way
    round: else a DataError naming the file, the line and the marker to restore."""
    open_at: dict[str, int] = {}
    for m in OPEN.finditer(text):
        name, line = m.group("name"), text.count("\n", 0, m.start()) + 1
        if not m.group("end"):
            if name in open_at:
                raise DataError(f"{where}:{open_at[name]}: <!-- publish:{name} --> has no end marker "
                                f"<!-- /publish:{name} --> before the next one at line {line}; put it back where the block ends")
            open_at[name] = line
        elif open_at.pop(name, None) is None:
            raise DataError(f"{where}:{line}: <!-- /publish:{name} --> ends a block that was never opened "
                            f"(<!-- publish:{name} --> is missing); put it back where the block starts")
    for name, line in open_at.items():
        raise DataError(f"{where}:{line}: <!-- publish:{name} --> has no end marker <!-- /publish:{name} -->; "
                        "put it back where the block ends")
