"""Supervised fine-tuning (SFT): next-token cross-entropy on the completion tokens only.

One step, as numbered in :func:`train`:

1. the next batch of example indices from a seeded, resumable :class:`~fourfold.data.EpochSampler`,
   right-padded to the batch's longest row (examples are tokenised once, up front);
2. forward; ``logits[:, :-1]`` predict ``input_ids[:, 1:]`` under the loss mask shifted the same
   way (1 on completion tokens and the EOS after them; 0 on BOS, prompt and padding);
3. :func:`fourfold.core.sft_loss` (mean over the batch's completion tokens), backward, global-norm
   clip and an AdamW step - skipped when the loss or the gradient norm is not finite - then the LR
   schedule (linear warm-up, then linear decay to 0 or constant);
4. a metrics row every ``train.log_every`` steps (means over the steps since the previous row) and
   the held-out loss on ``data.eval`` every ``train.eval_every`` steps and at the end;
5. a checkpoint every ``run.save_every`` steps, at the end, and on SIGTERM/SIGINT (then exit).

Tokenisation matches generation: a prompt is encoded exactly as
:func:`fourfold.data.tokenize_prompts` encodes it for PPO (BOS first, no other special tokens), so
the ids PPO generates after are the ids SFT trained on. The run writes ``output_dir/model/``, a
Hugging Face directory (safetensors + tokenizer) that ``AutoModelForCausalLM.from_pretrained`` loads.
With ``model.lora`` only a LoRA adapter over the frozen ``model.path`` trains (checkpoints hold the
adapter); ``model/`` is then the merged model and ``model-adapter/`` the adapter
(:mod:`fourfold.trainers.lora`).
"""

from __future__ import annotations

import time
from typing import Optional

import torch

from fourfold import dist
from fourfold.config import InitModelConfig, SFTConfig
from fourfold.core import sft_loss
from fourfold.data import EpochSampler, SFTExample, chat_template_renderer, collate_sft, encode_sft, line_of, load_sft
from fourfold.errors import DataError
from fourfold.models.checks import checker
from fourfold.models.factory import llama_config, random_causal_lm
from fourfold.models.loading import ensure_pad_embedding, load_causal_lm, load_tokenizer
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
from fourfold.trainers.fsdp import shard_roles
from fourfold.trainers.lora import adapted_lm, save_trained
from fourfold.trainers.memory import apply_model_levers, trained_dtype
from fourfold.trainers.scaffold import RunScaffold

_WINDOW_KEYS = ("steps", "good_steps", "loss", "token_accuracy", "grad_norm", "tokens", "seconds")


# ---------------------------------------------------------------------------------------------
# set-up pieces
# ---------------------------------------------------------------------------------------------


def load_model(model_cfg: InitModelConfig, device: torch.device):
    """(tokenizer with a dedicated pad, causal LM on ``device``): from ``model.path`` or, with
    ``model.from_scratch``, a random-init Llama of the configured sizes over the tokenizer's vocabulary.
    With ``model.lora`` the model is an :class:`~fourfold.models.lora.AdapterLM` over the frozen one."""
    tok = load_tokenizer(model_cfg.tokenizer or model_cfg.path, trust_remote_code=model_cfg.trust_remote_code)
    if model_cfg.from_scratch:
        config = llama_config(
            len(tok), model_cfg.hidden_size, model_cfg.num_layers, model_cfg.num_heads,
            model_cfg.intermediate_size, model_cfg.max_positions,
            pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
        )
        model = random_causal_lm(config, dtype=trained_dtype(model_cfg))  # global RNG: seeded by the caller
    else:
        model = load_causal_lm(model_cfg.path, dtype=trained_dtype(model_cfg), trust_remote_code=model_cfg.trust_remote_code)
        checker(tok, model_cfg).causal_lm(model, "model.path", model_cfg.path)  # an LM head, the tokenizer's vocabulary
    ensure_pad_embedding(model, tok)
    model = model.to(device)
    return tok, adapted_lm(model, model_cfg.lora)  # LoRA: the adapter over the frozen model is what trains


def encode_file(path: str, tokenizer, max_len: int, on_error: str) -> tuple[list[SFTExample], list[str]]:
    """Load and tokenise one SFT file once: (examples, one-line messages of the skipped rows).

    Rendering of chat ``messages`` uses the tokenizer's chat template when it has one. A prompt +
    completion over ``max_len`` tokens is a DataError naming file and line (never truncated).
    """
    records = load_sft(path, on_error=on_error, chat_template=chat_template_renderer(tokenizer))
    examples = encode_sft(records, tokenizer, max_len, truncate=False, on_error=on_error)  # add_bos as PPO prompts
    skipped = sorted(records.skipped, key=line_of)  # loader and tokeniser problems, in file order
    if not examples:
        raise DataError(f"{path}: no usable examples ({len(skipped)} skipped; first: {skipped[0]})")
    return examples, skipped


def load_examples(cfg: SFTConfig, tokenizer) -> tuple[list[SFTExample], Optional[list[SFTExample]], list[str]]:
    """(training examples, held-out examples or None, messages of the skipped rows of both files)."""
    tc, data = cfg.train, cfg.data
    train_ex, skipped = encode_file(data.train, tokenizer, tc.max_len, data.on_error)
    eval_ex = None
    if data.eval is not None:
        eval_ex, eval_skipped = encode_file(data.eval, tokenizer, tc.max_len, data.on_error)
        skipped += eval_skipped
    return train_ex, eval_ex, skipped


def to_device(batch: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    return {k: v.to(device, non_blocking=True) for k, v in batch.items()}


def batch_loss(model, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict]:
    """Step 2: the SFT loss of a right-padded batch (positions 0..n-1 per row; no left padding)."""
    ids, attn, loss_mask = batch["input_ids"], batch["attention_mask"], batch["loss_mask"]  # (B, L)
    logits = model(input_ids=ids, attention_mask=attn, use_cache=False).logits  # (B, L, V)
    return sft_loss(logits[:, :-1], ids[:, 1:], loss_mask[:, 1:])  # position t predicts token t+1


@torch.no_grad()
def evaluate(model, examples: list[SFTExample], batch_size: int, pad_id: int, device: torch.device) -> float:
    """Mean cross-entropy over all completion tokens of ``examples`` (token-weighted)."""
    was_training = model.training
    model.eval()
    order = sorted(range(len(examples)), key=lambda i: len(examples[i].input_ids))  # less padding
    total, count = 0.0, 0.0
    for start in range(0, len(order), batch_size):
        batch = to_device(collate_sft([examples[i] for i in order[start : start + batch_size]], pad_id), device)
        loss, _ = batch_loss(model, batch)
        n = float(batch["loss_mask"][:, 1:].sum())
        total += float(loss) * n
        count += n
    model.train(was_training)
    return total / max(count, 1.0)


def step_loss(model, batch: dict[str, torch.Tensor], counted: int, world) -> tuple[torch.Tensor, float, float, float]:
    """Step 2 on this rank's part of the batch: (the loss to backpropagate, and over the whole
    global batch: the loss, the token accuracy, the completion tokens). In one process the loss is
    the batch's token mean; under torchrun every rank's share of the global token mean
    (:func:`~fourfold.trainers.common.global_weight`), and the reported figures are global sums
    divided by the global token count. ``counted``: 0 when this rank's row does not count."""
    loss, stats = batch_loss(model, batch)
    tokens = float(batch["loss_mask"][:, 1:].sum())
    if not world.distributed:
        return loss, float(loss.detach()), float(stats["token_accuracy"]), tokens
    tokens = tokens if counted else 0.0
    loss_sum, correct, total = global_sums([float(loss.detach()) * tokens, float(stats["token_accuracy"]) * tokens, tokens])
    per_token = 1.0 / total if total else 0.0
    return loss * global_weight(tokens, total), loss_sum * per_token, correct * per_token, total


def _add_step(window: dict, loss: float, accuracy: float, tokens: float, grad_norm: Optional[float],
              seconds: float) -> None:
    """Add one step to the metrics window (``grad_norm`` None: the update was skipped)."""
    window["steps"] += 1
    window["good_steps"] += int(grad_norm is not None)
    window["loss"] += loss
    window["token_accuracy"] += accuracy
    window["grad_norm"] += grad_norm if grad_norm is not None else 0.0
    window["tokens"] += tokens
    window["seconds"] += seconds


def _window_row(window: dict) -> dict:
    """Means over the steps since the previous metrics row."""
    steps, good = max(window["steps"], 1), max(window["good_steps"], 1)
    return {
        "sft/loss": window["loss"] / steps,
        "sft/token_accuracy": window["token_accuracy"] / steps,
        "sft/grad_norm": window["grad_norm"] / good if window["good_steps"] else float("nan"),
        "time/step_s": window["seconds"] / steps,
        "time/train_tokens_per_s": window["tokens"] / max(window["seconds"], 1e-9),
    }


# ---------------------------------------------------------------------------------------------
# the loop
# ---------------------------------------------------------------------------------------------


def train(cfg: SFTConfig) -> dict:
    """Run SFT; returns ``{"output_dir", "model": path of the HF directory, "final": last metrics row}``."""
    tc = cfg.train
    # 0. set-up: seed, run directory, model, data (tokenised once), optimiser, schedule, resume
    run = RunScaffold(cfg)
    device = run.hf_device()
    dist.check_divisible("train.batch_size", tc.batch_size, run.world)
    tok, model = load_model(cfg.model, device)
    apply_model_levers(model, cfg.model, device)
    shard_roles({"model": model}, cfg.dist, device)  # torchrun: FSDP2 (before the optimizer sees the parameters)
    train_ex, eval_ex, skipped = load_examples(cfg, tok)
    require_batch(tc.batch_size, len(train_ex), f"training examples in {cfg.data.train}")
    sampler = EpochSampler(len(train_ex), tc.batch_size, seed=cfg.run.seed)
    total = num_steps(tc.max_steps, tc.epochs, len(sampler))
    opt = make_optimizer(model.parameters(), tc.lr, tc.weight_decay)
    sched = make_schedule(opt, total, tc.lr_schedule, tc.warmup_steps)
    window = dict.fromkeys(_WINDOW_KEYS, 0.0)
    start = track_steps(run, "model", model, opt, sched, sampler, window)
    model.train()
    pad_id = tok.pad_token_id
    batches = sampler.batches()
    last: dict = {}
    with run.loop(total=total, desc="sft", key_metrics=("sft/loss", "sft/eval_loss")) as logger:
        if skipped and run.resumed_step is None:
            logger.warn(f"{len(skipped)} bad rows skipped (data.on_error=skip); first: {skipped[0]}", step=0)
        for step in range(start + 1, total + 1):
            t0 = time.perf_counter()
            where = f"step {step}"
            # 1. batch (this rank's part of it under torchrun): right-padded to its longest row
            rows, counted = local_rows(next(batches), run.world)
            batch = to_device(collate_sft([train_ex[i] for i in rows], pad_id), device)
            # 2. forward and loss on the completion tokens
            loss, loss_value, accuracy, tokens = step_loss(model, batch, counted, run.world)
            lr = opt.param_groups[0]["lr"]  # the rate this step uses
            # 3. backward, clip, guarded AdamW step, schedule
            grad_norm, good = guarded_step(model, opt, sched, tc.max_grad_norm, run.guard, where,
                                           [(loss, {"sft_loss": torch.tensor(loss_value)})])
            if good:
                run.guard.good_step()
            run.log_skips(step)
            _add_step(window, loss_value, accuracy, tokens, grad_norm if good else None, time.perf_counter() - t0)
            run.stop_if_stuck(step)
            # 4. metrics (means since the previous row) and the held-out loss
            row: dict = {}
            if step % tc.log_every == 0 or step == total:
                row.update(_window_row(window), **{"sft/lr": lr, "train/nonfinite_skips": run.guard.total})
                window.update(dict.fromkeys(_WINDOW_KEYS, 0.0))  # the same dict: checkpoints read it
            if eval_ex is not None and ((tc.eval_every and step % tc.eval_every == 0) or step == total):
                row["sft/eval_loss"] = evaluate(model, eval_ex, tc.batch_size, pad_id, device)
            if row:
                logger.log(step, row)
                last = row
            # 5. checkpoint (every save_every steps, at the end, and when asked to stop)
            run.checkpoint_if_due(step, final=step == total)
        # the final model, loadable with plain transformers (LoRA: merged, and the adapter beside)
        written = save_trained(run, model, tok, run.out / "model")
    if not last:  # resumed a run that had already finished: report its last row
        last = last_metrics_row(run.out)
    run.done("sft", model=run.out / "model")
    return {"output_dir": str(run.out), **written, "final": last}
