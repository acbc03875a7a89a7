"""The stage cache of the applications: a stage reruns only when its settings or upstream changed.

A finished stage ``<out>/stages/<name>/`` holds a ``DONE`` record, ``{"key": ..., "result": ...}``
(JSON, sorted keys): the key hashes the stage's settings and the keys of the stages run before it
(:func:`stage_key`), the result is what the stage returned. ``fourfold demo`` runs its stages
through :class:`Stages`; ``fourfold experiments`` reads the demo's keys (:func:`done_key`) to key
its own runs, and copies a finished stage to another demo directory (:func:`write_done`).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from pathlib import Path
from typing import Any, Callable

from fourfold.atomic import write_text_atomic
from fourfold.checkpoint import save_pretrained_atomic
from fourfold.config import GenerationConfig, PPOAlgoConfig, config_to_dict


def digest(obj: Any) -> str:
    """A short stable hash (16 hex digits) of a JSON-able object (sorted keys; other values by str)."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


LATER_KEYS = ("micro_batch_tokens", "task_options", "assistant_turns", *GenerationConfig.ENGINE_KEYS,
              *GenerationConfig.TRUNCATION_KEYS, *PPOAlgoConfig.PRACTICE_KEYS,
              "log_grad_snr", "batch_epochs", "minibatches")
"""Settings added after the stage cache's keys were first written; each one's default reproduces
what ran before it existed (most choose how a step runs, not what it computes; SFT's
``assistant_turns`` at ``last`` trains what SFT trained before it). A key leaves them out while
they keep their defaults (:func:`keyed`), so the caches of earlier runs stay valid."""


def keyed(section) -> dict:
    """A config section (a dataclass) as a stage key holds it: its fields, but :data:`LATER_KEYS`
    left out while they equal the section class's defaults."""
    default = type(section)()
    return {k: v for k, v in config_to_dict(section).items()
            if not (k in LATER_KEYS and v == getattr(default, k))}


def stage_key(settings: Any, upstream: dict[str, str]) -> str:
    """The key of a stage run with ``settings`` after the stages ``upstream`` ({name: key})."""
    return digest({"settings": settings, "upstream": upstream})


def stage_dir(out: Path, name: str) -> Path:
    """Where stage ``name`` of the run directory ``out`` keeps its outputs and its DONE record."""
    return Path(out) / "stages" / name


def read_json(path: Path) -> Any:
    """The JSON value in ``path``; None when the file is missing or not valid JSON."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def read_done(out: Path, name: str) -> dict | None:
    """The DONE record of stage ``name`` in ``out`` (None when the stage has not finished)."""
    record = read_json(stage_dir(out, name) / "DONE")
    return record if isinstance(record, dict) else None


def done_key(out: Path, name: str) -> str | None:
    """The key stage ``name`` of ``out`` finished with (None when it has not)."""
    record = read_done(out, name)
    return record.get("key") if record else None


def write_done(out: Path, name: str, key: str, result: dict) -> None:
    """Mark stage ``name`` of ``out`` finished with ``key`` and ``result`` (atomically)."""
    write_text_atomic(stage_dir(out, name) / "DONE", json.dumps({"key": key, "result": result}, sort_keys=True))


ATTEMPT = "ATTEMPT"
"""The file of a stage's directory that holds the key of the run that started there: an unfinished
stage of another key is cleared, not resumed (its checkpoints are another configuration's)."""


class Stages:
    """``stages/<name>/DONE`` holds the key (config + upstream keys) a finished stage was run with,
    ``stages/<name>/ATTEMPT`` the key of the run that started it (:data:`ATTEMPT`)."""

    def __init__(self, out: Path, fresh: bool):
        self.out, self.fresh = out, fresh
        self.keys: dict[str, str] = {}

    def dir(self, name: str) -> Path:
        return stage_dir(self.out, name)

    def run(self, name: str, settings: Any, fn: Callable[[Path], dict], log: Callable[[str], None]) -> dict:
        """Run ``fn(stage directory)`` unless the stage finished with the same key; its result either way."""
        key = stage_key(settings, dict(self.keys))
        self.keys[name] = key
        d = self.dir(name)
        done = d / "DONE"
        if not self.fresh and done.is_file():
            record = json.loads(done.read_text())
            if record.get("key") == key:
                log(f"\\[{name}] cached ({d})")  # escaped: [name] is not rich markup
                return record.get("result", {})
        if d.exists() and (self.fresh or (done.is_file() and json.loads(done.read_text()).get("key") != key)):
            shutil.rmtree(d)  # stale outputs of another config: never resume across configs
        elif d.exists() and not done.is_file() and read_json(d / ATTEMPT) not in (None, key):
            # an unfinished run of another config (an interrupted full demo, then --quick): its
            # checkpoints cannot be resumed by this one
            log(f"\\[{name}] an unfinished run of another configuration was in {d}: cleared, this one starts afresh")
            shutil.rmtree(d)
        d.mkdir(parents=True, exist_ok=True)
        write_text_atomic(d / ATTEMPT, json.dumps(key))  # an interrupted run of this key may resume
        t0 = time.perf_counter()
        result = fn(d)
        result["wall_s"] = round(time.perf_counter() - t0, 2)
        write_done(self.out, name, key, result)
        return result


def copy_into_place(src: Path, dst: Path) -> None:
    """Copy a finished HF directory to its public name, atomically (temp copy, fsync, swap)."""
    save_pretrained_atomic(lambda tmp: shutil.copytree(src, tmp, dirs_exist_ok=True), dst)
