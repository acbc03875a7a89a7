"""The data-parallel seam's arithmetic (fourfold.run.parallel) on simulated ranks, in one
process: each rank's figures become those of the whole global batch, a rank whose rows do not count
adds nothing, and each rank's loss scale makes FSDP's average of the ranks' gradients the gradient of
the global mean (hand-computed values, then a property over random shares)."""
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fourfold import dist
from fourfold.dist import World
from fourfold.run import parallel
from fourfold.run.parallel import Figures, Part, loss_scale


def _global(monkeypatch, figures: list, parts: list) -> list:
    """Every simulated rank's ``Figures.global_``: the all-reduce is the sum of the ranks' vectors."""
    monkeypatch.setattr(dist, "world", lambda: World(0, len(figures)))
    sent = []
    monkeypatch.setattr(parallel, "global_sums", lambda values: sent.append(values) or values)
    for f, p in zip(figures, parts):
        f.global_(p)
    totals = [sum(column) for column in zip(*sent)]
    monkeypatch.setattr(parallel, "global_sums", lambda values: totals)
    return [f.global_(p) for f, p in zip(figures, parts)]


def test_two_ranks_report_the_whole_batch(monkeypatch):
    # rank 0: 3 tokens, mean loss 2, accuracy 1/3; rank 1: 1 token, loss 6, accuracy 1
    ranks = [Figures({"loss": 2.0, "acc": 1 / 3}, {"tokens": 3.0, "correct": 1.0}, "tokens"),
             Figures({"loss": 6.0, "acc": 1.0}, {"tokens": 1.0, "correct": 1.0}, "tokens")]
    (g0, share0), (g1, share1) = _global(monkeypatch, ranks, [Part([0], True), Part([1], True)])
    assert g0 == g1  # the same figures on every rank
    assert g0.means == pytest.approx({"loss": (2 * 3 + 6 * 1) / 4, "acc": 2 / 4})
    assert g0.sums == {"tokens": 4.0, "correct": 2.0}
    assert (share0, share1) == (0.75, 0.25)


def test_a_rank_whose_rows_do_not_count_adds_nothing(monkeypatch):
    ranks = [Figures({"loss": 5.0}, {"pairs": 2}, "pairs"), Figures({"loss": 99.0}, {"pairs": 1}, "pairs")]
    (g, share), (_, share_idle) = _global(monkeypatch, ranks, [Part([0, 1], True), Part([0], False)])
    assert g.means == {"loss": 5.0} and g.sums == {"pairs": 2} and (share, share_idle) == (1.0, 0.0)


def test_one_process_is_the_identity():
    f = Figures({"loss": 1.25}, {"tokens": 7.0}, "tokens")
    assert f.global_(Part([0], True)) == (f, 1.0)
    assert loss_scale(0.3) == 0.3 and loss_scale(0.25, World(1, 4)) == 1.0


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(-10, 10), st.integers(1, 9)), min_size=2, max_size=4))
def test_global_mean_and_scaled_gradients_match_the_whole_batch(shares):
    """For losses linear in one weight w (rank r: mean m_r * w over n_r items), the global mean is
    the item-weighted mean, and averaging the ranks' gradients of ``loss * loss_scale(share)`` gives
    the gradient of the global mean."""
    W = len(shares)
    total = sum(n for _, n in shares)
    want = sum(m * n for m, n in shares) / total
    grads = []
    for r, (m, n) in enumerate(shares):
        w = torch.tensor(1.0, dtype=torch.float64, requires_grad=True)
        (m * w * loss_scale(n / total, World(r, W))).backward()
        grads.append(float(w.grad))
    assert math.isclose(sum(grads) / W, want, rel_tol=1e-9, abs_tol=1e-12)  # FSDP's average


# ---- the rows of a rollout: this rank's slice, and every rank's gathered ---------------------------------


@pytest.mark.parametrize("n,world_size,slices", [
    (8, 2, [(0, 4), (4, 8)]),
    (5, 2, [(0, 2), (2, 5)]),  # as even as can be: the lower rank one fewer
    (6, 4, [(0, 1), (1, 3), (3, 4), (4, 6)]),
    (1, 2, [(0, 0), (0, 1)]),  # a rank may get none
])
def test_rank_slice_splits_the_rows_contiguously(monkeypatch, n, world_size, slices):
    for rank, (start, stop) in enumerate(slices):
        monkeypatch.setattr(dist, "world", lambda: World(rank, world_size))
        assert parallel.rank_slice(n) == slice(start, stop)
        assert parallel.several_ranks()


def test_one_process_takes_every_row_and_gathers_nothing(monkeypatch):
    import dataclasses

    @dataclasses.dataclass
    class Batch:
        x: torch.Tensor

    batch = Batch(torch.arange(3))
    monkeypatch.setattr(dist, "all_gather_rows", lambda t: pytest.fail("no collective in one process"))
    assert parallel.rank_slice(5) == slice(0, 5) and not parallel.several_ranks()
    assert parallel.gather_rows(batch) is batch


def test_gather_rows_concatenates_every_ranks_rows_in_rank_order(monkeypatch):
    """Rank 0 of 2: each tensor gathered in rank order (here rank 1 holds ``1 - x``), a bool one as
    bytes (gloo gathers no bool) and back, a None field left None."""
    import dataclasses
    from typing import Optional

    @dataclasses.dataclass
    class Batch:
        x: torch.Tensor
        done: torch.Tensor
        extra: Optional[torch.Tensor] = None

    sent = []
    monkeypatch.setattr(dist, "world", lambda: World(0, 2))
    monkeypatch.setattr(dist, "all_gather_rows", lambda t: sent.append(t.dtype) or torch.cat([t, 1 - t]))
    out = parallel.gather_rows(Batch(torch.tensor([[1, 2]]), torch.tensor([True])))
    assert torch.equal(out.x, torch.tensor([[1, 2], [0, -1]]))
    assert out.done.dtype == torch.bool and out.done.tolist() == [True, False]
    assert out.extra is None
    assert sent == [torch.int64, torch.uint8]


def test_global_sum_is_the_all_reduced_sum(monkeypatch):
    t = torch.tensor([1.5, -2.0])
    assert torch.equal(parallel.global_sum(t), t)  # one process: the tensor itself
    monkeypatch.setattr(dist, "world", lambda: World(1, 3))
    monkeypatch.setattr(dist, "all_reduce_sum", lambda x: x * 3)  # three ranks holding the same values
    assert torch.equal(parallel.global_sum(t), torch.tensor([4.5, -6.0]))
