"""The CPU allocator lever (``run.malloc_mmap_threshold_kib``, :mod:`fourfold.run.allocator`).

Each case runs in a fresh interpreter: glibc's threshold is process-wide and cannot be put back.
The workload is the pattern that keeps a PPO run's RSS above its live tensors: a freed 4 MiB block
raises glibc's dynamic threshold, then 1 MiB tensors come from the heap, and freeing every other
one leaves holes that stay resident. With the lever each of them is its own mapping and leaves.
"""
import subprocess
import sys
import textwrap

import pytest

from fourfold.config import RunConfig
from fourfold.errors import ConfigError
from fourfold.run.allocator import _libc, set_mmap_threshold

PROBE = textwrap.dedent(
    """
    import os, sys
    import torch
    from fourfold.config import RunConfig
    if sys.argv[1] != "off":  # the scaffold's way: a run config with the key set
        import dataclasses
        from fourfold.run.scaffold import RunScaffold
        @dataclasses.dataclass
        class Cfg:
            run: RunConfig
        RunScaffold(Cfg(RunConfig(output_dir=sys.argv[2], progress=False, tensorboard=False,
                                  malloc_mmap_threshold_kib=int(sys.argv[1]))))
    def rss():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    x = torch.ones(1 << 20)  # 4 MiB, mapped; freeing it raises glibc's dynamic threshold to 4 MiB
    del x
    ts = [torch.ones(256 * 1024) for _ in range(200)]  # 200 x 1 MiB, written
    before = rss()
    del ts[::2]  # 100 MiB freed in holes between live tensors
    print((before - rss()) / 2**20)
    """
)

glibc = pytest.mark.skipif(_libc() is None, reason="glibc only (Linux)")


def _released_mib(tmp_path, setting: str) -> float:
    out = subprocess.run([sys.executable, "-c", PROBE, setting, str(tmp_path / "run")], capture_output=True,
                         text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


@glibc
def test_freed_tensors_leave_the_resident_set_only_with_the_lever(tmp_path):
    kept = _released_mib(tmp_path, "off")
    released = _released_mib(tmp_path, "256")
    assert kept < 10  # glibc's default: the 100 MiB freed stays resident
    assert 95 <= released <= 105  # the lever: every 1 MiB tensor went back to the OS


@glibc
def test_a_threshold_above_the_tensors_changes_nothing(tmp_path):
    # 2048 KiB > the 1 MiB tensors: they come from the heap again (the threshold is what matters)
    assert _released_mib(tmp_path, "2048") < 10


def test_the_key_is_checked_in_one_line():
    for bad in (0, -1, 32769):
        with pytest.raises(ConfigError, match=r"run\.malloc_mmap_threshold_kib: must be in \[1, 32768\]"):
            RunConfig(malloc_mmap_threshold_kib=bad).validate()
    RunConfig(malloc_mmap_threshold_kib=256).validate()
    with pytest.raises(ValueError, match="got 0"):
        set_mmap_threshold(0)


def test_off_glibc_it_says_why_instead(monkeypatch):
    import fourfold.run.allocator as allocator

    monkeypatch.setattr(allocator, "_libc", lambda: None)
    message = allocator.set_mmap_threshold(256)
    assert message is not None and "glibc (Linux) setting; not applied" in message


def test_the_scaffold_warns_when_it_cannot_apply_it(monkeypatch, tmp_path, capsys):
    import dataclasses

    import fourfold.run.allocator as allocator
    from fourfold.run.scaffold import RunScaffold

    @dataclasses.dataclass
    class Cfg:
        run: RunConfig

    monkeypatch.setattr(allocator, "_libc", lambda: None)
    RunScaffold(Cfg(RunConfig(output_dir=str(tmp_path / "run"), progress=False, tensorboard=False,
                              malloc_mmap_threshold_kib=256)))
    out = capsys.readouterr().out  # warnings go to stdout with the results (fourfold.sinks)
    assert out.count("fourfold run: warning: run.malloc_mmap_threshold_kib is a glibc (Linux) setting") == 1
