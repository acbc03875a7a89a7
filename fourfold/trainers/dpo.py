"""Direct preference optimisation (DPO): a causal LM learns from preference pairs directly, with
no reward model, no sampling and no critic (Rafailov et al. 2023).

The pairs are those of ``fourfold reward`` (:mod:`fourfold.trainers.pairs`: the same files, split
and tokenisation: prompt ids with BOS first, then the response's ids and EOS). One step, as
numbered in :func:`train`:

1. the next batch of pair indices from a seeded, resumable :class:`~fourfold.data.EpochSampler`,
   laid out as PPO scores responses (:func:`~fourfold.data.collate_pair_responses`): ``2N`` rows,
   the chosen responses then the rejected ones, prompts left-padded, responses right-padded;
2. the policy's log-probs of each response's tokens, summed per response
   (:func:`~fourfold.core.sequence_logprobs`): chosen ``[N]`` and rejected ``[N]`` from one
   ``[2N, P+T]`` forward; the reference's sums of the same pairs were computed before step 1;
3. :func:`fourfold.core.dpo_loss` (``dpo.loss``: sigmoid or ipo; ``dpo.beta``,
   ``dpo.label_smoothing``), backward, global-norm clip, AdamW step (skipped when the loss or the
   gradient norm is not finite), LR schedule;
4. a metrics row every ``train.log_every`` steps (means over the pairs since the previous row) and
   held-out loss, accuracy and margin every ``train.eval_every`` steps and at the end;
5. a checkpoint every ``run.save_every`` steps, at the end, and on SIGTERM/SIGINT (then exit).

The reference is a role with ``logprobs(input_ids, attention_mask, n_response)`` (the interface of
:class:`~fourfold.models.roles.FrozenReference` and
:class:`~fourfold.models.roles.AdapterDisabledReference`): by default the frozen model of
``dpo.reference``, else of ``model.path`` (the SFT model DPO starts from); ``train(cfg,
reference=...)`` takes any such role. Its log-probs are constants, so they are computed once, up
front, for every training and held-out pair (in file order, ``train.batch_size`` pairs per forward,
kept on the CPU: two numbers a pair), and a reference this trainer loaded is then released:
training holds one model, the policy, and its optimizer state (the standard optimisation; TRL's
``precompute_ref_log_probs``). A resumed run computes them again, the same way, from the same
model, before it loads its checkpoint.

The memory levers of the model section (:mod:`fourfold.trainers.memory`) apply as in ``fourfold
sft``: ``model.gradient_checkpointing`` and ``model.precision`` on the policy; the reference is
loaded in the policy's weights dtype, and under ``bf16-mixed`` its log-probs are computed under
bf16 autocast like every forward of the policy.

The run writes ``output_dir/model/``, a Hugging Face directory (safetensors + tokenizer) that
``AutoModelForCausalLM.from_pretrained`` loads.

With ``model.lora`` only a LoRA adapter over the frozen ``model.path`` trains, and the reference
is that same model with the adapter disabled (:class:`~fourfold.models.roles.AdapterDisabledReference`;
``dpo.reference`` still names another one): one model in memory from the start. The run writes the
merged model to ``output_dir/model/`` and the adapter to ``output_dir/model-adapter/``, as ``fourfold
sft`` does (:mod:`fourfold.trainers.lora`).

Under ``torchrun`` every rank computes the reference's log-probs of every pair (a full copy of the
reference, released before training), the policy is sharded with FSDP2 (``dist.model``), each rank
takes its part of every global batch and its share of the global mean loss, and the metrics are
those of the global batch (as :mod:`fourfold.trainers.sft`).
"""

from __future__ import annotations

import time
from typing import Callable, Optional, Sequence

import torch
from torch import Tensor

from fourfold import dist
from fourfold.config import DPOAlgoConfig, DPOConfig
from fourfold.core import dpo_loss, sequence_logprobs
from fourfold.data import EpochSampler, PreferenceExample, collate_pair_responses
from fourfold.errors import ConfigError
from fourfold.models.levers import autocast_region
from fourfold.models.loading import ensure_pad_embedding, load_causal_lm, load_tokenizer
from fourfold.models.lora import AdapterLM
from fourfold.models.roles import AdapterDisabledReference, FrozenReference, response_logprobs
from fourfold.trainers.common import (
    global_sums,
    global_weight,
    guarded_step,
    last_metrics_row,
    local_rows,
    make_optimizer,
    make_schedule,
    num_steps,
    track_steps,
)
from fourfold.trainers.fsdp import shard_roles
from fourfold.trainers.lora import adapted_lm, save_trained
from fourfold.trainers.memory import apply_model_levers, trained_dtype
from fourfold.trainers.pairs import load_examples
from fourfold.trainers.scaffold import RunScaffold

LogprobsFn = Callable[[Tensor, Tensor, int], Tensor]
"""``fn(input_ids [B, P+T], attention_mask [B, P+T], T) -> log-probs [B, T]`` of the last T tokens."""

_STAT_KEYS = ("correct", "margin", "chosen_logps", "rejected_logps", "chosen_reward", "rejected_reward")
_WINDOW_KEYS = ("steps", "good_steps", "loss", "pairs", *_STAT_KEYS, "grad_norm", "seconds")


# ---------------------------------------------------------------------------------------------
# set-up pieces
# ---------------------------------------------------------------------------------------------


def _load_lm(path: str, cfg: DPOConfig, tok, device: torch.device):
    lm = load_causal_lm(path, dtype=trained_dtype(cfg.model), device=device,
                        trust_remote_code=cfg.model.trust_remote_code)
    ensure_pad_embedding(lm, tok)
    return lm


def load_policy(cfg: DPOConfig, device: torch.device):
    """(tokenizer with a dedicated pad, the policy: the causal LM of ``model.path`` on ``device``;
    with ``model.lora`` an :class:`~fourfold.models.lora.AdapterLM`, an adapter over that model kept
    frozen)."""
    tok = load_tokenizer(cfg.model.tokenizer or cfg.model.path, trust_remote_code=cfg.model.trust_remote_code)
    return tok, adapted_lm(_load_lm(cfg.model.path, cfg, tok, device), cfg.model.lora)


def load_reference(cfg: DPOConfig, tok, policy, device: torch.device):
    """The frozen reference: the causal LM of ``dpo.reference``, else of ``model.path`` (with
    ``model.lora``: the policy's own base with the adapter disabled, no second copy). It must score
    the policy's tokens: a different vocabulary size is a ConfigError naming the key."""
    if cfg.dpo.reference is None and isinstance(policy, AdapterLM):
        return AdapterDisabledReference(policy.base)
    path = cfg.dpo.reference or cfg.model.path
    ref = _load_lm(path, cfg, tok, device)
    n_ref, n_policy = ref.get_input_embeddings().num_embeddings, policy.get_input_embeddings().num_embeddings
    if n_ref != n_policy:
        raise ConfigError(f"dpo.reference: {path} has {n_ref} token embeddings, the policy {n_policy}; "
                          "the reference must share the policy's tokenizer")
    return FrozenReference(ref)


def policy_logprobs(policy) -> LogprobsFn:
    """The policy's token log-probs (with gradients), in the reference role's signature."""
    return lambda input_ids, attention_mask, n_response: response_logprobs(
        policy, input_ids, attention_mask, n_response)[0]


def pair_batch(examples: Sequence[PreferenceExample], pad_id: int, device: torch.device) -> dict[str, Tensor]:
    """Step 1's layout of ``examples`` (:func:`~fourfold.data.collate_pair_responses`) on ``device``."""
    return {k: v.to(device, non_blocking=True) for k, v in collate_pair_responses(examples, pad_id).items()}


def pair_logps(logprobs: LogprobsFn, batch: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
    """Step 2: (chosen [N], rejected [N]) sequence log-probs from one ``[2N, P+T]`` forward."""
    mask = batch["response_mask"]  # (2N, T)
    token_logps = logprobs(batch["input_ids"], batch["attention_mask"], mask.shape[1])  # (2N, T)
    seq = sequence_logprobs(token_logps, mask)  # (2N,)
    n = seq.shape[0] // 2
    return seq[:n], seq[n:]


@torch.no_grad()
def all_pair_logps(logprobs: LogprobsFn, examples: Sequence[PreferenceExample], batch_size: int, pad_id: int,
                   device: torch.device) -> tuple[Tensor, Tensor]:
    """(chosen [N], rejected [N]) sequence log-probs of all ``examples``, in order, on the CPU."""
    chosen, rejected = [], []
    for start in range(0, len(examples), batch_size):
        c, r = pair_logps(logprobs, pair_batch(examples[start : start + batch_size], pad_id, device))
        chosen.append(c.cpu())
        rejected.append(r.cpu())
    return torch.cat(chosen), torch.cat(rejected)


def reference_logps(reference, splits: Sequence[Optional[Sequence[PreferenceExample]]], batch_size: int,
                    pad_id: int, device: torch.device) -> list[Optional[tuple[Tensor, Tensor]]]:
    """The reference role's (chosen, rejected) sequence log-probs of each split (None stays None)."""
    return [None if ex is None else all_pair_logps(reference.logprobs, ex, batch_size, pad_id, device)
            for ex in splits]


def evaluate(policy, examples: Sequence[PreferenceExample], ref: tuple[Tensor, Tensor], algo: DPOAlgoConfig,
             batch_size: int, pad_id: int, device: torch.device) -> dict[str, float]:
    """Held-out DPO loss, accuracy (r_chosen > r_rejected strictly) and reward margin over all pairs."""
    was_training = policy.training
    policy.eval()
    chosen, rejected = all_pair_logps(policy_logprobs(policy), examples, batch_size, pad_id, device)
    policy.train(was_training)
    loss, stats = dpo_loss(chosen, rejected, ref[0], ref[1], algo.beta, algo.label_smoothing, algo.loss)
    return {"dpo/eval_loss": float(loss), "dpo/eval_accuracy": float(stats["accuracy"]),
            "dpo/eval_reward_margin": float(stats["reward_margin"])}


def step_figures(loss: Tensor, stats: dict, chosen: Tensor, rejected: Tensor, counted: int, world
                 ) -> tuple[Tensor, dict]:
    """(the loss to backpropagate, the step's figures for the metrics window: the mean loss, the
    pairs, and the pair-weighted sums of the statistics). In one process those of the batch; under
    torchrun those of the whole global batch and each rank's share of the global mean loss.
    ``counted``: 0 when this rank's pair does not count."""
    n = chosen.shape[0]
    per_pair = {"correct": stats["accuracy"], "margin": stats["reward_margin"], "chosen_logps": chosen.detach().mean(),
                "rejected_logps": rejected.detach().mean(), "chosen_reward": stats["chosen_reward"],
                "rejected_reward": stats["rejected_reward"]}
    figures = {"loss": float(loss.detach()), "pairs": n, **{key: float(mean) * n for key, mean in per_pair.items()}}
    if not world.distributed:
        return loss, figures
    n = n if counted else 0
    keys = ("loss", "pairs", *_STAT_KEYS)
    local = [figures["loss"] * n, n, *(figures[key] * bool(counted) for key in _STAT_KEYS)]
    totals = dict(zip(keys, global_sums(local)))
    totals["loss"] = totals["loss"] / totals["pairs"] if totals["pairs"] else 0.0
    return loss * global_weight(n, totals["pairs"]), totals


def _add_step(window: dict, figures: dict, grad_norm: Optional[float], seconds: float) -> None:
    """Add one step's :func:`step_figures` to the metrics window (``grad_norm`` None: the update was
    skipped)."""
    window["steps"] += 1
    window["good_steps"] += int(grad_norm is not None)
    for key in ("loss", "pairs", *_STAT_KEYS):
        window[key] += figures[key]
    window["grad_norm"] += grad_norm if grad_norm is not None else 0.0
    window["seconds"] += seconds


def _window_row(window: dict) -> dict:
    """Means over the steps (the loss, the gradient norm) and the pairs since the previous row."""
    steps, pairs = max(window["steps"], 1), max(window["pairs"], 1)
    return {
        "dpo/loss": window["loss"] / steps,
        "dpo/accuracy": window["correct"] / pairs,
        "dpo/reward_margin": window["margin"] / pairs,
        "dpo/chosen_logps": window["chosen_logps"] / pairs,
        "dpo/rejected_logps": window["rejected_logps"] / pairs,
        "dpo/chosen_reward": window["chosen_reward"] / pairs,
        "dpo/rejected_reward": window["rejected_reward"] / pairs,
        "train/grad_norm": window["grad_norm"] / window["good_steps"] if window["good_steps"] else float("nan"),
        "time/step_s": window["seconds"] / steps,
    }


# ---------------------------------------------------------------------------------------------
# the loop
# ---------------------------------------------------------------------------------------------


def _set_up(cfg: DPOConfig, device: torch.device, reference):
    """(tokenizer, policy (sharded under torchrun), (training pairs, held-out pairs or None, skipped
    rows), the reference's (chosen, rejected) log-probs of both splits). The reference (``reference``,
    else loaded) is used here and released."""
    tok, policy = load_policy(cfg, device)
    apply_model_levers(policy, cfg.model, device)
    pairs = load_examples(cfg, tok)
    role = reference if reference is not None else load_reference(cfg, tok, policy, device)
    with autocast_region(cfg.model.precision, device.type):  # no optimizer step inside: keep the cast cache
        ref_logps = reference_logps(role, pairs[:2], cfg.train.batch_size, tok.pad_token_id, device)
    shard_roles({"model": policy}, cfg.dist, device)  # torchrun: FSDP2 (before the optimizer sees the parameters)
    return tok, policy, pairs, ref_logps


def train(cfg: DPOConfig, *, reference=None) -> dict:
    """Run DPO; returns ``{"output_dir", "model": path of the HF directory, "final": last metrics
    row (with dpo/eval_* when there is a held-out split)}``.

    ``reference``: a reference role (``logprobs(input_ids, attention_mask, n_response) -> [B, T]``,
    e.g. :class:`~fourfold.models.roles.AdapterDisabledReference`); None loads the frozen model of
    ``dpo.reference`` or ``model.path``."""
    tc, algo = cfg.train, cfg.dpo
    # 0. set-up: seed, run directory, policy, data (split and tokenised once), the reference's
    #    log-probs of every pair (then the reference is released), optimiser, resume
    run = RunScaffold(cfg)
    device = run.hf_device()
    dist.check_divisible("train.batch_size", tc.batch_size, run.world)
    tok, policy, (train_ex, eval_ex, skipped), (ref_train, ref_eval) = _set_up(cfg, device, reference)
    pad_id = tok.pad_token_id
    sampler = EpochSampler(len(train_ex), tc.batch_size, seed=cfg.run.seed)
    total = num_steps(tc.max_steps, tc.epochs, len(sampler))
    opt = make_optimizer(policy.parameters(), tc.lr, tc.weight_decay)
    sched = make_schedule(opt, total, tc.lr_schedule, tc.warmup_steps)
    window = dict.fromkeys(_WINDOW_KEYS, 0.0)
    start = track_steps(run, "policy", policy, opt, sched, sampler, window)
    policy.train()
    logprobs = policy_logprobs(policy)
    batches = sampler.batches()
    last: dict = {}
    with run.loop(total=total, desc="dpo", key_metrics=("dpo/loss", "dpo/eval_accuracy")) as logger:
        if skipped and run.resumed_step is None:
            logger.warn(f"{len(skipped)} bad rows skipped (data.on_error=skip); first: {skipped[0]}", step=0)
        for step in range(start + 1, total + 1):
            t0 = time.perf_counter()
            # 1-2. batch (this rank's part under torchrun; chosen and rejected stacked), the policy's
            #      sequence log-probs
            idx, counted = local_rows(next(batches), run.world)
            chosen, rejected = pair_logps(logprobs, pair_batch([train_ex[i] for i in idx], pad_id, device))
            ref_c, ref_r = (x[idx].to(device) for x in ref_train)  # (N,) each, computed up front
            # 3. DPO loss, backward, clip, guarded AdamW step, schedule
            loss, stats = dpo_loss(chosen, rejected, ref_c, ref_r, algo.beta, algo.label_smoothing, algo.loss)
            loss, figures = step_figures(loss, stats, chosen, rejected, counted, run.world)
            lr = opt.param_groups[0]["lr"]  # the rate this step uses
            grad_norm, good = guarded_step(policy, opt, sched, tc.max_grad_norm, run.guard, f"step {step}",
                                           [(loss, {"dpo_loss": torch.tensor(figures["loss"])})])
            if good:
                run.guard.good_step()
            run.log_skips(step)
            _add_step(window, figures, grad_norm if good else None, time.perf_counter() - t0)
            run.stop_if_stuck(step)
            # 4. metrics (means since the previous row) and held-out loss / accuracy / margin
            row: dict = {}
            if step % tc.log_every == 0 or step == total:
                row.update(_window_row(window), **{"train/lr": lr, "train/nonfinite_skips": run.guard.total})
                window.update(dict.fromkeys(_WINDOW_KEYS, 0.0))  # the same dict: checkpoints read it
            if eval_ex is not None and ((tc.eval_every and step % tc.eval_every == 0) or step == total):
                row.update(evaluate(policy, eval_ex, ref_eval, algo, tc.batch_size, pad_id, device))
            if row:
                logger.log(step, row)
                last = row
            # 5. checkpoint (every save_every steps, at the end, and when asked to stop)
            run.checkpoint_if_due(step, final=step == total)
        # the final model, loadable with plain transformers (sharded: gathered by every rank first;
        # LoRA: merged, and the adapter beside it)
        written = save_trained(run, policy, tok, run.out / "model")
    if not last:  # resumed a run that had already finished: report its last row
        last = last_metrics_row(run.out)
    return {"output_dir": str(run.out), **written, "final": last}
