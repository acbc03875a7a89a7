"""benchmarks/ppo_iteration.py and estimate_vs_measured.py in LoRA mode (tiny sizes, in this
process): the roles over one shared base, the critic and the reward model as adapters, gradient
checkpointing; each returns (and prints) its JSON object with the estimate beside the measurement."""
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
TINY = ["--hidden", "32", "--layers", "1", "--heads", "2", "--vocab", "64", "--batch", "4", "--prompt-len", "4",
        "--response-len", "4", "--minibatch", "2", "--threads", "1", "--iterations", "1"]


@pytest.fixture(autouse=True)
def _benchmarks_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))


def test_ppo_iteration_with_lora_on_one_shared_base(capsys):
    import ppo_iteration

    out = ppo_iteration.main([*TINY, "--warmup", "0", "--lora", "4", "--critic-mode", "adapter", "--reward-mode", "adapter",
                              "--grad-ckpt"])
    assert capsys.readouterr().out.count("\n") == 1
    w = out["workload"]
    assert (w["lora"], w["critic_mode"], w["reward_mode"], w["grad_ckpt"]) == (4, "adapter", "adapter", True)
    assert 0 < w["trainable_policy_params_m"] < w["params_per_model_m"]
    assert out["s_per_iter"] > 0 and out["cpu_s_per_iter"] > 0 and out["estimate_peak_mib"] > 0
    with pytest.raises(SystemExit):
        ppo_iteration.main([*TINY, "--lora", "4", "--concurrent"])  # one base: roles run one at a time


def test_estimate_vs_measured_with_lora():
    import estimate_vs_measured

    out = estimate_vs_measured.main([*TINY, "--lora", "4", "--critic-mode", "adapter"])
    assert out["workload"]["lora"] == 4 and out["workload"]["critic_mode"] == "adapter"
    assert out["predicted"]["peak_mib"] > 0 and "peak_mib" in out["measured"]
