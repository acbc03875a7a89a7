"""What a new user meets in the first hour (issue 29): no deprecation noise from the package's own
metadata or from every LoRA run."""
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
