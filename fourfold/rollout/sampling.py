"""Sampling primitives shared by the engines: the truncation filter (:func:`truncate_logits`), one
step's pick, the prompt's forward, the stacking of a loop's steps into :class:`Samples`.

Sampling at a temperature, optionally truncated (:class:`Truncation`: ``generation.top_k``,
``top_p``, ``min_p``, applied after the temperature in that order, as Hugging Face's samplers do);
each row stops after its first EOS and everything after it is masked. The log-probs kept are those
of the sampled tokens under the distribution actually sampled from: the temperature-scaled
softmax, renormalised over the tokens the filter kept (the behaviour policy; without a filter the
plain temperature-scaled softmax, bit for bit as before the filter existed). With a filter each
step also keeps the log of the probability mass it kept (``kept_logmass``, <= 0): the policy's
full-softmax log-prob of a sampled token is its sampled log-prob plus that (docs/engines.md,
"Truncated sampling"). Training rollouts pick tokens with per-row noise
(:mod:`fourfold.rollout.noise`), so a row's tokens do not depend on the rank or the batch that
samples it.

Layout: ``sequences [B, P+T] = prompt (left-padded) + response (right-padded)``; the response
mask ``[B, T]`` is 1 on generated tokens up to and including the first EOS.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence

import torch

from fourfold import dist
from fourfold.models.roles import accepts_kwarg, position_ids_from_mask
from fourfold.rollout.noise import inverse_cdf


@dataclass
class Samples:
    """What sampling produced. Shapes: B rows, P prompt tokens, T response tokens."""

    sequences: torch.Tensor  # [B, P+T] prompt + response token ids (pad after EOS)
    attention_mask: torch.Tensor  # [B, P+T] 1 on prompt tokens and valid response tokens
    response_mask: torch.Tensor  # [B, T] float: 1 up to and including the first EOS
    logprobs: torch.Tensor  # [B, T] log-probs of the sampled tokens under the distribution sampled from (0 where masked)
    finished: torch.Tensor  # [B] bool: the row produced EOS
    entropy: Optional[torch.Tensor] = None  # [B, T] entropy of the sampling distribution (0 where masked)
    kept_logmass: Optional[torch.Tensor] = None  # [B, T] log of the mass a truncation kept (0 where masked); None: no filter

    @property
    def policy_logprobs(self) -> torch.Tensor:
        """``[B, T]`` log-probs of the sampled tokens under the policy's full temperature-scaled
        softmax: ``logprobs`` + ``kept_logmass`` (``logprobs`` itself without a filter)."""
        return self.logprobs if self.kept_logmass is None else self.logprobs + self.kept_logmass

    @property
    def n_response(self) -> int:
        return self.response_mask.shape[1]

    @property
    def responses(self) -> torch.Tensor:
        return self.sequences[:, -self.n_response:]


def cache_kwarg(model) -> str:
    """The keyword ``model``'s forward takes its KV cache by: ``cache`` (transformers >= 5) or
    ``past_key_values``."""
    return "cache" if accepts_kwarg(model, "cache") else "past_key_values"


def output_cache(out, cache_kw: str):
    """The KV cache a forward returned (under the keyword's name, :func:`cache_kwarg`)."""
    return getattr(out, "cache", None) if cache_kw == "cache" else out.past_key_values


@dataclass(frozen=True)
class Truncation:
    """The filters applied to the temperature-scaled distribution before each pick
    (``generation.top_k``, ``top_p``, ``min_p``); every one off by default (:data:`NO_TRUNCATION`)."""

    top_k: int = 0
    """Keep the ``top_k`` most probable tokens (and every token tied with the k-th); 0 = off."""
    top_p: float = 1.0
    """Nucleus: keep the smallest set of most probable tokens whose probability reaches ``top_p``
    (and every token tied with the least probable of them; the top token always); 1 = off."""
    min_p: float = 0.0
    """Keep the tokens whose probability is at least ``min_p`` times the top token's; 0 = off."""

    @property
    def active(self) -> bool:
        """Whether any filter is on (the pick then differs from pure temperature sampling)."""
        return self.top_k > 0 or self.top_p < 1.0 or self.min_p > 0.0


NO_TRUNCATION = Truncation()
"""No filter: pure temperature sampling."""


def kept_tokens(scaled: torch.Tensor, truncation: Truncation) -> torch.Tensor:
    """Which tokens ``[B, V]`` (bool) the filters keep of the temperature-scaled logits
    ``scaled [B, V]``, in Hugging Face's order (``TopK``, ``TopP``, ``MinP`` warpers after the
    temperature): top-k first; top-p on the distribution renormalised over top-k's tokens; min-p
    last. Ties are kept together: top-k keeps every token equal to the k-th largest logit (as
    Hugging Face's and vLLM's threshold does), top-p every token equal in probability to the least
    probable one it needs (an order-free set: Hugging Face and vLLM keep whichever tied token their
    sort puts first). The argmax is always kept, so no row is ever empty. (vLLM's v1 sampler runs
    min-p before top-k/top-p; the kept set is the same unless top-p and min-p are both on, since
    min-p compares each probability with the top one's, a ratio that renormalising leaves alone.)"""
    keep = torch.ones_like(scaled, dtype=torch.bool)
    V = scaled.shape[-1]
    if 0 < truncation.top_k < V:
        kth = torch.topk(scaled, truncation.top_k, dim=-1).values[:, -1:]  # (B, 1)
        keep = scaled >= kth
    if truncation.top_p < 1.0:
        probs = torch.softmax(scaled.masked_fill(~keep, float("-inf")), -1)  # (B, V), renormalised over top-k's
        desc = probs.sort(-1, descending=True).values
        above = desc.cumsum(-1) - desc  # the mass of the tokens sorted before each one
        needed = above < truncation.top_p  # the first token always (0 < top_p)
        floor = torch.where(needed, desc, torch.ones_like(desc)).amin(-1, keepdim=True)  # the least probable needed
        keep = keep & (probs >= floor)
    if truncation.min_p > 0.0:  # p_i >= min_p * p_max  <=>  s_i - s_max >= log(min_p)
        keep = keep & (scaled - scaled.amax(-1, keepdim=True) >= math.log(truncation.min_p))
    return keep


def truncate_logits(logits: torch.Tensor, temperature: float, truncation: Truncation = NO_TRUNCATION) -> torch.Tensor:
    """THE sampling filter, one pure function for every engine: ``logits [B, V]`` divided by
    ``temperature``, then the tokens :func:`kept_tokens` removes (top-k, then top-p, then min-p)
    set to -inf, so that a softmax of the result is the filtered distribution renormalised over the
    kept tokens. With every filter off it is ``logits / temperature`` itself."""
    scaled = logits / temperature  # (B, V)
    if not truncation.active:
        return scaled
    return scaled.masked_fill(~kept_tokens(scaled, truncation), float("-inf"))


def pick_tokens(logits: torch.Tensor, temperature: float, greedy: bool, generator: Optional[torch.Generator],
                u: Optional[torch.Tensor], truncation: Truncation = NO_TRUNCATION
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
    """One step's tokens ``[B]``, their log-probs, the entropy of the sampling distribution and the
    log of the probability mass the ``truncation`` kept (None without a filter, or greedy): argmax
    when ``greedy`` (no filter: the argmax is always kept), the inverse CDF at the uniforms ``u [B]``
    when given, else ``torch.multinomial`` on ``generator`` (the global generator when None). The
    log-probs and the entropy are of the distribution sampled from (:func:`truncate_logits`,
    renormalised over the kept tokens)."""
    if greedy or not truncation.active:  # the pure temperature pick, exactly as before the filters
        logp_all = torch.log_softmax(logits if greedy else logits / temperature, -1)  # (B, V)
        probs = logp_all.exp()
        tok = logits.argmax(-1) if greedy else _draw(probs, generator, u)
        logp = logp_all.gather(-1, tok[:, None]).squeeze(-1)
        return tok, logp, -(probs * logp_all).sum(-1), None
    scaled = logits / temperature
    filtered = truncate_logits(logits, temperature, truncation)  # (B, V), -inf off the kept tokens
    logp_all = torch.log_softmax(filtered, -1)
    probs = logp_all.exp()  # 0 off the kept tokens
    tok = _draw(probs, generator, u)
    logp = logp_all.gather(-1, tok[:, None]).squeeze(-1)
    entropy = -torch.where(probs > 0, probs * logp_all, torch.zeros_like(probs)).sum(-1)
    kept = torch.logsumexp(filtered, -1) - torch.logsumexp(scaled, -1)  # log of the kept mass, <= 0
    return tok, logp, entropy, kept.clamp(max=0.0)


def _draw(probs: torch.Tensor, generator: Optional[torch.Generator], u: Optional[torch.Tensor]) -> torch.Tensor:
    """The pick from ``probs [B, V]``: the inverse CDF at ``u`` when given, else ``torch.multinomial``."""
    if u is not None:
        return inverse_cdf(probs, u)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


@dataclass
class Choice:
    """One step's picks: ``tokens``, ``logprobs``, ``entropy`` ``[B]`` (pad and 0 on rows that had
    finished), ``alive`` ``[B]`` (the rows this step counts for), ``finished`` after it and, under
    a truncation, ``kept`` ``[B]`` (the log of the mass it kept; 0 on rows that had finished)."""

    tokens: torch.Tensor
    logprobs: torch.Tensor
    entropy: torch.Tensor
    alive: torch.Tensor
    finished: torch.Tensor
    kept: Optional[torch.Tensor] = None


def default_generator(device: torch.device) -> Optional[torch.Generator]:
    """The generator ``torch.multinomial(..., generator=None)`` draws from on ``device`` (the CPU's
    or that CUDA device's default one); None for another device type."""
    if device.type == "cpu":
        return torch.default_generator
    if device.type == "cuda":
        return torch.cuda.default_generators[device.index if device.index is not None else torch.cuda.current_device()]
    return None


def choose(logits: torch.Tensor, finished: torch.Tensor, temperature: float, greedy: bool,
           generator: Optional[torch.Generator], u: Optional[torch.Tensor], eos_token_id: Optional[int],
           pad_token_id: int, truncation: Truncation = NO_TRUNCATION) -> Choice:
    """One step of sampling from the last position's float32 ``logits [B, V]`` (:func:`pick_tokens`,
    under ``truncation``): rows already ``finished`` emit ``pad_token_id`` with log-prob, entropy
    and kept log-mass 0; a row that emits ``eos_token_id`` finishes."""
    tok, logp, ent, kept = pick_tokens(logits, temperature, greedy, generator, u, truncation)
    alive = ~finished
    tok = torch.where(alive, tok, torch.full_like(tok, pad_token_id))
    logp = torch.where(alive, logp, torch.zeros_like(logp))
    ent = torch.where(alive, ent, torch.zeros_like(ent))
    if kept is not None:
        kept = torch.where(alive, kept, torch.zeros_like(kept))
    if eos_token_id is not None:
        finished = finished | (alive & (tok == eos_token_id))
    return Choice(tok, logp, ent, alive, finished, kept)


def all_finished(finished: torch.Tensor, sync: bool) -> bool:
    """Whether every row has finished: on this rank, or with ``sync`` on every rank of the
    process group (the rows still alive are summed over ranks). A host-device sync."""
    alive = (~finished).sum()
    return int(dist.all_reduce_sum(alive) if sync else alive) == 0


def stack_samples(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, steps: Sequence[Choice],
                  finished: torch.Tensor) -> Samples:
    """The :class:`Samples` of the ``steps`` of a sampling loop (one :class:`Choice` per token)."""
    response = torch.stack([c.tokens for c in steps], 1)  # (B, T)
    response_mask = torch.stack([c.alive for c in steps], 1).float()
    sequences = torch.cat([prompt_ids, response], dim=1)
    attention_mask = torch.cat([prompt_mask.long(), response_mask.long()], dim=1)
    kept = None if steps[0].kept is None else torch.stack([c.kept for c in steps], 1)
    return Samples(sequences, attention_mask, response_mask, torch.stack([c.logprobs for c in steps], 1), finished,
                   torch.stack([c.entropy for c in steps], 1), kept)


def prefill(model: torch.nn.Module, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor):
    """The prompt's forward with the KV cache (the last position's logits only, when the model
    can): ``(output, position ids of the prompt [B, P])``."""
    keep_kw = {"logits_to_keep": 1} if accepts_kwarg(model, "logits_to_keep") else {}
    attn = prompt_mask.long()
    pos = position_ids_from_mask(attn)
    return model(input_ids=prompt_ids, attention_mask=attn, position_ids=pos, use_cache=True, **keep_kw), pos


def decode_responses(tokenizer, samples: Samples) -> list[str]:
    """Response texts (special tokens skipped, nothing after EOS)."""
    rows = []
    for ids, m in zip(samples.responses.tolist(), samples.response_mask.tolist()):
        rows.append(tokenizer.decode([t for t, v in zip(ids, m) if v > 0], skip_special_tokens=True))
    return rows
