"""A run's output directory, before anything is written into it (used by
:class:`~fourfold.run.scaffold.RunScaffold`):

* ``run.output_dir`` must not be empty, must be a directory (created when missing) and writable;
  otherwise one :class:`~fourfold.errors.ConfigError` line naming the path;
* a directory that already holds a run (a non-empty ``metrics.jsonl`` or a checkpoint) is refused
  unless ``run.resume`` (continue it) or ``run.overwrite`` (remove its metrics, events, TensorBoard
  files and checkpoints first): two runs never mix their metrics, and a later ``--resume`` never
  continues an older run's checkpoints;
* ``run.resume`` in a directory without a checkpoint is refused before anything is created there
  (a mistyped ``--output-dir`` never restarts a long run from step 0);
* resuming with another model or batch size than the checkpoints were written with is refused,
  naming the key (compared with the ``config.yaml`` the run wrote, before it is rewritten).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any, Iterator

from fourfold.config import config_to_dict
from fourfold.errors import ConfigError

RUN_FILES = ("metrics.jsonl", "events.jsonl", "samples.jsonl")
"""Files of a run that ``run.overwrite`` removes."""
RUN_DIRS = ("checkpoints", "tensorboard")
"""Directories of a run that ``run.overwrite`` removes."""

RESUME_SECTIONS = ("model", "agent")
"""Config sections that must not change on resume: the weights the checkpoints hold come from them."""
RESUME_FIELDS = ("batch_size", "rollout_batch_size", "minibatch_size", "num_envs", "num_steps")
"""Fields (in any section) that must not change on resume: the data order and the optimizer's steps
are counted in batches of these sizes (``micro_batch_size`` may change: it only splits a batch)."""


def prepare_run_dir(cfg) -> Path:
    """Check ``cfg.run.output_dir`` (a stage config's ``run`` section) and create it; refuse a used
    directory without ``run.resume`` or ``run.overwrite``; with ``run.overwrite`` remove the old run's
    files; with ``run.resume`` refuse another model or batch size. Returns the directory."""
    run = cfg.run
    if not str(run.output_dir).strip():
        raise ConfigError("run.output_dir: must not be empty (it would write into the current directory)")
    if run.resume and run.overwrite:
        raise ConfigError("run.overwrite: cannot be combined with run.resume (resume continues the run, "
                          "overwrite replaces it)")
    out = Path(run.output_dir)
    if run.resume and not _checkpoint_dirs(out):  # before anything is created: a mistyped directory stays absent
        held = " (it holds a run without one: --overwrite replaces it)" if out.is_dir() and holds_a_run(out) else ""
        raise ConfigError(f"run.resume: {out} holds no checkpoint to resume from{held}; check the output directory, "
                          "or start the run there without --resume")
    _create_writable(out)
    if not run.resume and holds_a_run(out):
        if not run.overwrite:
            raise ConfigError(f"run.output_dir: {out} already holds a run (metrics.jsonl or checkpoints); "
                              "pass --resume to continue it or --overwrite to replace it")
        clear_run(out)
    if run.resume and _checkpoint_dirs(out):
        check_resume_config(cfg, out / "config.yaml")
    return out


def _create_writable(out: Path) -> None:
    if out.exists() and not out.is_dir():
        raise ConfigError(f"run.output_dir: {out} is a file, not a directory")
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / f".fourfold-write-test-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise ConfigError(f"run.output_dir: {out} cannot be created or written ({e.strerror or e})") from None


def _checkpoint_dirs(out: Path) -> list[Path]:
    root = out / "checkpoints"
    return [p for p in root.iterdir() if p.name.startswith("step-")] if root.is_dir() else []


def holds_a_run(out: Path) -> bool:
    """Whether ``out`` holds an earlier run: a non-empty ``metrics.jsonl`` or a checkpoint."""
    metrics = out / "metrics.jsonl"
    return (metrics.is_file() and metrics.stat().st_size > 0) or bool(_checkpoint_dirs(out))


def clear_run(out: Path) -> None:
    """Remove an earlier run's metrics, events, TensorBoard files and checkpoints from ``out``."""
    for name in RUN_FILES:
        (out / name).unlink(missing_ok=True)
    for name in RUN_DIRS:
        if (out / name).is_dir():
            shutil.rmtree(out / name)


def _resume_keys(tree: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[str, Any]]:
    """(dotted key, value) of every setting that must not change on resume."""
    if not isinstance(tree, dict):
        return
    for key, value in tree.items():
        here = path + (str(key),)
        if isinstance(value, dict):
            yield from _resume_keys(value, here)
        elif here[0] in RESUME_SECTIONS or here[-1] in RESUME_FIELDS:
            yield ".".join(here), value


def _same(old: Any, new: Any) -> bool:
    """Equal values; paths that name the same existing file or directory count as equal."""
    if old == new:
        return True
    return (isinstance(old, str) and isinstance(new, str) and os.path.exists(old) and os.path.exists(new)
            and os.path.samefile(old, new))


def check_resume_config(cfg, saved: Path) -> None:
    """Refuse to resume ``cfg`` when a model or batch-size setting differs from the ``saved``
    config.yaml of the run whose checkpoints it would load (nothing to compare: no check)."""
    import yaml

    try:
        old = yaml.safe_load(saved.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return
    old_values = dict(_resume_keys(old))
    for key, value in _resume_keys(config_to_dict(cfg)):
        if key in old_values and not _same(old_values[key], value):
            raise ConfigError(f"{key}: {value!r} now, {old_values[key]!r} when the checkpoints in {saved.parent} "
                              "were written; resume with the same value, or start a new run (--overwrite or "
                              "another output_dir)")
