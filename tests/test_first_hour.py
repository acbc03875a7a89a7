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
