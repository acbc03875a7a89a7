"""`fourfold bon`: best-of-n sampling, the method that removes training altogether.

:func:`best_of_n` samples ``bon.n`` responses per prompt from a policy exactly as `fourfold generate`
samples (:func:`fourfold.apps.inference.sample_completions`: the same prompts, tokenisation, engine
and seeded generator, each prompt repeated n times in a row), scores every candidate exactly as
`fourfold score` does (a reward model: PPO's layout, the score at the last token, the
normalisation shift; or a reward function on the texts), and keeps the best of each prompt's n
(:func:`pick_best`: the first sampled on ties). ``run.output_dir/bon.jsonl`` (loadable with
``datasets.load_dataset("json", ...)``) has one row per prompt: ``prompt``, the chosen ``response``,
its ``score``, ``finished``, ``response_tokens``, ``chosen`` (its index among the candidates) and
``candidates`` (each ``response``, ``score``, ``finished``, ``response_tokens``). With ``bon.task``
(an embedded task with a gold reward, e.g. the demo's ``review``) every candidate and the chosen
response also get ``gold``, and the summary holds the chosen responses' gold, length, well-formed
share and repetition, beside plain sampling's gold (the mean over all candidates).

The summary line prints the analytic KL of the choice to the policy, ``log n - (n - 1) / n`` nats
(:func:`fourfold.core.overoptimization.bon_kl`). With n = 1 the response is the plain sample: the
same completions as `fourfold generate` with the same seed and settings. Docs: docs/bon.md.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Sequence

import torch

from fourfold.apps.inference import load_generator, load_reward_scorer, sample_completions
from fourfold.atomic import write_text_atomic
from fourfold.config import ScoreConfig, save_config, validate_tree
from fourfold.config.bon import BonConfig
from fourfold.core.overoptimization import bon_kl
from fourfold.data import collate_responses, encode_responses
from fourfold.data.formats import ResponseRecord
from fourfold.errors import ConfigError, DataError
from fourfold.models import load_reward_fn
from fourfold.models.roles import FunctionReward
from fourfold.run.scaffold import one_process_start

__all__ = ["best_of_n", "pick_best", "score_candidates"]


def pick_best(scores: Sequence[float]) -> int:
    """The index of the highest score, the first one on ties (a nan never wins)."""
    if not scores:
        raise ValueError("pick_best: no candidates")
    best = 0
    for i, s in enumerate(scores):
        if s > scores[best] or (math.isnan(scores[best]) and not math.isnan(s)):
            best = i
    return best


@torch.no_grad()
def score_candidates(cfg: BonConfig, rows: list[dict], device: torch.device) -> list[float]:
    """Each row's score by ``cfg.scorer`` (a reward model as `fourfold score` scores, or the
    reward function), in batches of ``bon.score_batch_size``."""
    size = cfg.bon.score_batch_size
    if cfg.scorer.reward is None:
        reward = FunctionReward(load_reward_fn(cfg.scorer.reward_fn))
        scores: list[float] = []
        for start in range(0, len(rows), size):
            batch = rows[start : start + size]
            placeholder = torch.zeros((len(batch), 0), dtype=torch.long)  # the role reads only its device
            scores += reward(placeholder, None, [r["prompt"] for r in batch], [r["response"] for r in batch]).tolist()
        return scores
    tok, reward = load_reward_scorer(ScoreConfig(model=cfg.scorer), device)
    n_positions = getattr(reward.model.hf.config, "max_position_embeddings", None)
    records = [ResponseRecord(r["prompt"], r["response"], r["finished"], line=i + 1, source="bon candidates")
               for i, r in enumerate(rows)]
    examples = encode_responses(records, tok, n_positions if isinstance(n_positions, int) else 512)
    scores = []
    for start in range(0, len(examples), size):
        ids, mask = collate_responses(examples[start : start + size], tok.pad_token_id)  # (B, P+T) as PPO's rollout
        scores += reward(ids.to(device), mask.to(device)).float().cpu().tolist()
    return scores


def _gold_task(cfg: BonConfig):
    """The embedded task of ``bon.task`` (None without one), built before anything is sampled."""
    if cfg.bon.task is None:
        return None
    from fourfold.tasks import get_task

    task = get_task(cfg.bon.task, options_key="bon.task_options", **cfg.bon.task_options)
    if not hasattr(task, "gold_reward"):
        raise ConfigError(f"bon.task: task {cfg.bon.task!r} has no gold reward")
    return task


def best_of_n(cfg: BonConfig) -> dict:
    """Write ``bon.jsonl`` (see the module docstring); returns ``{"output", "prompts", "n", "kl",
    "score", "score_plain", "skipped"}`` plus, with ``bon.task``, ``gold``, ``gold_plain`` and the
    task's response metrics of the chosen responses."""
    validate_tree(cfg)  # the Python API refuses what the CLI refuses
    device = one_process_start(cfg)
    out = Path(cfg.run.output_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
        save_config(cfg, out / "config.yaml")
    except OSError as e:
        raise ConfigError(f"run.output_dir: {out}: cannot write there ({e.strerror or e})") from None
    n, task = cfg.bon.n, _gold_task(cfg)
    tok, model = load_generator(cfg, device)
    loaded, flat = sample_completions(cfg, tok, model, device, repeat=n)
    del model
    for r, s in zip(flat, score_candidates(cfg, flat, device), strict=True):
        r["score"] = float(s)
    if task is not None:
        for r, g in zip(flat, task.gold_reward([r["prompt"] for r in flat], [r["response"] for r in flat])):
            r["gold"] = float(g)
    rows = []
    for start in range(0, len(flat), n):
        cands = flat[start : start + n]
        best = pick_best([c["score"] for c in cands])
        keep = [{k: v for k, v in c.items() if k != "prompt"} for c in cands]
        rows.append({"prompt": cands[0]["prompt"], **keep[best], "chosen": best, "candidates": keep})
    if not rows:
        raise DataError(f"{loaded.source}: no usable prompts")
    path = out / "bon.jsonl"
    try:
        write_text_atomic(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    except OSError as e:
        raise ConfigError(f"run.output_dir: {path}: cannot write ({e.strerror or e})") from None
    for line in loaded.skipped:
        print(f"fourfold bon: warning: skipped {line}", flush=True)
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    result = {"output": str(path), "prompts": len(rows), "n": n, "kl": bon_kl(n), "skipped": loaded.num_skipped,
              "score": mean([r["score"] for r in rows]), "score_plain": mean([r["score"] for r in flat])}
    line = (f"fourfold bon: {len(rows)} prompts, best of n={n} (KL = log n - (n-1)/n = {result['kl']:.4f} nats); "
            f"mean score {result['score']:.4g} (plain sampling {result['score_plain']:.4g})")
    if task is not None:
        result.update(gold=mean([r["gold"] for r in rows]), gold_plain=mean([r["gold"] for r in flat]))
        metrics = getattr(task, "response_metrics", None)
        if metrics is not None:
            result.update(metrics([r["prompt"] for r in rows], [r["response"] for r in rows]))
        line += f"; gold {result['gold']:.4g} (plain sampling {result['gold_plain']:.4g})"
    print(f"{line} -> {path}", flush=True)
    return result

