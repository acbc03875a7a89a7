"""The optimisation every trainer shares: AdamW and its schedule, the non-finite guard, and the one
guarded optimizer step (a non-finite loss, gradient norm or step never reaches the weights)."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Callable, Iterable, Optional

import torch

from fourfold import dist
from fourfold.errors import NonFiniteError
from fourfold.run.finite_step import finite_step
from fourfold.run.fsdp import average_gradients


def make_optimizer(params: Iterable[torch.nn.Parameter], lr: float, weight_decay: float = 0.0, eps: float = 1e-8):
    """AdamW; the fused CPU/CUDA kernel when this torch has it (one kernel for all parameters)."""
    params = [p for p in params if p.requires_grad]
    try:
        return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, eps=eps, fused=True)
    except (RuntimeError, TypeError):
        return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, eps=eps)


def make_schedule(optimizer, total_steps: int, kind: str = "linear", warmup_steps: int = 0):
    """LambdaLR: linear warm-up, then linear decay to 0 at total_steps (or constant)."""

    def factor(step: int) -> float:
        if warmup_steps and step < warmup_steps:
            return (step + 1) / warmup_steps
        if kind == "constant":
            return 1.0
        span = max(1, total_steps - warmup_steps)
        return max(0.0, 1.0 - (step - warmup_steps) / span)

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


@dataclass
class NonFiniteGuard:
    """Counts skipped updates; raises NonFiniteError after ``limit`` consecutive ones.

    A NaN/Inf in a loss, a gradient norm, a reward or an advantage never reaches the weights: the
    caller asks :meth:`ok` before stepping and skips the step when it says no; a step that itself
    leaves a non-finite weight is undone and counted with :meth:`skip` (see :func:`clip_and_step`).
    """

    limit: int = 3
    consecutive: int = 0
    total: int = 0
    good: int = 0
    """Updates that went through in this process (:meth:`good_step`)."""
    events: list = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _taken: int = field(default=0, repr=False)

    def ok(self, what: str, value: torch.Tensor | float, where: str = "") -> bool:
        v = value if isinstance(value, torch.Tensor) else torch.tensor(float(value))
        if bool(torch.isfinite(v).all()):
            return True
        self.skip(what, where)
        return False

    def skip(self, what: str, where: str = "") -> None:
        """Count one skipped update: ``what`` was not finite at ``where``."""
        with self._lock:  # the policy and the critic may update in two threads
            self.consecutive += 1
            self.total += 1
            self.events.append({"quantity": what, "where": where, "consecutive": self.consecutive})

    def take_new_events(self) -> list[dict]:
        """Events recorded since the last call (for the run's events.jsonl)."""
        with self._lock:
            new = self.events[self._taken:]
            self._taken = len(self.events)
        return new

    def good_step(self) -> None:
        self.consecutive = 0
        self.good += 1

    def check_limit(self) -> None:
        if self.consecutive >= self.limit:
            last = self.events[-1]
            raise NonFiniteError(
                f"{self.consecutive} consecutive non-finite updates (last: {last['quantity']} at {last['where']}); "
                f"stopped with the last good state (run.max_consecutive_skips={self.limit})"
            )


def clip_and_step(model, optimizer, scheduler, max_grad_norm: Optional[float], guard: NonFiniteGuard, where: str,
                  on_grads: Optional[Callable[[list], None]] = None) -> tuple[float, bool]:
    """Global grad-norm clip, then step only if the norm is finite, and keep the step only if every
    parameter after it is finite (:func:`fourfold.run.finite_step.finite_step`: else the
    pre-step weights and optimizer state are put back and the guard counts quantity
    ``parameters``). Returns ``(grad norm, the weights moved)``. A model replicated under torchrun
    first has its gradients averaged over the ranks (:func:`~fourfold.run.fsdp.average_gradients`).
    ``on_grads(params)``, when given, sees the parameters' averaged gradients before the clip (a
    measurement: it must not change them)."""
    average_gradients(model)
    params = [p for p in model.parameters() if p.grad is not None]
    if on_grads is not None:
        on_grads(params)
    if max_grad_norm is not None:
        norm = torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
    elif dist.started():  # sharded gradients: the norm of the whole gradient, the same on every rank
        norm = torch.nn.utils.get_total_norm([p.grad for p in params])
    else:
        norm = torch.norm(torch.stack([p.grad.detach().norm() for p in params])) if params else torch.zeros(())
    norm = dist.full_tensor(norm)
    taken = False
    if guard.ok("grad_norm", norm, where):
        taken = finite_step(optimizer)
        if not taken:  # the step overflowed and was undone
            guard.skip("parameters", where)
    optimizer.zero_grad(set_to_none=True)
    if scheduler is not None:
        scheduler.step()
    return float(norm), taken


def guarded_step(model, optimizer, scheduler, max_grad_norm: Optional[float], guard: NonFiniteGuard, where: str,
                 losses: Iterable[tuple[torch.Tensor, dict]], *, schedule_on_skip: bool = True,
                 on_grads: Optional[Callable[[list], None]] = None) -> tuple[Optional[float], bool]:
    """The one guarded optimizer step of every trainer (SFT, reward model, PPO's policy and critic,
    REINFORCE, gym).

    ``losses`` yields ``(loss, checks)`` per micro-batch (a list of one for a plain step), lazily:
    each item's ``checks`` (``{quantity: value}``, asked of ``guard`` in order, stopping at the
    first non-finite one) come before its ``loss.backward()``; gradients accumulate over the items.
    Then the global grad-norm clip, the optimizer step unless the norm is not finite, and the
    schedule (:func:`clip_and_step`).

    A non-finite checked quantity skips the whole step: the gradients are zeroed, later items are
    never computed, and the schedule still counts the step (so a resumed or a clean run sees the
    same learning rates) unless ``schedule_on_skip`` is False (PPO's policy and critic steps).

    Returns ``(grad_norm, taken)``: ``grad_norm`` is None when a checked quantity skipped the step,
    else the norm before clipping (not finite: the step was skipped); ``taken``: the weights moved
    (False also when the step itself left a non-finite weight and was undone).
    The guard's consecutive count is the caller's to reset (``guard.good_step()``), because what
    counts as one update is the caller's: a step, or PPO's whole iteration. ``on_grads`` as for
    :func:`clip_and_step` (called only when every check passed).
    """
    for loss, checks in losses:
        if not all(guard.ok(what, value, where) for what, value in checks.items()):
            optimizer.zero_grad(set_to_none=True)
            if scheduler is not None and schedule_on_skip:
                scheduler.step()
            return None, False
        loss.backward()
    return clip_and_step(model, optimizer, scheduler, max_grad_norm, guard, where, on_grads)
