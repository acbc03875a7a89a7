"""An optimizer step that can never leave a NaN or Inf in the weights.

The guarded step (:func:`fourfold.run.optim.guarded_step`) already refuses a non-finite loss
or gradient norm. What is left is the step itself overflowing: a huge learning rate (``lr=1e39``
in float32, ``lr=1e5`` in float16) turns finite gradients into infinite weights. :func:`finite_step`
checks the parameters after the step and, when one is not finite, puts the pre-step parameters and
optimizer state back: the step counts as a non-finite skip (quantity ``parameters``).

Cost, for a model of N parameters:

* every step: two fused L2 norms over the stepped parameters (``torch._foreach_norm``, one pass
  each, in float32), one before and one after the step, and one host sync each. On CPU that is a
  fraction of the AdamW step itself (which reads and writes four tensors of N), and far below the
  forward and backward passes.
* a copy of the parameters and the optimizer state (about 3 N for Adam) only when the step *might*
  overflow. For Adam and AdamW the update of one element is bounded whatever the gradients:
  ``|m_hat / (sqrt(v_hat) + eps)| <= 1 / sqrt((1 - beta2) (1 - beta1**2 / beta2))`` (Cauchy-Schwarz
  over the moment sums and the bias corrections; about 73 for the default betas), so
  ``|p_new| <= |p| |1 - lr wd| + lr * bound``, and ``|p| <= ||p||_2``. When that stays below a
  quarter of the dtype's largest number the step cannot overflow and no copy is kept; this holds
  for every ordinary run, whose steps therefore cost the two norms only. Any other optimizer, and
  betas outside ``beta1**2 < beta2``, always get the copy.
* In the one case the bound would miss (it cannot for Adam and AdamW, whose moments stay finite
  under finite gradients), a non-finite result without a copy stops the run with a
  :class:`~fourfold.errors.NonFiniteError` before anything is saved.
"""

from __future__ import annotations

import copy
import math
from typing import Optional

import torch

from fourfold import dist
from fourfold.errors import NonFiniteError

_SAFETY = 4.0
"""How far below the dtype's largest number a step's bound must stay for it to go uncopied."""


def _norms(params: list[torch.Tensor]) -> list[float]:
    """The L2 norm of each tensor (float32 accumulation; inf when even that overflows); of the whole
    parameter when it is sharded."""
    if not params:
        return []
    return dist.full_tensor(torch.stack(torch._foreach_norm(params, 2, dtype=torch.float32))).tolist()


def _local(t: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a DTensor; any other tensor as is."""
    return t.to_local() if hasattr(t, "to_local") else t


def adam_update_bound(betas: tuple[float, float]) -> Optional[float]:
    """The largest ``|m_hat / (sqrt(v_hat) + eps)|`` Adam can take for ``betas`` (None when
    ``beta1**2 >= beta2``: no bound of this form)."""
    beta1, beta2 = float(betas[0]), float(betas[1])
    if not (0 <= beta1 < 1 and 0 < beta2 < 1) or beta1 * beta1 >= beta2:
        return None
    return 1.0 / math.sqrt((1.0 - beta2) * (1.0 - beta1 * beta1 / beta2))


def may_overflow(optimizer: torch.optim.Optimizer, groups: list[list[torch.Tensor]]) -> bool:
    """Whether the next ``optimizer.step()`` could produce a non-finite parameter (``groups``:
    the parameters it will step, per param group). False only when the Adam bound says it cannot."""
    if not isinstance(optimizer, (torch.optim.Adam, torch.optim.AdamW)):
        return True
    for group, params in zip(optimizer.param_groups, groups):
        if not params:
            continue
        bound = adam_update_bound(group["betas"])
        if bound is None:
            return True
        lr, wd = float(group["lr"]), float(group["weight_decay"])
        decoupled = isinstance(optimizer, torch.optim.AdamW) or group.get("decoupled_weight_decay", False)
        shrink = abs(1.0 - lr * wd) if decoupled else 1.0
        largest = min(torch.finfo(p.dtype).max for p in params) / _SAFETY
        if not max(_norms(params)) * shrink + lr * bound < largest:  # a nan norm also says "may"
            return True
    return False


def _all_finite(params: list[torch.Tensor]) -> bool:
    """Every element of every tensor is finite (a finite norm proves it; else look element-wise,
    since the norm of large finite values can itself overflow)."""
    if all(math.isfinite(n) for n in _norms(params)):
        return True
    bad = torch.tensor(int(not all(bool(torch.isfinite(_local(p)).all()) for p in params)))
    return not bool(dist.all_reduce_max(bad))  # sharded: every rank looked at its shards


def finite_step(optimizer: torch.optim.Optimizer) -> bool:
    """``optimizer.step()``, undone when it left a non-finite parameter (or, in torch's non-fused
    kernels, stopped half-way on a learning rate the dtype cannot hold): returns whether the step
    stands. With no copy kept (see the module docstring) a non-finite result is a NonFiniteError."""
    groups = [[p for p in g["params"] if p.grad is not None] for g in optimizer.param_groups]
    params = [p for g in groups for p in g]
    backup = None
    if may_overflow(optimizer, groups):
        backup = ([_local(p).detach().clone() for p in params], {p: copy.deepcopy(optimizer.state[p]) for p in params})
    try:
        optimizer.step()
    except RuntimeError as e:  # torch's non-fused kernels refuse an lr that overflows the dtype, mid-step
        if backup is None or "overflow" not in str(e):
            raise
    else:
        if _all_finite(params):
            return True
        if backup is None:
            raise NonFiniteError("the optimizer step left non-finite weights and no copy of the previous ones "
                                 "was kept; stopped before saving anything")
    saved, state = backup
    with torch.no_grad():
        torch._foreach_copy_([_local(p) for p in params], saved)  # sharded: each rank puts its shards back
    for p in params:
        optimizer.state[p] = state[p]
    return False
