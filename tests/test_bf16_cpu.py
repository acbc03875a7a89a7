"""bf16 on a CPU without native bf16 is a trap (issue 40, item 17): the detection as a pure function
of torch's CPU kernels and the CPU's flags, the warning line of a run's start and of `fourfold
estimate`, and nothing said where bf16 is native, not asked, or not on the CPU."""
import torch

from fourfold import cli
from fourfold.config import PPOConfig, load_config
from fourfold.run.common import bf16_cpu_warning, cpu_flags, cpu_has_bf16


def test_native_bf16_is_the_kernels_and_the_flags():
    assert not cpu_has_bf16("AVX2", {"avx2", "avx512_bf16"})  # AVX2 kernels have no bf16 path (or are capped)
    assert not cpu_has_bf16("DEFAULT", {"sse4_2"})  # an old x86 without AVX2
    assert not cpu_has_bf16("AVX512", {"avx512f", "avx512bw"})  # Skylake-like: AVX-512, no BF16
    assert cpu_has_bf16("AVX512", {"avx512f", "avx512_bf16"})  # Zen 4/5, Cooper Lake
    assert cpu_has_bf16("AVX512", {"amx_bf16", "avx512f"})  # Sapphire Rapids
    assert cpu_has_bf16("DEFAULT", {"bf16", "asimd"}) and not cpu_has_bf16("DEFAULT", {"asimd"})  # Arm
    assert cpu_has_bf16("AVX512", None)  # nothing known: no warning rather than a wrong one


def test_cpu_flags_reads_x86_and_arm_cpuinfo(tmp_path):
    (tmp_path / "x86").write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512_bf16\n\nprocessor\t: 1\nflags\t: fpu\n")
    (tmp_path / "arm").write_text("processor\t: 0\nFeatures\t: fp asimd bf16\n")
    assert cpu_flags(str(tmp_path / "x86")) == {"fpu", "avx2", "avx512_bf16"}
    assert cpu_flags(str(tmp_path / "arm")) == {"fp", "asimd", "bf16"}
    assert cpu_flags(str(tmp_path / "none")) is None


def _cfg(tiny_lm, *extra):
    return load_config(PPOConfig, None, [f"model.policy={tiny_lm / 'sft'}", f"model.reward={tiny_lm / 'rm'}",
                                         f"data.prompts={tiny_lm / 'prompts.jsonl'}", *extra])


def test_the_warning_names_what_asked_bf16_and_the_fp32_way_out(tiny_lm):
    cpu, avx2 = torch.device("cpu"), dict(capability="AVX2", flags={"avx2"})
    line = bf16_cpu_warning(_cfg(tiny_lm, "model.precision=bf16-mixed"), cpu, **avx2)
    assert line.startswith("model.precision=bf16-mixed on a CPU without native bf16 (torch CPU kernels AVX2")
    assert "model.precision=fp32" in line and "\n" not in line
    assert "model.frozen_dtype=bfloat16" in bf16_cpu_warning(_cfg(tiny_lm, "model.frozen_dtype=bfloat16"), cpu, **avx2)
    assert bf16_cpu_warning(_cfg(tiny_lm), cpu, **avx2) is None  # fp32: nothing to say
    assert bf16_cpu_warning(_cfg(tiny_lm, "model.precision=bf16-mixed"), torch.device("meta"), **avx2) is None
    assert bf16_cpu_warning(_cfg(tiny_lm, "model.precision=bf16-mixed"), cpu, capability="AVX512",
                            flags={"avx512_bf16"}) is None


def test_a_run_and_the_estimate_say_it_once(tiny_lm, tmp_path, monkeypatch, capsys):
    from fourfold.run import common

    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    monkeypatch.setattr(common, "cpu_flags", lambda *a: {"avx2"})
    args = [f"model.policy={tiny_lm / 'sft'}", f"model.reward={tiny_lm / 'rm'}", f"data.prompts={tiny_lm / 'prompts.jsonl'}",
            "model.precision=bf16-mixed", "ppo.iterations=1", "ppo.rollout_batch_size=4", "ppo.minibatch_size=4",
            "generation.max_new_tokens=3", "run.device=cpu", "run.progress=false", "run.threads=1"]
    assert cli.main(["ppo", *args, "--output-dir", str(tmp_path / "run")]) == 0
    out = capsys.readouterr().out
    assert out.count("fourfold ppo: warning: model.precision=bf16-mixed on a CPU without native bf16") == 1, out
    assert cli.main(["estimate", *args]) == 0
    out = capsys.readouterr().out
    assert out.count("fourfold estimate: warning: model.precision=bf16-mixed on a CPU without native bf16") == 1, out
    monkeypatch.setattr(common, "cpu_flags", lambda *a: {"avx512_bf16"})
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX512")
    assert cli.main(["estimate", *args]) == 0
    assert "warning" not in capsys.readouterr().out  # native bf16: nothing
