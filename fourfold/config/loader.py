"""The loader: YAML files, ``key=value`` overrides, did-you-mean, type coercion, validation.

Schema-agnostic: it knows dataclasses, not stages (the stage schemas are the sibling modules).
Imports only the standard library (and PyYAML, lazily).
"""

from __future__ import annotations

import collections.abc
import dataclasses
import difflib
import math
import re
import types
import typing
from pathlib import Path
from typing import Any, Literal, Mapping, Sequence, TypeVar, Union

from fourfold.errors import ConfigError

T = TypeVar("T")


def require(condition: bool, key: str, message: str) -> None:
    """Raise ConfigError(f"{key}: {message}") unless condition holds (used by validate())."""
    if not condition:
        raise ConfigError(f"{key}: {message}")


def require_at_least(section: Any, prefix: str, low: float, *names: str) -> None:
    """Each field ``names`` of ``section`` is ``>= low``: else ``"<prefix>.<name>: must be >= <low>,
    got <value>"``, the first failing name in the order given."""
    for name in names:
        value = getattr(section, name)
        require(value >= low, f"{prefix}.{name}", f"must be >= {low}, got {value}")


def require_positive(section: Any, prefix: str, *names: str) -> None:
    """Each field ``names`` of ``section`` is ``> 0``: else ``"<prefix>.<name>: must be > 0, got
    <value>"``, the first failing name in the order given."""
    for name in names:
        value = getattr(section, name)
        require(value > 0, f"{prefix}.{name}", f"must be > 0, got {value}")


def validate_precision(dtype: str, precision: str, prefix: str = "model") -> None:
    """The model section's ``precision`` against its ``dtype``: bf16-mixed keeps float32 master
    weights (dtype float32), bf16 puts them in bfloat16 (dtype float32 or bfloat16, not float16)."""
    if precision == "bf16-mixed":
        require(dtype == "float32", f"{prefix}.precision",
                f"bf16-mixed keeps float32 master weights: set {prefix}.dtype=float32 (got {dtype})")
    if precision == "bf16":
        require(dtype != "float16", f"{prefix}.precision", f"bf16 conflicts with {prefix}.dtype=float16")


def type_name(tp: Any) -> str:
    """How the errors and `--help` name a type: int, one of 'a', 'b', list of str, str or null."""
    origin = typing.get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if origin in (Union, types.UnionType):
        return " or ".join(type_name(a) for a in typing.get_args(tp))
    if origin in (list, tuple, Sequence):
        args = typing.get_args(tp)
        return f"list of {type_name(args[0])}" if args else "list"
    if origin is dict:
        return "mapping"
    if _is_callable_type(tp):
        return "a function (in Python)"
    if tp is type(None):
        return "null"
    return getattr(tp, "__name__", str(tp))


def _is_callable_type(tp: Any) -> bool:
    """``typing.Callable`` (bare or subscripted): a field that takes a function built in Python."""
    return tp is collections.abc.Callable or typing.get_origin(tp) is collections.abc.Callable


def _coerce(value: Any, tp: Any, key: str, where: str) -> Any:
    """Check/convert one YAML value to the annotated type, or raise ConfigError naming the key."""
    origin = typing.get_origin(tp)
    bad = ConfigError(f"{where}{key}: expected {type_name(tp)}, got {value!r}")
    if tp is Any:
        return value
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        if not isinstance(value, dict):
            raise ConfigError(f"{where}{key}: expected a mapping (section), got {value!r}")
        return _build(tp, value, prefix=key + ".", where=where)
    if origin in (Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, key, where)
            except ConfigError:
                continue
        raise bad
    if _is_callable_type(tp):
        if callable(value) and not isinstance(value, type):
            return value
        raise bad
    if origin is Literal:
        if value in typing.get_args(tp):
            return value
        raise bad
    if origin in (list, tuple, Sequence):
        if not isinstance(value, (list, tuple)):
            raise bad
        args = typing.get_args(tp)
        inner = args[0] if args else Any
        items = [_coerce(v, inner, f"{key}[{i}]", where) for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin is dict or tp is dict:
        if not isinstance(value, dict):
            raise bad
        return dict(value)
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise bad
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer():
                return int(value)
            raise bad
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            if isinstance(value, str):  # YAML reads "1e-5" as a string
                try:
                    return float(value)
                except ValueError:
                    raise bad from None
            raise bad
        return float(value)
    if tp is str:
        if isinstance(value, (str, Path)):
            return str(value)
        raise bad
    return value


def _fields(cls: type) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(cls) if f.init}


def _unknown_key(cls: type, key: str, known: list[str], prefix: str, where: str) -> ConfigError:
    """The error for a key ``cls`` has no field for. A key the section renamed (its ``RENAMED``
    class attribute: old key -> (new key, note)) names its new key; any other gets the closest
    known key as a did-you-mean, and the list of known keys."""
    renamed = getattr(cls, "RENAMED", {}).get(key)
    if renamed is not None:
        new, note = renamed
        return ConfigError(f"{where}{prefix}{key}: renamed to {prefix}{new}" + (f" ({note})" if note else ""))
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
    hint = f" (did you mean '{prefix}{close[0]}'?)" if close else ""
    return ConfigError(f"{where}{prefix}{key}: unknown key{hint}; known keys here: {', '.join(sorted(known))}")


def _build(cls: type[T], data: dict, prefix: str = "", where: str = "") -> T:
    hints = typing.get_type_hints(cls)
    fields = _fields(cls)
    kwargs = {}
    for key, value in data.items():
        if key not in fields:
            raise _unknown_key(cls, str(key), list(fields), prefix, where)
        f = fields[key]
        if (isinstance(value, dict) and dataclasses.is_dataclass(hints[key])
                and f.default_factory is not dataclasses.MISSING):
            # a partial section keeps this stage's defaults for the keys it does not name
            value = _merge(dataclasses.asdict(f.default_factory()), value)
        kwargs[key] = _coerce(value, hints[key], prefix + key, where)
    try:
        return cls(**kwargs)
    except TypeError as e:  # a required field is missing
        raise ConfigError(f"{where}{prefix.rstrip('.') or cls.__name__}: {e}") from None


def _set_dotted(tree: dict, dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    node = tree
    for part in parts[:-1]:
        nxt = node.get(part)
        if not isinstance(nxt, dict):
            nxt = {}
            node[part] = nxt
        node = nxt
    node[parts[-1]] = value


class DuplicateKeyError(Exception):
    """A mapping in a YAML text names one key twice (YAML would keep the last one silently)."""

    def __init__(self, key: Any, line: int, first_line: int):
        super().__init__(f"line {line}: duplicate key {key!r} (first at line {first_line})")


def _unique_key_loader() -> type:
    """PyYAML's SafeLoader, except that a key given twice in one mapping (a repeated section or
    setting) raises :class:`DuplicateKeyError` instead of replacing the first silently. Merge keys
    (``<<``) keep their meaning: a key that overrides a merged one is not a duplicate."""
    import yaml

    class UniqueKeyLoader(yaml.SafeLoader):
        def construct_mapping(self, node, deep=False):
            if isinstance(node, yaml.MappingNode):
                seen: dict = {}
                for key_node, _ in node.value:
                    if key_node.tag == "tag:yaml.org,2002:merge":
                        continue
                    key = self.construct_object(key_node, deep=True)
                    line = key_node.start_mark.line + 1
                    try:
                        if key in seen:
                            raise DuplicateKeyError(key, line, seen[key])
                        seen[key] = line
                    except TypeError:  # an unhashable key: SafeLoader's own error follows
                        continue
            return super().construct_mapping(node, deep)

    return UniqueKeyLoader


def parse_yaml(text: str) -> Any:
    """``yaml.safe_load`` that refuses a key repeated in one mapping (:class:`DuplicateKeyError`)."""
    import yaml

    return yaml.load(text, Loader=_unique_key_loader())  # a SafeLoader subclass: safe


def _yaml_change(raw: str, node: Any, value: Any) -> str | None:
    """How YAML's reading of an override's ``raw`` text differs from that text, or None when it
    keeps it (what a number, null, true/false, a list or a quoted string means): a `` #`` comment
    cut, other text outside the value dropped, spaces at the ends of a string dropped, or YAML
    syntax in a plain string (an anchor, a tag, a line break)."""
    if node is None:
        return "it is all a YAML comment"
    head, tail = raw[: node.start_mark.index].strip(), raw[node.end_mark.index :].strip()
    if tail.startswith("#"):
        return f"{raw[node.end_mark.index:].rstrip()!r} is a YAML comment, which it drops"
    if head or tail:
        return f"YAML drops {(head or tail)!r}"
    if isinstance(value, str) and raw != raw.strip():
        return "YAML drops the spaces at its ends"
    if isinstance(value, str) and node.style is None and value != raw.strip():
        return "part of it is YAML syntax"
    return None


def parse_override(item: str) -> tuple[str, Any]:
    """``(dotted key, value)`` of one ``a.b=value`` override, the value read as YAML (numbers,
    null, true/false, lists like ``[q_proj, v_proj]``, quoted strings; text YAML cannot parse stays
    as written). A value YAML would not keep as typed (``data.train=a #b`` reads as ``a``: a
    comment; spaces at the ends of a string) is a ConfigError naming the key and the quoted form."""
    import yaml

    if "=" not in item:
        raise ConfigError(f"override {item!r}: expected KEY=VALUE, e.g. ppo.kl_coef=0.02")
    key, raw = item.split("=", 1)
    key = key.strip().lstrip("-")
    if not key:
        raise ConfigError(f"override {item!r}: empty key")
    if not raw.strip():
        return key, ""
    loader = _unique_key_loader()(raw)
    try:
        node = loader.get_single_node()
        value = None if node is None else loader.construct_document(node)
    except yaml.YAMLError:
        return key, raw
    except DuplicateKeyError as e:
        raise ConfigError(f"override {item!r}: {e}") from None
    finally:
        loader.dispose()
    change = _yaml_change(raw, node, value)
    if change is not None:
        quoted = "'" + raw.replace("'", "''") + "'"
        shown = "null" if value is None else repr(value)
        raise ConfigError(f"override {item!r}: YAML reads {key} as {shown} ({change}); to keep the text as "
                          f"written, quote it: {key}={quoted}")
    return key, value


def apply_overrides(tree: dict, overrides: Sequence[str]) -> dict:
    """Apply ``a.b=value`` strings to a nested dict (values read by :func:`parse_override`)."""
    for item in overrides:
        _set_dotted(tree, *parse_override(item))
    return tree


def config_to_dict(cfg: Any) -> dict:
    """The config as plain nested dicts (for YAML and for cache keys). A function set in Python (a
    ``model.reward_fn`` callable) is written as ``python:<module>.<qualname>``: the file says what
    ran, and no YAML can stand for the function itself."""
    return _named_callables(dataclasses.asdict(cfg))


def callable_label(fn: Any) -> str:
    """``python:<module>.<qualname>`` of a function (a functools.partial's function's)."""
    inner = getattr(fn, "func", fn)
    name = getattr(inner, "__qualname__", None) or type(inner).__name__
    return f"python:{getattr(inner, '__module__', None) or '?'}.{name}"


def _named_callables(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _named_callables(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_named_callables(v) for v in value)
    return callable_label(value) if callable(value) else value


def _merge(base: dict, extra: dict) -> dict:
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def config_from_dict(cls: type[T], data: dict, where: str = "", *, origin=None) -> T:
    """Build and validate ``cls`` from a nested mapping. Errors start with ``where`` (the file), or
    with ``origin(message)`` when given (:func:`load_config`: which source set the keys named)."""
    origin = origin or (lambda message: where)
    try:
        cfg = _build(cls, data or {})
        validate_tree(cfg)
    except ConfigError as e:
        raise ConfigError(f"{origin(str(e))}{e}") from None
    return cfg


def build_options(cls: type[T], options: Mapping[str, Any], key: str) -> T:
    """``cls`` (a dataclass) built from the free-form mapping at config key ``key`` (a task's
    ``data.task_options``) by the loader's own rules: a misspelt option is ``key.name: unknown key
    (did you mean 'key.other'?)`` and a wrong type names its key, as for every other key."""
    return _build(cls, dict(options or {}), prefix=f"{key}.")


_DOTTED = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+")
_HINTS = re.compile(r" \(did you mean '[^']*'\?\)|; known keys here: .*$|: renamed to .*$")


def _leaf_keys(tree: Mapping, prefix: str = "") -> set[str]:
    """Every dotted key of a nested mapping, sections included."""
    keys = set()
    for k, v in tree.items():
        keys.add(f"{prefix}{k}")
        if isinstance(v, Mapping):
            keys |= _leaf_keys(v, f"{prefix}{k}.")
    return keys


def _origin(path: Path | None, file_keys: set[str], cmd_keys: list[str]):
    """``message -> prefix`` for a config error: the file, the command line, or both, by which of
    them set the dotted keys the message names (a key set in both: the command line's value won).
    ``examples/grpo.yaml (model.reward) and the command line (model.reward_fn): ...`` for a
    conflict between the two; the file alone when the message names no key of the command line."""
    def origin(message: str) -> str:
        said = _HINTS.sub("", message)  # a did-you-mean's keys and the known keys are no source's
        named = list(dict.fromkeys(_DOTTED.findall(said)))
        cmd = [k for k in named if any(k == c or k.startswith(c + ".") for c in cmd_keys)]
        from_file = [k for k in named if k not in cmd and k in file_keys]
        if path is None:
            return "command line: " if cmd_keys else ""
        if not cmd:
            return f"{path}: "
        if not from_file:
            return "command line: "
        return f"{path} ({', '.join(from_file)}) and the command line ({', '.join(cmd)}): "

    return origin


def _unchanged(value: Any, coerced: Any) -> bool:
    """True when ``value`` already is what the loader made of it (an int for a float included, and
    an instance of a subclass, e.g. a numpy float)."""
    if coerced is value or (type(value) is int and type(coerced) is float):
        return True
    if isinstance(value, (list, tuple)) and isinstance(coerced, (list, tuple)):
        return len(value) == len(coerced) and all(_unchanged(a, b) for a, b in zip(value, coerced))
    return isinstance(value, type(coerced)) and (value == coerced or value != value)  # nan: left to the finite check


def _check_value(value: Any, tp: Any, key: str) -> None:
    """A field's value as the loader would have accepted it: of the annotated type (checked with
    the loader's own rules, so a config built in Python fails as the same file would) and, for
    every number, finite. No setting means something at inf or nan (null is the "no limit" of
    the optional ones), so a non-finite float is refused wherever it sits, lists included."""
    if dataclasses.is_dataclass(tp) and not isinstance(value, tp):
        raise ConfigError(f"{key}: expected a {tp.__name__} section, got {type(value).__name__}")
    if not _unchanged(value, _coerce(value, tp, key, "")):
        raise ConfigError(f"{key}: expected {type_name(tp)}, got {value!r}")
    items = value if isinstance(value, (list, tuple)) else [value]
    for i, item in enumerate(items):
        if isinstance(item, float) and not math.isfinite(item):
            where = f"{key}[{i}]" if item is not value else key
            raise ConfigError(f"{where}: must be a finite number, got {item}")


def validate_tree(cfg: Any, prefix: str = "") -> None:
    """Validate a config: every field's type and finiteness (:func:`_check_value`), then
    ``validate(prefix)`` on every nested section first, then on ``cfg`` itself.

    A section's ``validate(prefix)`` checks its own fields and names them ``prefix.key``; a stage
    config's ``validate("")`` checks combinations across sections (e.g. minibatch vs batch).
    :func:`config_from_dict` calls it, and so does every trainer at its start (through
    ``RunScaffold``): a config built in Python is checked exactly as one loaded by the CLI.
    """
    hints = typing.get_type_hints(type(cfg))
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        key = f"{prefix}.{f.name}" if prefix else f.name
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            validate_tree(value, key)
        else:
            _check_value(value, hints[f.name], key)
    validate = getattr(cfg, "validate", None)
    if callable(validate):
        validate(prefix)


def load_config(
    cls: type[T], path: str | Path | None = None, overrides: Sequence[str] = (), base: dict | None = None,
    *, settings: Mapping[str, Any] | None = None,
) -> T:
    """Load ``cls`` from an optional YAML file, then ``key=value`` overrides, then ``settings``
    (dotted key -> value, set as they are, never read as YAML: the CLI's ``--output-dir``), then
    validate.

    Errors name the file and the dotted key: ``examples/ppo.yaml: ppo.kl_coeff: unknown key (did
    you mean 'ppo.kl_coef'?)``; a key set on the command line is blamed there (``command line:
    ...``), and a conflict between the two names both (:func:`_origin`).
    """
    import yaml

    tree: dict = dict(base or {})
    file_keys: set[str] = set()
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"{path}: config file not found")
        try:
            loaded = parse_yaml(path.read_text(encoding="utf-8"))
        except DuplicateKeyError as e:
            raise ConfigError(f"{path}: {e}; give each section and key once") from None
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            line = f" line {mark.line + 1}" if mark is not None else ""
            raise ConfigError(f"{path}:{line} invalid YAML ({getattr(e, 'problem', e)})") from None
        except UnicodeDecodeError as e:
            raise ConfigError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"{path}: expected a mapping at the top level, got {type(loaded).__name__}")
        file_keys = _leaf_keys(loaded)
        tree = _merge(tree, loaded)
    cmd_keys = [parse_override(item)[0] for item in overrides] + list(settings or {})
    if overrides:
        tree = apply_overrides(tree, overrides)
    for key, value in (settings or {}).items():
        _set_dotted(tree, key, value)
    return config_from_dict(cls, tree, origin=_origin(path, file_keys, cmd_keys))


def config_yaml(cfg: Any) -> str:
    """The resolved config as YAML text, every key in field order (what ``load_config`` reads back
    to an equal config; ``fourfold <stage> --print-config`` prints it)."""
    import yaml

    return yaml.safe_dump(config_to_dict(cfg), sort_keys=False)


def save_config(cfg: Any, path: str | Path) -> None:
    """Write the resolved config as YAML (atomically: temp file then rename)."""
    from fourfold.atomic import write_text_atomic

    write_text_atomic(path, config_yaml(cfg))
