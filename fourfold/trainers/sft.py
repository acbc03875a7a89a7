"""Supervised fine-tuning (SFT): next-token cross-entropy on the completion tokens only.

One step, as numbered in :func:`train`:

1. the next batch of example indices from a seeded, resumable :class:`~fourfold.data.EpochSampler`,
   right-padded to the batch's longest row (examples are tokenised once, up front);
2. forward; ``logits[:, :-1]`` predict ``input_ids[:, 1:]`` under the loss mask shifted the same
   way (1 on completion tokens and the EOS after them; 0 on BOS, prompt and padding);
   :func:`fourfold.core.sft_loss`, the mean over the batch's completion tokens;
3. backward, global-norm clip and an AdamW step - skipped when the loss or the gradient norm is not
   finite - then the LR schedule (linear warm-up, then linear decay to 0 or constant);
4. a metrics row every ``train.log_every`` steps (means over the steps since the previous row) and
   the held-out loss on ``data.eval`` every ``train.eval_every`` steps and at the end;
5. a checkpoint every ``run.save_every`` steps, at the end, and on SIGTERM/SIGINT (then exit).

Steps 1, 3, 4 and 5 are the supervised loop's (:mod:`fourfold.trainers.supervised`); this module
holds the data set-up, the loss (step 2) and the metrics.

Tokenisation matches generation: a prompt is encoded exactly as
:func:`fourfold.data.tokenize_prompts` encodes it for PPO (BOS first, no other special tokens), so
the ids PPO generates after are the ids SFT trained on. The run writes ``output_dir/model/``, a
Hugging Face directory (safetensors + tokenizer) that ``AutoModelForCausalLM.from_pretrained`` loads.
With ``model.lora`` only a LoRA adapter over the frozen ``model.path`` trains (checkpoints hold the
adapter); ``model/`` is then the merged model and ``model-adapter/`` the adapter
(:mod:`fourfold.run.export`).
"""

from __future__ import annotations

from typing import Optional

import torch

from fourfold.config import SFTConfig
from fourfold.core import sft_loss
from fourfold.data import SFTExample, chat_template_renderer, collate_sft, encode_sft, line_of, load_sft, to_device
from fourfold.errors import DataError
from fourfold.run.export import save_trained
from fourfold.run.parallel import Figures, map_batches
from fourfold.run.scaffold import RunScaffold
from fourfold.trainers.prelude import stage_roles
from fourfold.trainers.supervised import SupervisedSteps, Window, require_batch

FIGURES = ("loss", "token_accuracy", "tokens")


# ---------------------------------------------------------------------------------------------
# set-up pieces
# ---------------------------------------------------------------------------------------------


def encode_file(path: str, tokenizer, max_len: int, on_error: str, assistant_turns: str = "last"
                ) -> tuple[list[SFTExample], list[str], list[str]]:
    """Load and tokenise one SFT file once: (examples, one-line messages of the skipped rows,
    warnings on the file as a whole: most tokens unknown).

    Rendering of chat ``messages`` uses the tokenizer's chat template when it has one. A prompt +
    completion over ``max_len`` tokens is a DataError naming file and line (never truncated).
    """
    records = load_sft(path, on_error=on_error, chat_template=chat_template_renderer(tokenizer),
                       assistant_turns=assistant_turns)
    examples = encode_sft(records, tokenizer, max_len, truncate=False, on_error=on_error)  # add_bos as PPO prompts
    skipped = sorted(records.skipped, key=line_of)  # loader and tokeniser problems, in file order
    if not examples:
        raise DataError(f"{path}: no usable examples ({len(skipped)} skipped; first: {skipped[0]})")
    return examples, skipped, records.notes


def load_examples(cfg: SFTConfig, tokenizer
                  ) -> tuple[list[SFTExample], Optional[list[SFTExample]], list[str], list[str]]:
    """(training examples, held-out examples or None, messages of the skipped rows of both files,
    warnings on the files as wholes)."""
    tc, data = cfg.train, cfg.data
    train_ex, skipped, notes = encode_file(data.train, tokenizer, tc.max_len, data.on_error, data.assistant_turns)
    eval_ex = None
    if data.eval is not None:
        eval_ex, eval_skipped, eval_notes = encode_file(data.eval, tokenizer, tc.max_len, data.on_error, data.assistant_turns)
        skipped += eval_skipped
        notes += eval_notes
    return train_ex, eval_ex, skipped, notes


def batch_loss(model, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict]:
    """Step 2: the SFT loss of a right-padded batch (positions 0..n-1 per row; no left padding)."""
    ids, attn, loss_mask = batch["input_ids"], batch["attention_mask"], batch["loss_mask"]  # (B, L)
    logits = model(input_ids=ids, attention_mask=attn, use_cache=False).logits  # (B, L, V)
    return sft_loss(logits[:, :-1], ids[:, 1:], loss_mask[:, 1:])  # position t predicts token t+1


@torch.no_grad()
def evaluate(model, examples: list[SFTExample], batch_size: int, pad_id: int, device: torch.device) -> float:
    """Mean cross-entropy over all completion tokens of ``examples`` (token-weighted); under
    torchrun each rank evaluates its share of the batches (:func:`~fourfold.run.parallel.map_batches`)."""
    was_training = model.training
    model.eval()
    order = sorted(range(len(examples)), key=lambda i: len(examples[i].input_ids))  # less padding

    def batch_sums(rows: list[SFTExample]) -> tuple[float, float]:
        batch = to_device(collate_sft(rows, pad_id), device)
        loss, _ = batch_loss(model, batch)
        n = float(batch["loss_mask"][:, 1:].sum())
        return float(loss) * n, n

    sums = map_batches(batch_sums, [examples[i] for i in order], batch_size)
    total, count = 0.0, 0.0
    for loss_sum, n in sums:
        total += loss_sum
        count += n
    model.train(was_training)
    return total / max(count, 1.0)


def step_loss(model, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, Figures]:
    """Step 2 on this rank's rows: the loss (their token mean) and its figures (the loss and the
    token accuracy, means weighted by the completion tokens)."""
    loss, stats = batch_loss(model, batch)
    tokens = float(batch["loss_mask"][:, 1:].sum())
    return loss, Figures({"loss": float(loss.detach()), "token_accuracy": float(stats["token_accuracy"])},
                         {"tokens": tokens}, weight="tokens")


def window_row(window: Window) -> dict:
    """Means over the steps since the previous metrics row."""
    return {
        "sft/loss": window.per_step("loss"),
        "sft/token_accuracy": window.per_step("token_accuracy"),
        "sft/grad_norm": window.mean_grad_norm(),
        "time/step_s": window.per_step("seconds"),
        "time/train_tokens_per_s": window["tokens"] / max(window["seconds"], 1e-9),
    }


# ---------------------------------------------------------------------------------------------
# the stage
# ---------------------------------------------------------------------------------------------


def train(cfg: SFTConfig) -> dict:
    """Run SFT; returns ``{"output_dir", "model": path of the HF directory, "final": last metrics row}``."""
    tc = cfg.train
    # 0. set-up: seed, run directory, model, data (tokenised once), optimiser, schedule, resume
    run = RunScaffold(cfg)
    device = run.hf_device()
    roles = stage_roles(run, "sft", cfg, device, {"train.batch_size": tc.batch_size})
    tok, model = roles.tokenizer, roles.policy
    train_ex, eval_ex, skipped, notes = load_examples(cfg, tok)
    require_batch(tc.batch_size, len(train_ex), f"training examples in {cfg.data.train}")
    steps = SupervisedSteps(run, model, tc, len(train_ex), "model", FIGURES)
    pad_id = tok.pad_token_id

    def step(rows: list) -> tuple[torch.Tensor, Figures]:
        return step_loss(model, to_device(collate_sft([train_ex[i] for i in rows], pad_id), device))

    held_out = None if eval_ex is None else (
        lambda: {"sft/eval_loss": evaluate(model, eval_ex, tc.batch_size, pad_id, device)})
    with steps.loop("sft", ("sft/loss", "sft/eval_loss"), skipped, notes) as logger:
        last = steps.run(logger, step=step, row=window_row, evaluate=held_out, check="sft_loss", lr_key="sft/lr")
        # the final model, loadable with plain transformers (LoRA: merged, and the adapter beside)
        written = save_trained(run, model, tok, run.out / "model")
    return run.finish({"output_dir": str(run.out), **written, "final": last}, model=run.out / "model")
