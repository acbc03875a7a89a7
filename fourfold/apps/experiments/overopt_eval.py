"""The overoptimization family's subprocess work (``python -m fourfold.apps.experiments bon-curve
SPEC.json | ppo-curve SPEC.json``): best-of-n curves of every reward model from one set of SFT
samples, and the held-out evaluation of a PPO run's checkpoints.
"""

from __future__ import annotations

import json
import math
import re
import time
from pathlib import Path
from typing import Any, Mapping

from fourfold.atomic import write_text_atomic
from fourfold.errors import FourfoldError


def _setup(spec: Mapping[str, Any]):
    import torch

    from fourfold.run.common import quiet_transformers
    from fourfold.tasks import get_task

    quiet_transformers()
    torch.set_num_threads(int(spec.get("threads") or 1))
    return get_task("review", **spec["task_options"])


def bon_curve_spec(spec: Mapping[str, Any]) -> dict:
    """Sample ``N`` responses to each prompt from the SFT model (torch seeded with ``sample_seed``),
    score them with every reward model of ``rms`` ({size: directory}) and gold, and write for each
    size the best-of-n curve n = 1..N (d = sqrt(log n - (n-1)/n), the unbiased estimator's expected
    gold and proxy, averaged over prompts). spec: sft, rms, task_options, prompts, N, sample_seed,
    max_new_tokens, temperature, out, key, threads."""
    import torch

    from fourfold.apps.evaluation import sample_texts
    from fourfold.core.overoptimization import bon_kl, expected_best_of_n
    from fourfold.models.build import load_saved

    task = _setup(spec)
    t0 = time.perf_counter()
    N, prompts = int(spec["N"]), list(spec["prompts"])
    roles = load_saved(spec["sft"], policy=spec["sft"])
    torch.manual_seed(spec["sample_seed"])
    flat = [p for p in prompts for _ in range(N)]
    texts, batches = sample_texts(roles.policy, roles.tokenizer, flat, max_new_tokens=spec["max_new_tokens"],
                                  temperature=spec["temperature"])
    gold = torch.tensor(task.gold_reward(flat, texts), dtype=torch.float64).view(len(prompts), N)  # (P, N)
    d = [math.sqrt(bon_kl(n)) for n in range(1, N + 1)]
    curves = {}
    for size, rm_dir in spec["rms"].items():
        rm = load_saved(spec["sft"], reward=rm_dir).reward_model.eval()
        with torch.no_grad():
            proxy = torch.cat([rm.score(s.sequences, s.attention_mask).double() for s in batches]).view(len(prompts), N)
        by_prompt = expected_best_of_n(proxy, gold)  # (P, N): what curve_fits.peak_test reads
        curves[str(size)] = {"n": list(range(1, N + 1)), "d": d, "gold": by_prompt.mean(0).tolist(),
                             "gold_by_prompt": [[round(x, 6) for x in row] for row in by_prompt.tolist()],
                             "proxy": expected_best_of_n(proxy, proxy).mean(0).tolist()}
    result = {"key": spec["key"], "curves": curves, "gold_std": float(gold.std()), "samples": len(flat),
              "seconds": round(time.perf_counter() - t0, 1)}
    write_text_atomic(Path(spec["out"]), json.dumps(result, sort_keys=True))
    return result


def run_checkpoints(run_dir: Path) -> list[list]:
    """[[iteration, directory]] of a run's complete checkpoints (``step-XXXXXXXX``), in order."""
    from fourfold.checkpoint import checkpoint_dirs

    out = []
    for d in checkpoint_dirs(run_dir):
        m = re.search(r"(\d+)$", Path(d).name)
        if m:
            out.append([int(m.group(1)), str(d)])
    return sorted(out)


def ppo_curve_spec(spec: Mapping[str, Any]) -> dict:
    """Evaluate the checkpoints of the PPO run in ``run_dir`` (with ``init``: all of them, and the SFT
    model as iteration 0; without: the last) on the held-out prompts: proxy (its RM), gold and KL to
    the SFT model, the same sampling seed at every point; with ``prune``, then delete all but the last
    checkpoint. spec: sft, rm, run_dir, init, prune, task_options,
    prompts, sample_seed, max_new_tokens, temperature, out, key, threads."""
    import torch

    from fourfold.apps.evaluation import evaluate_policy
    from fourfold.checkpoint import load_checkpoint
    from fourfold.config import GenerationConfig
    from fourfold.models.build import load_saved

    task = _setup(spec)
    t0 = time.perf_counter()
    roles = load_saved(spec["sft"], policy=spec["sft"], reference=spec["sft"], reward=spec["rm"])
    roles.reward_model.eval()
    gen = GenerationConfig(max_new_tokens=spec["max_new_tokens"], temperature=spec["temperature"])
    prompts = list(spec["prompts"])
    checkpoints = run_checkpoints(Path(spec["run_dir"]))
    if not checkpoints:
        raise FourfoldError(f"{spec['run_dir']}: the run has no complete checkpoint to evaluate")
    points = [[0, None]] + checkpoints if spec.get("init", True) else checkpoints[-1:]
    out = []
    for it, path in points:
        if path is not None:
            load_checkpoint(path, modules={"policy": roles.policy}, restore_rng=False)
        torch.manual_seed(spec["sample_seed"])
        summary, rows = evaluate_policy(roles.policy, roles.reference, roles.reward_model, roles.tokenizer, task,
                                        prompts, gen)
        out.append({"iteration": int(it), "d": math.sqrt(max(summary["kl"], 0.0)), **summary,
                    "gold_by_prompt": [r["gold"] for r in rows]})  # per prompt: curve_fits.peak_test
    return write_curve(spec, out, checkpoints, t0)


def write_curve(spec: Mapping[str, Any], points: list[dict], checkpoints: list[list], t0: float) -> dict:
    """A curve job's result ({key, points, seconds}) written to ``spec['out']``; with ``spec['prune']``
    the run's checkpoints but the last deleted (it is evaluated; its finished policy/ stays), PRUNED said."""
    result = {"key": spec["key"], "points": points, "seconds": round(time.perf_counter() - t0, 1)}
    write_text_atomic(Path(spec["out"]), json.dumps(result, sort_keys=True))
    if spec.get("prune"):
        import shutil

        write_text_atomic(Path(spec["run_dir"]) / "PRUNED", "checkpoints before the last deleted after evaluation\n")
        for _, path in checkpoints[:-1]:
            shutil.rmtree(path, ignore_errors=True)
    return result
