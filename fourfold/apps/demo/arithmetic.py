"""`fourfold demo --task arithmetic`: RL from a verifiable reward, from zero, on the embedded
arithmetic world (fourfold.tasks.arithmetic; docs/arithmetic.md).

1. ``sft``: the corpus whose demonstrations are only partly right (``error_rate``), the
   tokenizer, and SFT of a tiny Llama from scratch -> ``sft/``;
2. ``grpo``: GRPO with the shipped rule reward (``fourfold.tasks.arithmetic:reward``: the final
   answer against the ``answer`` column, plus a format rule) on training-side problems -> ``policy/``;
3. ``eval``: greedy and sampled (temperature 1) held-out accuracy of both models on problems whose
   pairs neither stage saw;
4. ``report.md`` and ``result.json`` (accuracy before/after, greedy and sampled, seconds) in
   ``run.output_dir``, with ``provenance.json`` (the commit and machine).

The stages run through the demo's stage cache (:class:`fourfold.apps.cache.Stages`): a rerun with
the same settings reuses them, ``--fresh`` reruns all. ``tools/arithmetic_learnability.py`` (the
measurement of the world's learnability) shares :func:`accuracy`, :func:`sft_config` and
:func:`grpo_config` with this module.
"""
from __future__ import annotations

import dataclasses
import json
import random
import time
from functools import partial
from pathlib import Path

import torch

from fourfold.apps.demo.arithmetic_config import QUICK, ArithmeticDemoConfig

REWARD_FN = "fourfold.tasks.arithmetic:reward"
METRICS = ("accuracy", "well_formed", "dropped_carry", "answered")
"""What the report and result.json keep of the task's response metrics, per model and decoding."""


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))


def lengths(digits: int) -> tuple[int, int]:
    """(longest prompt, longest answer) in words: ``<bos> what is A + B ?`` and the worked solution
    with room to spare."""
    return 6 + 2 * digits, 9 * digits + 6


@torch.no_grad()
def accuracy(model_dir: str, task, rows: list[dict], *, greedy: bool, seed: int, max_new_tokens: int) -> dict:
    """The task's response metrics of ``model_dir``'s answers to ``rows``: greedy, or sampled at
    temperature 1 with ``torch.manual_seed(seed)``."""
    from fourfold.data import left_pad, tokenize_prompts
    from fourfold.models.loading import load_causal_lm, load_tokenizer
    from fourfold.rollout.eager import sample
    from fourfold.rollout.sampling import decode_responses

    tok, model = load_tokenizer(model_dir), load_causal_lm(model_dir, device="cpu")
    model.eval()
    torch.manual_seed(seed)
    prompts = [r["prompt"] for r in rows]
    ids = tokenize_prompts(prompts, tok, 64)
    texts = []
    for i in range(0, len(prompts), 256):
        pid, pmask = left_pad(ids[i : i + 256], tok.pad_token_id)
        s = sample(model, pid, pmask, max_new_tokens=max_new_tokens, temperature=1.0, greedy=greedy,
                   eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
        texts += decode_responses(tok, s)
    return task.response_metrics(prompts, texts)


def sft_config(*, tokenizer: str, train: str, out: str, digits: int, hidden: int, layers: int, steps: int, lr: float,
               batch_size: int, seed: int, threads: int, run=None):
    """The SFT stage: a Llama of ``hidden`` x ``layers`` from scratch over the world's tokenizer."""
    from fourfold.config import InitModelConfig, RunConfig, SFTConfig, SFTDataConfig, TrainLoopConfig

    max_prompt, max_new = lengths(digits)
    return SFTConfig(
        model=InitModelConfig(from_scratch=True, tokenizer=tokenizer, hidden_size=hidden, num_layers=layers,
                              num_heads=4, max_positions=max_prompt + max_new),
        data=SFTDataConfig(train=train),
        train=TrainLoopConfig(max_steps=steps, batch_size=batch_size, lr=lr, warmup_steps=max(1, steps // 20),
                              max_len=max_prompt + max_new, log_every=50),
        run=run or RunConfig(output_dir=out, seed=seed, threads=threads, overwrite=True, progress=False,
                             tensorboard=False))


def grpo_config(*, policy: str, prompts: str, out: str, digits: int, group: int, iterations: int, rollout: int,
                minibatch: int, epochs: int, lr: float, kl: float, seed: int, threads: int, run=None):
    """The GRPO stage with the rule reward, as examples/arithmetic_grpo.yaml writes it."""
    from fourfold.config import LMModelConfig, PPOAlgoConfig, PPOConfig, PromptDataConfig, RunConfig
    from fourfold.config.ppo import GenerationConfig

    max_prompt, max_new = lengths(digits)
    return PPOConfig(
        model=LMModelConfig(policy=policy, reward_fn=REWARD_FN),
        data=PromptDataConfig(prompts=prompts, max_prompt_len=max_prompt),
        generation=GenerationConfig(max_new_tokens=max_new, temperature=1.0),
        ppo=PPOAlgoConfig(advantage="grpo", samples_per_prompt=group, iterations=iterations, rollout_batch_size=rollout,
                          minibatch_size=minibatch, ppo_epochs=epochs, kl_in="loss", kl_coef=kl, kl_estimator="k3",
                          loss_agg="seq-mean-token-mean", lr=lr, lr_schedule="constant"),
        run=run or RunConfig(output_dir=out, seed=seed, threads=threads, overwrite=True, progress=False,
                             tensorboard=False, samples_every=0))


def _sub_run(cfg: ArithmeticDemoConfig, d: Path, save_every: int):
    """The ``run`` section of a stage writing into its stage directory ``d``: it resumes the stage's
    newest checkpoint (an interrupted demo continues when rerun), else starts over there."""
    from fourfold.checkpoint import checkpoint_dirs
    from fourfold.config import RunConfig

    resume = bool(checkpoint_dirs(d))
    r = cfg.run
    return RunConfig(output_dir=str(d), seed=r.seed, device=r.device, threads=r.threads, save_every=save_every,
                     keep_checkpoints=2, resume=resume, overwrite=not resume, progress=False, tensorboard=False,
                     samples_every=0)


def stage_sft(cfg: ArithmeticDemoConfig, task, out: Path, d: Path) -> dict:
    from fourfold.apps.cache import copy_into_place
    from fourfold.tasks import build_word_tokenizer
    from fourfold.trainers import sft as sft_trainer

    seed, data = cfg.run.seed, out / "data"
    corpus = task.sft_examples(cfg.examples, random.Random(seed))
    write_jsonl(data / "sft_train.jsonl", [{"prompt": r["prompt"], "completion": r["completion"]} for r in corpus])
    build_word_tokenizer(task.tokenizer_corpus(), out / "tokenizer")
    sft_cfg = sft_config(tokenizer=str(out / "tokenizer"), train=str(data / "sft_train.jsonl"), out=str(d),
                         digits=cfg.digits, hidden=cfg.hidden_size, layers=cfg.num_layers, steps=cfg.sft_steps,
                         lr=cfg.sft_lr, batch_size=cfg.sft_batch_size, seed=seed, threads=cfg.run.threads,
                         run=_sub_run(cfg, d, save_every=max(50, cfg.sft_steps // 5)))
    res = sft_trainer.train(sft_cfg)
    copy_into_place(Path(res["model"]), out / "sft")
    return {"corpus_correct": round(sum(bool(r["correct"]) for r in corpus) / len(corpus), 4)}


def stage_grpo(cfg: ArithmeticDemoConfig, task, out: Path, d: Path) -> dict:
    from fourfold.apps.cache import copy_into_place
    from fourfold.trainers import ppo as ppo_trainer

    seed, data = cfg.run.seed, out / "data"
    write_jsonl(data / "prompts.jsonl", task.problems(2048, random.Random(seed + 1)))
    grpo_cfg = grpo_config(policy=str(out / "sft"), prompts=str(data / "prompts.jsonl"), out=str(d), digits=cfg.digits,
                           group=cfg.samples_per_prompt, iterations=cfg.iterations, rollout=cfg.rollout_batch_size,
                           minibatch=cfg.minibatch_size, epochs=1, lr=cfg.lr, kl=cfg.kl_coef, seed=seed,
                           threads=cfg.run.threads, run=_sub_run(cfg, d, save_every=10))
    res = ppo_trainer.train(grpo_cfg)
    copy_into_place(Path(res["policy"]), out / "policy")
    final = res.get("final", {})
    return {"score_mean_last": final.get("reward/score_mean")}


def stage_eval(cfg: ArithmeticDemoConfig, task, out: Path, d: Path) -> dict:
    seed = cfg.run.seed
    heldout = task.problems(cfg.heldout, random.Random(seed + 2), split="heldout")
    write_jsonl(out / "data" / "heldout.jsonl", heldout)
    max_new = lengths(cfg.digits)[1]
    res = {}
    for name, model in (("before", out / "sft"), ("after", out / "policy")):
        res[name] = {mode: {k: round(v, 4) for k, v in accuracy(str(model), task, heldout, greedy=mode == "greedy",
                                                               seed=seed, max_new_tokens=max_new).items()
                            if k in METRICS}
                     for mode in ("greedy", "sampled")}
    return res


def run(cfg: ArithmeticDemoConfig) -> dict:
    """SFT -> GRPO -> eval -> report in ``cfg.run.output_dir``; returns the result record."""
    from fourfold.apps.cache import Stages
    from fourfold.apps.provenance import provenance, write_provenance
    from fourfold.atomic import write_text_atomic
    from fourfold.config import save_config
    from fourfold.run.common import quiet_transformers
    from fourfold.tasks import get_task

    made, t0 = provenance(), time.perf_counter()
    if cfg.quick:
        cfg = dataclasses.replace(cfg, **QUICK)
    quiet_transformers()
    torch.set_num_threads(cfg.run.threads)
    out = Path(cfg.run.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    save_config(cfg, out / "config.yaml")
    task = get_task("arithmetic", digits=cfg.digits, error_rate=cfg.error_rate)
    stages = Stages(out, cfg.fresh)
    settings = {k: v for k, v in dataclasses.asdict(cfg).items() if k not in ("quick", "fresh", "run")}
    settings["seed"] = cfg.run.seed
    sft_keys = ("digits", "error_rate", "examples", "hidden_size", "num_layers", "sft_steps", "sft_lr",
                "sft_batch_size", "seed")
    log = partial(print, flush=True)
    log("1/4 SFT from scratch on the partly-right corpus")
    r_sft = stages.run("sft", {k: settings[k] for k in sft_keys}, partial(stage_sft, cfg, task, out), log)
    log("2/4 GRPO with the rule reward (fourfold.tasks.arithmetic:reward)")
    r_grpo = stages.run("grpo", settings, partial(stage_grpo, cfg, task, out), log)
    log("3/4 held-out accuracy, greedy and sampled, before and after")
    r_eval = stages.run("eval", settings, partial(stage_eval, cfg, task, out), log)
    result = {"task": "arithmetic", "seed": cfg.run.seed, "quick": cfg.quick, "heldout": cfg.heldout,
              "before": r_eval["before"], "after": r_eval["after"],
              "seconds": {"sft": r_sft.get("wall_s"), "grpo": r_grpo.get("wall_s"), "eval": r_eval.get("wall_s"),
                          "total": round(time.perf_counter() - t0, 1)},
              "settings": settings}
    write_text_atomic(out / "result.json", json.dumps(result, indent=1, sort_keys=True) + "\n")
    write_text_atomic(out / "report.md", report(result, made))
    write_provenance(out, made)
    log("4/4 report")
    b, a = result["before"]["greedy"]["accuracy"], result["after"]["greedy"]["accuracy"]
    log(f"held-out accuracy (greedy) {b:.1%} -> {a:.1%}; report: {out / 'report.md'}")
    return result


def report(result: dict, made: dict) -> str:
    """report.md of a result record."""
    rows = []
    for mode in ("greedy", "sampled"):
        b, a = result["before"][mode], result["after"][mode]
        rows.append(f"| {mode} | {b['accuracy']:.1%} | {a['accuracy']:.1%} | {b['well_formed']:.1%} -> "
                    f"{a['well_formed']:.1%} | {b['dropped_carry']:.1%} -> {a['dropped_carry']:.1%} |")
    s, sec = result["settings"], result["seconds"]
    return "\n".join([
        f"# fourfold demo --task arithmetic (seed {result['seed']}{', --quick' if result['quick'] else ''})", "",
        f"SFT from scratch on {s['examples']} demonstrations of {s['digits']}-digit addition, "
        f"{s['error_rate']:.0%} of them with one mistake, then GRPO ({s['iterations']} iterations of "
        f"{s['rollout_batch_size']} answers, {s['samples_per_prompt']} per problem) with the rule reward "
        f"`{REWARD_FN}`. Accuracy on {result['heldout']} held-out problems (pairs neither stage saw).", "",
        "| decoding | accuracy after SFT | after GRPO | well-formed | dropped a carry |", "|---|---|---|---|---|",
        *rows, "",
        f"Seconds: SFT {sec['sft']}, GRPO {sec['grpo']}, eval {sec['eval']}; this invocation {sec['total']} "
        "(a cached stage counts its first run).", "",
        f"Made on {made.get('machine')}, commit {made.get('commit')}, {made.get('date')}: `{made.get('command')}`.", ""])
