"""EpochSampler: seeded per-epoch permutations; a resumed sampler continues with exactly the same order."""
import itertools
import json

import pytest

from fourfold.data import EpochSampler
from fourfold.errors import DataError


def _take(sampler, n):
    return list(itertools.islice(sampler.batches(), n))


@pytest.mark.parametrize("n,bs,drop_last", [(10, 3, False), (10, 3, True), (8, 4, False), (7, 7, True)])
def test_each_epoch_is_a_permutation_in_batches(n, bs, drop_last):
    s = EpochSampler(n, bs, seed=1, drop_last=drop_last)
    epochs = [list(s) for _ in range(3)]
    for batches in epochs:
        assert len(batches) == len(s)
        flat = [i for b in batches for i in b]
        assert len(set(flat)) == len(flat) and set(flat) <= set(range(n))
        assert len(flat) == (n - n % bs if drop_last else n)
        assert all(len(b) == bs for b in batches[:-1])
    assert epochs[0] != epochs[1]  # reshuffled per epoch
    assert s.state_dict()["epoch"] == 3


def test_seed_decides_the_order():
    assert _take(EpochSampler(20, 4, seed=0), 10) == _take(EpochSampler(20, 4, seed=0), 10)
    assert _take(EpochSampler(20, 4, seed=0), 10) != _take(EpochSampler(20, 4, seed=1), 10)
    assert list(EpochSampler(5, 2, shuffle=False)) == [[0, 1], [2, 3], [4]]


@pytest.mark.parametrize("stop", [0, 1, 3, 4, 5, 9])
@pytest.mark.parametrize("drop_last", [False, True])
def test_resume_equality(stop, drop_last):
    total = 12
    reference = _take(EpochSampler(10, 3, seed=7, drop_last=drop_last), total)

    first = EpochSampler(10, 3, seed=7, drop_last=drop_last)
    head = _take(first, stop)
    state = json.loads(json.dumps(first.state_dict()))  # survives a JSON (or torch.save) round trip

    resumed = EpochSampler(10, 3, seed=123, drop_last=drop_last)  # seed comes from the state
    resumed.load_state_dict(state)
    assert head + _take(resumed, total - stop) == reference


def test_state_at_epoch_end_is_start_of_next():
    s = EpochSampler(6, 3, seed=0)
    it = iter(s)
    next(it), next(it)  # the whole epoch handed out, generator not yet exhausted
    assert s.state_dict() == {"epoch": 1, "position": 0, "seed": 0, "num_samples": 6}


def test_resume_with_a_different_dataset_size_is_refused():
    s = EpochSampler(10, 2)
    state = s.state_dict()
    with pytest.raises(DataError, match="data now has 11 records, the checkpoint was taken with 10"):
        EpochSampler(11, 2).load_state_dict(state)


def test_bad_arguments():
    for args, kw in [((0, 1), {}), ((3, 0), {}), ((3, 4), {"drop_last": True})]:
        with pytest.raises(ValueError):
            EpochSampler(*args, **kw)
