"""A rollout collected by two processes (torchrun, gloo) is the 1-process rollout: each rank samples
its slice of the global rows with their own noise, the token loop stops when every rank is done,
and every rank gathers the same whole batch. Also with the static engine over an FSDP-sharded
policy, gathered once per rollout or copied into a plain inference copy by the engine's sync."""
import sys
from pathlib import Path

import pytest
import torch
from disttest_utils import torchrun_script

HERE = Path(__file__).resolve().parent


def _worker():
    sys.path.insert(0, str(HERE))
    try:
        import collect_worker
    finally:
        sys.path.remove(str(HERE))
    return collect_worker


@pytest.mark.slow  # the PPO tests of test_ppo_dist.py cover it end to end; this one isolates collect()
@pytest.mark.parametrize("engine", [(), ("static", "gathered"), ("static", "copy"), ("eager", "gathered")],
                         ids=["eager", "static-gathered", "static-copy", "eager-gathered"])
def test_two_ranks_collect_the_one_process_rollout(tiny_lm, tmp_path, engine):
    from fourfold.dist import SINGLE

    proc = torchrun_script(HERE / "collect_worker.py", tiny_lm, tmp_path / "two", *engine, timeout=180, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    one = _worker().run(str(tiny_lm), SINGLE)  # the eager engine on the policy itself, one process
    assert bool(one["tensors"]["finished"].any()) and not bool(one["tensors"]["finished"].all())  # uneven EOS
    for rank in (0, 1):
        two = torch.load(tmp_path / f"two.{rank}.pt")
        assert two["responses"] == one["responses"]
        for key, expected in one["tensors"].items():
            got = two["tensors"][key]
            assert got.shape == expected.shape, key
            if expected.is_floating_point():
                torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5 if engine else 1e-6, msg=key)
            else:
                assert torch.equal(got, expected), key
        assert two["metrics"].keys() == one["metrics"].keys()
        for key, value in one["metrics"].items():
            assert abs(two["metrics"][key] - value) <= 1e-5 * max(1.0, abs(value)), key


@pytest.mark.slow
def test_the_default_weights_gather_a_sharded_policy_once_and_give_live_numbers_exactly(tiny_lm, tmp_path):
    """generation.weights: auto (the default) over an FSDP-sharded policy resolves to gathered, and
    its rollout is live's (the slow path it replaces) bit for bit in float32."""
    runs = {}
    for weights in ("auto", "live"):
        proc = torchrun_script(HERE / "collect_worker.py", tiny_lm, tmp_path / weights, "eager", weights, timeout=180,
                               check=False)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        runs[weights] = [torch.load(tmp_path / f"{weights}.{rank}.pt") for rank in (0, 1)]
    for auto, live in zip(runs["auto"], runs["live"]):
        assert (auto["weights"], live["weights"]) == ("gathered", "live")
        assert auto["responses"] == live["responses"] and auto["metrics"] == live["metrics"]
        for key, expected in live["tensors"].items():
            assert torch.equal(auto["tensors"][key], expected), key


@pytest.mark.slow
def test_two_ranks_give_each_part_its_rows_columns_and_gather_the_parts(tiny_lm, tmp_path):
    """A weighted reward (the reward model + 0.5 x a function of a ``row`` column) over two ranks:
    each rank's function call gets its own rows' column values, and the gathered parts and scores
    are the one-process ones."""
    from fourfold.dist import SINGLE

    proc = torchrun_script(HERE / "collect_worker.py", tiny_lm, tmp_path / "two", "weighted", "", timeout=180,
                           check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    one = _worker().run(str(tiny_lm), SINGLE, "weighted")
    assert one["tensors"]["part/row_reward"].tolist() == [float(i) for i in range(8)]
    for rank in (0, 1):
        two = torch.load(tmp_path / f"two.{rank}.pt")
        assert torch.equal(two["tensors"]["part/row_reward"], one["tensors"]["part/row_reward"])
        for key in ("part/rm", "scores"):
            torch.testing.assert_close(two["tensors"][key], one["tensors"][key], rtol=1e-5, atol=1e-6, msg=key)
        assert two["metrics"]["reward/row_reward_mean"] == one["metrics"]["reward/row_reward_mean"] == 3.5
