"""What a new user meets in the first hour (issue 29): no deprecation noise from the package's own
metadata or from every LoRA run."""
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

from fourfold.models.factory import llama_config, random_causal_lm
from fourfold.models.lora import LoraSettings, SharedBase
from fourfold.run.common import quiet_transformers

ROOT = Path(__file__).resolve().parents[1]


def test_package_metadata_builds_without_a_deprecation_warning(tmp_path):
    """pyproject.toml's `license` is an SPDX string: setuptools builds the metadata (what `pip
    install -e .` does first) without its `project.license` table deprecation."""
    code = ("import sys; from setuptools import build_meta; "
            "print(build_meta.prepare_metadata_for_build_editable(sys.argv[1]))")
    proc = subprocess.run([sys.executable, "-W", "default", "-c", code, str(tmp_path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "Deprecat" not in proc.stderr + proc.stdout, proc.stderr
    metadata = (tmp_path / proc.stdout.strip().splitlines()[-1] / "METADATA").read_text()
    assert "License-Expression: Apache-2.0" in metadata


def test_a_lora_model_is_built_without_the_gradient_checkpointing_future_warning():
    """peft reads `is_gradient_checkpointing`, which transformers 5 deprecates: quiet_transformers
    filters that one message, and only that one."""
    lm = random_causal_lm(llama_config(40, hidden=16, layers=1, heads=2, max_positions=16), seed=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        quiet_transformers()
        SharedBase(lm, LoraSettings(r=2, alpha=4.0))
        warnings.warn("another FutureWarning", FutureWarning, stacklevel=1)
    messages = [str(w.message) for w in caught]
    assert not [m for m in messages if "is_gradient_checkpointing" in m], messages
    assert "another FutureWarning" in messages


def _reward_run(tmp_path, *extra) -> subprocess.CompletedProcess:
    """`fourfold reward > out 2> err` on a tiny model from scratch, one pair tied (a warning)."""
    from fourfold.tasks.tokenizer import build_word_tokenizer

    tok = tmp_path / "tok"
    if not tok.is_dir():
        build_word_tokenizer([f"w{i}" for i in range(12)], tok)
    data = tmp_path / "pairs.jsonl"
    rows = [{"prompt": "w1", "chosen": "w2 w3", "rejected": "w4"}, {"prompt": "w1", "chosen": "w2", "rejected": "w2"}] * 2
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    argv = ["reward", "model.from_scratch=true", f"model.tokenizer={tok}", "model.hidden_size=8", "model.num_layers=1",
            "model.num_heads=2", "model.max_positions=16", f"data.train={data}", "data.eval_fraction=0",
            "train.max_len=16", "train.batch_size=1", "train.max_steps=2", "train.log_every=1",
            "run.tensorboard=false", "run.device=cpu", "run.threads=1", *extra]
    env = dict(os.environ, PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1")
    return subprocess.run([sys.executable, "-m", "fourfold.cli", *argv], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)


def test_everything_a_run_says_goes_to_stdout_and_only_errors_to_stderr(tmp_path):
    """The README's convention (`fourfold ... > log 2> err`): the step lines, the warnings (with the
    stage's name, progress bar or not) and the summary line in `log`; nothing in `err` (where an
    error's one line goes: tests/trainers/test_ppo.py)."""
    tie = ("fourfold reward: warning: 2 tied preference pairs left out ('chosen' and 'rejected' the same: no "
           "preference to learn)")
    run = _reward_run(tmp_path, f"run.output_dir={tmp_path / 'a'}")  # stdout is a pipe: one plain line per row
    assert run.returncode == 0 and run.stderr == "", run.stderr
    lines = run.stdout.splitlines()
    assert [line.split(": ")[0] for line in lines] == ["fourfold reward", "reward 1/2", "reward 2/2", "fourfold reward"]
    assert lines[0].startswith(tie) and lines[-1].startswith("fourfold reward: done in ")

    quiet = _reward_run(tmp_path, f"run.output_dir={tmp_path / 'b'}", "run.progress=false")
    assert quiet.returncode == 0 and quiet.stderr == "", quiet.stderr
    lines = quiet.stdout.splitlines()
    assert len(lines) == 2 and lines[0].startswith(tie) and lines[1].startswith("fourfold reward: done in ")


# ---- the CLI and the examples (issue 29.7) --------------------------------------------------------


def test_an_override_after_an_option_counts_as_one_before_it(tmp_path, monkeypatch):
    """`fourfold sft --config c.yaml train.lr=1e-4 --output-dir d train.max_steps=2`: both overrides
    reach the config, in order (a later one wins), and an unknown option is still refused."""
    import pytest

    from fourfold.cli import main
    from fourfold.tasks.tokenizer import build_word_tokenizer

    build_word_tokenizer([f"w{i}" for i in range(12)], tmp_path / "tok")
    (tmp_path / "train.jsonl").write_text(json.dumps({"prompt": "w1", "completion": "w2"}) + "\n")
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"model: {{from_scratch: true, tokenizer: {tmp_path / 'tok'}, hidden_size: 8, num_layers: 1, "
                   f"num_heads: 2, max_positions: 16}}\ndata: {{train: {tmp_path / 'train.jsonl'}}}\n"
                   "train: {max_len: 16}\n")
    seen = []
    monkeypatch.setattr("fourfold.trainers.sft.train", lambda c, **kw: seen.append(c))
    argv = ["sft", "--config", str(cfg), "train.lr=1e-4", "--output-dir", str(tmp_path / "d"), "train.max_steps=2",
            "--seed", "3", "train.max_steps=5"]
    assert main(argv) == 0
    (c,) = seen
    assert (c.train.lr, c.train.max_steps, c.run.output_dir, c.run.seed) == (1e-4, 5, str(tmp_path / "d"), 3)
    with pytest.raises(SystemExit) as e:
        main(["sft", "--config", str(cfg), "train.lr=1e-4", "--output-dri", "x"])
    assert e.value.code == 2 and len(seen) == 1


def test_version(capsys):
    import pytest

    import fourfold
    from fourfold.cli import main

    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out == f"fourfold {fourfold.__version__}\n"


def test_python_dash_m_fourfold_is_the_fourfold_command():
    """``python -m fourfold`` runs the same cli: --version prints it and exits 0; no stage prints the
    help and exits 2."""
    import fourfold

    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    out = subprocess.run([sys.executable, "-m", "fourfold", "--version"], capture_output=True, text=True, env=env)
    assert (out.returncode, out.stdout) == (0, f"fourfold {fourfold.__version__}\n"), out.stderr
    bare = subprocess.run([sys.executable, "-m", "fourfold"], capture_output=True, text=True, env=env)
    assert bare.returncode == 2 and bare.stdout.startswith("usage: fourfold"), bare.stderr


def test_a_reward_fn_over_the_examples_placeholder_reward_names_both_sources(tmp_path):
    """examples/grpo.yaml names a placeholder reward model: `model.reward_fn=...` on the command line
    is refused with a line that says which source set which key and how to keep one; with
    `model.reward=null` too it loads."""
    import pytest

    from fourfold.config import PPOConfig, load_config
    from fourfold.errors import ConfigError

    fn = tmp_path / "my_rewards.py"
    fn.write_text("def score(prompts, responses):\n    return [0.0] * len(prompts)\n")
    example = ROOT / "examples" / "grpo.yaml"
    with pytest.raises(ConfigError) as e:
        load_config(PPOConfig, example, [f"model.reward_fn={fn}:score"])
    assert str(e.value) == (f"{example} (model.reward) and the command line (model.reward_fn): model.reward: "
                            "model.reward (a reward-model directory) and model.reward_fn are both set; keep one "
                            "(model.reward=null to score with the reward_fn)")
    cfg = load_config(PPOConfig, example, ["model.reward=null", f"model.reward_fn={fn}:score"])
    assert cfg.model.reward is None and cfg.model.reward_fn == f"{fn}:score"
    assert "model.reward=null model.reward_fn=" in example.read_text()  # the example says how


def test_a_config_error_blames_the_source_that_set_the_key(tmp_path):
    """A key set on the command line is the command line's error, one from the file the file's."""
    import pytest

    from fourfold.config import PPOConfig, load_config
    from fourfold.errors import ConfigError

    example = ROOT / "examples" / "ppo.yaml"
    with pytest.raises(ConfigError, match=r"^command line: ppo\.kl_coeff: unknown key \(did you mean 'ppo\.kl_coef'\?\)"):
        load_config(PPOConfig, example, ["ppo.kl_coeff=1"])
    bad = tmp_path / "bad.yaml"
    bad.write_text("ppo: {kl_coeff: 1}\n")
    with pytest.raises(ConfigError, match=rf"^{bad}: ppo\.kl_coeff: unknown key"):
        load_config(PPOConfig, bad, ["ppo.kl_coef=0.1"])


# ---- bad input (issue 29.8) ----------------------------------------------------------------------


def test_a_typo_in_the_task_options_gets_a_did_you_mean():
    import pytest

    from fourfold.errors import ConfigError
    from fourfold.tasks import ReviewTask, get_task

    with pytest.raises(ConfigError) as e:
        get_task("review", options_key="data.task_options", labeler_lenght_bias=0)
    assert str(e.value).startswith("data.task_options.labeler_lenght_bias: unknown key (did you mean "
                                   "'data.task_options.labeler_length_bias'?); known keys here: ")
    with pytest.raises(ConfigError, match=r"^task_options\.labeler_noise: expected float, got 'abc'$"):
        get_task("review", labeler_noise="abc")
    task = get_task("review", labeler_length_bias=0, length_range=[5, 30])  # as the YAML gives them
    assert task.config == ReviewTask(labeler_length_bias=0.0, length_range=(5, 30)).config


def test_static_engine_settings_are_refused_alike_with_the_eager_engine():
    """The eager engine reads neither generation.compile nor generation.stop_check_every: off their
    defaults, both are refused with it; with engine: static both are taken."""
    import pytest

    from fourfold.config import GenerationConfig
    from fourfold.errors import ConfigError

    with pytest.raises(ConfigError, match=r"^generation\.compile: .*set generation\.engine=static"):
        GenerationConfig(compile=True).validate()
    with pytest.raises(ConfigError, match=r"^generation\.stop_check_every: the static engine's setting .*set "
                                          r"generation\.engine=static \(or leave stop_check_every at 8\)"):
        GenerationConfig(stop_check_every=3).validate()
    GenerationConfig().validate()
    GenerationConfig(engine="static", compile=True, stop_check_every=3).validate()


# ---- exports that load where users load them (issue 29.6) -----------------------------------------


def test_lora_adapters_load_through_the_peft_auto_classes_from_another_directory(tiny_lm, tmp_path, monkeypatch):
    """A LoRA SFT and a LoRA reward run given relative paths (as typed on a command line): their
    adapter directories record the base absolute, so AutoPeftModelForCausalLM and (with num_labels=1,
    docs/lora.md) AutoPeftModelForSequenceClassification load them from anywhere, equal to the
    merged exports."""
    import random
    import shutil

    import torch
    from peft import AutoPeftModelForCausalLM, AutoPeftModelForSequenceClassification
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    from fourfold.config import RewardConfig, SFTConfig, load_config
    from fourfold.trainers import reward, sft

    work, elsewhere = tmp_path / "work", tmp_path / "elsewhere"
    work.mkdir()
    elsewhere.mkdir()
    shutil.copytree(tiny_lm / "sft", work / "base")
    rng = random.Random(0)
    words = lambda n: " ".join(f"w{rng.randrange(60)}" for _ in range(n))  # noqa: E731
    (work / "sft.jsonl").write_text("".join(json.dumps({"prompt": words(3), "completion": words(4)}) + "\n"
                                            for _ in range(16)))
    (work / "prefs.jsonl").write_text("".join(json.dumps({"prompt": words(3), "chosen": words(4), "rejected": words(4)})
                                              + "\n" for _ in range(16)))
    common = ["model.lora.r=4", "model.lora.alpha=8", "train.max_steps=2", "train.batch_size=4", "train.lr=1e-2",
              "train.max_len=16", "run.progress=false", "run.tensorboard=false", "run.device=cpu"]
    monkeypatch.chdir(work)
    sft.train(load_config(SFTConfig, None, ["model.path=base", "data.train=sft.jsonl", "run.output_dir=sft", *common]))
    reward.train(load_config(RewardConfig, None, ["model.path=sft/model", "data.train=prefs.jsonl",
                                                  "data.eval_fraction=0", "run.output_dir=rm", *common]))
    for adapter, base in (("sft/model-adapter", "base"), ("rm/model-adapter", "sft/model")):
        recorded = json.loads((work / adapter / "adapter_config.json").read_text())["base_model_name_or_path"]
        assert recorded == str((work / base).resolve())

    monkeypatch.chdir(elsewhere)
    ids = torch.tensor([[5, 9, 11, 7, 20]])
    with torch.no_grad():
        policy = AutoPeftModelForCausalLM.from_pretrained(str(work / "sft" / "model-adapter"))
        merged = AutoModelForCausalLM.from_pretrained(str(work / "sft" / "model"))
        torch.testing.assert_close(policy(input_ids=ids).logits, merged(input_ids=ids).logits, atol=1e-5, rtol=1e-5)
        rm = AutoPeftModelForSequenceClassification.from_pretrained(str(work / "rm" / "model-adapter"), num_labels=1)
        merged_rm = AutoModelForSequenceClassification.from_pretrained(str(work / "rm" / "model"))
        torch.testing.assert_close(rm(input_ids=ids).logits, merged_rm(input_ids=ids).logits, atol=1e-5, rtol=1e-5)


# ---- interrupt and resume say the run's state (issue 29.5) ----------------------------------------


def _scaffold(out, **run):
    import dataclasses

    import torch

    from fourfold.config import RunConfig
    from fourfold.run.scaffold import RunScaffold

    @dataclasses.dataclass
    class Cfg:
        run: RunConfig

    scaffold = RunScaffold(Cfg(RunConfig(output_dir=str(out), progress=False, tensorboard=False, **run)))
    torch.manual_seed(0)
    model = torch.nn.Linear(2, 1)
    scaffold.track(modules={"m": model}, optimizers={"m": torch.optim.SGD(model.parameters(), lr=0.1)},
                   state=lambda step: {"step": step})
    return scaffold


def test_the_last_step_is_always_checkpointed_and_a_resume_says_where_it_starts(tmp_path, capsys):
    """A loop's last step is saved though save_every does not divide it (ppo.iterations=7
    run.save_every=5 kept only step 5), the summary names it, and a resume says its step."""
    run = _scaffold(tmp_path, save_every=5)
    with run.loop(total=7, desc="t", key_metrics=()) as logger:
        for step in range(1, 8):
            logger.log(step, {"x": step})
            run.checkpoint_if_due(step)  # as PPO and REINFORCE call it: no final=
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step-00000005", "step-00000007"]
    run.stage = "ppo"
    run.finish({})
    done = capsys.readouterr().out
    assert "last checkpoint step-00000007 (--resume with more steps extends the run from it)" in done, done

    again = _scaffold(tmp_path, resume=True)
    again.stage = "ppo"
    assert again.resume() == {"step": 7}
    assert capsys.readouterr().out == f"fourfold ppo: resumed from step 7 ({tmp_path / 'checkpoints' / 'step-00000007'})\n"


def test_a_stop_signal_during_a_checkpoint_is_acted_on_at_that_step(tmp_path):
    """SIGTERM arriving while the periodic checkpoint is written stops the run at that step (the
    flag is read after the save), with that checkpoint named, instead of one iteration later."""
    import os
    import signal

    import pytest

    from fourfold.run.scaffold import RunInterrupted

    run = _scaffold(tmp_path, save_every=2)
    save = run.save

    def slow_save(step):
        save(step)
        os.kill(os.getpid(), signal.SIGTERM)  # arrives while the checkpoint is being written

    run.save = slow_save
    with pytest.raises(RunInterrupted) as e:
        with run.loop(total=10, desc="t", key_metrics=()):
            for step in range(1, 11):
                run.checkpoint_if_due(step)
    assert e.value.step == 2 and e.value.checkpoint == tmp_path / "checkpoints" / "step-00000002"
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["step-00000002"]


def _ppo_args(tiny_lm, out, iterations, *extra):
    return [f"model.policy={tiny_lm / 'sft'}", f"model.reward_fn={tiny_lm / 'reward_fn.py'}:reward",
            "model.critic_init=policy", f"data.prompts={tiny_lm / 'prompts.jsonl'}", f"ppo.iterations={iterations}",
            "ppo.rollout_batch_size=8", "ppo.minibatch_size=4", "ppo.ppo_epochs=1", "generation.max_new_tokens=6",
            f"run.output_dir={out}", "run.progress=false", "run.tensorboard=false", "run.device=cpu",
            "run.save_every=2", "ppo.lr_schedule=constant", *extra]  # a linear decay depends on the planned length


def test_a_finished_ppo_run_extends_with_resume_as_if_it_had_run_longer(tiny_lm, tmp_path):
    """ppo.iterations=3 run.save_every=2 leaves step 3; `--resume ppo.iterations=5` continues from
    it (nothing redone) and ends with the metrics and weights of an uninterrupted 5-iteration run
    (at a constant learning rate: a linear decay is planned for the run's length)."""
    from safetensors.torch import load_file

    from fourfold.config import PPOConfig, load_config
    from fourfold.reporting import is_timing_key, read_metrics
    from fourfold.trainers import ppo

    ppo.train(load_config(PPOConfig, None, _ppo_args(tiny_lm, tmp_path / "long", 5)))
    ppo.train(load_config(PPOConfig, None, _ppo_args(tiny_lm, tmp_path / "short", 3)))
    assert sorted(p.name for p in (tmp_path / "short" / "checkpoints").iterdir()) == ["step-00000002", "step-00000003"]
    ppo.train(load_config(PPOConfig, None, _ppo_args(tiny_lm, tmp_path / "short", 5, "run.resume=true")))

    def rows(d):
        return [{k: v for k, v in r.items() if not is_timing_key(k)} for r in read_metrics(d / "metrics.jsonl")]

    assert [r["iteration"] for r in rows(tmp_path / "short")] == [1, 2, 3, 4, 5]
    assert rows(tmp_path / "short") == rows(tmp_path / "long")
    events = [json.loads(line) for line in (tmp_path / "short" / "events.jsonl").read_text().splitlines()]
    assert [e["step"] for e in events if e["kind"] == "resume"] == [3]
    a, b = (load_file(str(tmp_path / d / "policy" / "model.safetensors")) for d in ("long", "short"))
    assert a.keys() == b.keys() and all(a[k].equal(b[k]) for k in a)


def test_an_interrupted_run_names_its_checkpoint_and_the_resume_command(tmp_path, monkeypatch, capsys):
    from pathlib import Path

    from fourfold.checkpoint import CHECKPOINTS_DIR
    from fourfold.cli import main
    from fourfold.run.scaffold import RunInterrupted

    out = tmp_path / "run"
    kept = out / CHECKPOINTS_DIR / "step-00000004"

    def stopped(cfg, **kw):
        raise RunInterrupted(4, kept)

    monkeypatch.setattr("fourfold.trainers.sft.train", stopped)
    argv = ["sft", "model.path=m", "data.train=t.jsonl", "--output-dir", str(out)]
    assert main(argv) == 130
    said, err = capsys.readouterr()
    assert err == "" and said == (f"fourfold sft: interrupted after step 4; kept checkpoint {kept}; continue with: "
                                  f"fourfold sft model.path=m data.train=t.jsonl --output-dir {out} --resume\n")

    def early(cfg, **kw):  # Ctrl-C before the first checkpoint (while the model loads)
        Path(cfg.run.output_dir).mkdir(parents=True, exist_ok=True)
        raise KeyboardInterrupt

    monkeypatch.setattr("fourfold.trainers.sft.train", early)
    assert main(argv) == 130
    assert capsys.readouterr().out == ("fourfold sft: interrupted before its first checkpoint (nothing to resume); "
                                       f"start it again with: fourfold sft model.path=m data.train=t.jsonl "
                                       f"--output-dir {out} --overwrite\n")
