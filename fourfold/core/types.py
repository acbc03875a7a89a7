"""The batch of experience every trainer passes around."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Callable, Optional, Union

import torch
from torch import Tensor

TensorFn = Callable[[Tensor], Tensor]

# Fields with one entry per step, shaped like ``mask``.
_PER_STEP = ("mask", "logprobs", "values", "rewards", "ref_logprobs", "advantages", "returns", "is_weights")


@dataclass
class Rollout:
    """One batch of experience. Per-step tensors are [B, T] (B rows = sequences or envs, T =
    response tokens or env steps); per-row [B].

    Fields: ``actions [B, T]`` long (sampled tokens / actions; may carry trailing dims, e.g.
    continuous actions ``[B, T, A]``), ``mask [B, T]`` float (1 = valid step), ``logprobs [B, T]``
    log pi_old(a_t | s_t) (temperature-scaled for LMs), ``values [B, T]`` V_old(s_t) (zeros when
    there is no critic), ``rewards [B, T]``, optional ``ref_logprobs [B, T]`` log pi_ref(a_t | s_t),
    ``scores [B]`` sequence-level score (reward model), ``advantages [B, T]``, ``returns [B, T]``,
    optional ``is_weights [B, T]`` (the rollout correction's per-token importance weights, None =
    none) and ``context``: row-aligned inputs with dim 0 = B (LM: ``"input_ids" [B, P+T]``,
    ``"attention_mask" [B, P+T]``).

    Construction checks that every tensor has B rows and every per-step tensor has ``mask``'s
    shape (ValueError naming the field otherwise).
    """

    actions: Tensor
    mask: Tensor
    logprobs: Tensor
    values: Tensor
    rewards: Tensor
    ref_logprobs: Optional[Tensor] = None
    scores: Optional[Tensor] = None
    advantages: Optional[Tensor] = None
    returns: Optional[Tensor] = None
    context: dict[str, Tensor] = field(default_factory=dict)
    is_weights: Optional[Tensor] = None

    def __post_init__(self) -> None:
        B = self.batch_size
        shape = tuple(self.mask.shape)
        for f in fields(self):
            if f.name == "context":
                continue
            value = getattr(self, f.name)
            if value is None:
                continue
            if value.dim() == 0 or value.shape[0] != B:
                raise ValueError(f"Rollout.{f.name} has shape {tuple(value.shape)}: expected {B} rows")
            if f.name in _PER_STEP and tuple(value.shape) != shape:
                raise ValueError(f"Rollout.{f.name} has shape {tuple(value.shape)}: expected mask's shape {shape}")
            if f.name == "actions" and tuple(value.shape[: len(shape)]) != shape:
                raise ValueError(f"Rollout.actions has shape {tuple(value.shape)}: expected {shape} (+ action dims)")
        for key, value in self.context.items():
            if value.dim() == 0 or value.shape[0] != B:
                raise ValueError(f"Rollout.context[{key!r}] has shape {tuple(value.shape)}: expected {B} rows")

    @property
    def batch_size(self) -> int:
        """B, the number of rows."""
        return int(self.actions.shape[0])

    def map(self, fn: TensorFn, *, steps: Optional[TensorFn] = None, context: Optional[TensorFn] = None) -> "Rollout":
        """A new Rollout (checked as any): ``fn`` applied to every tensor field and every context
        entry, None staying None; ``steps``, when given, instead of ``fn`` on ``actions`` and the
        per-step fields (those shaped like ``mask``), ``context`` instead of ``fn`` on the context
        entries. The original is unchanged. E.g. the first ``t`` steps and context columns
        ``cols``: ``r.map(lambda x: x, steps=lambda x: x[:, :t], context=lambda x: x[:, cols])``."""
        step_fn, context_fn = steps or fn, context or fn
        kwargs = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "context":
                kwargs[f.name] = {k: context_fn(v) for k, v in value.items()}
            elif value is not None:
                kwargs[f.name] = (step_fn if f.name == "actions" or f.name in _PER_STEP else fn)(value)
        return Rollout(**kwargs)

    def select(self, idx: Union[Tensor, slice]) -> "Rollout":
        """Rows ``idx`` (long indices, bool row mask ``[B]``, or a slice) of every tensor field and
        every context entry; None stays None. A new Rollout; the original is unchanged."""
        if isinstance(idx, Tensor):
            return self.map(lambda x: x[idx.to(x.device)])
        return self.map(lambda x: x[idx])

    def to(self, device: Union[str, torch.device]) -> "Rollout":
        """Every tensor moved to ``device`` (a new Rollout)."""
        return self.map(lambda x: x.to(device))
