"""`fourfold demo`: the whole classic RLHF stack on the embedded review task, from zero.

Stages (each uses the same public trainers and data formats a user would, and is cached: a
stage whose config and inputs are unchanged is skipped; ``--fresh`` reruns all):

1. ``sft``     generate the corpus, build the word-level tokenizer, SFT a tiny Llama from scratch;
2. ``pairs``   sample response pairs from the SFT model, label them with the simulated labelers;
               also held-out one-slip pairs (a sample vs the same sample with one word broken);
3. ``reward``  train the reward model (initialised from SFT) on those labels; its accuracy is
               measured on held-out pairs against the labelers and against the hidden gold reward,
               and on the one-slip pairs (does it see grammar at all?);
4. ``ppo``     PPO against the frozen RM, KL to the frozen SFT reference, critic from the RM;
5. ``eval``    SFT vs PPO policy on held-out prompts: proxy (RM) score, gold reward, KL, length,
               well-formed share, repetition;
6. ``report``  ``report.html`` (self-contained) with curves, samples and per-token advantages.

Outputs under ``run.output_dir`` (default ``runs/demo``): ``sft/``, ``reward/``, ``policy/``,
``critic/`` (HF directories), ``data/`` (JSONL in the user-facing formats), ``metrics.jsonl``
(every stage's rows, tagged with ``stage``), ``eval.json``, ``report.html``, ``provenance.json``
(commit, machine, date, command), and ``stages/`` (each trainer's own run directory with its
checkpoints, so a killed demo resumes).

LoRA mode (``lora.r=16``, the ``lora`` section): PPO trains an adapter on the SFT model (the
reference is that model with adapters off) and, with ``lora.reward`` (the default), the reward stage
trains a LoRA reward model on the SFT model, published as ``reward/`` (merged) and
``reward-adapter/``, which PPO loads as a third adapter beside an adapter critic: one base for all
four roles. ``reward/``, ``policy/`` and ``critic/`` stay merged HF directories, so the eval and
the report read them as they read a full run's. Without ``lora`` every stage key is unchanged.

The code: :func:`run` calls the stages in order through the stage cache (:class:`fourfold.apps.cache.Stages`);
each stage is a function ``stage_<name>(demo, stage_dir) -> result`` over a :class:`DemoRun` (the
config, directories, task and console one invocation shares), and its cache key is
``<name>_stage_settings(cfg)`` plus the keys of the stages before it.
"""

from __future__ import annotations

import dataclasses
import json
import random
import time
from functools import partial
from pathlib import Path
from typing import Any, Callable, Mapping

import torch

from fourfold.apps.cache import Stages, copy_into_place, keyed, stage_key
from fourfold.apps.evaluation import evaluate_policy, load_eval_roles, pair_accuracy, sample_engine, sample_texts
from fourfold.apps.provenance import provenance, write_provenance
from fourfold.apps.seeds import stream_seed
from fourfold.atomic import write_text_atomic
from fourfold.checkpoint import checkpoint_dirs, save_pretrained_atomic
from fourfold.config import (
    DemoConfig,
    InitModelConfig,
    LMModelConfig,
    PPOConfig,
    PreferenceDataConfig,
    PromptDataConfig,
    RewardConfig,
    RewardLossConfig,
    RunConfig,
    SFTConfig,
    SFTDataConfig,
    TrainLoopConfig,
    config_to_dict,
    save_config,
)
from fourfold.config.sampling import truncates
from fourfold.sinks import fmt_fixed, fmt_number

QUICK = {  # --quick: the same pipeline on about 2.5 minutes of 2 cores (measured 97-104 s of stages, seeds 0-2, on a busy machine)
    "sft.examples": 12000, "sft.steps": 700, "pairs.pairs": 3000, "pairs.eval_pairs": 200, "pairs.slip_eval_pairs": 100,
    "reward.steps": 200, "ppo.iterations": 24, "ppo.rollout_batch_size": 64, "ppo.minibatch_size": 16,
    "eval.prompts": 512, "run.save_every": 4,
}


def apply_quick(cfg, quick: Mapping[str, Any] = QUICK):
    """A copy of the config ``cfg`` with the settings ``quick`` over it: ``{"field" or
    "section.field" (or "section.sub.field"): value}``. The demo's --quick is :data:`QUICK` (the
    default); ``fourfold experiments --quick`` applies its own table (:data:`fourfold.apps.experiments.QUICK`)
    with it."""
    def put(section, path: list[str], value):
        if len(path) == 1:
            return dataclasses.replace(section, **{path[0]: value})
        return dataclasses.replace(section, **{path[0]: put(getattr(section, path[0]), path[1:], value)})

    cfg = dataclasses.replace(cfg)
    for key, value in quick.items():
        value = list(value) if isinstance(value, list) else value  # never share the table's lists
        cfg = put(cfg, key.split("."), value)
    return cfg


# ---------------------------------------------------------------------------------------------
# small helpers: JSONL writes and the stages' cache keys
# ---------------------------------------------------------------------------------------------


def write_jsonl(path: Path, rows: list[dict]) -> None:
    write_text_atomic(path, "".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))


def sft_stage_settings(cfg: DemoConfig) -> dict:
    """What the SFT stage's cache key holds (``cfg`` with ``--quick`` already applied). Of the task
    options only those that change the corpus count (``ReviewTaskConfig.CORPUS_FIELDS``): changing
    a labeler or gold option (``labeler_length_bias``, ``ill_formed_gold``, ...) reruns pairs,
    reward and PPO but keeps the SFT model. The experiments use it to seed an unbiased-labeler
    demo with this SFT model."""
    from fourfold.tasks import ReviewTaskConfig

    corpus = {k: v for k, v in cfg.task_options.items() if k in ReviewTaskConfig.CORPUS_FIELDS}
    return {"sft": config_to_dict(cfg.sft), "model": config_to_dict(cfg.model), "task": corpus, "seed": cfg.run.seed}


def pairs_stage_settings(cfg: DemoConfig) -> dict:
    """What the pairs stage's cache key holds: its section, the response length and the task options,
    and the sampling filters (``generation.top_k``, ``top_p``, ``min_p``: the pairs are sampled
    through them) only when one is on, so a demo without them keeps its key."""
    settings = {"pairs": config_to_dict(cfg.pairs), "gen": cfg.generation.max_new_tokens, "task": cfg.task_options}
    if truncates(cfg.generation):
        settings["truncation"] = {k: getattr(cfg.generation, k) for k in cfg.generation.TRUNCATION_KEYS}
    return settings


def reward_stage_settings(cfg: DemoConfig) -> dict:
    """What the reward stage's cache key holds: its section, and the LoRA settings only when the
    reward model trains with LoRA (``lora.reward``), so a demo without LoRA keeps its keys."""
    settings = {"reward": config_to_dict(cfg.reward)}
    if cfg.lora is not None and cfg.lora.reward:
        settings["lora"] = config_to_dict(cfg.lora)
    return settings


def ppo_stage_settings(cfg: DemoConfig) -> dict:
    """What the PPO stage's cache key holds: its sections, and the LoRA settings only when set."""
    settings = {"ppo": keyed(cfg.ppo), "gen": keyed(cfg.generation), "task": cfg.task_options}
    if cfg.lora is not None:
        settings["lora"] = config_to_dict(cfg.lora)
    return settings


def eval_stage_settings(cfg: DemoConfig) -> dict:
    """What the eval stage's cache key holds: its section (the models are the upstream stages')."""
    return {"eval": config_to_dict(cfg.eval)}


def ppo_stage_config(cfg: DemoConfig, out: Path, prompts: Path, run: RunConfig) -> PPOConfig:
    """The PPO stage's config: against the frozen RM, KL to the frozen SFT reference, critic from
    the RM. With ``lora``: the policy is an adapter on the SFT model (learning rate times
    ``lora.lr_multiplier``) and the reference that model with adapters off; with ``lora.reward``
    the RM is the third adapter and the critic a fourth (from the RM's), all on one base.
    ``data.task`` (and ``data.task_options``) name the review task although the stage passes its prompts
    and gold probe to the trainer itself: ``fourfold ppo --config stages/ppo/config.yaml`` then logs the
    gold reward too."""
    model = LMModelConfig(policy=str(out / "sft"), reward=str(out / "reward"))  # a critic starts as the RM
    algo, lora = cfg.ppo, cfg.lora
    if lora is not None:
        model = dataclasses.replace(model, lora=lora.adapter(), critic_mode="adapter" if lora.reward else "separate",
                                    reward=str(out / ("reward-adapter" if lora.reward else "reward")))
        algo = dataclasses.replace(algo, lr=algo.lr * lora.lr_multiplier)
        run = dataclasses.replace(run, concurrent_roles=False)  # roles over one base run one at a time
    return PPOConfig(model=model, data=PromptDataConfig(prompts=str(prompts), task="review", max_prompt_len=16,
                                                        task_options=dict(cfg.task_options)),
                     generation=cfg.generation, ppo=algo, run=run)


def sft_stage_key(cfg: DemoConfig) -> str:
    """The key :func:`run` gives its SFT stage (the first stage: nothing upstream) for ``cfg``
    (``--quick`` is applied here when ``cfg.quick``)."""
    c = apply_quick(cfg) if cfg.quick else cfg
    return stage_key(sft_stage_settings(c), {})


def reward_stage_key(cfg: DemoConfig) -> str:
    """The key :func:`run` gives its reward stage for ``cfg`` (after SFT and pairs): a demo directory
    whose reward stage finished with it needs no ``run(cfg, stop_after="reward")``."""
    c = apply_quick(cfg) if cfg.quick else cfg
    up = {"sft": sft_stage_key(c)}
    up["pairs"] = stage_key(pairs_stage_settings(c), dict(up))
    return stage_key(reward_stage_settings(c), up)


# ---------------------------------------------------------------------------------------------
# the pipeline
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass
class DemoRun:
    """What the stages of one ``fourfold demo`` invocation share."""

    cfg: DemoConfig
    """The demo's config, ``--quick`` applied."""
    out: Path
    """The run directory (``run.output_dir``)."""
    task: Any
    """The review task with ``cfg.task_options``."""
    stages: Stages
    """The stage cache of ``out``."""
    log: Callable[..., None]
    """The console (rich markup, on stdout, where every line of a run goes: :mod:`fourfold.sinks`)."""
    t_start: float
    """``time.perf_counter()`` when the run started."""

    @classmethod
    def start(cls, cfg: DemoConfig) -> DemoRun:
        """Apply ``--quick``, quiet transformers, set torch's threads, create the run directory and
        write its ``config.yaml``."""
        from rich.console import Console

        from fourfold.run.common import quiet_transformers
        from fourfold.tasks import get_task

        if cfg.quick:
            cfg = apply_quick(cfg)
        console = Console(soft_wrap=True)
        quiet_transformers()
        if cfg.run.threads is not None:
            torch.set_num_threads(cfg.run.threads)
        out = Path(cfg.run.output_dir)
        out.mkdir(parents=True, exist_ok=True)
        save_config(cfg, out / "config.yaml")
        t_start = time.perf_counter()
        return cls(cfg, out, get_task("review", **cfg.task_options), Stages(out, cfg.fresh), console.print, t_start)

    @property
    def seed(self) -> int:
        return self.cfg.run.seed

    @property
    def data(self) -> Path:
        """The stages' data files, in the user-facing formats."""
        return self.out / "data"

    @property
    def max_len(self) -> int:
        return self.cfg.model.max_positions

    def sub_run(self, d: Path, save_every: int | None = None) -> RunConfig:
        """The ``run`` section of a trainer stage writing into its stage directory ``d``: it resumes
        the stage's newest checkpoint (a killed demo continues), else starts over there."""
        run = self.cfg.run
        resume = bool(checkpoint_dirs(d))
        return RunConfig(output_dir=str(d), seed=self.seed, device=run.device, threads=run.threads,
                         save_every=run.save_every if save_every is None else save_every, keep_checkpoints=2,
                         resume=resume, overwrite=not resume, progress=run.progress, tensorboard=run.tensorboard,
                         concurrent_roles=run.concurrent_roles, report_to=run.report_to,
                         samples_every=run.samples_every)


def stage_sft(demo: DemoRun, d: Path) -> dict:
    """1. corpus, tokenizer, SFT from scratch -> ``sft/`` (the reference)."""
    from fourfold.tasks.tokenizer import build_word_tokenizer
    from fourfold.trainers import sft as sft_trainer

    cfg, out, data, seed = demo.cfg, demo.out, demo.data, demo.seed
    rng = random.Random(stream_seed(seed, "sft_corpus"))
    write_jsonl(data / "sft_train.jsonl", demo.task.sft_examples(cfg.sft.examples, rng))
    write_jsonl(data / "sft_eval.jsonl", demo.task.sft_examples(500, random.Random(stream_seed(seed, "sft_eval"))))
    build_word_tokenizer(demo.task.tokenizer_corpus(), out / "tokenizer")
    sft_cfg = SFTConfig(
        model=InitModelConfig(from_scratch=True, tokenizer=str(out / "tokenizer"), hidden_size=cfg.model.hidden_size,
                              num_layers=cfg.model.num_layers, num_heads=cfg.model.num_heads,
                              max_positions=cfg.model.max_positions),
        data=SFTDataConfig(train=str(data / "sft_train.jsonl"), eval=str(data / "sft_eval.jsonl")),
        train=TrainLoopConfig(max_steps=cfg.sft.steps, batch_size=cfg.sft.batch_size, lr=cfg.sft.lr,
                              warmup_steps=max(1, cfg.sft.steps // 20), max_len=demo.max_len, log_every=25),
        run=demo.sub_run(d, save_every=max(50, cfg.sft.steps // 6)),
    )
    res = sft_trainer.train(sft_cfg)
    copy_into_place(Path(res["model"]), out / "sft")
    return {"eval_loss": res["final"].get("sft/eval_loss")}


def stage_pairs(demo: DemoRun, d: Path) -> dict:
    """2. response pairs from the SFT model, labelled by the simulated labelers."""
    from fourfold.models.build import load_saved

    cfg, task, data, temperature = demo.cfg, demo.task, demo.data, demo.cfg.pairs.temperature
    sft = load_saved(str(demo.out / "sft"), policy=str(demo.out / "sft"))  # checked by the one loader
    tok, model = sft.tokenizer, sft.policy
    torch.manual_seed(stream_seed(demo.seed, "pairs"))
    rng = random.Random(stream_seed(demo.seed, "pairs"))
    prompts = task.sample_prompts(cfg.pairs.pairs + cfg.pairs.eval_pairs, rng)
    engine = sample_engine(cfg.generation)  # generation.engine: the pairs are sampled as PPO samples
    a, _ = sample_texts(model, tok, prompts, max_new_tokens=cfg.generation.max_new_tokens, temperature=temperature,
                        engine=engine)
    b, _ = sample_texts(model, tok, prompts, max_new_tokens=cfg.generation.max_new_tokens, temperature=temperature,
                        engine=engine)
    rows = _labelled_rows(task, prompts, a, b, rng)
    n_eval = min(cfg.pairs.eval_pairs, len(rows) // 5)
    slips, slips_eval = _slip_pairs(task, model, tok, cfg, demo.seed)
    write_jsonl(data / "preferences_eval.jsonl", rows[:n_eval])
    write_jsonl(data / "preferences.jsonl", rows[n_eval:] + slips)
    write_jsonl(data / "preferences_eval_slips.jsonl", slips_eval)
    agree = [x["gold_chosen"] > x["gold_rejected"] for x in rows if x["gold_chosen"] != x["gold_rejected"]]
    longer = [len(x["chosen"].split()) > len(x["rejected"].split()) for x in rows
              if len(x["chosen"].split()) != len(x["rejected"].split())]
    return {"pairs": len(rows) - n_eval, "eval_pairs": n_eval, "slip_pairs": len(slips),
            "slip_eval_pairs": len(slips_eval),
            "slips_labels_choose_intact": sum(x["chosen"] == x["intact"] for x in slips_eval) / max(1, len(slips_eval)),
            "labels_agree_with_gold": sum(agree) / max(1, len(agree)),
            "labels_prefer_longer": sum(longer) / max(1, len(longer))}


def stage_reward(demo: DemoRun, d: Path) -> dict:
    """3. the reward model, initialised from SFT -> ``reward/``; its accuracy on held-out pairs
    against the labelers and against the hidden gold reward, and on the one-slip pairs."""
    from fourfold.models.build import load_saved
    from fourfold.trainers import reward as reward_trainer

    cfg, out, data = demo.cfg, demo.out, demo.data
    init = out / "sft"
    if cfg.reward.extra_layers:  # a deeper RM, grown from the SFT model (same function at the start)
        init = d / "init"
        if not (init / "config.json").is_file():
            _grow_sft(out / "sft", init, cfg.reward.extra_layers, stream_seed(demo.seed, "rm_growth"))
    lora = cfg.lora if cfg.lora is not None and cfg.lora.reward else None
    rm_cfg = RewardConfig(
        model=InitModelConfig(path=str(init), lora=None if lora is None else lora.adapter()),
        data=PreferenceDataConfig(train=str(data / "preferences.jsonl"), eval=str(data / "preferences_eval.jsonl")),
        train=TrainLoopConfig(max_steps=cfg.reward.steps, batch_size=cfg.reward.batch_size,
                              lr=cfg.reward.lr * (1.0 if lora is None else lora.lr_multiplier),
                              warmup_steps=max(1, cfg.reward.steps // 20), max_len=demo.max_len, log_every=25),
        reward=RewardLossConfig(normalize=True),
        run=demo.sub_run(d, save_every=max(50, cfg.reward.steps // 4)),
    )
    res = reward_trainer.train(rm_cfg)
    copy_into_place(Path(res["model"]), out / "reward")
    if "adapter" in res:  # LoRA: PPO loads the adapter onto its one base
        copy_into_place(Path(res["adapter"]), out / "reward-adapter")
    saved = load_saved(str(out / "reward"), reward=str(out / "reward"))  # checked by the one loader
    rm, tok = saved.reward_model, saved.tokenizer
    result = {**pair_accuracy(rm, tok, data / "preferences_eval.jsonl", demo.max_len),
              "eval_loss": res["final"].get("rm/eval_loss")}
    slips_file = data / "preferences_eval_slips.jsonl"
    if slips_file.is_file() and slips_file.stat().st_size > 0:  # none asked for (or a run cached before)
        slips = pair_accuracy(rm, tok, slips_file, demo.max_len)
        result.update({f"slips_{k}": v for k, v in slips.items()})
    return result


def stage_ppo(demo: DemoRun, d: Path) -> dict:
    """4. PPO against the frozen RM, KL to the frozen SFT reference, critic from the RM."""
    from fourfold.tasks import task_probe
    from fourfold.trainers import ppo as ppo_trainer

    n_prompts = max(1024, 2 * demo.cfg.ppo.rollout_batch_size)
    prompt_rng = random.Random(stream_seed(demo.seed, "ppo_prompts"))
    write_jsonl(demo.data / "ppo_prompts.jsonl", [{"prompt": p} for p in demo.task.sample_prompts(n_prompts, prompt_rng)])
    ppo_cfg = ppo_stage_config(demo.cfg, demo.out, demo.data / "ppo_prompts.jsonl", demo.sub_run(d))
    res = ppo_trainer.train(ppo_cfg, probe=task_probe(demo.task))
    copy_into_place(Path(res["policy"]), demo.out / "policy")
    copy_into_place(d / "critic", demo.out / "critic")
    return {"final": {k: v for k, v in res["final"].items() if k.startswith(("reward/", "kl/", "rollout/"))}}


def stage_eval(demo: DemoRun, d: Path) -> dict:
    """5. before/after evaluation on held-out prompts -> ``eval.json``."""
    out, gen = demo.out, demo.cfg.generation
    torch.manual_seed(stream_seed(demo.seed, "eval_sampling"))
    roles = load_eval_roles(str(out / "sft"), str(out / "reward"), policy=str(out / "policy"))  # loading draws no RNG
    ref, rm, tok = roles.reference, roles.reward_model, roles.tokenizer
    prompts = demo.task.sample_prompts(demo.cfg.eval.prompts, random.Random(stream_seed(demo.seed, "eval_prompts")))
    before, rows_b = evaluate_policy(ref.model, ref, rm, tok, demo.task, prompts, gen)
    after, rows_a = evaluate_policy(roles.policy, ref, rm, tok, demo.task, prompts, gen)
    sd = max(before["gold_std"], 1e-6)
    result = {"sft": before, "ppo": after, "gold_gain_sd": (after["gold"] - before["gold"]) / sd,
              "proxy_gain_sd": (after["proxy"] - before["proxy"]) / max(before["proxy_std"], 1e-6)}
    write_text_atomic(out / "eval.json", json.dumps(result, indent=2, sort_keys=True))
    write_jsonl(d / "samples.jsonl", [{"model": "sft", **x} for x in rows_b] + [{"model": "ppo", **x} for x in rows_a])
    return result


def write_run_metrics(demo: DemoRun, r_eval: dict) -> None:
    """The run's ``metrics.jsonl``: every trainer stage's rows and the two evaluations, tagged ``stage``."""
    from fourfold.reporting import read_metrics

    rows = []
    for name in ("sft", "reward", "ppo"):
        for row in read_metrics(demo.stages.dir(name) / "metrics.jsonl"):
            rows.append({"stage": name, **row})
    for name in ("sft", "ppo"):
        rows.append({"stage": "eval", "model": name, **{k: v for k, v in r_eval[name].items()}})
    write_jsonl(demo.out / "metrics.jsonl", rows)


def _log_outcome(demo: DemoRun, r_eval: dict) -> None:
    b, a = r_eval["sft"], r_eval["ppo"]
    demo.log(f"\n[bold]SFT -> PPO on {demo.cfg.eval.prompts} held-out prompts[/bold]")
    for k in ("proxy", "gold", "kl", "length", "well_formed", "repetition"):
        demo.log(f"    {k:12s} {fmt_fixed(b[k]):>8s} -> {fmt_fixed(a[k]):>8s}")
    demo.log("    (kl: nats per response, the k1 estimate, unbiased: its mean over a sample can fall below 0)")
    demo.log(f"    gold gain: {r_eval['gold_gain_sd']:+.2f} SFT standard deviations")
    demo.log(f"\nreport: {demo.out / 'report.html'}   ({time.perf_counter() - demo.t_start:.0f}s)")


def run(cfg: DemoConfig, *, stop_after: str | None = None) -> dict:
    """Run the pipeline; ``stop_after="reward"`` stops once SFT, pairs and the reward model exist
    (``fourfold experiments`` starts every arm from those cached stages)."""
    made = provenance()  # the checkout these numbers come from, as the run starts
    demo = DemoRun.start(cfg)
    cfg, out, log, lora = demo.cfg, demo.out, demo.log, demo.cfg.lora
    log("[bold]1/6 SFT[/bold] corpus -> tokenizer -> SFT from scratch")
    r_sft = demo.stages.run("sft", sft_stage_settings(cfg), partial(stage_sft, demo), log)
    log(f"    SFT model: {out / 'sft'} (held-out loss {fmt_number(r_sft.get('eval_loss'))})")
    log("[bold]2/6 pairs[/bold] SFT samples -> simulated labelers -> preference data")
    r_pairs = demo.stages.run("pairs", pairs_stage_settings(cfg), partial(stage_pairs, demo), log)
    log(f"    {r_pairs['pairs']} pairs in {demo.data / 'preferences.jsonl'}; labels agree with gold on "
        f"{r_pairs['labels_agree_with_gold']:.0%}, prefer the longer response {r_pairs['labels_prefer_longer']:.0%}")
    log("[bold]3/6 reward model[/bold] Bradley-Terry on the labels"
        + (f" (SFT model + {cfg.reward.extra_layers} layers)" if cfg.reward.extra_layers else "")
        + (f" (LoRA r={lora.r} on the SFT model)" if lora is not None and lora.reward else ""))
    r_rm = demo.stages.run("reward", reward_stage_settings(cfg), partial(stage_reward, demo), log)
    log(f"    RM: {out / 'reward'}; held-out accuracy vs labelers {r_rm['accuracy_vs_labelers']:.1%}, "
        f"vs gold {r_rm['accuracy_vs_gold']:.1%}")
    if stop_after == "reward":
        return {"output_dir": str(out), "sft": str(out / "sft"), "reward": str(out / "reward"),
                "tokenizer": str(out / "tokenizer"), "data": str(demo.data), "sft_result": r_sft,
                "pairs": r_pairs, "reward_result": r_rm}
    log("[bold]4/6 PPO[/bold] policy vs frozen RM, KL to the frozen SFT reference"
        + (f" (LoRA r={lora.r}{', one base for all four roles' if lora.reward else ''})" if lora else ""))
    demo.stages.run("ppo", ppo_stage_settings(cfg), partial(stage_ppo, demo), log)
    log("[bold]5/6 eval[/bold] SFT vs PPO on held-out prompts")
    r_eval = demo.stages.run("eval", eval_stage_settings(cfg), partial(stage_eval, demo), log)
    write_run_metrics(demo, r_eval)

    from fourfold.apps.demo.report import write_report  # 6. cheap: always rewritten from the run directory

    log("[bold]6/6 report[/bold]")
    write_report(out, task=demo.task, summary={"sft": r_sft, "pairs": r_pairs, "reward": r_rm, "eval": r_eval})
    write_provenance(out, made)  # the commit and machine of these numbers (fourfold.apps.publish reads it)
    _log_outcome(demo, r_eval)
    return {"output_dir": str(out), "eval": r_eval, "reward": r_rm, "pairs": r_pairs}


def _grow_sft(sft: Path, dst: Path, extra_layers: int, seed: int) -> None:
    """``dst``: the SFT model with ``extra_layers`` more decoder layers that start as no-ops, and
    its tokenizer (an HF directory the reward trainer initialises from)."""
    from fourfold.models.factory import grow_layers
    from fourfold.models.loading import load_causal_lm, load_tokenizer

    grown = grow_layers(load_causal_lm(str(sft), device="cpu"), extra_layers, seed=seed)
    tok = load_tokenizer(str(sft))

    def save(tmp: Path) -> None:
        grown.save_pretrained(tmp)
        tok.save_pretrained(tmp)

    save_pretrained_atomic(save, dst)


def _slip_pairs(task, model, tokenizer, cfg: DemoConfig, seed: int) -> tuple[list[dict], list[dict]]:
    """Minimal pairs ``(train, held_out)``: an SFT sample to a fresh prompt against the same sample
    with one slip (``task.slip``: a word substituted, swapped, dropped or repeated), labelled by the
    same simulated labelers. The held-out ones (``pairs.slip_eval_pairs``) measure whether the
    reward model sees grammar at all; ``pairs.slip_pairs`` more are added to its training data.
    Each set has its own random streams, so neither changes with the other's size, and the
    natural pairs change with neither."""
    return (_slip_rows(task, model, tokenizer, cfg, cfg.pairs.slip_pairs, stream_seed(seed, "slip_pairs")),
            _slip_rows(task, model, tokenizer, cfg, cfg.pairs.slip_eval_pairs, stream_seed(seed, "slip_eval_pairs")))


def _slip_rows(task, model, tokenizer, cfg: DemoConfig, n: int, seed: int) -> list[dict]:
    if n == 0:
        return []
    rng = random.Random(seed)
    torch.manual_seed(seed)
    prompts = task.sample_prompts(n, rng)
    intact, _ = sample_texts(model, tokenizer, prompts, max_new_tokens=cfg.generation.max_new_tokens,
                             temperature=cfg.pairs.temperature, engine=sample_engine(cfg.generation))
    slipped = [task.slip(r, rng) for r in intact]
    return _labelled_rows(task, prompts, intact, [e for e, _ in slipped], rng,
                          extra=[{"intact": x, "slip": kind} for x, (_, kind) in zip(intact, slipped)])


def _labelled_rows(task, prompts: list[str], a: list[str], b: list[str], rng: random.Random,
                   extra: list[dict] | None = None) -> list[dict]:
    """Preference rows (the reward stage's format, plus each side's gold) for the pairs
    ``(a[i], b[i])`` as the task's labelers choose, with ``extra[i]`` merged into row ``i``.
    Identical or empty pairs carry no preference and are left out."""
    labels = task.label_pairs(prompts, a, b, rng)
    gold_a, gold_b = task.gold_reward(prompts, a), task.gold_reward(prompts, b)
    rows = []
    for i, (p, x, y, lab, ga, gb) in enumerate(zip(prompts, a, b, labels, gold_a, gold_b)):
        if x == y or not x or not y:
            continue
        chosen, rejected = (x, y) if lab == 0 else (y, x)
        g_c, g_r = (ga, gb) if lab == 0 else (gb, ga)
        rows.append({"prompt": p, "chosen": chosen, "rejected": rejected, "gold_chosen": g_c, "gold_rejected": g_r,
                     **(extra[i] if extra else {})})
    return rows

