"""fourfold.data: reading user data files, validating them, tokenising and batching.

* :mod:`fourfold.data.io` - ``read_records``: JSONL / Parquet rows with their line numbers, and rows of
  a local ``datasets`` directory (``DIR`` or ``DIR:SPLIT``) or a hub dataset (``NAME:SPLIT``).
* :mod:`fourfold.data.formats` - typed records and validating loaders (field names: docs/data.md).
* :mod:`fourfold.data.chat` - message lists rendered to prompt text (a chat template or the plain fallback).
* :mod:`fourfold.data.collate` - tokenisation, padding and the resumable :class:`EpochSampler`.
* :mod:`fourfold.data.responses` - prompt + response rows (and preference pairs) tokenised and padded
  as PPO scores them.
* :mod:`fourfold.data.encoding` - the pieces every ``encode_*`` shares (the ``on_error`` sink, row
  locations, special ids, tokenising text as text, BOS).

Every problem with a user's file is a one-line :class:`fourfold.errors.DataError` naming the file,
the line and the problem; loaders and ``encode_*`` take ``on_error="skip"`` to skip and count bad rows.
"""

from fourfold.data import chat, collate, formats, responses
from fourfold.data.chat import *  # noqa: F403  (the names of chat.__all__)
from fourfold.data.collate import *  # noqa: F403  (the names of collate.__all__)
from fourfold.data.formats import *  # noqa: F403  (the names of formats.__all__)
from fourfold.data.io import line_of, location, no_usable_rows, read_records, read_source
from fourfold.data.responses import *  # noqa: F403  (the names of responses.__all__)

# Each module's __all__ names its public API once; the package re-exports them all (io: its readers).
__all__ = ["read_records", "read_source", "location", "line_of", "no_usable_rows"]
__all__ += formats.__all__
__all__ += chat.__all__
__all__ += collate.__all__
__all__ += responses.__all__
