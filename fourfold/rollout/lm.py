"""Generation -> Rollout for language models.

Two steps, both without gradients:

1. :func:`sample` — batched sampling with the KV cache from left-padded prompts: pure sampling
   (top_k = 0, top_p = 1) at a temperature; each row stops after its first EOS and everything after
   it is masked; the loop stops as soon as every row has finished (on every rank, when asked). It
   keeps the log-probs of the sampled tokens under the temperature-scaled logits: these are pi_old.
   Training rollouts pick tokens with per-row noise (:mod:`fourfold.rollout.noise`), so a row's
   tokens do not depend on the rank or the batch that samples it.
2. :func:`score` — one batched forward pass each of the reference (log-probs), the critic (values)
   and the reward model (one scalar per sequence) over prompt + response.

Layout: ``sequences [B, P+T] = prompt (left-padded) + response (right-padded)``; the response
mask ``[B, T]`` is 1 on generated tokens up to and including the first EOS.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, fields, replace
from typing import Optional, Protocol, Sequence

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


@torch.no_grad()
def sample(
    model: torch.nn.Module,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    *,
    max_new_tokens: int,
    temperature: float = 1.0,
    eos_token_id: Optional[int] = None,
    pad_token_id: int = 0,
    generator: Optional[torch.Generator] = None,
    greedy: bool = False,
    noise: Optional[torch.Tensor] = None,
    sync_stop: bool = False,
) -> Samples:
    """Sample up to ``max_new_tokens`` per row with the KV cache; stop when every row has EOS.

    ``eos_token_id=None`` disables stopping (fixed-length responses, as in the benchmark).
    ``noise``: uniforms ``[B, max_new_tokens]`` (:meth:`fourfold.rollout.noise.RowNoise.uniforms`);
    step ``t`` picks each row's token by the inverse CDF at ``noise[:, t]``, so a row's tokens
    depend on its own uniforms only. Without it tokens come from ``torch.multinomial`` on
    ``generator`` (evaluation's and ``fourfold generate``'s path). ``sync_stop``: the loop stops
    only when every row of every rank has finished (one all-reduce per step): a sharded model's
    forward is a collective, so all ranks must make the same number of calls.
    """
    B = prompt_ids.shape[0]
    device = prompt_ids.device
    cache_kw = cache_kwarg(model)
    out, pos = prefill(model, prompt_ids, prompt_mask)
    attn = prompt_mask.long()
    next_pos = pos[:, -1:] + 1  # (B, 1)
    finished = torch.zeros(B, dtype=torch.bool, device=device)
    steps = []
    for step in range(max_new_tokens):
        u = None if noise is None else noise[:, step].to(device)
        c = choose(out.logits[:, -1, :].float(), finished, temperature, greedy, generator, u, eos_token_id, pad_token_id)
        steps.append(c)
        finished = c.finished
        if eos_token_id is not None and all_finished(finished, sync_stop):
            break
        if step + 1 == max_new_tokens:
            break
        attn = torch.cat([attn, torch.ones(B, 1, dtype=attn.dtype, device=device)], dim=1)
        out = model(input_ids=c.tokens[:, None], attention_mask=attn, position_ids=next_pos,
                    use_cache=True, **{cache_kw: output_cache(out, cache_kw)})
        next_pos = next_pos + 1
    return stack_samples(prompt_ids, prompt_mask, steps, finished)


class RolloutEngine(Protocol):
    """What generates a rollout's responses: :func:`sample` (Hugging Face forwards with the KV cache)
    is the built-in engine; the engines of :mod:`fourfold.rollout.engine` (with their weight sync)
    and any other backend (a vLLM server holding a copy of the policy's weights, say) go in by
    implementing this call and being passed as ``collect(..., engine=...)``. It must return
    :class:`Samples` whose ``logprobs`` are the policy's (pi_old) under ``temperature``; with
    ``noise`` (uniforms ``[B, max_new_tokens]``) row r's tokens depend only on row r's noise, and
    with ``sync_stop`` it keeps stepping until every rank's rows are done."""

    def __call__(self, model: torch.nn.Module, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, *,
                 max_new_tokens: int, temperature: float, eos_token_id: Optional[int], pad_token_id: int,
                 noise: Optional[torch.Tensor], sync_stop: bool) -> Samples: ...


@dataclass
class Scores:
    ref_logprobs: torch.Tensor  # [B, T]
    values: torch.Tensor  # [B, T] V(s_t) from the critic (zeros without one)
    scores: torch.Tensor  # [B] reward per sequence


def select_rows(batch, rows: slice):
    """Rows ``rows`` of every tensor of a :class:`Samples` or :class:`Scores` (a new one)."""
    return replace(batch, **{f.name: getattr(batch, f.name)[rows] for f in fields(batch)
                             if getattr(batch, f.name) is not None})


def _gather(t: torch.Tensor) -> torch.Tensor:
    if t.dtype == torch.bool:  # gloo gathers no bool: as bytes
        return dist.all_gather_rows(t.to(torch.uint8)).bool()
    return dist.all_gather_rows(t)


def gather_rows(batch):
    """Every rank's rows of a :class:`Samples` or :class:`Scores`, concatenated in rank order
    (``batch`` itself in one process). Each rank's tensors must have the same shapes: the same
    number of rows, prompts padded to the same width, responses of the same (synced) length."""
    if not dist.world().distributed:
        return batch
    return replace(batch, **{f.name: _gather(getattr(batch, f.name)) for f in fields(batch)
                             if getattr(batch, f.name) is not None})


def decode_responses(tokenizer, samples: Samples) -> list[str]:
    """Response texts (special tokens skipped, nothing after EOS)."""
    rows = []
    for ids, m in zip(samples.responses.tolist(), samples.response_mask.tolist()):
        rows.append(tokenizer.decode([t for t, v in zip(ids, m) if v > 0], skip_special_tokens=True))
    return rows


@torch.no_grad()
def score(
    samples: Samples,
    *,
    reference,
    reward,
    critic=None,
    temperature: float = 1.0,
    prompts: Optional[Sequence[str]] = None,
    responses: Optional[Sequence[str]] = None,
    concurrent: bool = False,
) -> Scores:
    """Reference log-probs, critic values and reward scores in one batched no-grad pass each.

    With ``concurrent`` the reference pass runs in a second thread beside the critic and reward
    passes (independent models; same results).
    """
    seq, attn, T = samples.sequences, samples.attention_mask, samples.n_response

    def reference_pass() -> torch.Tensor:
        with torch.no_grad():
            return reference.logprobs(seq, attn, T, temperature) * samples.response_mask

    pool = ThreadPoolExecutor(max_workers=1) if concurrent else None
    ref_future = pool.submit(reference_pass) if pool else None
    try:
        if critic is not None:
            values = critic.response_values(seq, attn, T) * samples.response_mask
        else:
            values = torch.zeros_like(samples.logprobs)
        scores = reward(seq, attn, prompts, responses).float()
        ref_logprobs = ref_future.result() if ref_future else reference_pass()
    finally:
        if pool:
            pool.shutdown()
    return Scores(ref_logprobs, values, scores)
