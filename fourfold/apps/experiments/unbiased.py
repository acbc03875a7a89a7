"""The unbiased-labeler demo behind ``ppo-unbiased-rm``: the same SFT model, a different RM.

Its stages are the demo's, run with ``unbiased_task_options`` over the demo's task options in
their own directory; the SFT stage is copied from the demo (:func:`seed_sft_stage`) when its key
allows, so the arm starts from exactly the model the other arms start from.
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

from fourfold.apps.cache import read_done, stage_dir, write_done
from fourfold.apps.demo.pipeline import sft_stage_key
from fourfold.apps.experiments.config import ExperimentsConfig
from fourfold.config import DemoConfig


def unbiased_demo_config(cfg: ExperimentsConfig) -> DemoConfig:
    """The demo config of the unbiased labelers (its own output directory)."""
    out = cfg.unbiased_demo_dir or cfg.demo.run.output_dir.rstrip("/") + "-unbiased"
    return dataclasses.replace(cfg.demo, task_options={**cfg.demo.task_options, **cfg.unbiased_task_options},
                               run=dataclasses.replace(cfg.demo.run, output_dir=out))


def seed_sft_stage(src: DemoConfig, dst: DemoConfig) -> bool:
    """Give ``dst``'s demo directory ``src``'s finished SFT stage when both key it alike.

    The SFT stage's key holds only the options that change the corpus (demo.sft_stage_settings), so
    labeler options leave it alone: the SFT model is the same, and copying it saves the SFT stage
    and makes ppo-unbiased-rm start from exactly the model the other arms start from. Returns True
    when the stage was seeded (or already was).
    """
    d_key = sft_stage_key(dst)
    if dst.fresh or d_key != sft_stage_key(src):
        return False
    s_dir, d_dir = Path(src.run.output_dir), Path(dst.run.output_dir)
    s_done = read_done(s_dir, "sft")
    if not s_done or s_done.get("key") != d_key:
        return False  # the source is not finished, or demo.py keys its stage differently now
    d_done = read_done(d_dir, "sft")
    if d_done and d_done.get("key") == d_key:
        return True
    for name in ("sft", "tokenizer"):
        if (d_dir / name).exists():
            shutil.rmtree(d_dir / name)
        shutil.copytree(s_dir / name, d_dir / name)
    for name in ("sft_train.jsonl", "sft_eval.jsonl"):
        (d_dir / "data").mkdir(parents=True, exist_ok=True)
        shutil.copy2(s_dir / "data" / name, d_dir / "data" / name)
    if stage_dir(d_dir, "sft").exists():
        shutil.rmtree(stage_dir(d_dir, "sft"))
    write_done(d_dir, "sft", d_key, {**s_done.get("result", {}), "seeded_from": str(s_dir)})
    return True
