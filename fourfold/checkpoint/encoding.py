"""The pickle-free encoding of what a checkpoint stores as files of its own (plain checkpoints:
everything; sharded ones: the schedulers, the trainer's state and the RNG states): JSON for
structure, safetensors for tensors.

A component ``<name>`` is ``<name>.json`` (``{"tree": ..., "tensors_file": bool, "dropped": [...]}``)
and, when it holds tensors, ``<name>.safetensors``. Tuples, non-string dict keys, NaN/inf and numpy
arrays survive the round trip through small tagged JSON objects (see ``_Encoder``).
"""
from __future__ import annotations

import json
import math
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import safetensors.torch
import torch

from fourfold.checkpoint.durable import fsync_file, write_bytes
from fourfold.checkpoint.errors import CheckpointError

__all__ = ["read_component", "write_component"]

_DROP = object()  # marker for a value left out by a lenient _Encoder
_TAGS = frozenset({"__tensor__", "__tuple__", "__dict__", "__float__", "__ndarray__"})


class _Encoder:
    """Turns a nested structure into (JSON-able tree, {key: tensor}).

    Tags: ``{"__tensor__": key}`` (tensor in the safetensors file), ``{"__tuple__": [...]}``,
    ``{"__dict__": [[k, v], ...]}`` (dicts with non-str keys, e.g. optimizer state ``{0: ...}``),
    ``{"__float__": "nan" | "inf" | "-inf"}``, ``{"__ndarray__": {dtype, shape, hex}}``.
    Tensors that are the same view of the same memory (tied weights) are stored once.
    ``lenient`` (schedulers, whose state may hold callables): instead of raising, a value that
    cannot be stored is left out of its dict (so ``__dict__.update`` keeps the caller's rebuilt
    one) or becomes ``None`` in a list/tuple, and its path is listed in ``dropped``.
    """

    def __init__(self, what: str, *, lenient: bool = False):
        self.what = what
        self.lenient = lenient
        self.tensors: dict[str, torch.Tensor] = {}
        self.dropped: list[str] = []
        self._views: dict[tuple, str] = {}

    def _tensor_key(self, t: torch.Tensor, path: tuple[str, ...]) -> str:
        if t.is_sparse or t.layout != torch.strided:
            raise CheckpointError(f"{self.what}: {'/'.join(path)}: only dense tensors can be stored")
        view = (t.device, t.dtype, t.data_ptr(), tuple(t.shape), tuple(t.stride()))
        if view in self._views:
            return self._views[view]
        key = "/".join(path) or "tensor"
        base, n = key, 1
        while key in self.tensors:
            n += 1
            key = f"{base}#{n}"
        x = t.detach()
        if x.device.type != "cpu":
            x = x.to("cpu")  # already a copy
        else:
            x = x.clone()  # a snapshot that shares memory with nothing else (safetensors needs that)
        self.tensors[key] = x.contiguous()
        self._views[view] = key
        return key

    def encode(self, obj: Any, path: tuple[str, ...] = ()) -> Any:
        if isinstance(obj, torch.Tensor):
            return {"__tensor__": self._tensor_key(obj, path)}
        if obj is None or isinstance(obj, (bool, str)):
            return obj
        if isinstance(obj, int):
            return int(obj)
        if isinstance(obj, float):
            return float(obj) if math.isfinite(obj) else {"__float__": repr(float(obj))}
        if isinstance(obj, (tuple, list)):
            items = [self.encode(v, path + (str(i),)) for i, v in enumerate(obj)]
            items = [None if v is _DROP else v for v in items]
            return {"__tuple__": items} if isinstance(obj, tuple) else items
        if isinstance(obj, Mapping):
            pairs = [(k, self.encode(v, path + (str(k),))) for k, v in obj.items()]
            pairs = [(k, v) for k, v in pairs if v is not _DROP]
            if all(isinstance(k, str) and k not in _TAGS for k, _ in pairs):
                return dict(pairs)
            keys = [self.encode(k, path + ("key",)) for k, _ in pairs]
            if any(k is _DROP for k in keys):
                raise CheckpointError(f"{self.what}: {'/'.join(path)}: a dict key is not storable")
            return {"__dict__": [[k, v] for k, (_, v) in zip(keys, pairs)]}
        np = sys.modules.get("numpy")
        if np is not None:
            if isinstance(obj, np.ndarray) and obj.dtype != object:
                a = np.ascontiguousarray(obj)
                return {"__ndarray__": {"dtype": a.dtype.str, "shape": list(a.shape), "hex": a.tobytes().hex()}}
            if isinstance(obj, np.generic):
                return self.encode(obj.item(), path)
        if self.lenient:
            self.dropped.append("/".join(path))
            return _DROP
        raise CheckpointError(
            f"{self.what}: {'/'.join(path) or '<root>'}: a {type(obj).__name__} is neither a tensor nor "
            "JSON-able (checkpoints never pickle); store plain values instead"
        )


def _decode(obj: Any, tensors: Mapping[str, torch.Tensor]) -> Any:
    if isinstance(obj, list):
        return [_decode(v, tensors) for v in obj]
    if not isinstance(obj, dict):
        return obj
    if len(obj) == 1:
        (tag, val), = obj.items()
        if tag == "__tensor__":
            return tensors[val]
        if tag == "__tuple__":
            return tuple(_decode(v, tensors) for v in val)
        if tag == "__dict__":
            return {_decode(k, tensors): _decode(v, tensors) for k, v in val}
        if tag == "__float__":
            return float(val)
        if tag == "__ndarray__":
            import numpy as np

            a = np.frombuffer(bytes.fromhex(val["hex"]), dtype=np.dtype(val["dtype"]))
            return a.reshape(val["shape"]).copy()
    return {k: _decode(v, tensors) for k, v in obj.items()}


def write_component(directory: Path, name: str, obj: Any, *, what: str, lenient: bool = False) -> None:
    """``directory/name.json`` (+ ``name.safetensors`` when there are tensors), each fsynced.
    ``what`` names ``obj`` in errors; ``lenient``: leave out what cannot be stored (see ``_Encoder``)."""
    directory.mkdir(parents=True, exist_ok=True)
    enc = _Encoder(what, lenient=lenient)
    tree = enc.encode(obj)
    tree = None if tree is _DROP else tree
    if enc.tensors:
        st_path = directory / f"{name}.safetensors"
        safetensors.torch.save_file(enc.tensors, str(st_path), metadata={"format": "pt"})
        fsync_file(st_path)
    doc = {"tree": tree, "tensors_file": bool(enc.tensors), "dropped": enc.dropped}
    write_bytes(directory / f"{name}.json", json.dumps(doc, allow_nan=False).encode())


def read_component(directory: Path, name: str, *, map_location: Any = "cpu") -> Any:
    """The object :func:`write_component` stored as ``directory/name``, its tensors on ``map_location``."""
    doc = json.loads((directory / f"{name}.json").read_text())
    tensors: dict[str, torch.Tensor] = {}
    if doc["tensors_file"]:
        device = str(torch.device(map_location)) if map_location is not None else "cpu"
        tensors = safetensors.torch.load_file(str(directory / f"{name}.safetensors"), device=device)
    return _decode(doc["tree"], tensors)
