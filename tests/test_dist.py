"""The pieces of distributed runs that need no process group: how a global batch splits over the
ranks, the loss weights, the logger of the other ranks, the layers FSDP2 shards, and that one
process stays untouched (runs under torchrun: tests/distributed)."""
import pytest
import torch

from fourfold import dist
from fourfold.models.build import Roles
from fourfold.models.plan import FULL, RolePlan, RoleSpec
from fourfold.reporting import MetricsLogger
from fourfold.trainers.fsdp import decoder_layers, export_state_dict
from fourfold.trainers.parallel import Part, global_sums, loss_scale, place_roles, shard_rows
from fourfold.trainers.scaffold import NullLogger


@pytest.mark.parametrize("n,world", [(8, 2), (7, 2), (1, 2), (5, 3), (16, 1)])
def test_a_batch_splits_without_overlap_or_loss(n, world):
    parts = [list(range(n))[dist.shard(n, dist.World(r, world, r))] for r in range(world)]
    assert sum(parts, []) == list(range(n))
    assert max(map(len, parts)) - min(map(len, parts)) <= 1
    if n % world == 0:
        assert {len(p) for p in parts} == {n // world}


def test_a_rank_without_rows_runs_on_a_row_that_does_not_count():
    batch = [11, 12, 13]
    assert shard_rows(batch, dist.World(0, 1, 0)) == Part([11, 12, 13], True)
    assert shard_rows([11], dist.World(0, 2, 0)) == Part([11], False)  # nothing of its own: the first row, not counted
    assert shard_rows([11], dist.World(1, 2, 1)) == Part([11], True)
    assert shard_rows(batch, dist.World(1, 2, 1)) == Part([12, 13], True)


def test_one_process_is_left_alone():
    assert not dist.started() and dist.world() == dist.SINGLE
    assert global_sums([1.5, 2.0]) == [1.5, 2.0]
    assert loss_scale(1.0) == 1.0 and loss_scale(0.25) == 0.25
    model = torch.nn.Linear(2, 1)
    plan = RolePlan("sft", (RoleSpec("policy", FULL, "m", "model.path", True, torch.float32),), "m", "model.path")
    place_roles(Roles(None, policy=model), plan, "cpu")  # no group: nothing sharded
    assert type(model) is torch.nn.Linear
    assert export_state_dict(model) is None
    assert not dist.is_peer_failure(RuntimeError("Connection reset by peer"))


def test_the_other_ranks_logger_takes_everything_the_metrics_logger_does():
    public = {name for name in vars(MetricsLogger) if not name.startswith("_")}
    null = NullLogger()
    assert public <= {name for name in dir(null) if not name.startswith("_")}
    null.log(3, {"a": 1.0})
    null.samples(3, [{"prompt": "p"}])
    null.event("x", step=3)
    null.warn("y")
    null.close()
    assert null.last_step == 3 and null.tensorboard_dir is None


def test_fsdp_units_are_the_decoder_layers():
    from fourfold.models.factory import llama_config, random_causal_lm, random_scalar_model
    from fourfold.models.roles import ScalarModel

    cfg = llama_config(20, hidden=16, layers=3, heads=2, max_positions=16)
    lm, rm = random_causal_lm(cfg, seed=0), ScalarModel(random_scalar_model(cfg, seed=0))
    for model, layers in ((lm, lm.model.layers), (rm, rm.hf.model.layers)):
        assert decoder_layers(model) == list(layers)
