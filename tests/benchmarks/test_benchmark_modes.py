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


def test_estimate_vs_measured_with_lora(monkeypatch):
    import estimate_vs_measured

    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "262144")  # recorded (glibc reads it only at process start)
    out = estimate_vs_measured.main([*TINY, "--lora", "4", "--critic-mode", "adapter"])
    assert out["allocator_env"]["MALLOC_MMAP_THRESHOLD_"] == "262144"
    assert out["workload"]["lora"] == 4 and out["workload"]["critic_mode"] == "adapter"
    assert out["predicted"]["peak_mib"] > 0 and "peak_mib" in out["measured"]


def test_frozen_dtype_puts_the_frozen_roles_and_the_lora_base_in_bf16():
    import ppo_iteration
    import torch

    def estimate_mib(extra):
        out = ppo_iteration.main([*TINY, "--warmup", "0", *extra])
        assert out["workload"]["frozen_dtype"] == (extra[-1] if "--frozen-dtype" in extra else None)
        return out["estimate_peak_mib"]

    assert estimate_mib(["--lora", "4", "--frozen-dtype", "bfloat16"]) < estimate_mib(["--lora", "4"])
    args = ppo_iteration.argparse.Namespace(vocab=64, hidden=32, layers=1, heads=2, intermediate=None, prompt_len=4,
                                            response_len=4, precision="fp32", lora=4, critic_mode="adapter",
                                            reward_mode="separate", grad_ckpt=False, frozen_dtype="bfloat16")
    _, roles = ppo_iteration.build_roles(args, torch.device("cpu"))
    base = roles.reference.base.lm
    assert {p.dtype for p in base.parameters() if not p.requires_grad} == {torch.bfloat16}
    assert {p.dtype for p in roles.reward_model.parameters()} == {torch.bfloat16}
    assert all(p.dtype == torch.float32 for p in roles.policy.parameters())  # the adapter trains in fp32


def test_the_allocator_lever_is_recorded_and_checked(monkeypatch):
    import argparse

    import ppo_iteration

    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)
    assert ppo_iteration.allocator_env(argparse.Namespace(malloc_mmap_threshold_kib=256)) == {
        "run.malloc_mmap_threshold_kib": 256}
    with pytest.raises(ValueError, match="got 0"):  # checked before anything runs (applied in a subprocess only)
        ppo_iteration.apply_allocator(argparse.Namespace(malloc_mmap_threshold_kib=0))


def test_decode_benchmark_compares_the_engines(capsys):
    """benchmarks/decode.py: the engines side by side (tiny sizes; the compiled step is left to the
    slow test of the engine), each with its figures and its tokens compared with the eager engine's;
    one JSON line."""
    import decode

    out = decode.main(["--hidden", "32", "--layers", "1", "--heads", "2", "--vocab", "64", "--batch", "4",
                       "--prompt-len", "4", "--response-len", "6", "--repeats", "2", "--threads", "1",
                       "--engines", "eager,static"])
    assert capsys.readouterr().out.count("\n") == 1
    assert set(out["engines"]) == {"eager", "static"}
    for figures in out["engines"].values():
        for key in ("first_call_s", "s_per_rollout", "cpu_s_per_rollout", "tokens_per_s", "decode_tokens_per_s",
                    "peak_mem_mib", "speedup_vs_eager"):
            assert figures[key] > 0, key
        assert figures["same_tokens_as_eager"] and figures["max_logprob_diff"] < 1e-5
    assert out["workload"]["batch"] == 4 and out["workload"]["static_weights"] == "copy"


def test_ppo_iteration_with_the_static_engine(capsys):
    import ppo_iteration

    out = ppo_iteration.main([*TINY, "--warmup", "0", "--engine", "static", "--weights", "copy"])
    assert capsys.readouterr().out.count("\n") == 1
    w = out["workload"]
    assert (w["engine"], w["weights"], w["compile"]) == ("static", "copy", False)
    assert out["s_generate_first"] > 0 and out["s_sync"] > 0
    with pytest.raises(SystemExit):
        ppo_iteration.main([*TINY, "--compile"])  # compiles the static engine's step only

