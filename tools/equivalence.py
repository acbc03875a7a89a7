"""Tiny seed-0 runs of every stage, reduced to what a refactor must keep: the metrics rows without
their timing keys and the sha256 of every weights file the runs export. Prints one JSON object.

    python tools/equivalence.py runs/equiv-before > before.json     # on the old commit
    python tools/equivalence.py runs/equiv-after > after.json       # on the new one
    python tools/equivalence.py --compare before.json after.json    # exit 1 on any difference
    python tools/equivalence.py --demo runs/demo-quick > demo.json    # a `fourfold demo` output, reduced

The runs go through the command line (``python -m fourfold.cli``), so the script needs nothing of
the package's internals and runs unchanged on both sides of a refactor: sft, reward and dpo (full
and LoRA), ppo with gae (critic from the reward model) and with grpo, reinforce, gym (CartPole),
LoRA ppo with an adapter critic over a LoRA reward adapter, and ppo, sft, reward and dpo under
``torchrun --nproc-per-node 2`` (skip those with ``--no-torchrun``). Everything is built here from
configs (a word-level tokenizer, random Llamas): no network.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
COMMON = ["run.device=cpu", "run.threads=1", "run.progress=false", "run.tensorboard=false", "run.seed=0"]


def _words(rng: random.Random, n: int, vocab: int = 60) -> str:
    return " ".join(f"w{rng.randrange(vocab)}" for _ in range(n))


def _write_jsonl(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def make_inputs(root: Path) -> dict[str, str]:
    """A word tokenizer, a random causal LM and reward model (hidden 64, 2 layers), SFT examples,
    preference pairs, prompts and a rule-based reward function."""
    sys.path.insert(0, str(REPO))
    from fourfold.models.factory import llama_config, random_causal_lm, random_scalar_model
    from fourfold.tasks.tokenizer import build_word_tokenizer

    tok = build_word_tokenizer([f"w{i}" for i in range(60)])
    cfg = llama_config(len(tok), hidden=64, layers=2, heads=4, max_positions=128, pad_token_id=tok.pad_token_id,
                       bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    random_causal_lm(cfg, seed=0).save_pretrained(root / "base")
    tok.save_pretrained(root / "base")
    random_scalar_model(cfg, seed=1).save_pretrained(root / "rm0")
    tok.save_pretrained(root / "rm0")
    rng = random.Random(0)
    sft = [{"prompt": _words(rng, rng.randrange(1, 4)), "completion": _words(rng, rng.randrange(1, 6))}
           for _ in range(40)]
    pairs = [{"prompt": _words(rng, 3), "chosen": _words(rng, 4, 20), "rejected": _words(rng, 4)} for _ in range(40)]
    prompts = [{"prompt": _words(rng, rng.randrange(2, 6))} for _ in range(64)]
    (root / "reward_fn.py").write_text("def reward(prompts, responses):\n"
                                       "    return [r.split().count('w7') / 4.0 for r in responses]\n")
    return {"base": str(root / "base"), "rm0": str(root / "rm0"), "tok": str(root / "base"),
            "sft": _write_jsonl(root / "sft.jsonl", sft[:32]), "sft_eval": _write_jsonl(root / "sft_eval.jsonl", sft[32:]),
            "pairs": _write_jsonl(root / "pairs.jsonl", pairs), "prompts": _write_jsonl(root / "prompts.jsonl", prompts),
            "reward_fn": f"{root / 'reward_fn.py'}:reward"}


def _cli(stage: str, overrides: list[str], nproc: int = 0) -> None:
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    if nproc:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
               "-m", "fourfold.cli", stage, *overrides]
    else:
        cmd = [sys.executable, "-m", "fourfold.cli", stage, *overrides]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise SystemExit(f"{stage} {' '.join(overrides)}: exit {proc.returncode}\n{proc.stderr[-3000:]}")


def _sup(*extra: str) -> list[str]:
    return ["train.max_steps=4", "train.batch_size=8", "train.lr=1e-2", "train.log_every=1", "train.max_len=16",
            "train.eval_every=2", *COMMON, *extra]


def _lm(policy: str, reward: str, inp: dict, *extra: str) -> list[str]:
    return [f"model.policy={policy}", f"model.reward={reward}", f"data.prompts={inp['prompts']}",
            "generation.max_new_tokens=6", "run.samples_every=1", *COMMON, *extra]


def _ppo(policy: str, reward: str, inp: dict, *extra: str) -> list[str]:
    return _lm(policy, reward, inp, "ppo.iterations=3", "ppo.rollout_batch_size=8", "ppo.minibatch_size=4",
               "ppo.lr=1e-2", "ppo.critic_lr=1e-2", "run.concurrent_roles=false", *extra)


LORA = ["model.lora.r=4", "model.lora.alpha=8"]


def run_all(root: Path, torchrun: bool) -> dict[str, Path]:
    """Every stage's run directory, by name (runs that feed later ones first)."""
    inp = make_inputs(root)
    runs: dict[str, Path] = {}

    def go(name: str, stage: str, overrides: list[str], nproc: int = 0) -> Path:
        out = root / name
        _cli(stage, overrides + [f"run.output_dir={out}"], nproc)
        runs[name] = out
        return out

    base = inp["base"]
    go("sft", "sft", _sup(f"model.path={base}", f"data.train={inp['sft']}", f"data.eval={inp['sft_eval']}"))
    go("sft-lora", "sft", _sup(f"model.path={base}", f"data.train={inp['sft']}", *LORA))
    go("reward", "reward", _sup(f"model.path={base}", f"data.train={inp['pairs']}"))
    go("reward-lora", "reward", _sup(f"model.path={base}", f"data.train={inp['pairs']}", *LORA))
    go("dpo", "dpo", _sup(f"model.path={base}", f"data.train={inp['pairs']}", "dpo.beta=0.5"))
    go("dpo-lora", "dpo", _sup(f"model.path={base}", f"data.train={inp['pairs']}", "dpo.beta=0.5", *LORA))
    rm = str(runs["reward"] / "model")
    go("ppo-gae", "ppo", _ppo(base, rm, inp, "model.critic_init=reward"))
    go("ppo-grpo", "ppo", _ppo(base, rm, inp, "ppo.advantage=grpo", "ppo.samples_per_prompt=4",
                               "ppo.kl_in=loss", "ppo.loss_agg=seq-mean-token-mean"))
    go("reinforce", "reinforce", _lm(base, rm, inp, "reinforce.iterations=3", "reinforce.rollout_batch_size=8",
                                     "reinforce.lr=1e-2"))
    go("gym", "gym", ["env.id=CartPole-v1", "env.num_envs=4", "ppo.total_timesteps=512", "ppo.num_steps=32",
                      "ppo.ppo_epochs=2", "eval.every_steps=256", "eval.episodes=2", *COMMON])
    go("ppo-lora", "ppo", _ppo(base, str(runs["reward-lora"] / "model-adapter"), inp, *LORA,
                               "model.critic_mode=adapter", "model.critic_init=reward"))
    if torchrun:
        go("sft-2proc", "sft", _sup(f"model.path={base}", f"data.train={inp['sft']}",
                                     f"data.eval={inp['sft_eval']}"), nproc=2)
        go("reward-2proc", "reward", _sup(f"model.path={base}", f"data.train={inp['pairs']}"), nproc=2)
        go("dpo-2proc", "dpo", _sup(f"model.path={base}", f"data.train={inp['pairs']}", "dpo.beta=0.5"),
           nproc=2)
        go("ppo-2proc", "ppo", _ppo(base, rm, inp, "model.critic_init=reward"), nproc=2)
    return runs


def _timing(key: str) -> bool:
    return key.startswith("time/") or key.endswith(("_s", "_per_s"))


def fingerprint(run: Path) -> dict:
    """Metrics rows without timing keys, the samples, the sha256 of each exported weights file and
    of the newest checkpoint's module files."""
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    rows = [{k: v for k, v in r.items() if not _timing(k)} for r in rows]
    samples = run / "samples.jsonl"
    weights = {}
    for f in sorted(run.rglob("*.safetensors")):
        rel = f.relative_to(run)
        if rel.parts[0] == "checkpoints":
            continue
        weights[str(rel)] = hashlib.sha256(f.read_bytes()).hexdigest()
    out = {"rows": rows, "weights": weights, "checkpoint": {}}
    newest = sorted((run / "checkpoints").glob("step-*"))[-1:]
    for f in sorted(newest[0].glob("modules/*.safetensors")) if newest else []:
        out["checkpoint"][f.name] = hashlib.sha256(f.read_bytes()).hexdigest()
    if samples.is_file():
        out["samples"] = samples.read_text()
    return out


def demo_fingerprint(out: Path) -> dict:
    """The same reduction for a ``fourfold demo`` output directory: each stage that trained (its
    metrics, samples, weights), the pairs and the held-out samples, and eval.json minus timing."""
    found = {}
    for stage in sorted(p for p in (out / "stages").iterdir() if p.is_dir()):
        if (stage / "metrics.jsonl").is_file():
            found[f"demo-{stage.name}"] = fingerprint(stage)
        else:
            found[f"demo-{stage.name}"] = {"samples": "".join(f.read_text() for f in sorted(stage.rglob("*.jsonl")))}
    data = {str(f.relative_to(out)): hashlib.sha256(f.read_bytes()).hexdigest()
            for f in sorted([*(out / "data").rglob("*"), *out.glob("*/*.safetensors")]) if f.is_file()}
    evaluation = json.loads((out / "eval.json").read_text())
    found["demo-eval"] = {"rows": [{k: v for k, v in evaluation.items() if not _timing(k)}], "weights": data}
    return found


def compare(a: dict, b: dict) -> list[str]:
    problems = []
    for name in sorted(set(a) | set(b)):
        if name not in a or name not in b:
            problems.append(f"{name}: only in {'the first' if name in a else 'the second'}")
            continue
        for part in ("rows", "weights", "samples", "checkpoint"):
            if a[name].get(part) != b[name].get(part):
                problems.append(f"{name}: {part} differ")
    return problems


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("root", nargs="?", help="an empty directory for the runs")
    p.add_argument("--no-torchrun", action="store_true", help="leave out the 2-process runs")
    p.add_argument("--compare", nargs=2, metavar="JSON", help="compare two outputs of this script instead")
    p.add_argument("--demo", metavar="DIR", help="reduce the output directory of a `fourfold demo` run instead")
    args = p.parse_args(argv)
    if args.demo:
        print(json.dumps(demo_fingerprint(Path(args.demo)), sort_keys=True))
        return 0
    if args.compare:
        a, b = (json.loads(Path(f).read_text()) for f in args.compare)
        problems = compare(a, b)
        print("\n".join(problems) if problems else f"identical: {len(a)} runs")
        return 1 if problems else 0
    root = Path(args.root)
    root.mkdir(parents=True, exist_ok=False)
    runs = run_all(root.resolve(), torchrun=not args.no_torchrun)
    print(json.dumps({name: fingerprint(run) for name, run in runs.items()}, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
