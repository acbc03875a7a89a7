"""Is the arithmetic world learnable? SFT from scratch on the partly-right corpus, then GRPO with
the shipped rule reward (``fourfold.tasks.arithmetic:reward``), and held-out accuracy before and
after, greedy and sampled at temperature 1.

    python tools/arithmetic_learnability.py --out runs/arith [--seed 0] [--sft-steps 500] ...

With ``--data-only`` it writes the data and the tokenizer and stops; the same two runs are then
``fourfold sft --config examples/arithmetic_sft.yaml`` and ``fourfold ppo --config
examples/arithmetic_grpo.yaml`` (the defaults below are those files' settings).

Writes under ``--out``: ``data/`` (``sft_train.jsonl``, ``prompts.jsonl`` and
``heldout.jsonl`` with their ``answer`` column), ``tokenizer/``, ``sft/`` and ``grpo/`` (the
trainers' run directories) and ``result.json``; prints the result as one JSON line. Uses the
public trainers with the same configs a user would write (``examples/arithmetic_sft.yaml``,
``examples/arithmetic_grpo.yaml``), built by :mod:`fourfold.apps.demo.arithmetic` (which
``fourfold demo --task arithmetic`` runs with these defaults).
"""
from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

import torch

from fourfold.apps.demo.arithmetic import accuracy, grpo_config, lengths, sft_config, write_jsonl


def parser() -> argparse.ArgumentParser:
    """The script's options; their defaults are the measured settings."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="runs/arith")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--digits", type=int, default=2)
    p.add_argument("--error-rate", type=float, default=0.6)
    p.add_argument("--examples", type=int, default=20000)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--sft-steps", type=int, default=500)
    p.add_argument("--sft-lr", type=float, default=3e-3)
    p.add_argument("--sft-batch", type=int, default=64)
    p.add_argument("--iterations", type=int, default=30)
    p.add_argument("--group", type=int, default=8)
    p.add_argument("--rollout", type=int, default=256)
    p.add_argument("--minibatch", type=int, default=128)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--kl", type=float, default=0.0)
    p.add_argument("--heldout", type=int, default=512)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--skip-sft", action="store_true", help="reuse --out's SFT model")
    p.add_argument("--data-only", action="store_true",
                   help="write data/ and tokenizer/ and stop (for examples/arithmetic_{sft,grpo}.yaml)")
    return p


def main(argv=None) -> dict:
    from fourfold.run.common import quiet_transformers
    from fourfold.tasks import build_word_tokenizer, get_task
    from fourfold.trainers import ppo as ppo_trainer
    from fourfold.trainers import sft as sft_trainer

    a = parser().parse_args(argv)

    quiet_transformers()
    torch.set_num_threads(a.threads)
    out, t0 = Path(a.out), time.perf_counter()
    task = get_task("arithmetic", digits=a.digits, error_rate=a.error_rate)
    data = out / "data"
    max_new = lengths(a.digits)[1]
    heldout = task.problems(a.heldout, random.Random(a.seed + 2), split="heldout")
    if not a.skip_sft:
        corpus = task.sft_examples(a.examples, random.Random(a.seed))
        write_jsonl(data / "sft_train.jsonl", [{"prompt": r["prompt"], "completion": r["completion"]} for r in corpus])
        write_jsonl(data / "prompts.jsonl", task.problems(2048, random.Random(a.seed + 1)))
        write_jsonl(data / "heldout.jsonl", heldout)
        build_word_tokenizer(task.tokenizer_corpus(), out / "tokenizer")
        if a.data_only:
            print(json.dumps({"data": str(data), "tokenizer": str(out / "tokenizer")}))
            return {}
        sft_cfg = sft_config(tokenizer=str(out / "tokenizer"), train=str(data / "sft_train.jsonl"), out=str(out / "sft"),
                             digits=a.digits, hidden=a.hidden, layers=a.layers, steps=a.sft_steps, lr=a.sft_lr,
                             batch_size=a.sft_batch, seed=a.seed, threads=a.threads)
        sft_trainer.train(sft_cfg)
    t_sft = time.perf_counter() - t0
    sft_dir = str(out / "sft" / "model")
    before = {"greedy": accuracy(sft_dir, task, heldout, greedy=True, seed=a.seed, max_new_tokens=max_new),
              "sampled": accuracy(sft_dir, task, heldout, greedy=False, seed=a.seed, max_new_tokens=max_new)}
    t1 = time.perf_counter()
    grpo_cfg = grpo_config(policy=sft_dir, prompts=str(data / "prompts.jsonl"), out=str(out / "grpo"), digits=a.digits,
                           group=a.group, iterations=a.iterations, rollout=a.rollout, minibatch=a.minibatch,
                           epochs=a.epochs, lr=a.lr, kl=a.kl, seed=a.seed, threads=a.threads)
    ppo_trainer.train(grpo_cfg)
    t_grpo = time.perf_counter() - t1
    policy = str(out / "grpo" / "policy")
    after = {"greedy": accuracy(policy, task, heldout, greedy=True, seed=a.seed, max_new_tokens=max_new),
             "sampled": accuracy(policy, task, heldout, greedy=False, seed=a.seed, max_new_tokens=max_new)}
    result = {"settings": vars(a), "before": before, "after": after, "sft_s": round(t_sft, 1),
              "grpo_s": round(t_grpo, 1), "total_s": round(time.perf_counter() - t0, 1)}
    (out / "result.json").write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    brief = {k: {m: {x: round(v[m][x], 3) for x in ("accuracy", "well_formed", "dropped_carry")} for m in v}
             for k, v in (("before", before), ("after", after))}
    print(json.dumps({**brief, "sft_s": result["sft_s"], "grpo_s": result["grpo_s"]}))
    return result


if __name__ == "__main__":
    main()
