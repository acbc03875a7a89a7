"""The loader: YAML files, ``key=value`` overrides, did-you-mean, type coercion, validation.

Schema-agnostic: it knows dataclasses, not stages (the stage schemas are the sibling modules).
Imports only the standard library (and PyYAML, lazily).
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from pathlib import Path
from typing import Any, Literal, Sequence, TypeVar, Union

from fourfold.errors import ConfigError

T = TypeVar("T")


def require(condition: bool, key: str, message: str) -> None:
    """Raise ConfigError(f"{key}: {message}") unless condition holds (used by validate())."""
    if not condition:
        raise ConfigError(f"{key}: {message}")


def validate_precision(dtype: str, precision: str, prefix: str = "model") -> None:
    """The model section's ``precision`` against its ``dtype``: bf16-mixed keeps float32 master
    weights (dtype float32), bf16 puts them in bfloat16 (dtype float32 or bfloat16, not float16)."""
    if precision == "bf16-mixed":
        require(dtype == "float32", f"{prefix}.precision",
                f"bf16-mixed keeps float32 master weights: set {prefix}.dtype=float32 (got {dtype})")
    if precision == "bf16":
        require(dtype != "float16", f"{prefix}.precision", f"bf16 conflicts with {prefix}.dtype=float16")


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if origin in (Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(tp))
    if origin in (list, tuple, Sequence):
        args = typing.get_args(tp)
        return f"list of {_type_name(args[0])}" if args else "list"
    if origin is dict:
        return "mapping"
    if tp is type(None):
        return "null"
    return getattr(tp, "__name__", str(tp))


def _coerce(value: Any, tp: Any, key: str, where: str) -> Any:
    """Check/convert one YAML value to the annotated type, or raise ConfigError naming the key."""
    origin = typing.get_origin(tp)
    bad = ConfigError(f"{where}{key}: expected {_type_name(tp)}, got {value!r}")
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
    if origin is dict:
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


def apply_overrides(tree: dict, overrides: Sequence[str]) -> dict:
    """Apply ``a.b=value`` strings to a nested dict (values parsed as YAML scalars)."""
    import yaml

    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r}: expected KEY=VALUE, e.g. ppo.kl_coef=0.02")
        key, raw = item.split("=", 1)
        key = key.strip().lstrip("-")
        if not key:
            raise ConfigError(f"override {item!r}: empty key")
        try:
            value = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError:
            value = raw
        _set_dotted(tree, key, value)
    return tree


def config_to_dict(cfg: Any) -> dict:
    """The config as plain nested dicts (for YAML and for cache keys)."""
    return dataclasses.asdict(cfg)


def _merge(base: dict, extra: dict) -> dict:
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def config_from_dict(cls: type[T], data: dict, where: str = "") -> T:
    """Build and validate ``cls`` from a nested mapping."""
    cfg = _build(cls, data or {}, where=where)
    try:
        validate_tree(cfg)
    except ConfigError as e:
        raise ConfigError(f"{where}{e}") from None
    return cfg


def validate_tree(cfg: Any, prefix: str = "") -> None:
    """Call ``validate(prefix)`` on every nested section first, then on ``cfg`` itself.

    A section's ``validate(prefix)`` checks its own fields and names them ``prefix.key``; a stage
    config's ``validate("")`` checks combinations across sections (e.g. minibatch vs batch).
    """
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            validate_tree(value, f"{prefix}.{f.name}" if prefix else f.name)
    validate = getattr(cfg, "validate", None)
    if callable(validate):
        validate(prefix)


def load_config(
    cls: type[T], path: str | Path | None = None, overrides: Sequence[str] = (), base: dict | None = None
) -> T:
    """Load ``cls`` from an optional YAML file, then ``key=value`` overrides, then validate.

    Errors name the file and the dotted key: ``examples/ppo.yaml: ppo.kl_coeff: unknown key (did
    you mean 'ppo.kl_coef'?)``.
    """
    import yaml

    tree: dict = dict(base or {})
    where = ""
    if path is not None:
        path = Path(path)
        where = f"{path}: "
        if not path.is_file():
            raise ConfigError(f"{path}: config file not found")
        try:
            loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
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
        tree = _merge(tree, loaded)
    if overrides:
        tree = apply_overrides(tree, overrides)
        where = where or "command line: "
    return config_from_dict(cls, tree, where=where)


def save_config(cfg: Any, path: str | Path) -> None:
    """Write the resolved config as YAML (atomically: temp file then rename)."""
    import yaml

    from fourfold.atomic import write_text_atomic

    write_text_atomic(path, yaml.safe_dump(config_to_dict(cfg), sort_keys=False))
