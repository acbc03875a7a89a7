"""KL penalty between the policy and the frozen reference, and the KL coefficient controllers."""

from __future__ import annotations

import math
from typing import Union

import torch
from torch import Tensor

from fourfold.core.masks import as_bool_mask, last_valid_index
from fourfold.names import KL_KINDS  # the estimates' names, written once there


def kl_estimate(logprobs: Tensor, ref_logprobs: Tensor, kind: str = "k1") -> Tensor:
    """Per-token estimate of KL(pi || pi_ref) from the sampled tokens' log-probabilities.

    With d = logprobs - ref_logprobs (= log pi(a) - log pi_ref(a), a ~ pi):

        k1  = d                     unbiased, can be negative
        k2  = d^2 / 2               biased, low variance, >= 0
        k3  = exp(-d) - 1 + d       unbiased, >= 0  (Schulman's k3: (r - 1) - log r, r = pi_ref/pi)
        abs = |d|

    Any shape; elementwise; the result has the shape of the broadcast inputs. Unknown ``kind``
    raises ValueError naming the allowed kinds.
    """
    if kind not in KL_KINDS:
        raise ValueError(f"unknown KL estimator kind {kind!r}; expected one of {', '.join(KL_KINDS)}")
    d = logprobs - ref_logprobs
    if kind == "k1":
        return d
    if kind == "k2":
        return 0.5 * d * d
    if kind == "k3":
        return torch.expm1(-d) + d
    return d.abs()


def token_rewards(
    scores: Tensor,
    logprobs: Tensor,
    ref_logprobs: Tensor,
    mask: Tensor,
    kl_coef: Union[float, Tensor],
    kind: str = "k1",
) -> tuple[Tensor, Tensor]:
    """Per-token PPO-RLHF rewards: a KL penalty on every valid token plus the sequence score on
    the last valid token (Ziegler et al. 2019; Ouyang et al. 2022).

        kl[b, t]      = m[b, t] * kl_estimate(logprobs, ref_logprobs, kind)[b, t]
        rewards[b, t] = -kl_coef * kl[b, t] + [t == last valid t of row b] * scores[b]

    Shapes: ``scores [B]``, ``logprobs``/``ref_logprobs``/``mask`` ``[B, T]`` (any ``[..., T]``
    with ``scores [...]``). Returns ``(rewards [B, T], kl [B, T])``, both 0 outside the mask; a row
    with no valid token gets no score. Pure: pass detached tensors (rollout quantities).
    """
    m = as_bool_mask(mask)
    est = kl_estimate(logprobs, ref_logprobs, kind)
    kl = torch.where(m, est, torch.zeros((), dtype=est.dtype, device=est.device))
    rewards = -kl_coef * kl
    last = last_valid_index(m)  # -1 for an empty row: matches no t
    t = torch.arange(m.shape[-1], device=m.device)
    at_last = t == last.unsqueeze(-1)
    scores = scores.to(rewards.dtype).unsqueeze(-1)
    rewards = rewards + torch.where(at_last, scores, torch.zeros((), dtype=rewards.dtype, device=rewards.device))
    return rewards, kl


def _as_float(x: Union[float, Tensor]) -> float:
    return float(x.item()) if isinstance(x, Tensor) else float(x)


class FixedKLController:
    """Constant KL coefficient. ``.value`` is the coefficient; ``update`` does nothing."""

    def __init__(self, kl_coef: float):
        if kl_coef < 0:
            raise ValueError(f"kl_coef must be >= 0, got {kl_coef}")
        self.value = float(kl_coef)

    def update(self, current_kl: Union[float, Tensor], n_steps: int) -> float:
        """No-op; returns ``.value``."""
        return self.value

    def state_dict(self) -> dict[str, float]:
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.value = float(state["value"])


class AdaptiveKLController:
    """Adaptive KL coefficient (Ziegler et al. 2019, "Fine-Tuning Language Models from Human
    Preferences", section 2.2): after a batch with observed KL ``current_kl`` over ``n_steps``
    samples,

        error  = clip(current_kl / target - 1, -0.2, 0.2)
        value *= 1 + error * n_steps / horizon

    so the coefficient grows when the policy drifts past ``target`` and shrinks below it.
    ``state_dict()`` holds the current value (plain float); ``target`` and ``horizon`` are config.
    """

    def __init__(self, init_kl_coef: float, target: float, horizon: float):
        if init_kl_coef < 0:
            raise ValueError(f"init_kl_coef must be >= 0, got {init_kl_coef}")
        if not target > 0:
            raise ValueError(f"target must be > 0, got {target}")
        if not horizon > 0:
            raise ValueError(f"horizon must be > 0, got {horizon}")
        self.value = float(init_kl_coef)
        self.target = float(target)
        self.horizon = float(horizon)

    def update(self, current_kl: Union[float, Tensor], n_steps: int) -> float:
        """Apply one update in place; returns the new ``.value``. A non-finite ``current_kl``
        raises ValueError (the coefficient is left unchanged)."""
        kl = _as_float(current_kl)
        if not math.isfinite(kl):
            raise ValueError(f"current_kl must be finite, got {kl}")
        error = min(max(kl / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + error * n_steps / self.horizon
        return self.value

    def state_dict(self) -> dict[str, float]:
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.value = float(state["value"])
