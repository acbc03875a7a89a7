"""Checkpoints: bit-identical resume, RNG, pruning, kills mid-write, no pickle."""
import json
import os
import random
import signal
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from fourfold.checkpoint import (
    CheckpointError,
    capture_rng_state,
    checkpoint_step,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    restore_rng_state,
    save_checkpoint,
    save_pretrained_atomic,
)


def _model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Dropout(0.2), torch.nn.Linear(16, 3))


def _make(seed: int, opt_kwargs: dict):
    model = _model(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, **opt_kwargs)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda it: 0.9**it)
    return model, opt, sched


def _train_step(model, opt, sched) -> None:
    x = torch.randn(8, 6)  # draws from the global RNG, as does dropout: RNG restore matters
    loss = model(x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    sched.step()


@pytest.mark.parametrize("opt_kwargs", [{}, {"foreach": True}, {"fused": True}], ids=["default", "foreach", "fused"])
def test_resume_is_bit_identical(tmp_path, opt_kwargs):
    model, opt, sched = _make(0, opt_kwargs)
    for _ in range(3):
        _train_step(model, opt, sched)
    path = save_checkpoint(
        tmp_path, 3, modules={"policy": model}, optimizers={"policy": opt}, schedulers={"policy": sched},
        state={"iteration": 3, "kl": {"value": 0.1}},
    )
    expected = []
    for _ in range(3):
        _train_step(model, opt, sched)
        expected.append([p.detach().clone() for p in model.parameters()])
    expected_lr = opt.param_groups[0]["lr"]

    random.random(), torch.rand(5)  # disturb the RNGs: the restore must undo this
    model2, opt2, sched2 = _make(1, opt_kwargs)
    state = load_checkpoint(path, modules={"policy": model2}, optimizers={"policy": opt2}, schedulers={"policy": sched2})
    assert state == {"iteration": 3, "kl": {"value": 0.1}}
    for want in expected:
        _train_step(model2, opt2, sched2)
        for a, b in zip(model2.parameters(), want):
            assert torch.equal(a, b)
    assert opt2.param_groups[0]["lr"] == expected_lr
    assert isinstance(opt2.param_groups[0]["betas"], tuple)


def test_rng_capture_restore():
    np.random.rand()  # numpy is imported: its global state is part of the capture
    saved = capture_rng_state()
    assert {"python", "torch_cpu", "numpy"} <= set(saved)
    a = (random.random(), torch.rand(4), np.random.rand(3))
    restore_rng_state(saved)
    b = (random.random(), torch.rand(4), np.random.rand(3))
    assert a[0] == b[0] and torch.equal(a[1], b[1]) and np.array_equal(a[2], b[2])


def test_rng_restored_from_checkpoint(tmp_path):
    path = save_checkpoint(tmp_path, 1)
    a = (random.random(), torch.rand(4), np.random.rand(2))
    load_checkpoint(path)
    b = (random.random(), torch.rand(4), np.random.rand(2))
    assert a[0] == b[0] and torch.equal(a[1], b[1]) and np.array_equal(a[2], b[2])
    load_checkpoint(path, restore_rng=False)
    assert random.random() != a[0] or not torch.equal(torch.rand(4), a[1])


def test_state_round_trip_types(tmp_path):
    state = {
        "tuple": (1, (2.5, "x")),
        "int_keys": {0: "a", 7: [1, 2]},
        "nonfinite": [float("nan"), float("inf"), -float("inf")],
        "tensor": torch.arange(4, dtype=torch.int64),
        "scalar": torch.tensor(0.25),
        "array": np.arange(6, dtype=np.uint32).reshape(2, 3),
        "tag_like": {"__tensor__": "not a tensor"},
        "none": None,
        "big": 2**70,
    }
    out = load_checkpoint(save_checkpoint(tmp_path, 0, state=state))
    assert out["tuple"] == (1, (2.5, "x"))
    assert out["int_keys"] == {0: "a", 7: [1, 2]}
    assert np.isnan(out["nonfinite"][0]) and out["nonfinite"][1:] == [float("inf"), -float("inf")]
    assert torch.equal(out["tensor"], state["tensor"]) and torch.equal(out["scalar"], state["scalar"])
    assert out["array"].dtype == np.uint32 and np.array_equal(out["array"], state["array"])
    assert out["tag_like"] == {"__tensor__": "not a tensor"}
    assert out["none"] is None and out["big"] == 2**70
    with pytest.raises(CheckpointError, match="state: bad"):
        save_checkpoint(tmp_path, 1, state={"bad": object()})
    assert checkpoint_step(latest_checkpoint(tmp_path)) == 0
    assert not [p for p in (tmp_path / "checkpoints").iterdir() if p.name.startswith(".tmp-")]


class _Tied(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(10, 4)
        self.head = torch.nn.Linear(4, 10, bias=False)
        self.head.weight = self.embed.weight
        self.register_buffer("scale", torch.tensor([2.0]))


def test_tied_weights_and_buffers(tmp_path):
    torch.manual_seed(0)
    a = _Tied()
    a.scale.fill_(3.0)
    path = save_checkpoint(tmp_path, 1, modules={"m": a})
    b = _Tied()
    load_checkpoint(path, modules={"m": b})
    assert b.head.weight is b.embed.weight and torch.equal(b.embed.weight, a.embed.weight)
    assert torch.equal(b.scale, a.scale)
    doc = json.loads((path / "modules" / "m.json").read_text())["tree"]
    assert doc["head.weight"] == doc["embed.weight"]  # stored once


def test_keep_prunes_and_no_pickle(tmp_path):
    model, opt, sched = _make(0, {})
    _train_step(model, opt, sched)
    for step in range(1, 6):
        save_checkpoint(tmp_path, step, modules={"p": model}, optimizers={"p": opt}, schedulers={"p": sched}, keep=2)
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert names == ["step-00000004", "step-00000005"]
    for p in (tmp_path / "checkpoints").rglob("*"):
        if p.is_file():
            assert p.name == "COMPLETE" or p.suffix in {".safetensors", ".json"}, p
            assert not p.read_bytes().startswith(b"\x80"), p  # pickle protocol header
    save_checkpoint(tmp_path, 6, modules={"p": model}, keep=0)  # keep <= 0: keep everything
    assert [checkpoint_step(p) for p in list_checkpoints(tmp_path)] == [4, 5, 6]


def test_latest_ignores_tmp_incomplete_and_mismatched(tmp_path):
    m = torch.nn.Linear(2, 2)
    good = save_checkpoint(tmp_path, 5, modules={"m": m}, keep=0)
    root = tmp_path / "checkpoints"
    import shutil

    shutil.copytree(good, root / ".tmp-step-00000009-1-abcd")  # complete but temporary
    shutil.copytree(good, root / "step-00000010")
    (root / "step-00000010" / "COMPLETE").unlink()  # no marker
    shutil.copytree(good, root / "step-00000011")
    manifest = json.loads((root / "step-00000011" / "COMPLETE").read_text())
    manifest["step"] = 11
    (root / "step-00000011" / "COMPLETE").write_text(json.dumps(manifest))
    with open(root / "step-00000011" / "modules" / "m.safetensors", "ab") as f:
        f.write(b"x")  # size no longer matches the manifest
    assert latest_checkpoint(tmp_path) == good
    best = shutil.copytree(good, tmp_path / "best")  # a copy under another name still loads
    load_checkpoint(best, modules={"m": m})
    with pytest.raises(CheckpointError):
        load_checkpoint(root / "step-00000010")
    with pytest.raises(CheckpointError, match="no modules named"):
        load_checkpoint(good, modules={"other": m})


def test_corrupted_content_detected(tmp_path):
    path = save_checkpoint(tmp_path, 1, modules={"m": torch.nn.Linear(2, 2)})
    f = path / "modules" / "m.safetensors"
    data = bytearray(f.read_bytes())
    data[-1] ^= 0xFF  # same size, different content
    f.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="sha256"):
        load_checkpoint(path, modules={"m": torch.nn.Linear(2, 2)})


class _Boom(Exception):
    pass


def _filled(value: float):
    m = torch.nn.Linear(8, 8)
    with torch.no_grad():
        for p in m.parameters():
            p.fill_(value)
    opt = torch.optim.AdamW(m.parameters())
    m(torch.ones(1, 8)).sum().backward()
    opt.step()
    with torch.no_grad():
        for p in m.parameters():
            p.fill_(value)
    return m, opt


def _loaded_value(path) -> float:
    m, opt = _filled(0.0)
    load_checkpoint(path, modules={"m": m}, optimizers={"o": opt})
    return m.weight[0, 0].item()


@pytest.mark.parametrize("new_step", [2, 1], ids=["new-step", "overwrite-step"])
def test_failure_at_every_write_point(tmp_path, monkeypatch, new_step):
    """Fail the k-th fsync/rename of a save, for every k: the newest complete checkpoint is
    always loadable and holds either the old or the new content, never a mix."""
    m1, o1 = _filled(1.0)
    save_checkpoint(tmp_path, 1, modules={"m": m1}, optimizers={"o": o1})
    m2, o2 = _filled(2.0)
    real_fsync, real_rename = os.fsync, os.rename
    k = 0
    while True:
        k += 1
        calls = [0]

        def counting(real):
            def wrapper(*args):
                calls[0] += 1
                if calls[0] == k:
                    raise _Boom(f"injected at call {k}")
                return real(*args)

            return wrapper

        monkeypatch.setattr(os, "fsync", counting(real_fsync))
        monkeypatch.setattr(os, "rename", counting(real_rename))
        try:
            save_checkpoint(tmp_path, new_step, modules={"m": m2}, optimizers={"o": o2}, keep=0)
            failed = False
        except _Boom:
            failed = True
        monkeypatch.setattr(os, "fsync", real_fsync)
        monkeypatch.setattr(os, "rename", real_rename)
        latest = latest_checkpoint(tmp_path)
        assert latest is not None
        step = checkpoint_step(latest)
        value = _loaded_value(latest)
        if new_step == 2:  # a new step: either the old checkpoint or the whole new one
            assert (step, value) in {(1, 1.0), (2, 2.0)}
        else:  # overwriting step 1: step 1 is always there, old or new content
            assert step == 1 and value in (1.0, 2.0)
        for p in (tmp_path / "checkpoints").iterdir():  # nothing half-written under a final name
            assert p.name.startswith(".tmp-") or (p / "COMPLETE").exists()
        if not failed:
            break
        if new_step == 2 and step == 2:  # failed after the rename: reset for the next k
            import shutil

            shutil.rmtree(latest)
    assert k > 10  # every file write, directory fsync and rename was a failure point
    assert _loaded_value(latest_checkpoint(tmp_path)) == 2.0
    assert not [p for p in (tmp_path / "checkpoints").iterdir() if p.name.startswith(".tmp-")]


def _linear_filled(value: float):
    m = torch.nn.Linear(128, 128)
    opt = torch.optim.AdamW(m.parameters())
    m(torch.ones(1, 128)).sum().backward()
    opt.step()
    with torch.no_grad():
        for p in m.parameters():
            p.fill_(value)
    return m, opt


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_sigkill_during_saves(tmp_path):
    """A forked process saving in a loop is SIGKILLed at random moments; every time, the newest
    complete checkpoint loads and is self-consistent (weights == the step it was saved at)."""
    rng = random.Random(0)
    next_step = 1
    for _ in range(8):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # child: save forever, never return into pytest
            try:
                os.close(r)
                m, opt = _linear_filled(0.0)
                os.write(w, b"r")
                step = next_step
                while True:
                    with torch.no_grad():
                        for p in m.parameters():
                            p.fill_(float(step))
                    save_checkpoint(tmp_path, step, modules={"m": m}, optimizers={"o": opt}, state={"step": step})
                    step += 1
            finally:
                os._exit(1)
        os.close(w)
        try:
            assert os.read(r, 1) == b"r"
            time.sleep(rng.uniform(0.0, 0.1))
        finally:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            os.close(r)
        latest = latest_checkpoint(tmp_path)
        if latest is None:
            continue
        m, opt = _linear_filled(-1.0)
        state = load_checkpoint(latest, modules={"m": m}, optimizers={"o": opt})
        assert state["step"] == checkpoint_step(latest)
        assert torch.all(m.weight == state["step"]) and torch.all(m.bias == state["step"])
        for p in (tmp_path / "checkpoints").iterdir():  # nothing half-written under a final name
            assert p.name.startswith(".tmp-") or (p / "COMPLETE").exists()
        next_step = state["step"] + 1
    assert latest_checkpoint(tmp_path) is not None
    # a later save cleans up whatever the kills left behind
    save_checkpoint(tmp_path, next_step + 100, state={"step": 0})
    assert not [p for p in (tmp_path / "checkpoints").iterdir() if p.name.startswith(".tmp-")]


def test_save_pretrained_atomic(tmp_path):
    out = tmp_path / "policy"

    def saver(text):
        def write(d: Path):
            (d / "config.json").write_text(text)
            (d / "sub").mkdir()
            (d / "sub" / "w.bin").write_bytes(b"\0" * 10)

        return write

    assert save_pretrained_atomic(saver("v1"), out) == out
    assert (out / "config.json").read_text() == "v1"
    save_pretrained_atomic(saver("v2"), out)
    assert (out / "config.json").read_text() == "v2"

    def failing(d: Path):
        (d / "config.json").write_text("half")
        raise RuntimeError("killed")

    with pytest.raises(RuntimeError):
        save_pretrained_atomic(failing, out)
    assert (out / "config.json").read_text() == "v2"
    (tmp_path / ".tmp-policy-123-deadbeef").mkdir()  # as left by a SIGKILL
    (tmp_path / ".tmp-policy-final-9-deadbeef").mkdir()  # another output's: not ours to delete
    save_pretrained_atomic(saver("v3"), out)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".tmp-policy-final-9-deadbeef", "policy"]
    assert (out / "config.json").read_text() == "v3"


def test_import_rules():
    """checkpoint/reporting import only torch, safetensors, numpy, rich, matplotlib, the stdlib and
    fourfold.core/errors/atomic (design.md rule 6; reporting also its metric table,
    fourfold.names): never transformers or another fourfold subpackage (the checkpoint
    package: its own modules, and fourfold.dist for the sharded ones); atomic (their shared file
    writes) and names import the stdlib alone."""
    import ast

    allowed_third_party = {"torch", "safetensors", "numpy", "rich", "matplotlib", "wandb"}  # wandb: sinks.py, lazily
    root = Path(__file__).resolve().parents[1] / "fourfold"
    files = sorted((root / "checkpoint").glob("*.py")) + [root / name for name in ("reporting.py", "sinks.py", "atomic.py",
                                                                                   "names.py")]
    assert len(files) > 3
    for path in files:
        name = path.relative_to(root).as_posix()
        allowed_fourfold = {"core", "errors", "atomic", "sinks", "names"} | ({"checkpoint", "dist"} if name.startswith("checkpoint/") else set())
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                mods = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):  # `from fourfold import dist`: fourfold.dist
                mods = [f"fourfold.{a.name}" for a in node.names] if node.module == "fourfold" else [node.module or ""]
            else:
                continue
            for mod in mods:
                top = mod.split(".")[0]
                if name in ("atomic.py", "names.py"):
                    assert top == "__future__" or top in sys.stdlib_module_names, (name, mod)
                elif top == "fourfold":
                    assert mod.split(".")[1] in allowed_fourfold, (name, mod)
                elif top != "__future__":
                    assert top in allowed_third_party or top in sys.stdlib_module_names, (name, mod)


class _Warmup:
    """A callable-object lr lambda: LambdaLR stores its __dict__, which here holds a function."""

    def __init__(self, steps):
        self.steps, self.shape = steps, lambda x: x

    def __call__(self, it):
        return min(1.0, (it + 1) / self.steps)


def test_schedulers_store_plain_values_only(tmp_path):
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=1.0)
    warm = torch.optim.lr_scheduler.LambdaLR(opt, _Warmup(4))
    plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(opt)  # holds an inf: JSON-tagged
    for _ in range(2):
        opt.step()
        warm.step()
    plateau.step(1.0)
    path = save_checkpoint(tmp_path, 2, optimizers={"o": opt}, schedulers={"warm": warm, "plateau": plateau})
    doc = json.loads((path / "schedulers" / "warm.json").read_text())
    assert doc["dropped"] == ["lr_lambdas/0/shape"]
    opt2 = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    warm2 = torch.optim.lr_scheduler.LambdaLR(opt2, _Warmup(99))  # the caller rebuilds the lambda
    plateau2 = torch.optim.lr_scheduler.ReduceLROnPlateau(opt2)
    load_checkpoint(path, optimizers={"o": opt2}, schedulers={"warm": warm2, "plateau": plateau2})
    assert warm2.last_epoch == 2 and warm2.lr_lambdas[0].steps == 4
    assert warm2.lr_lambdas[0].shape(3) == 3  # the rebuilt function survives the load
    assert plateau2.best == plateau.best and plateau2.num_bad_epochs == plateau.num_bad_epochs
    assert opt2.param_groups[0]["lr"] == opt.param_groups[0]["lr"]
