"""Every key of a config, from the config classes themselves: what ``fourfold <stage> --help`` lists.

One source: a key's type is its annotation (named as the loader's errors name it), its default the
dataclass's, and its help the first sentence of the string literal under the field in its class (a
field's docstring; read from the class's source with :mod:`ast`, since Python keeps no such
strings at run time). A section (a nested dataclass, also an optional one such as ``model.lora``)
is a heading, its keys listed under it. Standard library only.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import re
import textwrap
import typing
from typing import Any, NamedTuple

from fourfold.config.loader import type_name


class Key(NamedTuple):
    """One key of a config: its dotted name, type, default (as YAML writes it) and help line."""

    key: str
    type: str
    default: str
    help: str


@functools.lru_cache(maxsize=None)
def _own_field_docs(cls: type) -> dict:
    """``{field name: docstring}`` of the fields ``cls``'s own class body annotates."""
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return {}
    body = ast.parse(source).body[0].body
    docs = {}
    for node, nxt in zip(body, body[1:]):
        if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and isinstance(nxt, ast.Expr)
                and isinstance(nxt.value, ast.Constant) and isinstance(nxt.value.value, str)):
            docs[node.target.id] = inspect.cleandoc(nxt.value.value)
    return docs


def field_docs(cls: type) -> dict:
    """``{field name: docstring}`` of every field of dataclass ``cls``, inherited ones included."""
    docs: dict = {}
    for base in reversed(cls.__mro__):
        if dataclasses.is_dataclass(base):
            docs.update(_own_field_docs(base))
    return docs


_SENTENCE_END = re.compile(r"(?<!\be\.g)(?<!\bi\.e)(?<!\betc)(?<!\bvs)(?<!\bal)(?<!\bDr)\. ")


def first_sentence(doc: str) -> str:
    """A docstring's first sentence, on one line (up to the first '. ' or the end of its paragraph)."""
    text = " ".join(doc.split("\n\n", 1)[0].split())
    end = _SENTENCE_END.search(text)
    return text if end is None else text[: end.start() + 1]


def _yaml_value(value: Any) -> str:
    """A default as YAML (and so an override) writes it: null, true, 3e-4, [q_proj, v_proj]."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return repr(value) if value == "" or value != value.strip() else value
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_yaml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_yaml_value(v)}" for k, v in value.items()) + "}"
    if dataclasses.is_dataclass(value):
        return _yaml_value(dataclasses.asdict(value))
    return str(value)


def _section_class(tp: Any):
    """The dataclass a field's type is a section of (``X`` or ``Optional[X]``), else None."""
    if dataclasses.is_dataclass(tp):
        return tp
    sections = [a for a in typing.get_args(tp) if dataclasses.is_dataclass(a)]
    return sections[0] if len(sections) == 1 and typing.get_origin(tp) is not list else None


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


def config_keys(cls: type, prefix: str = "", value: Any = dataclasses.MISSING) -> list[Key]:
    """Every key of config class ``cls``: its plain keys in field order, then its sections depth
    first, each section's own entry (type ``section`` or ``section or null``) before its keys (a
    section's help: its field's docstring, else its class's). ``value``: the instance whose values are the defaults
    (a section's default in its parent: the demo's ``ppo`` section is not PPO's)."""
    if value is dataclasses.MISSING:
        try:
            value = cls()
        except TypeError:  # a section with required fields: no instance, the fields' own defaults
            value = None
    hints = typing.get_type_hints(cls)
    docs = field_docs(cls)
    keys: list[Key] = []
    sections: list[Key] = []
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        name = prefix + f.name
        default = getattr(value, f.name) if value is not None else _default(f)
        section = _section_class(hints[f.name])
        help_ = first_sentence(docs.get(f.name) or (section.__doc__ or "" if section is not None else ""))
        if section is not None:
            shown = "null" if default is None else ("required" if default is dataclasses.MISSING else "")
            sections.append(Key(name, "section" if section is hints[f.name] else "section or null", shown, help_))
            inner = default if dataclasses.is_dataclass(default) else dataclasses.MISSING
            sections += config_keys(section, name + ".", inner)
            continue
        shown = "required" if default is dataclasses.MISSING else _yaml_value(default)
        keys.append(Key(name, type_name(hints[f.name]), shown, help_))
    return keys + sections


def keys_help(cls: type, width: int = 100, title: str = "config keys") -> str:
    """The keys of ``cls`` for ``--help``: a heading per section, then per key one entry
    ``  section.key  TYPE  default: X  help``, wrapped at ``width`` with the help indented."""
    lines = [f"{title} (set as key=value, or in the --config YAML file; --print-config shows them resolved):"]
    for k in config_keys(cls):
        if k.type.startswith("section"):
            about = f" ({k.type}, default {k.default})" if k.default else ""
            lines += ["", *textwrap.wrap(f"{k.key}:{about}  {k.help}".rstrip(), width, subsequent_indent="  ")]
            continue
        head = f"  {k.key}  {k.type}  default: {k.default}"
        if len(head) > width * 2 // 3:  # a long type or default: the help starts on the next line
            # "default: X" stays on one line (textwrap breaks at ASCII whitespace, not at a NUL)
            lines += [line.replace("\0", " ") for line in textwrap.wrap(
                head.replace("default: ", "default:\0"), width, subsequent_indent=" " * 6,
                break_on_hyphens=False, break_long_words=False)]
            head = " " * 4
        lines += textwrap.wrap(k.help, width, initial_indent=head + "  ", subsequent_indent=" " * 6,
                               break_on_hyphens=False, break_long_words=False) or [head]
    return "\n".join(lines)
