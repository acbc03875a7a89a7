"""Durable, atomic file-system primitives of the checkpoints and of Hugging Face style output
directories: fsynced writes, temporary names that readers ignore, a directory swapped into place
in one rename, and the rule that names the directory being saved when a write fails.

Every temporary entry is a sibling named ``.tmp-<what>-<pid>-<8 hex>`` (:func:`temp_name`); the
random part comes from ``os.urandom``, so saving never consumes a random number the run draws.
"""
from __future__ import annotations

import hashlib
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path

import safetensors

from fourfold.atomic import fsync_dir
from fourfold.errors import FourfoldError

__all__ = [
    "TMP_PREFIX",
    "fsync_file",
    "remove",
    "reraise_naming",
    "save_pretrained_atomic",
    "sha256",
    "swap_into_place",
    "temp_name",
    "write_bytes",
]

TMP_PREFIX = ".tmp-"
"""The prefix of every temporary entry (a save in progress, a swapped-out or doomed copy)."""


def fsync_file(path: Path) -> None:
    """fsync the file at ``path`` (written by someone else, e.g. safetensors)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` and fsync it before returning."""
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def sha256(path: Path) -> str:
    """The hex sha256 of the file at ``path``, read in 4 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def temp_name(name: str) -> str:
    """``.tmp-<name>-<pid>-<8 hex>``: a fresh temporary name for ``name`` (a sibling of it)."""
    # os.urandom, not `random`/tempfile: saving must not consume any RNG the run depends on.
    return f"{TMP_PREFIX}{name}-{os.getpid()}-{os.urandom(4).hex()}"


def remove(path: Path) -> None:
    """Delete a file or a directory tree; one that is already gone is fine."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        try:
            path.unlink()
        except FileNotFoundError:
            pass


_OS_ERROR = re.compile(r"os error (\d+)")


def reraise_naming(error: BaseException, target: Path) -> None:
    """Re-raise ``error``; a failed write (disk full, the file-size limit) becomes an OSError naming
    the directory being saved instead of a file in its deleted temporary copy (or no file at all).
    safetensors reports its write errors as a SafetensorError quoting the OS error number."""
    errno = None
    if isinstance(error, OSError) and not isinstance(error, FourfoldError):
        errno = error.errno
    elif isinstance(error, safetensors.SafetensorError) and (m := _OS_ERROR.search(str(error))):
        errno = int(m.group(1))
    if errno is not None:
        raise OSError(errno, os.strerror(errno), str(target)) from error
    raise error


def swap_into_place(tmp: Path, final: Path) -> None:
    """Rename the finished ``tmp`` directory to ``final`` (its sibling), replacing any old
    ``final`` through a trash name that is put back if the swap fails; fsync the parent."""
    parent = final.parent
    trash: Path | None = None
    try:
        if final.exists():
            trash = parent / temp_name(f"trash-{final.name}")
            os.rename(final, trash)
        os.rename(tmp, final)
        fsync_dir(parent)
    except BaseException:
        if trash is not None and trash.exists() and not final.exists():
            os.rename(trash, final)
            trash = None
        remove(tmp)
        raise
    if trash is not None:
        remove(trash)


# ---- Hugging Face style output directories -------------------------------------------------------


def _fsync_tree(top: Path) -> None:
    for dirpath, _dirnames, filenames in os.walk(top):
        for f in filenames:
            p = Path(dirpath) / f
            if not p.is_symlink():
                fsync_file(p)
        fsync_dir(Path(dirpath))


def save_pretrained_atomic(saver: Callable[[Path], None], out_dir: str | os.PathLike) -> Path:
    """Run ``saver(tmp_dir)`` (e.g. ``lambda d: model.save_pretrained(d)``) into a temporary
    sibling ``.tmp-<name>-*`` of ``out_dir``, fsync it, then swap it into place: the old
    ``out_dir`` is renamed to ``.tmp-trash-<name>-*``, the new one renamed to ``out_dir``, and
    the trash deleted. A kill never leaves a half-written directory under ``out_dir``; in the
    instant between the two renames ``out_dir`` is absent and the previous copy is in the trash
    directory. Stale ``.tmp-<name>-*``/``.tmp-trash-<name>-*`` siblings from killed calls are
    removed first. Returns ``out_dir``."""
    out = Path(out_dir)
    parent = out.parent
    parent.mkdir(parents=True, exist_ok=True)
    stale = re.compile(rf"^{re.escape(TMP_PREFIX)}(trash-)?{re.escape(out.name)}-\d+-[0-9a-f]{{8}}$")
    for p in list(parent.iterdir()):
        if stale.match(p.name):
            remove(p)
    tmp = parent / temp_name(out.name)
    tmp.mkdir()
    try:
        saver(tmp)
        _fsync_tree(tmp)
    except BaseException as e:
        remove(tmp)
        reraise_naming(e, out)
    swap_into_place(tmp, out)
    return out
