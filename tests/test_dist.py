"""The pieces of distributed runs that need no process group: how a global batch splits over the
ranks, the loss weights, the logger of the other ranks, the layers FSDP2 shards, and that one
process stays untouched (runs under torchrun: tests/distributed)."""
import pytest
import torch

from fourfold import dist
from fourfold.models.build import Roles
from fourfold.models.plan import FULL, RolePlan, RoleSpec
from fourfold.reporting import MetricsLogger
from fourfold.run.fsdp import decoder_layers, export_state_dict
from fourfold.run.parallel import Part, global_sums, loss_scale, map_batches, mean_over_ranks, place_roles, shard_rows
from fourfold.run.scaffold import NullLogger


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


@pytest.mark.parametrize("n_items", [0, 1, 7, 8, 9])
def test_a_pass_in_batches_is_split_over_the_ranks_and_gathered_in_order(monkeypatch, n_items):
    """map_batches on rank r of 3 (simulated: the gather returns what each rank would compute) runs
    fn on batches r, r + 3, ... plus the first batch again where it has one batch fewer than rank 0,
    and returns the one-process list."""
    items, world = list(range(100, 100 + n_items)), 3
    one = map_batches(lambda batch: sum(batch), items, 2)  # one process: the plain loop
    assert one == [sum(items[i:i + 2]) for i in range(0, n_items, 2)]
    for rank in range(world):
        calls: list = []
        monkeypatch.setattr(dist, "world", lambda rank=rank: dist.World(rank, world, rank))
        monkeypatch.setattr(dist, "all_gather_objects", lambda mine: [one[r::world] for r in range(world)])
        assert map_batches(lambda batch: calls.append(batch) or sum(batch), items, 2) == one
        batches = [items[i:i + 2] for i in range(0, n_items, 2)]
        assert calls == batches[rank::world] + batches[:1] * (-(-len(batches) // world) - len(batches[rank::world]))


def test_means_over_each_ranks_rows_combine_weighted_by_the_rows(monkeypatch):
    assert mean_over_ranks({"gold": 0.5}, 3) == {"gold": 0.5}  # one process: as given
    monkeypatch.setattr(dist, "world", lambda: dist.World(0, 2, 0))
    monkeypatch.setattr(dist, "all_reduce_sum", lambda t: t + torch.tensor([1.0 * 1, 1]))  # rank 1: mean 1.0 over 1 row
    assert mean_over_ranks({"gold": 0.5}, 3) == {"gold": (0.5 * 3 + 1.0) / 4}


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


def _as_rank(monkeypatch, rank: int, gathered) -> None:
    """This process as rank ``rank`` of 2, whose all_gather_objects gives ``gathered(mine)``."""
    monkeypatch.setattr(dist, "world", lambda: dist.World(rank, 2, rank))
    monkeypatch.setattr(dist, "all_gather_objects", gathered)


def test_an_error_of_one_rank_is_raised_on_every_rank_with_its_message(monkeypatch):
    """raise_first_error / all_reduce_checked: in one process the error itself (or the sum); under
    torchrun (simulated: rank 1 sends, rank 0 gets what rank 1 sent) rank 1 raises its own
    exception and rank 0 a copy: a UserCodeError's class and message with the user's traceback as
    text, or for an error that is not fourfold's own one line naming rank 1; when both ranks have
    one, rank 0's."""
    from fourfold.errors import ConfigError, UserCodeError, user_traceback

    assert dist.all_reduce_checked((3, 4), None) == [3, 4]
    with pytest.raises(ConfigError, match="^env.factory: bad$"):
        dist.all_reduce_checked([3], ConfigError("env.factory: bad"))
    try:
        try:
            raise ValueError("the board has no square z9")
        except ValueError as inner:
            raise UserCodeError("env.factory: make_env: step() of turn 0 of the environment of row p.jsonl:23") from inner
    except UserCodeError as e:
        user = e
    text = user_traceback(user)
    assert text.startswith("Traceback") and text.endswith("ValueError: the board has no square z9\n")
    for error in (user, KeyError("no such move")):
        sent: list = []
        _as_rank(monkeypatch, 1, lambda mine: sent.append(mine) or [None, mine])
        with pytest.raises(type(error)) as own:
            dist.raise_first_error(error)
        assert own.value is error  # the failing rank: its own exception, cause and traceback kept
        _as_rank(monkeypatch, 0, lambda mine: [mine, sent[0]])
        with pytest.raises(dist.FourfoldError) as copy:
            dist.raise_first_error(None)
        if error is user:
            assert type(copy.value) is UserCodeError and str(copy.value) == str(user)
            assert copy.value.__cause__ is None and user_traceback(copy.value) == text
            assert dist.raised_on_every_rank(copy.value) and dist.raised_on_every_rank(own.value)  # both settle
        else:
            assert not dist.raised_on_every_rank(copy.value)  # rank 1's KeyError escapes its CLI: no wait for it
            assert type(copy.value) is dist.PeerLostError
            assert str(copy.value) == ("rank 1 of 2 raised KeyError: 'no such move' (its traceback is in that rank's "
                                       "output), so this one stops")
        with pytest.raises(ConfigError, match="^rank 0's$"):  # both ranks failed: the lowest rank's
            dist.raise_first_error(ConfigError("rank 0's"))
