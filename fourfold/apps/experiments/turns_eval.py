"""The turns family's subprocess work (``python -m fourfold.apps.experiments turns-world SPEC.json |
turns-eval SPEC.json``): a lookup world's data, tokenizer and SFT model, and the gold of a policy on
the world's held-out chains (greedy and sampled at temperature 1, each trajectory in its own
environment). :func:`lookup_gold` is also what ``tools/lookup_learnability.py`` measures with.
"""

from __future__ import annotations

import json
import random
import shutil
import time
from pathlib import Path
from typing import Mapping

import torch

from fourfold.atomic import write_text_atomic

GOLD_MODES = ("greedy", "sampled")
"""How a policy's gold is measured: its most likely turn each time, or turns sampled at T = 1."""
EVAL_BATCH = 256


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, "".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))


def write_lookup_data(out: Path, task, *, seed: int, examples: int, prompts: int, heldout: int) -> dict:
    """A lookup world's files under ``out``: data/sft_train.jsonl (``examples`` SFT episodes),
    data/prompts.jsonl (``prompts`` RL rows), data/heldout.jsonl (``heldout`` rows of held-out chains),
    data/fresh.jsonl (``heldout`` new rows of training-side chains) and tokenizer/. Returns their paths."""
    from fourfold.tasks import build_word_tokenizer

    data = out / "data"
    paths = {name: data / f"{name}.jsonl" for name in ("sft_train", "prompts", "heldout", "fresh")}
    write_jsonl(paths["sft_train"], task.sft_rows(examples, random.Random(seed)))
    write_jsonl(paths["prompts"], task.problems(prompts, random.Random(seed + 1)))
    write_jsonl(paths["heldout"], task.problems(heldout, random.Random(seed + 2), split="heldout"))
    write_jsonl(paths["fresh"], task.problems(heldout, random.Random(seed + 3)))
    build_word_tokenizer(task.tokenizer_corpus(), out / "tokenizer")
    return {**{k: str(v) for k, v in paths.items()}, "tokenizer": str(out / "tokenizer")}


@torch.no_grad()
def lookup_gold(model_dir: str, rows: list[dict], *, greedy: bool, seed: int, max_turns: int, max_tokens: int,
                max_new_tokens: int) -> dict:
    """Gold of ``model_dir`` on ``rows`` (prompts-file rows of the lookup world): the share of
    trajectories answered right, its binomial standard error, the mean turns per trajectory."""
    from fourfold.data.observations import ObservationEncoder
    from fourfold.models.loading import load_causal_lm, load_tokenizer
    from fourfold.rollout.env import make_envs
    from fourfold.rollout.turns import TurnSettings, sample_turns
    from fourfold.tasks.lookup import LookupTask

    tok, model = load_tokenizer(model_dir), load_causal_lm(model_dir, device="cpu")
    model.eval()
    gen = torch.Generator().manual_seed(seed)
    enc = ObservationEncoder(tok)
    settings = TurnSettings(max_turns=max_turns, max_tokens=max_tokens, max_new_tokens=max_new_tokens,
                            decode=lambda ids: tok.decode(ids, skip_special_tokens=True), temperature=1.0,
                            eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, greedy=greedy, generator=gen)
    returns, turns = [], []
    for i in range(0, len(rows), EVAL_BATCH):
        chunk = rows[i:i + EVAL_BATCH]
        envs = make_envs("fourfold.tasks.lookup:make_env", chunk, [f"heldout:{j + 1}" for j in range(i, i + len(chunk))])
        first = [enc.first(e.reset(), e.where, max_tokens) for e in envs]
        batch = sample_turns(model, envs, first, settings, enc.next)
        returns += batch.turn_rewards.sum(1).tolist()
        turns += batch.n_turns.tolist()
    g = LookupTask.gold(returns)
    return {"gold": g, "gold_se": (g * (1 - g) / len(returns)) ** 0.5, "n": len(returns),
            "turns_mean": sum(turns) / len(turns)}


def read_rows(path: str) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]


def policy_gold(model_dir: str, rows: list[dict], spec: Mapping) -> dict:
    """{greedy: {...}, sampled: {...}} of :func:`lookup_gold` with the spec's limits and seed."""
    return {mode: lookup_gold(model_dir, rows, greedy=mode == "greedy", seed=int(spec["sample_seed"]),
                              max_turns=int(spec["max_turns"]), max_tokens=int(spec["max_tokens"]),
                              max_new_tokens=int(spec["max_new_tokens"])) for mode in GOLD_MODES}


def eval_spec(spec: Mapping) -> dict:
    """``turns-eval``: the gold of spec['policy'] on spec['rows'] (a jsonl), written to spec['out']
    with spec['key']."""
    torch.set_num_threads(int(spec.get("threads") or 1))
    t0 = time.perf_counter()
    res = {"key": spec["key"], "gold": policy_gold(spec["policy"], read_rows(spec["rows"]), spec)}
    res["seconds"] = round(time.perf_counter() - t0, 1)
    write_text_atomic(Path(spec["out"]), json.dumps(res, indent=1, sort_keys=True))
    return res


def world_spec(spec: Mapping) -> dict:
    """``turns-world``: a hops' data and tokenizer (:func:`write_lookup_data`), its SFT model (the
    spec's SFT config, saved by the family), the SFT model's gold; world.json with spec['key'] last,
    so a world cut short is made again."""
    from fourfold.config import SFTConfig, load_config
    from fourfold.run.common import quiet_transformers
    from fourfold.tasks.lookup import LookupTask
    from fourfold.trainers import sft as sft_trainer

    quiet_transformers()
    torch.set_num_threads(int(spec.get("threads") or 1))
    t0 = time.perf_counter()
    out = Path(spec["out"])
    for name in ("sft", "world.json"):
        p = out / name
        if p.is_dir():
            shutil.rmtree(p)
        elif p.exists():
            p.unlink()
    task = LookupTask(**spec["task"])
    paths = write_lookup_data(out, task, seed=int(spec["seed"]), examples=int(spec["examples"]),
                              prompts=int(spec["prompts"]), heldout=int(spec["heldout"]))
    sft_trainer.train(load_config(SFTConfig, spec["sft_config"]))
    t_sft = time.perf_counter() - t0
    gold = policy_gold(str(out / "sft" / "model"), read_rows(paths["heldout"]), spec)
    res = {"key": spec["key"], "paths": paths, "gold": gold, "sft_s": round(t_sft, 1),
           "seconds": round(time.perf_counter() - t0, 1)}
    write_text_atomic(out / "world.json", json.dumps(res, indent=1, sort_keys=True))
    return res
