"""Sampling primitives shared by the engines: one step's pick, the prompt's forward, the stacking
of a loop's steps into :class:`Samples`.

Pure sampling (top_k = 0, top_p = 1) at a temperature; each row stops after its first EOS and
everything after it is masked. The log-probs kept are those of the sampled tokens under the
temperature-scaled logits: these are pi_old. Training rollouts pick tokens with per-row noise
(:mod:`fourfold.rollout.noise`), so a row's tokens do not depend on the rank or the batch that
samples it.

Layout: ``sequences [B, P+T] = prompt (left-padded) + response (right-padded)``; the response
mask ``[B, T]`` is 1 on generated tokens up to and including the first EOS.
"""

from __future__ import annotations

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
    logprobs: torch.Tensor  # [B, T] log pi_old of the sampled tokens (0 where masked)
    finished: torch.Tensor  # [B] bool: the row produced EOS
    entropy: Optional[torch.Tensor] = None  # [B, T] entropy of the sampling distribution (0 where masked)

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


def pick_tokens(logits: torch.Tensor, temperature: float, greedy: bool, generator: Optional[torch.Generator],
                u: Optional[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One step's tokens ``[B]``, their log-probs and the entropy of the sampling distribution:
    argmax when ``greedy``, the inverse CDF at the uniforms ``u [B]`` when given, else
    ``torch.multinomial`` on ``generator`` (the global generator when None)."""
    logp_all = torch.log_softmax(logits if greedy else logits / temperature, -1)  # (B, V)
    probs = logp_all.exp()
    if greedy:
        tok = logits.argmax(-1)
    elif u is not None:
        tok = inverse_cdf(probs, u)
    else:
        tok = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
    logp = logp_all.gather(-1, tok[:, None]).squeeze(-1)
    return tok, logp, -(probs * logp_all).sum(-1)


@dataclass
class Choice:
    """One step's picks: ``tokens``, ``logprobs``, ``entropy`` ``[B]`` (pad and 0 on rows that had
    finished), ``alive`` ``[B]`` (the rows this step counts for) and ``finished`` after it."""

    tokens: torch.Tensor
    logprobs: torch.Tensor
    entropy: torch.Tensor
    alive: torch.Tensor
    finished: torch.Tensor


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
           pad_token_id: int) -> Choice:
    """One step of sampling from the last position's float32 ``logits [B, V]`` (:func:`pick_tokens`):
    rows already ``finished`` emit ``pad_token_id`` with log-prob and entropy 0; a row that emits
    ``eos_token_id`` finishes."""
    tok, logp, ent = pick_tokens(logits, temperature, greedy, generator, u)
    alive = ~finished
    tok = torch.where(alive, tok, torch.full_like(tok, pad_token_id))
    logp = torch.where(alive, logp, torch.zeros_like(logp))
    ent = torch.where(alive, ent, torch.zeros_like(ent))
    if eos_token_id is not None:
        finished = finished | (alive & (tok == eos_token_id))
    return Choice(tok, logp, ent, alive, finished)


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
    return Samples(sequences, attention_mask, response_mask, torch.stack([c.logprobs for c in steps], 1), finished,
                   torch.stack([c.entropy for c in steps], 1))


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
