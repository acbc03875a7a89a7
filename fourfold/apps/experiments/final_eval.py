"""The work the sweep's subprocesses do (``python -m fourfold.apps.experiments evaluate SPEC.json |
prepare-demo DEMO.yaml``): the final evaluation of one saved policy on the held-out prompts, and the
unbiased-labeler demo's stages.
"""

from __future__ import annotations

import dataclasses
import json
import random
import time
from pathlib import Path
from typing import Any, Mapping

from fourfold.apps.experiments.config import ExperimentsConfig
from fourfold.apps.report_kit import std
from fourfold.apps.seeds import stream_seed
from fourfold.atomic import write_text_atomic
from fourfold.config import DemoConfig, GenerationConfig


def eval_prompts(cfg: ExperimentsConfig) -> list[str]:
    """The held-out prompts every policy is evaluated on (the demo's eval prompts)."""
    from fourfold.tasks import get_task

    task = get_task("review", **cfg.demo.task_options)
    return task.sample_prompts(cfg.eval_prompts, random.Random(stream_seed(cfg.demo.run.seed, "eval_prompts")))


def eval_sample_seed(cfg: ExperimentsConfig) -> int:
    """The torch seed set before the responses are sampled (as the demo's eval stage does)."""
    return stream_seed(cfg.demo.run.seed, "eval_sampling")


def evaluate_spec(spec: Mapping[str, Any]) -> dict:
    """Evaluate one saved policy as the spec says; writes and returns {key, summary, rows}.

    spec: policy, reference, reward (directories), task_options, prompts, sample_seed,
    max_new_tokens, temperature, out (JSON path), key, threads.
    """
    import torch

    from fourfold.apps.evaluation import evaluate_policy, load_eval_roles
    from fourfold.run.common import quiet_transformers
    from fourfold.tasks import get_task

    quiet_transformers()
    torch.set_num_threads(int(spec.get("threads") or 1))
    task = get_task("review", **spec["task_options"])
    roles = load_eval_roles(spec["reference"], spec["reward"], policy=spec["policy"])
    policy, ref, rm, tok = roles.policy, roles.reference, roles.reward_model, roles.tokenizer
    gen = GenerationConfig(max_new_tokens=spec["max_new_tokens"], temperature=spec["temperature"])
    prompts = list(spec["prompts"])
    torch.manual_seed(spec["sample_seed"])
    t0 = time.perf_counter()
    summary, rows = evaluate_policy(policy, ref, rm, tok, task, prompts, gen)
    lengths = [len(r["response"].split()) for r in rows]
    summary.update({"n": len(rows), "length_std": std(lengths), "kl_std": std([r["kl"] for r in rows]),
                    "eval_s": round(time.perf_counter() - t0, 2)})
    result = {"key": spec["key"], "summary": summary, "rows": rows}
    write_text_atomic(Path(spec["out"]), json.dumps(result, sort_keys=True))
    return result


def prepare_demo(path: Path) -> dict:
    """Run the demo config in ``path`` up to its reward model (quietly); returns demo.run's result."""
    from fourfold.apps.demo import pipeline as demo
    from fourfold.config import load_config

    cfg = load_config(DemoConfig, path)
    return demo.run(dataclasses.replace(cfg, run=dataclasses.replace(cfg.run, progress=False)), stop_after="reward")
