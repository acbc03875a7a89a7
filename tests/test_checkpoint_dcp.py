"""Sharded (DCP) checkpoints, in one process: the collectives are identities there, so the format,
its atomic layout, loading, corruption and mismatches are checked without torchrun (what differs
with several ranks, resharding and a rank's death, is in tests/distributed)."""
import json

import pytest
import torch

from fourfold.checkpoint import (
    CheckpointError,
    CorruptCheckpointError,
    PlainCheckpointer,
    ShardedCheckpointer,
    checkpointer,
    is_sharded_checkpoint,
    latest_checkpoint,
    load_checkpoint,
    load_plain_sharded,
    load_sharded,
    save_checkpoint,
    save_sharded,
)
from fourfold.run.optim import make_optimizer, make_schedule


def _trained(seed: int, width: int = 4):
    """A small model, AdamW and its schedule after two steps (so the optimizer has state)."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(3, width), torch.nn.Linear(width, 1))
    opt = make_optimizer(model.parameters(), 1e-2)
    sched = make_schedule(opt, 10, "linear", 2)
    for _ in range(2):
        model(torch.randn(5, 3)).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
        sched.step()
    return model, opt, sched


def _same(a, b) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


def test_a_sharded_checkpoint_round_trips_with_its_layout(tmp_path):
    model, opt, sched = _trained(0)
    torch.manual_seed(7)
    path = save_sharded(tmp_path, 3, modules={"m": model}, optimizers={"m": opt}, schedulers={"m": sched},
                        state={"step": 3, "data": [1, 2]})
    after_save = torch.rand(3)
    manifest = json.loads((path / "COMPLETE").read_text())
    assert path.name == "step-00000003" and latest_checkpoint(tmp_path) == path and is_sharded_checkpoint(path)
    assert manifest["layout"] == "dcp" and manifest["world_size"] == 1
    assert {"dcp/.metadata", "state.json", "schedulers/m.json", "rng-rank00000.json"} <= set(manifest["files"])
    assert not list((tmp_path / "checkpoints").glob(".tmp-*"))

    other, other_opt, other_sched = _trained(1)
    state, note = load_sharded(path, modules={"m": other}, optimizers={"m": other_opt}, schedulers={"m": other_sched})
    assert state == {"step": 3, "data": [1, 2]} and note is None
    assert _same(model, other) and other_sched.state_dict() == sched.state_dict()
    assert all(torch.equal(opt.state[p]["exp_avg"], other_opt.state[q]["exp_avg"])
               for p, q in zip(model.parameters(), other.parameters()))
    assert torch.equal(torch.rand(3), after_save)  # the RNG state saved with it came back


def test_a_corrupt_or_mismatched_sharded_checkpoint_is_one_line(tmp_path):
    model, opt, _ = _trained(0)
    path = save_sharded(tmp_path, 1, modules={"m": model}, optimizers={"m": opt})
    wider, wider_opt, _ = _trained(0, width=5)
    with pytest.raises(CheckpointError, match=r"its models do not load into this run's .*another architecture\?$"):
        load_sharded(path, modules={"m": wider}, optimizers={"m": wider_opt})
    with pytest.raises(CheckpointError, match=r"no modules named \['x'\]"):
        load_sharded(path, modules={"x": model}, optimizers={})
    with pytest.raises(CheckpointError, match=r"a sharded \(dcp\) checkpoint of a torchrun run"):
        load_checkpoint(path, modules={"m": model})
    shard = next((path / "dcp").glob("*.distcp"))
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(CorruptCheckpointError, match="sha256 does not match"):
        load_sharded(path, modules={"m": model}, optimizers={"m": opt})


def test_a_plain_checkpoint_loads_by_parameter_name(tmp_path):
    """What a torchrun run does with a one-process checkpoint (here into plain modules)."""
    model, opt, sched = _trained(0)
    path = save_checkpoint(tmp_path, 2, modules={"m": model}, optimizers={"m": opt}, schedulers={"m": sched},
                           state={"step": 2})
    other, other_opt, other_sched = _trained(1)
    state, note = load_plain_sharded(path, modules={"m": other}, optimizers={"m": other_opt},
                                     schedulers={"m": other_sched})
    assert state == {"step": 2} and "written by one process (no torchrun)" in note
    assert _same(model, other)
    assert all(torch.equal(opt.state[p]["exp_avg_sq"], other_opt.state[q]["exp_avg_sq"])
               for p, q in zip(model.parameters(), other.parameters()))


@pytest.mark.parametrize("sharded", [False, True])
def test_a_checkpointer_saves_its_kind_and_loads_either(tmp_path, sharded):
    """checkpointer(sharded) picks the run's kind; its load reads both kinds, with a note only when
    a plain checkpoint goes into a sharded run (one process here: no resharding)."""
    ckpt = checkpointer(sharded)
    assert isinstance(ckpt, ShardedCheckpointer if sharded else PlainCheckpointer)
    for written_sharded in (False, True):
        model, opt, sched = _trained(0)
        path = checkpointer(written_sharded).save(tmp_path / str(written_sharded), 2, modules={"m": model},
                                                  optimizers={"m": opt}, schedulers={"m": sched}, state={"step": 2})
        assert is_sharded_checkpoint(path) == written_sharded
        other, other_opt, other_sched = _trained(1)
        state, note = ckpt.load(path, modules={"m": other}, optimizers={"m": other_opt}, schedulers={"m": other_sched})
        assert state == {"step": 2} and _same(model, other)
        assert other_sched.state_dict() == sched.state_dict()
        assert (note is not None) == (sharded and not written_sharded)
