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
from typing import Optional, Sequence

import torch

from fourfold.apps.inference import (
    Progress,
    Scorer,
    load_generator,
    load_scorer,
    sample_completions,
    score_records,
    scorer_functions,
)
from fourfold.atomic import write_text_atomic
from fourfold.config import save_config, validate_tree
from fourfold.config.bon import BonConfig
from fourfold.core.overoptimization import bon_kl
from fourfold.data import prompt_columns
from fourfold.data.formats import ResponseRecord
from fourfold.errors import ConfigError, DataError
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


def score_candidates(cfg: BonConfig, rows: list[dict], scorer: Scorer, device: torch.device,
                     columns: tuple = ()) -> tuple[list[float], dict]:
    """Each candidate's score by the one reward role of ``cfg.scorer`` (:func:`fourfold.apps.inference.load_scorer`:
    a reward model as `fourfold score` scores, reward functions given the prompts file's ``columns``
    of the candidate's prompt row (``row["columns"]``), their weighted sum), in batches of
    ``bon.score_batch_size``; and a weighted scorer's parts (name -> one score per candidate; {} for one source)."""
    records = [ResponseRecord(r["prompt"], r["response"], r["finished"], line=i + 1, source="bon candidates",
                              row=r.get("columns", {})) for i, r in enumerate(rows)]
    done, scores, parts = score_records(records, scorer, device, columns, cfg.bon.score_batch_size,
                                        progress=Progress("fourfold bon: scored", "candidates"))
    if len(done) != len(records):  # a reward model refuses a candidate too long for it (on_error raise)
        raise DataError("bon candidates: some candidates could not be scored")
    return scores, parts


CANDIDATE_BYTES = 700
"""Memory of one sampled candidate held until it is scored (a dict of its text, flags and length,
and its place in the list), plus 8 bytes per response token of text: what :func:`check_candidates`
multiplies."""


def check_candidates(cfg: BonConfig, available: Optional[int] = None) -> None:
    """Before anything loads: the candidates (prompts x ``bon.n``) are held in memory until they are
    scored, so a count whose rows would not fit in ``available`` bytes (default: the memory free now)
    is a ConfigError naming ``bon.n``, with the GiB it would take and the largest n that fits."""
    from fourfold.data.io import read_source

    n_prompts = len(read_source(cfg.data.prompts, on_error="skip", skipped=[])[1])
    per = CANDIDATE_BYTES + 8 * cfg.generation.max_new_tokens
    need = n_prompts * cfg.bon.n * per
    if available is None:
        import psutil

        available = psutil.virtual_memory().available
    if need > 0.8 * available:
        fits = max(int(0.8 * available // (per * max(n_prompts, 1))), 0)
        raise ConfigError(f"bon.n: {cfg.bon.n} candidates for each of {n_prompts} prompts are {n_prompts * cfg.bon.n:.3g} "
                          f"responses, about {need / 2**30:.3g} GiB held until they are scored, and {available / 2**30:.3g} "
                          f"GiB are free: lower bon.n (at most {fits} fits here) or split data.prompts")


def _check_task_reads(cfg: BonConfig, task) -> None:
    """``bon.task``'s gold reads only its own world's prompts: none of data.prompts readable is a
    ConfigError (every candidate's gold would be the ill-formed floor); some is one warning line."""
    reads = getattr(task, "reads_prompt", None)
    if reads is None:
        return
    from fourfold.data import load_prompts

    prompts = [r.prompt for r in load_prompts(cfg.data.prompts, on_error="skip")]
    unread = [p for p in prompts if not reads(p)]
    if prompts and len(unread) == len(prompts):
        raise ConfigError(f"bon.task: {cfg.bon.task} reads none of the prompts of {cfg.data.prompts} (first: {unread[0]!r}): "
                          "every candidate's gold would be its ill-formed floor; give that world's prompts "
                          "(fourfold demo writes them) or unset bon.task")
    if unread:
        print(f"fourfold bon: warning: bon.task: {cfg.bon.task} cannot read {len(unread)} of {len(prompts)} prompts "
              f"of {cfg.data.prompts} (first: {unread[0]!r}): their candidates' gold is the ill-formed floor", flush=True)


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
    columns = prompt_columns(cfg.data.prompts)
    check_candidates(cfg)
    functions, notes = scorer_functions(cfg.scorer, columns, cfg.data.prompts)  # before any model loads
    tok, model = load_generator(cfg, device)
    if task is not None:
        _check_task_reads(cfg, task)
    loaded, flat = sample_completions(cfg, tok, model, device, repeat=n, with_columns=bool(columns),
                                      progress=Progress("fourfold bon: sampled", "candidates"))
    del model
    scorer = load_scorer(cfg.scorer, device, functions, notes)
    for line in scorer.notes:
        print(f"fourfold bon: warning: {line}", flush=True)
    scores, parts = score_candidates(cfg, flat, scorer, device, columns)
    for i, (r, s) in enumerate(zip(flat, scores, strict=True)):
        r.pop("columns", None)
        r["score"] = float(s)
        if parts:
            r["parts"] = {name: float(values[i]) for name, values in parts.items()}
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

