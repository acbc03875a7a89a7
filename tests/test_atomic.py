"""fourfold.atomic: whole-file writes that leave the old or the new file, never a part."""
import os

import pytest

from fourfold.atomic import write_text_atomic


def test_write_creates_parents_and_replaces_without_leftovers(tmp_path):
    path = tmp_path / "a" / "b" / "x.json"
    assert write_text_atomic(path, "first\n") == path
    assert path.read_text(encoding="utf-8") == "first\n"
    write_text_atomic(path, "second ü\n")
    assert path.read_text(encoding="utf-8") == "second ü\n"
    assert sorted(p.name for p in path.parent.iterdir()) == ["x.json"]


def test_a_failed_write_keeps_the_old_file(tmp_path, monkeypatch):
    path = tmp_path / "x.txt"
    write_text_atomic(path, "old")

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError, match="disk full"):
        write_text_atomic(path, "new")
    assert path.read_text() == "old"
