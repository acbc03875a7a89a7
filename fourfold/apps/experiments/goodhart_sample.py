"""The re-posed overoptimization family's subprocess work (issue 41; ``python -m
fourfold.apps.experiments goodhart-bon SPEC.json | goodhart-curve SPEC.json``): the models are
loaded here, the measures are :mod:`fourfold.apps.experiments.goodhart_eval`'s pure functions.

* :func:`bon_spec` - ``N`` SFT samples of each best-of-n prompt, sampled once and scored by every
  world's gold and every reward model of every world, then
  :func:`~fourfold.apps.experiments.goodhart_eval.bon_measures` per world;
* :func:`curve_spec` - a PPO run's checkpoints on the evaluation schedule (and the SFT model as
  iteration 0), ``A`` samples of each curve prompt at each, scored by the world's gold, KL to the
  SFT model and every RM of the world (:func:`~fourfold.apps.experiments.goodhart_eval.curve_point`);
  then, with ``prune``, every checkpoint but the last deleted.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Mapping

from fourfold.atomic import write_text_atomic
from fourfold.errors import FourfoldError


def _setup(spec: Mapping[str, Any]) -> None:
    import torch

    from fourfold.run.common import quiet_transformers

    quiet_transformers()
    torch.set_num_threads(int(spec.get("threads") or 1))


def _scores(rm, batches, shape: tuple[int, int]):
    """An RM's scores of sampled batches (the sequences as PPO scores them), as ``[P, A]`` float64."""
    import torch

    with torch.no_grad():
        return torch.cat([rm.score(s.sequences, s.attention_mask).double() for s in batches]).view(*shape)


def _load_rms(sft: str, rms: Mapping[str, str]) -> dict:
    from fourfold.models.build import load_saved

    return {level: load_saved(sft, reward=d).reward_model.eval() for level, d in rms.items()}


def bon_spec(spec: Mapping[str, Any]) -> dict:
    """Sample ``N`` responses to each prompt from the SFT model (torch seeded with ``sample_seed``),
    and for each world of ``worlds`` ({world: {task_options, rms: {level: directory}}}) score them by
    its gold and its RMs: :func:`bon_measures` on the ``grid``. Writes {key, worlds: {world:
    measures}, samples, sample_s, seconds} to ``out``. spec: sft, worlds, prompts, N, grid,
    sample_seed, max_new_tokens, temperature, batch_size, out, key, threads."""
    import torch

    from fourfold.apps.evaluation import sample_texts
    from fourfold.apps.experiments.goodhart_eval import bon_measures
    from fourfold.models.build import load_saved
    from fourfold.tasks import get_task

    _setup(spec)
    t0 = time.perf_counter()
    N, prompts = int(spec["N"]), list(spec["prompts"])
    roles = load_saved(spec["sft"], policy=spec["sft"])
    torch.manual_seed(spec["sample_seed"])
    flat = [p for p in prompts for _ in range(N)]
    texts, batches = sample_texts(roles.policy, roles.tokenizer, flat, max_new_tokens=spec["max_new_tokens"],
                                  temperature=spec["temperature"], batch_size=int(spec.get("batch_size") or 128))
    sample_s = time.perf_counter() - t0
    rows = [texts[i * N:(i + 1) * N] for i in range(len(prompts))]
    out = {}
    for world, w in spec["worlds"].items():
        task = get_task("review", **w["task_options"])
        gold = torch.tensor(task.gold_reward(flat, texts), dtype=torch.float64).view(len(prompts), N)
        proxies = {level: _scores(rm, batches, (len(prompts), N)) for level, rm in _load_rms(spec["sft"], w["rms"]).items()}
        out[world] = {**bon_measures(rows, gold, proxies, spec["grid"]), "gold_std": float(gold.std()),
                      **task.response_metrics(flat, texts)}
    result = {"key": spec["key"], "worlds": out, "samples": len(flat), "sample_s": round(sample_s, 1),
              "seconds": round(time.perf_counter() - t0, 1)}
    write_text_atomic(Path(spec["out"]), json.dumps(result, sort_keys=True))
    return result


def schedule_points(checkpoints: list[list], schedule: list[int]) -> list[list]:
    """The [iteration, directory] of ``checkpoints`` whose iteration is on ``schedule``, and the
    last checkpoint always (the run's end), in order."""
    if not checkpoints:
        return []
    keep = set(schedule) | {checkpoints[-1][0]}
    return [c for c in checkpoints if c[0] in keep]


def curve_spec(spec: Mapping[str, Any]) -> dict:
    """Evaluate the PPO run in ``run_dir``: the SFT model (iteration 0) and its checkpoints on
    ``schedule`` (and the last), each by ``A`` samples of every prompt (the same sampling seed at
    every point), scored by the world's gold (``task_options``), KL to the SFT model (k1, summed
    over the response) and every RM of ``rms`` ({level: directory}); ``trained_on`` the run's RM
    level or 'gold'. Writes {key, points, seconds} to ``out``; with ``prune`` then deletes all but
    the last checkpoint. spec: sft, rms, trained_on, run_dir, schedule, prompts, A, task_options,
    sample_seed, max_new_tokens, temperature, out, key, prune, threads."""
    import torch

    from fourfold.apps.evaluation import sample_texts
    from fourfold.apps.experiments.goodhart_eval import curve_point
    from fourfold.apps.experiments.overopt_eval import run_checkpoints, write_curve
    from fourfold.checkpoint import load_checkpoint
    from fourfold.core import kl_estimate
    from fourfold.models.build import load_saved
    from fourfold.tasks import get_task

    _setup(spec)
    t0 = time.perf_counter()
    task = get_task("review", **spec["task_options"])
    roles = load_saved(spec["sft"], policy=spec["sft"], reference=spec["sft"])
    rms = _load_rms(spec["sft"], spec["rms"])
    prompts, A, temp = list(spec["prompts"]), int(spec["A"]), float(spec["temperature"])
    flat = [p for p in prompts for _ in range(A)]
    checkpoints = run_checkpoints(Path(spec["run_dir"]))
    if not checkpoints:
        raise FourfoldError(f"{spec['run_dir']}: the run has no complete checkpoint to evaluate")
    points = []
    for it, path in [[0, None]] + schedule_points(checkpoints, list(spec["schedule"])):
        if path is not None:
            load_checkpoint(path, modules={"policy": roles.policy}, restore_rng=False)
        torch.manual_seed(spec["sample_seed"])
        texts, batches = sample_texts(roles.policy, roles.tokenizer, flat, max_new_tokens=spec["max_new_tokens"],
                                      temperature=temp)
        kl = []
        with torch.no_grad():
            for s in batches:
                ref = roles.reference.logprobs(s.sequences, s.attention_mask, s.n_response, temp)
                kl += (kl_estimate(s.policy_logprobs, ref, "k1") * s.response_mask).sum(1).tolist()
        shape = (len(prompts), A)
        gold = torch.tensor(task.gold_reward(flat, texts), dtype=torch.float64).view(*shape)
        proxies = {level: _scores(rm, batches, shape) for level, rm in rms.items()}
        pt = curve_point(gold, torch.tensor(kl, dtype=torch.float64).view(*shape), proxies, spec["trained_on"])
        points.append({"iteration": int(it), **pt, **task.response_metrics(flat, texts)})
    return write_curve(spec, points, checkpoints, t0)

