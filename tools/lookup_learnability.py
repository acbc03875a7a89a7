"""Is the lookup world learnable? SFT from scratch on its imperfect play, then GRPO against its
environment (``env.factory: fourfold.tasks.lookup:make_env``), and gold (the share of held-out
rows answered right, greedy and sampled at temperature 1, each trajectory in its own
environment) before and after, on fresh rows of the training side's chains and on the held-out
chains (a (key, digit) pair never seen in SFT or RL: a policy that reads the reply copies its
digit; one that memorised the pairs it saw does not).

    python tools/lookup_learnability.py --out runs/lookup [--seed 0] [--hops 1] [--data-only]

The runs are ``fourfold sft --config examples/lookup_sft.yaml`` and ``fourfold ppo --config
examples/lookup_grpo.yaml`` with their paths under ``--out`` (``--hops`` sets the world, and
env.max_turns = hops + 1). Writes ``data/`` (``sft_train.jsonl``, ``prompts.jsonl``,
``heldout.jsonl``, ``fresh.jsonl``: :func:`fourfold.apps.experiments.turns_eval.write_lookup_data`),
``tokenizer/``, ``sft/``, ``grpo/`` and ``result.json``; prints one JSON line.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from fourfold.apps.experiments.turns_eval import lookup_gold, read_rows, write_lookup_data

ROOT = Path(__file__).resolve().parent.parent


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="runs/lookup")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--hops", type=int, default=1)
    p.add_argument("--value-digits", type=int, default=2)
    p.add_argument("--error-rate", type=float, default=0.6)
    p.add_argument("--guess-share", type=float, default=0.2)
    p.add_argument("--examples", type=int, default=4000)
    p.add_argument("--heldout", type=int, default=512)
    p.add_argument("--iterations", type=int, default=None, help="GRPO iterations (default: the example's)")
    p.add_argument("--sft-steps", type=int, default=None, help="SFT steps (default: the example's)")
    p.add_argument("--data-only", action="store_true", help="write the data and the tokenizer, then stop")
    return p


def main(argv=None) -> dict:
    from fourfold.config import PPOConfig, SFTConfig, load_config
    from fourfold.run.common import quiet_transformers
    from fourfold.tasks.lookup import LookupTask
    from fourfold.trainers import ppo as ppo_trainer
    from fourfold.trainers import sft as sft_trainer

    a = parser().parse_args(argv)
    quiet_transformers()
    torch.set_num_threads(1)
    out, t0 = Path(a.out), time.perf_counter()
    task = LookupTask(hops=a.hops, value_digits=a.value_digits, error_rate=a.error_rate,
                      guess_share=a.guess_share)
    paths = write_lookup_data(out, task, seed=a.seed, examples=a.examples, prompts=2048, heldout=a.heldout)
    data = out / "data"
    heldout, fresh = read_rows(paths["heldout"]), read_rows(paths["fresh"])  # fresh: training-side chains, new rows
    if a.data_only:
        print(json.dumps({"data": str(data), "tokenizer": str(out / "tokenizer")}))
        return {}
    turns, tokens = a.hops + 1, 20 + 12 * a.hops  # hops 1: the examples' 32
    sft_over = [f"model.tokenizer={out / 'tokenizer'}", f"data.train={data / 'sft_train.jsonl'}",
                f"run.output_dir={out / 'sft'}", f"run.seed={a.seed}", "run.progress=false",
                f"model.max_positions={tokens}", f"train.max_len={tokens}"]
    if a.sft_steps is not None:
        sft_over.append(f"train.max_steps={a.sft_steps}")
    sft_trainer.train(load_config(SFTConfig, ROOT / "examples" / "lookup_sft.yaml", sft_over))
    t_sft = time.perf_counter() - t0
    sft_dir = str(out / "sft" / "model")
    measure = dict(seed=a.seed, max_turns=turns, max_tokens=tokens, max_new_tokens=5)
    def measured(model_dir: str) -> dict:
        return {f"{split}_{mode}": lookup_gold(model_dir, rows, greedy=mode == "greedy", **measure)
                for split, rows in (("train", fresh), ("heldout", heldout)) for mode in ("greedy", "sampled")}

    before = measured(sft_dir)
    t1 = time.perf_counter()
    rl_over = [f"model.policy={sft_dir}", f"data.prompts={data / 'prompts.jsonl'}", f"run.output_dir={out / 'grpo'}",
               f"run.seed={a.seed}", "run.progress=false", f"env.max_turns={turns}", f"env.max_tokens={tokens}"]
    if a.iterations is not None:
        rl_over.append(f"ppo.iterations={a.iterations}")
    ppo_trainer.train(load_config(PPOConfig, ROOT / "examples" / "lookup_grpo.yaml", rl_over))
    t_grpo = time.perf_counter() - t1
    policy = str(out / "grpo" / "policy")
    after = measured(policy)
    result = {"settings": vars(a), "before": before, "after": after, "sft_s": round(t_sft, 1),
              "grpo_s": round(t_grpo, 1), "total_s": round(time.perf_counter() - t0, 1)}
    (out / "result.json").write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    print(json.dumps({k: result[k] for k in ("before", "after", "sft_s", "grpo_s")}))
    return result


if __name__ == "__main__":
    main()
