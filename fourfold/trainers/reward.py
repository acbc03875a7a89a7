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
With ``model.lora`` only a LoRA adapter and the head train (checkpoints hold those): the reward model
is an :class:`~fourfold.models.lora.AdapterScalarModel`, the type PPO loads, on the backbone of the
model it starts from; ``model/`` is then the merged model and ``model-adapter/`` the LoRA reward-model
directory that ``fourfold ppo`` with ``model.lora`` loads as an adapter on the same base
(:mod:`fourfold.models.lora.files`).

Steps 1, 3, 4 and 5 are the supervised loop's (:mod:`fourfold.trainers.supervised`); this module
holds the data set-up, the scores and loss (step 2), the metrics and the normalisation.
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from fourfold.config import RewardConfig
from fourfold.core import bradley_terry_loss
from fourfold.data import PreferenceExample, collate_preferences, to_device
from fourfold.run.export import save_trained
from fourfold.run.fsdp import reshard
from fourfold.run.parallel import Figures, map_batches
from fourfold.run.scaffold import RunScaffold
from fourfold.trainers.pairs import load_examples
from fourfold.trainers.prelude import stage_roles
from fourfold.trainers.supervised import SupervisedSteps, Window, require_batch

FIGURES = ("loss", "margin", "correct", "pairs", "score_sum", "score_sq", "scores")


# ---------------------------------------------------------------------------------------------
# set-up pieces
# ---------------------------------------------------------------------------------------------


def pair_scores(rm, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Steps 1-2: (chosen [N], rejected [N]) scores from one stacked ``[2N, L]`` forward."""
    ids = torch.cat([batch["chosen_input_ids"], batch["rejected_input_ids"]])  # (2N, L)
    mask = torch.cat([batch["chosen_attention_mask"], batch["rejected_attention_mask"]])  # (2N, L)
    scores = rm.score(ids, mask)  # (2N,) at each row's last valid token (the EOS)
    n = batch["chosen_input_ids"].shape[0]
    return scores[:n], scores[n:]


@torch.no_grad()
def score_pairs(rm, examples: list[PreferenceExample], batch_size: int, pad_id: int,
                device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(chosen [N], rejected [N]) scores of all ``examples``, in order, on the CPU; under torchrun
    each rank scores its share of the batches (:func:`~fourfold.run.parallel.map_batches`)."""
    was_training = rm.training
    rm.eval()

    def scores(pairs: list[PreferenceExample]) -> tuple[torch.Tensor, torch.Tensor]:
        c, r = pair_scores(rm, to_device(collate_preferences(pairs, pad_id), device))
        return c.cpu(), r.cpu()

    parts = map_batches(scores, examples, batch_size)
    rm.train(was_training)
    return torch.cat([c for c, _ in parts]), torch.cat([r for _, r in parts])


def evaluate(rm, examples: list[PreferenceExample], batch_size: int, pad_id: int,
             device: torch.device, margin: Optional[float]) -> dict[str, float]:
    """Held-out Bradley-Terry loss and accuracy (r_chosen > r_rejected strictly) over all pairs."""
    chosen, rejected = score_pairs(rm, examples, batch_size, pad_id, device)
    loss, stats = bradley_terry_loss(chosen, rejected, margin)
    return {"rm/eval_loss": float(loss), "rm/eval_accuracy": float(stats["accuracy"])}


@torch.no_grad()
def normalize(rm, examples: list[PreferenceExample], batch_size: int, pad_id: int,
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


def step_loss(rm, batch: dict[str, torch.Tensor], margin: Optional[float]) -> tuple[torch.Tensor, Figures]:
    """Step 2 on this rank's pairs: the Bradley-Terry loss (their mean) and its figures (the loss and
    the mean margin, weighted by the pairs; the correct pairs, the pairs, and the sum, sum of squares
    and count of the scores)."""
    chosen, rejected = pair_scores(rm, batch)
    loss, stats = bradley_terry_loss(chosen, rejected, margin)
    both = torch.cat([chosen, rejected]).detach().double()
    n = chosen.shape[0]
    return loss, Figures({"loss": float(loss.detach()), "margin": float(stats["margin_mean"])},
                         {"correct": float(stats["accuracy"]) * n, "pairs": n, "score_sum": float(both.sum()),
                          "score_sq": float((both * both).sum()), "scores": both.numel()}, weight="pairs")


def window_row(window: Window) -> dict:
    """Means over the steps (and pairs, and scores) since the previous metrics row."""
    n = max(window["scores"], 1)
    mean = window["score_sum"] / n
    var = max(window["score_sq"] / n - mean * mean, 0.0)
    return {
        "rm/loss": window.per_step("loss"),
        "rm/accuracy": window["correct"] / max(window["pairs"], 1),
        "rm/margin": window.per_step("margin"),
        "rm/score_mean": mean,
        "rm/score_std": math.sqrt(var),
        "rm/grad_norm": window.mean_grad_norm(),
        "time/step_s": window.per_step("seconds"),
    }


# ---------------------------------------------------------------------------------------------
# the stage
# ---------------------------------------------------------------------------------------------


def _set_up(cfg: RewardConfig, run: RunScaffold, device: torch.device):
    """(tokenizer, reward model (sharded under torchrun), (training pairs, held-out pairs or None,
    skipped rows, warning lines on the data)), after the batch-size checks (it divides by the world, it fits the data)."""
    tc = cfg.train
    roles = stage_roles(run, "reward", cfg, device, {"train.batch_size": tc.batch_size})
    train_ex, eval_ex, skipped, notes = load_examples(cfg, roles.tokenizer)
    require_batch(tc.batch_size, len(train_ex), f"training pairs from {cfg.data.train}"
                  + (" (after holding out data.eval_fraction)" if cfg.data.eval is None and eval_ex else ""))
    return roles.tokenizer, roles.reward_model, (train_ex, eval_ex, skipped, notes)


def train(cfg: RewardConfig) -> dict:
    """Train a reward model; returns ``{"output_dir", "model", "final": last metrics row (with
    rm/eval_* when there is a held-out split), "normalization": {"mean", "std"} or None}``."""
    tc, margin = cfg.train, cfg.reward.margin
    # 0. set-up: seed, run directory, model, data (split and tokenised once), optimiser, resume
    run = RunScaffold(cfg)
    device = run.hf_device()
    tok, rm, (train_ex, eval_ex, skipped, notes) = _set_up(cfg, run, device)
    # a full reward model's checkpoint holds its HF model (keys as in its directory); LoRA: adapter and head
    steps = SupervisedSteps(run, rm, tc, len(train_ex), "reward_model", FIGURES, tracked=getattr(rm, "hf", rm))
    pad_id = tok.pad_token_id

    def step(rows: list) -> tuple[torch.Tensor, Figures]:
        return step_loss(rm, to_device(collate_preferences([train_ex[i] for i in rows], pad_id), device), margin)

    def held_out() -> dict:
        return evaluate(rm, eval_ex, tc.batch_size, pad_id, device, margin)

    stats_norm = None
    with steps.loop("reward", ("rm/loss", "rm/eval_accuracy"), skipped, notes) as logger:
        last = steps.run(logger, step=step, row=window_row, evaluate=held_out if eval_ex is not None else None,
                         check="rm_loss", lr_key="rm/lr")
        # normalise on the training responses (after the last checkpoint: a resume never sees it)
        if cfg.reward.normalize:
            stats_norm = normalize(rm, train_ex, tc.batch_size, pad_id, device)
            logger.event("normalize", step=steps.total, **stats_norm)
        # the final model, loadable with plain transformers (AutoModelForSequenceClassification;
        # LoRA: merged, and the adapter beside)
        written = save_trained(run, rm, tok, run.out / "model")
    return run.finish({"output_dir": str(run.out), **written, "final": last, "normalization": stats_norm},
                      model=run.out / "model")
