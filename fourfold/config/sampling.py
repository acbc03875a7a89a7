"""The sampling filters of a generation section (``generation.top_k``, ``top_p``, ``min_p``, the
fields of :class:`fourfold.config.ppo.GenerationConfig`): their check, whether one is on, and how a
run's notes name them. What they do: :func:`fourfold.rollout.sampling.truncate_logits`."""

from __future__ import annotations

from fourfold.config.loader import require

FILTERS_OFF = {"top_k": 0, "top_p": 1.0, "min_p": 0.0}
"""Each filter's value that turns it off (its default): sampling is then pure temperature sampling."""


def require_filters(gen, prefix: str = "generation") -> None:
    """The filters' ranges, each refused in one line naming its key and the range expected."""
    require(gen.top_k >= 0, f"{prefix}.top_k", f"must be >= 0 (0 = off), got {gen.top_k}")
    require(0 < gen.top_p <= 1, f"{prefix}.top_p", f"must be in (0, 1] (1 = off), got {gen.top_p:g}")
    require(0 <= gen.min_p < 1, f"{prefix}.min_p", f"must be in [0, 1) (0 = off), got {gen.min_p:g}")


def truncates(gen) -> bool:
    """Whether a filter of ``gen`` is on (top_k > 0, top_p < 1 or min_p > 0): the rollout's log-probs
    are then the truncated distribution's, not the policy's full softmax."""
    return gen.top_k > 0 or gen.top_p < 1.0 or gen.min_p > 0.0


def filters_said(gen, prefix: str = "generation") -> str:
    """The filters of ``gen`` that are on, as a run's notes name them (e.g. 'generation.top_p 0.9')."""
    return ", ".join(f"{prefix}.{k} {getattr(gen, k):g}" for k, off in FILTERS_OFF.items() if getattr(gen, k) != off)
