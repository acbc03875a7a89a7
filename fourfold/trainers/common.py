"""Pieces every trainer shares: seeding, optimisers and schedules, the non-finite guard and the
one guarded optimizer step, saving HF directories. A trainer never imports another trainer; what
two of them need lives here (the run around the loop lives in :mod:`fourfold.trainers.scaffold`).
"""

from __future__ import annotations

import json
import math
import random
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Optional

import torch

from fourfold import dist
from fourfold.errors import ConfigError, NonFiniteError
from fourfold.trainers.finite_step import finite_step, full_tensor


def seed_everything(seed: int) -> torch.Generator:
    """Seed python, numpy (when imported) and torch; return a dedicated CPU generator for sampling."""
    random.seed(seed)
    torch.manual_seed(seed)
    if "numpy" in sys.modules:
        import numpy as np

        np.random.seed(seed % 2**32)
    gen = torch.Generator()
    gen.manual_seed(seed)
    return gen


def quiet_transformers() -> None:
    """Keep transformers' load reports and progress bars off the terminal (our own bar is there)."""
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
    except ImportError:  # pragma: no cover
        pass


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

    def check_limit(self) -> None:
        if self.consecutive >= self.limit:
            last = self.events[-1]
            raise NonFiniteError(
                f"{self.consecutive} consecutive non-finite updates (last: {last['quantity']} at {last['where']}); "
                f"stopped with the last good state (run.max_consecutive_skips={self.limit})"
            )


def clip_and_step(model, optimizer, scheduler, max_grad_norm: Optional[float], guard: NonFiniteGuard, where: str
                  ) -> tuple[float, bool]:
    """Global grad-norm clip, then step only if the norm is finite, and keep the step only if every
    parameter after it is finite (:func:`fourfold.trainers.finite_step.finite_step`: else the
    pre-step weights and optimizer state are put back and the guard counts quantity
    ``parameters``). Returns ``(grad norm, the weights moved)``."""
    params = [p for p in model.parameters() if p.grad is not None]
    if max_grad_norm is not None:
        norm = torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
    elif dist.started():  # sharded gradients: the norm of the whole gradient, the same on every rank
        norm = torch.nn.utils.get_total_norm([p.grad for p in params])
    else:
        norm = torch.norm(torch.stack([p.grad.detach().norm() for p in params])) if params else torch.zeros(())
    norm = full_tensor(norm)
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
                 losses: Iterable[tuple[torch.Tensor, dict]], *, schedule_on_skip: bool = True
                 ) -> tuple[Optional[float], bool]:
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
    counts as one update is the caller's: a step, or PPO's whole iteration.
    """
    for loss, checks in losses:
        if not all(guard.ok(what, value, where) for what, value in checks.items()):
            optimizer.zero_grad(set_to_none=True)
            if scheduler is not None and schedule_on_skip:
                scheduler.step()
            return None, False
        loss.backward()
    return clip_and_step(model, optimizer, scheduler, max_grad_norm, guard, where)


def local_rows(indices: list[int], world: dist.World) -> tuple[list[int], int]:
    """(this rank's contiguous part of a global batch of example ``indices``, how many of its rows
    count). A batch splits as evenly as it can (:func:`fourfold.dist.shard`); a rank left without
    rows (the last batch of an epoch smaller than the world) takes the batch's first row and counts
    none of it: its forward and backward still run, which FSDP's collectives need from every rank."""
    part = indices[dist.shard(len(indices), world)]
    return (part, len(part)) if part else (indices[:1], 0)


def global_sums(values: list[float]) -> list[float]:
    """``values`` summed over every rank, in float64 (``values`` themselves in one process)."""
    if not dist.world().distributed:
        return values
    return dist.all_reduce_sum(torch.tensor(values, dtype=torch.float64)).tolist()


def global_weight(count: float, total: float) -> float:
    """The factor that turns a loss averaged over this rank's ``count`` items into its share of the
    average over all ranks' ``total``: FSDP averages the gradients over the ranks, so a rank's loss
    is scaled by ``count * world_size / total`` (0 for a rank whose rows do not count)."""
    return count * dist.world().world_size / total if total else 0.0


def num_steps(max_steps: Optional[int], epochs: float, batches_per_epoch: int) -> int:
    """Optimizer steps of a supervised run: ``max_steps``, else ``ceil(epochs * batches per epoch)``."""
    if max_steps is not None:
        return max_steps
    return max(1, math.ceil(epochs * batches_per_epoch))


def require_batch(batch_size: int, examples: int, what: str) -> None:
    """A ConfigError naming ``train.batch_size`` when one batch needs more than the ``examples``
    a supervised stage loaded (``what`` says which, e.g. "training examples in data.jsonl")."""
    if batch_size > examples:
        raise ConfigError(f"train.batch_size: {batch_size} is more than the {examples} {what}; "
                          f"lower it to at most {examples}")


def save_hf(model, tokenizer, out_dir: str | Path, state_dict: Optional[dict] = None) -> Path:
    """Write a HF directory (safetensors) atomically: temp sibling dir, swapped into place.

    Next to a generative model (policy, SFT model) the tokenizer is saved with
    ``padding_side: left``, so that batched ``generate`` works in plain transformers; next to a
    classifier (reward model, critic) it keeps the library default (right padding, which
    ``AutoModelForSequenceClassification`` handles: it scores the last non-pad token). fourfold's
    own loading sets the side itself and pads with its own helpers, so it reads either the same.
    ``state_dict``: the weights to write instead of the model's own (the gathered whole of a
    sharded model, :func:`fourfold.trainers.fsdp.export_state_dict`)."""
    from fourfold.checkpoint import save_pretrained_atomic

    def _save(tmp: Path) -> None:
        if state_dict is None:
            model.save_pretrained(tmp, safe_serialization=True)
        else:
            model.save_pretrained(tmp, safe_serialization=True, state_dict=state_dict)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
            if getattr(model, "can_generate", lambda: False)():
                _set_padding_side(Path(tmp) / "tokenizer_config.json", "left")

    return save_pretrained_atomic(_save, out_dir)


def _set_padding_side(tokenizer_config: Path, side: str) -> None:
    """Record ``padding_side`` in a saved ``tokenizer_config.json`` (transformers writes it only
    when it was an explicit init argument)."""
    cfg = json.loads(tokenizer_config.read_text(encoding="utf-8"))
    cfg["padding_side"] = side
    tokenizer_config.write_text(json.dumps(cfg, indent=2, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")


def track_steps(run, name: str, module, optimizer, scheduler, sampler, window: dict) -> int:
    """The checkpoint of a step-based trainer (SFT, reward model) and its resume: ``module``, its
    optimizer and schedule (under ``name``), the sampler's position, the metrics ``window``
    (updated in place on resume) and the non-finite count, on the :class:`RunScaffold` ``run``.
    Returns the step the loop continues after (0 for a fresh run)."""
    run.track(modules={name: module}, optimizers={name: optimizer}, schedulers={name: scheduler},
              state=lambda step: {"step": step, "sampler": sampler.state_dict(), "window": dict(window),
                                  "nonfinite_total": run.guard.total})
    state = run.resume()
    if state is None:
        return 0
    sampler.load_state_dict(state["sampler"])
    window.update(state["window"])
    return state["step"]


def last_metrics_row(out: Path) -> dict:
    """The last row of ``out/metrics.jsonl`` without its step ({} when there is none): what a
    trainer reports when it resumed a run that had already finished."""
    from fourfold.reporting import read_metrics

    rows = read_metrics(out / "metrics.jsonl")
    return {k: v for k, v in rows[-1].items() if k != "step"} if rows else {}
