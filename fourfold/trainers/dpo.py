"""Direct preference optimisation (DPO): a causal LM learns from preference pairs directly, with
no reward model, no sampling and no critic (Rafailov et al. 2023).

The pairs are those of ``fourfold reward`` (:mod:`fourfold.trainers.pairs`). One step, as numbered
in :func:`train`: steps 1, 3, 4 and 5 are the supervised loop's (:mod:`fourfold.trainers.supervised`);
this module holds the set-up (the reference's log-probs of every pair computed once, up front, and
the reference released), the loss (:func:`fourfold.core.dpo_loss`) and the metrics (``dpo/*``).
The step in full, the reference, the memory levers, LoRA and torchrun: docs/dpo.md.
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence

import torch
from torch import Tensor

from fourfold.config import DPOAlgoConfig, DPOConfig
from fourfold.core import dpo_loss, sequence_logprobs
from fourfold.data import PreferenceExample, collate_pair_responses, to_device
from fourfold.models.levers import autocast_region
from fourfold.models.roles import response_logprobs
from fourfold.run.export import save_trained
from fourfold.run.parallel import Figures, map_batches
from fourfold.run.scaffold import RunScaffold
from fourfold.trainers.pairs import load_examples
from fourfold.trainers.prelude import stage_roles
from fourfold.trainers.supervised import SupervisedSteps, Window

LogprobsFn = Callable[[Tensor, Tensor, int], Tensor]
"""``fn(input_ids [B, P+T], attention_mask [B, P+T], T) -> log-probs [B, T]`` of the last T tokens."""

STATS = ("correct", "margin", "chosen_logps", "rejected_logps", "chosen_reward", "rejected_reward")
FIGURES = ("loss", "pairs", *STATS)


# ---------------------------------------------------------------------------------------------
# set-up pieces
# ---------------------------------------------------------------------------------------------


def policy_logprobs(policy) -> LogprobsFn:
    """The policy's token log-probs (with gradients), in the reference role's signature."""
    return lambda input_ids, attention_mask, n_response: response_logprobs(
        policy, input_ids, attention_mask, n_response)[0]


def pair_batch(examples: Sequence[PreferenceExample], pad_id: int, device: torch.device) -> dict[str, Tensor]:
    """Step 1's layout of ``examples`` (:func:`~fourfold.data.collate_pair_responses`) on ``device``."""
    return to_device(collate_pair_responses(examples, pad_id), device)


def pair_logps(logprobs: LogprobsFn, batch: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
    """Step 2: (chosen [N], rejected [N]) sequence log-probs from one ``[2N, P+T]`` forward."""
    mask = batch["response_mask"]  # (2N, T)
    token_logps = logprobs(batch["input_ids"], batch["attention_mask"], mask.shape[1])  # (2N, T)
    seq = sequence_logprobs(token_logps, mask)  # (2N,)
    n = seq.shape[0] // 2
    return seq[:n], seq[n:]


def response_tokens(examples: Sequence[PreferenceExample]) -> tuple[Tensor, Tensor]:
    """(chosen [N], rejected [N]): each response's number of tokens (EOS included: the tokens whose
    log-probs step 2 sums), the n of the 'ipo' loss's per-token means."""
    def count(ids_of) -> Tensor:
        return torch.tensor([len(ids_of(e)) - e.num_prompt_tokens for e in examples], dtype=torch.long)

    return count(lambda e: e.chosen_ids), count(lambda e: e.rejected_ids)


@torch.no_grad()
def all_pair_logps(logprobs: LogprobsFn, examples: Sequence[PreferenceExample], batch_size: int, pad_id: int,
                   device: torch.device) -> tuple[Tensor, Tensor]:
    """(chosen [N], rejected [N]) sequence log-probs of all ``examples``, in order, on the CPU; under
    torchrun each rank computes its share of the batches (:func:`~fourfold.run.parallel.map_batches`)."""

    def logps(pairs: list[PreferenceExample]) -> tuple[Tensor, Tensor]:
        c, r = pair_logps(logprobs, pair_batch(pairs, pad_id, device))
        return c.cpu(), r.cpu()

    parts = map_batches(logps, examples, batch_size)
    return torch.cat([c for c, _ in parts]), torch.cat([r for _, r in parts])


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
    loss, stats = dpo_loss(chosen, rejected, ref[0], ref[1], algo.beta, algo.label_smoothing, algo.loss,
                           *response_tokens(examples))
    return {"dpo/eval_loss": float(loss), "dpo/eval_accuracy": float(stats["accuracy"]),
            "dpo/eval_reward_margin": float(stats["reward_margin"])}


def step_loss(policy, batch: dict[str, Tensor], ref: tuple[Tensor, Tensor], algo: DPOAlgoConfig,
              tokens: Optional[tuple[Tensor, Tensor]] = None) -> tuple[Tensor, Figures]:
    """Steps 2-3 on this rank's pairs: the DPO loss (their mean) and its figures (the loss, weighted by
    the pairs; the pairs and the pair-weighted sums of the statistics). ``tokens``: the responses'
    token counts (:func:`response_tokens`), which the 'ipo' loss needs."""
    chosen, rejected = pair_logps(policy_logprobs(policy), batch)
    loss, stats = dpo_loss(chosen, rejected, ref[0], ref[1], algo.beta, algo.label_smoothing, algo.loss,
                           *(tokens or (None, None)))
    n = chosen.shape[0]
    per_pair = {"correct": stats["accuracy"], "margin": stats["reward_margin"], "chosen_logps": chosen.detach().mean(),
                "rejected_logps": rejected.detach().mean(), "chosen_reward": stats["chosen_reward"],
                "rejected_reward": stats["rejected_reward"]}
    return loss, Figures({"loss": float(loss.detach())}, {"pairs": n, **{k: float(m) * n for k, m in per_pair.items()}},
                         weight="pairs")


def window_row(window: Window) -> dict:
    """Means over the steps (the loss, the gradient norm) and the pairs since the previous row."""
    pairs = max(window["pairs"], 1)
    return {
        "dpo/loss": window.per_step("loss"),
        "dpo/accuracy": window["correct"] / pairs,
        "dpo/reward_margin": window["margin"] / pairs,
        "dpo/chosen_logps": window["chosen_logps"] / pairs,
        "dpo/rejected_logps": window["rejected_logps"] / pairs,
        "dpo/chosen_reward": window["chosen_reward"] / pairs,
        "dpo/rejected_reward": window["rejected_reward"] / pairs,
        "dpo/grad_norm": window.mean_grad_norm(),
        "time/step_s": window.per_step("seconds"),
    }


# ---------------------------------------------------------------------------------------------
# the stage
# ---------------------------------------------------------------------------------------------


def _set_up(cfg: DPOConfig, run: RunScaffold, device: torch.device, reference):
    """(tokenizer, policy (sharded under torchrun), (training pairs, held-out pairs or None, skipped
    rows, warning lines on the data), the reference's (chosen, rejected) log-probs of both splits).
    The reference (``reference``, else the plan's, loaded with the policy) is used before the
    policy is placed on the ranks, and released."""
    data: dict = {}

    def reference_pass(roles) -> None:  # on the roles as built, before they are placed
        data["pairs"] = load_examples(cfg, roles.tokenizer)
        role, roles.reference = reference or roles.reference, None
        with autocast_region(cfg.model.precision, device.type):  # no optimizer step inside: keep the cast cache
            data["ref_logps"] = reference_logps(role, data["pairs"][:2], cfg.train.batch_size,
                                                roles.tokenizer.pad_token_id, device)

    roles = stage_roles(run, "dpo", cfg, device, {"train.batch_size": cfg.train.batch_size},
                        without=() if reference is None else ("reference",), before_placing=reference_pass)
    return roles.tokenizer, roles.policy, data["pairs"], data["ref_logps"]


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
    tok, policy, (train_ex, eval_ex, skipped, notes), (ref_train, ref_eval) = _set_up(cfg, run, device, reference)
    steps = SupervisedSteps(run, policy, tc, len(train_ex), "policy", FIGURES)
    pad_id = tok.pad_token_id

    def step(rows: list) -> tuple[Tensor, Figures]:
        ref = tuple(x[rows].to(device) for x in ref_train)  # (N,) each, computed up front
        examples = [train_ex[i] for i in rows]
        tokens = tuple(x.to(device) for x in response_tokens(examples))  # (N,) each: 'ipo''s per-token means
        return step_loss(policy, pair_batch(examples, pad_id, device), ref, algo, tokens)

    def held_out() -> dict:
        return evaluate(policy, eval_ex, ref_eval, algo, tc.batch_size, pad_id, device)

    with steps.loop("dpo", ("dpo/loss", "dpo/eval_accuracy"), skipped, notes) as logger:
        last = steps.run(logger, step=step, row=window_row, evaluate=held_out if eval_ex is not None else None,
                         check="dpo_loss", lr_key="dpo/lr")
        # the final model, loadable with plain transformers (sharded: gathered by every rank first;
        # LoRA: merged, and the adapter beside it)
        written = save_trained(run, policy, tok, run.out / "model")
    return run.finish({"output_dir": str(run.out), **written, "final": last}, model=run.out / "model")
