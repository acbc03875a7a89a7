"""Reward-model training: a Bradley-Terry scalar model from preference pairs.

The reward model is a :class:`~fourfold.models.roles.ScalarModel` (backbone + linear head); a pair
is scored at the last non-pad token of ``prompt + chosen + EOS`` and of ``prompt + rejected + EOS``
(the same position and layout PPO scores its responses at). One step, as numbered in :func:`train`:

1. the next batch of pair indices from a seeded, resumable :class:`~fourfold.data.EpochSampler`;
   chosen and rejected right-padded to one common length (the batch's longest row) and stacked into
   one ``[2N, L]`` forward;
2. scores ``[2N]`` at each row's last valid token, split into chosen ``[N]`` and rejected ``[N]``;
3. :func:`fourfold.core.bradley_terry_loss` ``-log sigmoid(r_c - r_r - margin)``, backward,
   global-norm clip, AdamW step (skipped when the loss or the gradient norm is not finite), LR schedule;
4. a metrics row every ``train.log_every`` steps (means since the previous row) and held-out loss /
   accuracy every ``train.eval_every`` steps and at the end;
5. a checkpoint every ``run.save_every`` steps, at the end, and on SIGTERM/SIGINT (then exit).

After the loop, with ``reward.normalize``, the scores of all training responses (chosen and
rejected) are measured and ``score' = (score - mean) / std`` is folded into the model
(:meth:`ScalarModel.set_affine`), so PPO sees rewards of mean 0 and std 1 on that reference set.
The run writes ``output_dir/model/``: an ``AutoModelForSequenceClassification`` directory
(``num_labels=1``) with the tokenizer. Llama's head has no bias, so the normalisation's shift is kept
in ``config.json`` as ``fourfold_score_shift``: :func:`~fourfold.models.loading.load_sequence_scorer`
plus ``ScalarModel`` reproduce the normalised scores; plain transformers' logits omit the shift.
With ``model.lora`` only LoRA adapters and the head train (checkpoints hold those); ``model/`` is then
the merged model and ``model-adapter/`` the LoRA reward-model directory that ``fourfold ppo`` with
``model.lora`` loads as an adapter on the same base (:mod:`fourfold.models.lora`).
"""

from __future__ import annotations

import math
import time
from typing import Optional

import torch

from fourfold import dist
from fourfold.config import InitModelConfig, RewardConfig
from fourfold.core import bradley_terry_loss
from fourfold.data import EpochSampler, PreferenceExample, collate_preferences
from fourfold.models.checks import checker
from fourfold.models.factory import llama_config, random_scalar_model
from fourfold.models.loading import ensure_pad_embedding, load_sequence_scorer, load_tokenizer
from fourfold.models.lora import LoraScalarModel, lora_scalar_model
from fourfold.models.lora_export import TrainedParameters
from fourfold.models.roles import ScalarModel
from fourfold.trainers.common import (
    global_sums,
    global_weight,
    guarded_step,
    last_metrics_row,
    local_rows,
    make_optimizer,
    make_schedule,
    num_steps,
    require_batch,
    track_steps,
)
from fourfold.trainers.fsdp import reshard, shard_roles
from fourfold.trainers.lora import lora_settings, save_trained
from fourfold.trainers.memory import apply_model_levers, trained_dtype
from fourfold.trainers.pairs import load_examples
from fourfold.trainers.scaffold import RunScaffold

_WINDOW_KEYS = ("steps", "good_steps", "loss", "correct", "pairs", "margin", "score_sum", "score_sq",
                "scores", "grad_norm", "seconds")


# ---------------------------------------------------------------------------------------------
# set-up pieces
# ---------------------------------------------------------------------------------------------


def load_model(model_cfg: InitModelConfig, device: torch.device) -> tuple[object, ScalarModel]:
    """(tokenizer with a dedicated pad, ScalarModel on ``device``).

    A reward-model directory keeps its head; a causal-LM directory keeps its backbone and gets a
    fresh head drawn from N(0, 0.02^2); ``from_scratch`` builds a random-init Llama of the configured
    sizes over the tokenizer's vocabulary. With ``model.lora`` it is a
    :class:`~fourfold.models.lora.LoraScalarModel` over the frozen model.
    """
    tok = load_tokenizer(model_cfg.tokenizer or model_cfg.path, trust_remote_code=model_cfg.trust_remote_code)
    if model_cfg.from_scratch:
        config = llama_config(
            len(tok), model_cfg.hidden_size, model_cfg.num_layers, model_cfg.num_heads,
            model_cfg.intermediate_size, model_cfg.max_positions,
            pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
        )
        rm = ScalarModel(random_scalar_model(config, dtype=trained_dtype(model_cfg)))
        fresh_head = True
    else:
        rm = ScalarModel(load_sequence_scorer(model_cfg.path, dtype=trained_dtype(model_cfg),
                                              trust_remote_code=model_cfg.trust_remote_code))
        archs = getattr(rm.config, "architectures", None) or []
        fresh_head = not any(a.endswith("ForSequenceClassification") for a in archs)
        checker(tok, model_cfg).scorer(rm.hf, "model.path", model_cfg.path, head_required=not fresh_head)
    if fresh_head:
        rm.reset_head("normal")  # global RNG: seeded by the caller
    ensure_pad_embedding(rm.hf, tok)
    rm = rm.to(device)
    settings = lora_settings(model_cfg.lora)  # LoRA: adapters and the head train, the backbone is frozen
    return tok, (rm if settings is None else lora_scalar_model(rm, settings))


def pair_scores(rm: ScalarModel, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Steps 1-2: (chosen [N], rejected [N]) scores from one stacked ``[2N, L]`` forward."""
    ids = torch.cat([batch["chosen_input_ids"], batch["rejected_input_ids"]])  # (2N, L)
    mask = torch.cat([batch["chosen_attention_mask"], batch["rejected_attention_mask"]])  # (2N, L)
    scores = rm.score(ids, mask)  # (2N,) at each row's last valid token (the EOS)
    n = batch["chosen_input_ids"].shape[0]
    return scores[:n], scores[n:]


def to_device(batch: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    return {k: v.to(device, non_blocking=True) for k, v in batch.items()}


@torch.no_grad()
def score_pairs(rm: ScalarModel, examples: list[PreferenceExample], batch_size: int, pad_id: int,
                device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(chosen [N], rejected [N]) scores of all ``examples``, in order, on the CPU."""
    was_training = rm.training
    rm.eval()
    chosen, rejected = [], []
    for start in range(0, len(examples), batch_size):
        batch = to_device(collate_preferences(examples[start : start + batch_size], pad_id), device)
        c, r = pair_scores(rm, batch)
        chosen.append(c.cpu())
        rejected.append(r.cpu())
    rm.train(was_training)
    return torch.cat(chosen), torch.cat(rejected)


def evaluate(rm: ScalarModel, examples: list[PreferenceExample], batch_size: int, pad_id: int,
             device: torch.device, margin: Optional[float]) -> dict[str, float]:
    """Held-out Bradley-Terry loss and accuracy (r_chosen > r_rejected strictly) over all pairs."""
    chosen, rejected = score_pairs(rm, examples, batch_size, pad_id, device)
    loss, stats = bradley_terry_loss(chosen, rejected, margin)
    return {"rm/eval_loss": float(loss), "rm/eval_accuracy": float(stats["accuracy"])}


@torch.no_grad()
def normalize(rm: ScalarModel, examples: list[PreferenceExample], batch_size: int, pad_id: int,
              device: torch.device) -> dict[str, float]:
    """Fold ``(score - mean) / std`` over all training responses (chosen and rejected) into ``rm``.
    Returns the raw mean and (population) std. A constant scorer (std ~ 0) is only shifted."""
    chosen, rejected = score_pairs(rm, examples, batch_size, pad_id, device)
    scores = torch.cat([chosen, rejected]).double()
    mean, std = float(scores.mean()), float(scores.std(correction=0))
    scale = 1.0 / std if std > 1e-6 else 1.0
    reshard(rm)  # sharded: the head's own shard takes the affine, not a gathered copy
    rm.set_affine(scale, -mean * scale)
    return {"mean": mean, "std": std}


_FIGURES = ("loss", "correct", "pairs", "margin", "score_sum", "score_sq", "scores")


def step_figures(loss: torch.Tensor, stats: dict, chosen: torch.Tensor, rejected: torch.Tensor, counted: int,
                 world) -> tuple[torch.Tensor, dict]:
    """(the loss to backpropagate, the step's figures for the metrics window: the mean loss and
    margin, the correct pairs, the pairs, and the sum, sum of squares and count of the scores).
    In one process those of the batch; under torchrun those of the whole global batch (sums over
    the ranks, means over all pairs) and each rank's share of the global mean loss
    (:func:`~fourfold.trainers.common.global_weight`). ``counted``: 0 when this rank's pair does not
    count."""
    both = torch.cat([chosen, rejected]).detach().double()
    n = chosen.shape[0]
    figures = {"loss": float(loss.detach()), "correct": float(stats["accuracy"]) * n, "pairs": n,
               "margin": float(stats["margin_mean"]), "score_sum": float(both.sum()),
               "score_sq": float((both * both).sum()), "scores": both.numel()}
    if not world.distributed:
        return loss, figures
    n = n if counted else 0
    local = [figures[k] * n if k in ("loss", "margin") else figures[k] * bool(counted) for k in _FIGURES]
    totals = dict(zip(_FIGURES, global_sums(local)))
    for k in ("loss", "margin"):
        totals[k] = totals[k] / totals["pairs"] if totals["pairs"] else 0.0
    return loss * global_weight(n, totals["pairs"]), totals


def _add_step(window: dict, figures: dict, grad_norm: Optional[float], seconds: float) -> None:
    """Add one step's :func:`step_figures` to the metrics window (``grad_norm`` None: the update
    was skipped)."""
    window["steps"] += 1
    window["good_steps"] += int(grad_norm is not None)
    for key in _FIGURES:
        window[key] += figures[key]
    window["grad_norm"] += grad_norm if grad_norm is not None else 0.0
    window["seconds"] += seconds


def _window_row(window: dict) -> dict:
    """Means over the steps (and pairs, and scores) since the previous metrics row."""
    steps, n = max(window["steps"], 1), max(window["scores"], 1)
    mean = window["score_sum"] / n
    var = max(window["score_sq"] / n - mean * mean, 0.0)
    return {
        "rm/loss": window["loss"] / steps,
        "rm/accuracy": window["correct"] / max(window["pairs"], 1),
        "rm/margin": window["margin"] / steps,
        "rm/score_mean": mean,
        "rm/score_std": math.sqrt(var),
        "rm/grad_norm": window["grad_norm"] / window["good_steps"] if window["good_steps"] else float("nan"),
        "time/step_s": window["seconds"] / steps,
    }


# ---------------------------------------------------------------------------------------------
# the loop
# ---------------------------------------------------------------------------------------------


def _set_up(cfg: RewardConfig, run: RunScaffold, device: torch.device):
    """(tokenizer, reward model (sharded under torchrun), (training pairs, held-out pairs or None,
    skipped rows)), after the batch-size checks (it divides by the world, it fits the data)."""
    tc = cfg.train
    dist.check_divisible("train.batch_size", tc.batch_size, run.world)
    tok, rm = load_model(cfg.model, device)
    apply_model_levers(rm, cfg.model, device)
    shard_roles({"model": rm}, cfg.dist, device)  # torchrun: FSDP2 (before the optimizer sees the parameters)
    train_ex, eval_ex, skipped = load_examples(cfg, tok)
    require_batch(tc.batch_size, len(train_ex), f"training pairs from {cfg.data.train}"
                  + (" (after holding out data.eval_fraction)" if cfg.data.eval is None and eval_ex else ""))
    return tok, rm, (train_ex, eval_ex, skipped)


def train(cfg: RewardConfig) -> dict:
    """Train a reward model; returns ``{"output_dir", "model", "final": last metrics row (with
    rm/eval_* when there is a held-out split), "normalization": {"mean", "std"} or None}``."""
    tc, margin = cfg.train, cfg.reward.margin
    # 0. set-up: seed, run directory, model, data (split and tokenised once), optimiser, resume
    run = RunScaffold(cfg)
    device = run.hf_device()
    tok, rm, (train_ex, eval_ex, skipped) = _set_up(cfg, run, device)
    sampler = EpochSampler(len(train_ex), tc.batch_size, seed=cfg.run.seed)
    total = num_steps(tc.max_steps, tc.epochs, len(sampler))
    opt = make_optimizer(rm.hf.parameters(), tc.lr, tc.weight_decay)
    sched = make_schedule(opt, total, tc.lr_schedule, tc.warmup_steps)
    window = dict.fromkeys(_WINDOW_KEYS, 0.0)
    tracked = TrainedParameters(rm.hf) if isinstance(rm, LoraScalarModel) else rm.hf  # LoRA: no frozen base
    start = track_steps(run, "reward_model", tracked, opt, sched, sampler, window)
    rm.train()
    pad_id = tok.pad_token_id
    batches = sampler.batches()
    last: dict = {}
    stats_norm = None
    with run.loop(total=total, desc="reward", key_metrics=("rm/loss", "rm/eval_accuracy")) as logger:
        if skipped and run.resumed_step is None:
            logger.warn(f"{len(skipped)} bad rows skipped (data.on_error=skip); first: {skipped[0]}", step=0)
        for step in range(start + 1, total + 1):
            t0 = time.perf_counter()
            where = f"step {step}"
            # 1-2. batch (this rank's part under torchrun; chosen and rejected stacked) and scores
            rows, counted = local_rows(next(batches), run.world)
            batch = to_device(collate_preferences([train_ex[i] for i in rows], pad_id), device)
            chosen, rejected = pair_scores(rm, batch)
            # 3. Bradley-Terry loss, backward, clip, guarded AdamW step, schedule
            loss, stats = bradley_terry_loss(chosen, rejected, margin)
            loss, figures = step_figures(loss, stats, chosen, rejected, counted, run.world)
            lr = opt.param_groups[0]["lr"]  # the rate this step uses
            grad_norm, good = guarded_step(rm.hf, opt, sched, tc.max_grad_norm, run.guard, where,
                                           [(loss, {"rm_loss": torch.tensor(figures["loss"])})])
            if good:
                run.guard.good_step()
            run.log_skips(step)
            _add_step(window, figures, grad_norm if good else None, time.perf_counter() - t0)
            run.stop_if_stuck(step)
            # 4. metrics (means since the previous row) and held-out loss / accuracy
            row: dict = {}
            if step % tc.log_every == 0 or step == total:
                row.update(_window_row(window), **{"rm/lr": lr, "train/nonfinite_skips": run.guard.total})
                window.update(dict.fromkeys(_WINDOW_KEYS, 0.0))  # the same dict: checkpoints read it
            if eval_ex is not None and ((tc.eval_every and step % tc.eval_every == 0) or step == total):
                row.update(evaluate(rm, eval_ex, tc.batch_size, pad_id, device, margin))
            if row:
                logger.log(step, row)
                last = row
            # 5. checkpoint (every save_every steps, at the end, and when asked to stop)
            run.checkpoint_if_due(step, final=step == total)
        # normalise on the training responses (after the last checkpoint: a resume never sees it)
        if cfg.reward.normalize:
            stats_norm = normalize(rm, train_ex, tc.batch_size, pad_id, device)
            logger.event("normalize", step=total, **stats_norm)
        # the final model, loadable with plain transformers (AutoModelForSequenceClassification;
        # LoRA: merged, and the adapter beside)
        written = save_trained(run, rm, tok, run.out / "model")
    if not last:  # resumed a run that had already finished: report its last row
        last = last_metrics_row(run.out)
    run.done("reward", model=run.out / "model")
    return {"output_dir": str(run.out), **written, "final": last, "normalization": stats_norm}
