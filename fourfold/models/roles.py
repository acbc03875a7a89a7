"""The four roles over `transformers` models.

* **Policy** (trained) and **reference** (frozen) are causal LMs; both are asked for the per-token
  log-probs of a response given prompt + response, under the sampling temperature.
* **Reward model** (frozen) and **critic** (trained) are :class:`ScalarModel` s: a backbone plus a
  linear head giving one scalar per position; the reward is read at the last valid token, the
  critic's value V(s_t) at the position whose logits choose token t. Both are saved as
  ``AutoModelForSequenceClassification`` directories with one label, so plain transformers loads
  them.
* A plain function ``reward_fn(prompts, responses) -> list[float]`` is a reward role too, and so is
  a reward model with a tokenizer of its own (:class:`RetokenizingReward`: the text encoded again).

Sequences are laid out as ``[B, L] = left-padded prompt (P) + right-padded response (T)``; position
ids come from the attention mask (``cumsum - 1``), so left padding does not shift positions.
"""

from __future__ import annotations

import inspect
from typing import Callable, Optional, Protocol, Sequence

import torch
import torch.utils.checkpoint
from torch import nn

from fourfold.core import entropy_from_logits, logprobs_from_logits
from fourfold.errors import ConfigError
from fourfold.models.reward_fn import call_reward_fn


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """position_ids [B, L] = cumsum(mask) - 1, clamped at 0 (left padding keeps positions 0..n-1)."""
    return (attention_mask.long().cumsum(-1) - 1).clamp_(min=0)


def accepts_kwarg(model: nn.Module, name: str) -> bool:
    """Whether ``model.forward`` takes the keyword ``name``. A wrapper that hands its keywords on to
    another module (a LoRA role over a shared base) names that module ``forwards_to``; its forward's
    signature answers. So does the model inside a peft ``PeftModel`` (``get_base_model()``), whose
    own forward passes such keywords on through ``**kwargs`` only."""
    cache = model.__dict__.setdefault("_fourfold_kwargs", {})
    if name not in cache:
        target = getattr(model, "forwards_to", model)
        if hasattr(target, "get_base_model"):
            target = target.get_base_model()
        cache[name] = name in inspect.signature(target.forward).parameters
    return cache[name]


def response_logits(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, n_response: int) -> torch.Tensor:
    """Logits [B, T, V] at the positions that choose the last T tokens of ``input_ids``.

    Position L-T-1 predicts token L-T, ..., position L-2 predicts token L-1; the LM head is only
    applied to those positions when the model supports ``logits_to_keep``.
    """
    kwargs = dict(input_ids=input_ids, attention_mask=attention_mask,
                  position_ids=position_ids_from_mask(attention_mask), use_cache=False)
    if accepts_kwarg(model, "logits_to_keep"):
        kwargs["logits_to_keep"] = n_response + 1
    logits = model(**kwargs).logits  # (B, T+1 or L, V)
    return logits[:, -(n_response + 1):-1]


def response_logprobs(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    n_response: int,
    temperature: float = 1.0,
    with_entropy: bool = False,
) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """(log pi(a_t | s_t) [B, T], entropy [B, T] or None) of the last T tokens, logits / temperature.

    The entropy keeps its graph: a loss with an entropy bonus differentiates through it. The model's
    logits ``[B, T+1, V]`` (the LM head at the response positions) exist whole, in the model's
    compute dtype; :mod:`fourfold.core.logprobs` never adds a float32 copy of them. When the model
    carries a chunk size (:data:`LOGITS_CHUNK`, ``model.logits_chunk``), the head is applied to that
    many tokens at a time instead (:func:`chunked_response_logprobs`).
    """
    chunk = getattr(model, LOGITS_CHUNK, None)
    if chunk:
        return chunked_response_logprobs(model, input_ids, attention_mask, n_response, temperature,
                                         with_entropy, chunk)
    logits = response_logits(model, input_ids, attention_mask, n_response)
    tokens = input_ids[:, -n_response:]
    logprobs = logprobs_from_logits(logits, tokens, temperature)
    entropy = entropy_from_logits(logits, temperature) if with_entropy else None
    return logprobs, entropy


LOGITS_CHUNK = "fourfold_logits_chunk"
"""Attribute of a causal LM (or of a LoRA role over one) that :func:`response_logprobs` reads: when
set (an int, by :func:`fourfold.models.levers.set_logits_chunk`), the LM head runs on at most that
many response tokens at a time."""

_POST_HEAD_KEYS = ("final_logit_softcapping", "logit_scale", "logits_scaling")  # config keys that change logits


def inner_model(model: nn.Module) -> nn.Module:
    """The transformers model that does a role's work: ``model`` itself, the causal LM a LoRA role
    forwards to (``forwards_to``), or the model inside a peft wrapper."""
    lm = getattr(model, "forwards_to", model)
    return lm.get_base_model() if hasattr(lm, "get_base_model") else lm


def response_hidden(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                    n_response: int) -> torch.Tensor:
    """The LM head's input [B, T, H] at the positions that choose the last T tokens of ``input_ids``.

    The model runs as a whole (so a LoRA role activates its adapter) with ``logits_to_keep=1``, and
    the decoder's output (the final-norm hidden states) is captured by a hook on its backbone.
    """
    lm = inner_model(model)
    if not accepts_kwarg(model, "logits_to_keep"):
        raise ConfigError(f"model.logits_chunk: {type(lm).__name__}'s forward does not take logits_to_keep, "
                          "so it would compute the full logits anyway; leave model.logits_chunk null")
    scaled = [k for k in _POST_HEAD_KEYS if getattr(lm.config, k, None) not in (None, 1.0)]
    if scaled:
        raise ConfigError(f"model.logits_chunk: {type(lm).__name__} transforms its logits after the head "
                          f"({scaled[0]}); chunking would skip that, leave model.logits_chunk null")
    captured: list[torch.Tensor] = []
    handle = lm.base_model.register_forward_hook(lambda module, args, out: captured.append(out[0]))
    try:
        model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids_from_mask(attention_mask),
              use_cache=False, logits_to_keep=1)
    finally:
        handle.remove()
    return captured[-1][:, -(n_response + 1):-1]  # (B, T, H)


def _head_logprobs(head: nn.Module, hidden: torch.Tensor, tokens: torch.Tensor, temperature: float,
                   with_entropy: bool) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    logits = head(hidden)  # (n, V)
    logprobs = logprobs_from_logits(logits, tokens, temperature)
    return logprobs, entropy_from_logits(logits, temperature) if with_entropy else None


def chunked_response_logprobs(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                              n_response: int, temperature: float = 1.0, with_entropy: bool = False,
                              chunk: int = 1024) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """:func:`response_logprobs` with the LM head applied to ``chunk`` tokens at a time.

    The ``B x T`` response positions' hidden states are cut into chunks of ``chunk`` tokens; each
    chunk's logits ``[chunk, V]`` give its log-probs (and entropies) and are freed. With gradients
    on, each chunk runs under non-reentrant :func:`torch.utils.checkpoint.checkpoint`: backward
    recomputes the chunk's logits instead of keeping them, so at most one chunk of logits (and its
    gradient) exists at any time. Same values and gradients as the unchunked path, up to float
    rounding of the head's matmul.
    """
    hidden = response_hidden(model, input_ids, attention_mask, n_response)
    B, T, H = hidden.shape
    flat, tokens = hidden.reshape(B * T, H), input_ids[:, -n_response:].reshape(B * T)
    head = inner_model(model).get_output_embeddings()
    logprobs, entropies = [], []
    for start in range(0, B * T, chunk):
        args = (head, flat[start:start + chunk], tokens[start:start + chunk], temperature, with_entropy)
        if torch.is_grad_enabled():
            lp, ent = torch.utils.checkpoint.checkpoint(_head_logprobs, *args, use_reentrant=False)
        else:
            lp, ent = _head_logprobs(*args)
        logprobs.append(lp)
        entropies.append(ent)
    entropy = torch.cat(entropies).view(B, T) if with_entropy else None
    return torch.cat(logprobs).view(B, T), entropy


def per_position_scalars(backbone: nn.Module, head: nn.Linear, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                         keep_last: Optional[int] = None, shift: Optional[float] = None) -> torch.Tensor:
    """``head(backbone(...).last_hidden_state)`` [B, L] (or [B, keep_last]) in float32, plus ``shift``.

    The hidden states are cast to the head's dtype (a no-op when they already match, as in a plain
    :class:`ScalarModel`; a float32 head over a bf16 shared base in LoRA mode).
    """
    hidden = backbone(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids_from_mask(attention_mask),
        use_cache=False,
    ).last_hidden_state  # (B, L, H)
    if keep_last is not None:
        hidden = hidden[:, -keep_last:]
    values = head(hidden.to(head.weight.dtype)).squeeze(-1).float()  # (B, L)
    return values + float(shift) if shift else values


class ScalarRole:
    """What the reward model and the critic offer on top of ``forward`` (per-position scalars [B, L])
    and ``head`` (the linear layer with one output): :class:`ScalarModel` and the LoRA roles of
    :mod:`fourfold.models.lora` share it."""

    head: nn.Linear

    def score(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Scalar [B] at the last valid (attention_mask == 1) position of each row."""
        values = self(input_ids, attention_mask)
        last = last_valid_position(attention_mask)
        return values.gather(1, last[:, None]).squeeze(1)

    def response_values(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, n_response: int) -> torch.Tensor:
        """V(s_t) [B, T]: the scalar at the position that chooses response token t."""
        return self(input_ids, attention_mask, keep_last=n_response + 1)[:, :-1]

    @torch.no_grad()
    def reset_head(self, mode: str = "zero", std: float = 0.02) -> None:
        """'zero' (fresh critic: V = 0 everywhere at start) or 'normal' (fresh reward head)."""
        if mode == "zero":
            self.head.weight.zero_()
        else:
            self.head.weight.normal_(0.0, std)
        if self.head.bias is not None:
            self.head.bias.zero_()

    score_shift: Optional[float]
    """A constant added to every scalar (the reward normalisation's shift on a bias-free head)."""

    @torch.no_grad()
    def set_affine(self, scale: float, shift: float) -> None:
        """Fold ``score' = scale * score + shift`` into the role (reward normalisation).

        The scale goes into the head's weight (and bias, when it has one). The shift goes into the
        head's bias when it has one; a bias-free head (Llama's ``score``: ``bias=False``, and
        ``from_pretrained`` would drop an added bias as an unexpected key) keeps it as
        :attr:`score_shift` (a :class:`ScalarModel` in its config as ``fourfold_score_shift``, which
        ``save_pretrained`` writes to ``config.json``). So the saved model reproduces the affine
        exactly; plain transformers' logits are ``score - fourfold_score_shift``.
        """
        self.head.weight.mul_(scale)
        if self.head.bias is not None:
            self.head.bias.mul_(scale).add_(shift)
            return
        self.score_shift = scale * float(self.score_shift or 0.0) + float(shift)


class ScalarModel(ScalarRole, nn.Module):
    """Backbone + linear head -> one float per position (reward model and critic).

    Wraps an ``AutoModelForSequenceClassification`` with ``num_labels=1`` (``.hf``); the head is
    its ``score`` (or ``classifier``) layer applied to every position instead of only the last.
    ``head`` overrides that lookup (a peft model keeps the trained head inside a wrapper).
    """

    def __init__(self, hf_model: nn.Module, head: Optional[nn.Linear] = None):
        super().__init__()
        self.hf = hf_model
        if head is None:
            head = getattr(hf_model, "score", None) or getattr(hf_model, "classifier", None)
        if not isinstance(head, nn.Linear) or head.out_features != 1:
            raise TypeError(f"{type(hf_model).__name__}: expected a linear head with one output (score/classifier)")
        self.head = head

    @property
    def backbone(self) -> nn.Module:
        return self.hf.base_model

    @property
    def config(self):
        return self.hf.config

    @property
    def score_shift(self) -> Optional[float]:
        """The normalisation's shift, kept in the config as ``fourfold_score_shift`` (see
        :meth:`~ScalarRole.set_affine`)."""
        return getattr(self.hf.config, "fourfold_score_shift", None)

    @score_shift.setter
    def score_shift(self, value: float) -> None:
        self.hf.config.fourfold_score_shift = value

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, keep_last: Optional[int] = None) -> torch.Tensor:
        """Per-position scalars [B, L] (or [B, keep_last] for the last positions), float32."""
        return per_position_scalars(self.backbone, self.head, input_ids, attention_mask, keep_last, self.score_shift)

    def save_pretrained(self, path, **kwargs):
        return self.hf.save_pretrained(path, **kwargs)


def last_valid_position(attention_mask: torch.Tensor) -> torch.Tensor:
    """Index [B] of the last 1 in each row (0 for an all-zero row)."""
    L = attention_mask.shape[-1]
    idx = torch.arange(L, device=attention_mask.device).expand_as(attention_mask)
    return torch.where(attention_mask.bool(), idx, torch.zeros_like(idx)).amax(-1)


# ---------------------------------------------------------------------------------------------
# Reward roles: anything callable as reward(input_ids, attention_mask, prompts, responses) -> [B]
# ---------------------------------------------------------------------------------------------


class RewardRole(Protocol):
    def __call__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                 prompts: Sequence[str], responses: Sequence[str]) -> torch.Tensor: ...


class ModelReward:
    """The frozen reward model: scores prompt + response at the last valid token."""

    needs_text = False

    def __init__(self, model: ScalarModel):
        self.model = freeze(model)

    @torch.no_grad()
    def __call__(self, input_ids, attention_mask, prompts=None, responses=None) -> torch.Tensor:
        return self.model.score(input_ids, attention_mask)


def ends_with_eos(input_ids: torch.Tensor, attention_mask: torch.Tensor, eos_token_id: Optional[int]) -> list[bool]:
    """Whether each row's last valid token is ``eos_token_id`` (a finished response; all true
    without an EOS id)."""
    if eos_token_id is None or input_ids.shape[1] == 0:
        return [True] * input_ids.shape[0]
    last = last_valid_position(attention_mask)
    return (input_ids.gather(1, last[:, None]).squeeze(1) == eos_token_id).tolist()


def user_text_ids(tokenizer, text: str) -> list[int]:
    """Ids of user text with no special tokens added and special-token strings read as text
    (``split_special_tokens``, as :mod:`fourfold.data.literal` reads the rows of a file)."""
    try:
        return list(tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"])
    except TypeError:  # a tokenizer without split_special_tokens
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])


class RetokenizingReward:
    """A reward model with a tokenizer of its own (another vocabulary than the policy's): the
    responses, decoded by the loop with the policy's tokenizer, are encoded again with
    ``tokenizer`` and scored by ``model`` at the last valid token.

    Each row is laid out as ``fourfold score`` lays it out (prompt left-padded, response
    right-padded): ``[BOS] + prompt + response (+ EOS when the policy's response ended with
    ``policy_eos_id``)``, the prompt's text as it is, or, for a prompt rendered from chat messages
    (:class:`fourfold.data.RenderedChat`) when ``tokenizer`` has a chat template, the whole
    conversation ``messages + [assistant: response]`` rendered by the reward model's own template
    (its special tokens special, nothing added), as the prompt part. docs/rewards.md."""

    needs_text = True

    def __init__(self, model: ScalarModel, tokenizer, policy_eos_id: Optional[int]):
        self.model = freeze(model)
        self.tokenizer, self.policy_eos_id = tokenizer, policy_eos_id

    def encode_row(self, prompt: str, response: str, finished: bool) -> tuple[list[int], list[int]]:
        """(prompt part, response part) ids of one row in the reward model's vocabulary."""
        tok = self.tokenizer
        messages = getattr(prompt, "messages", None)
        if messages and getattr(tok, "chat_template", None):
            conversation = [*map(dict, messages), {"role": "assistant", "content": response}]
            text = tok.apply_chat_template(conversation, tokenize=False)
            return list(tok(text, add_special_tokens=False)["input_ids"]), []
        bos = [tok.bos_token_id] if tok.bos_token_id is not None else []
        eos = [tok.eos_token_id] if finished else []
        return bos + user_text_ids(tok, str(prompt)), user_text_ids(tok, response) + eos

    def encode(self, prompts: Sequence[str], responses: Sequence[str], finished: Sequence[bool]
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(input_ids, attention_mask)`` [B, P + T] of the rows in the reward model's vocabulary."""
        rows = [self.encode_row(p, r, f) for p, r, f in zip(prompts, responses, finished)]
        P, T = max(len(p) for p, _ in rows), max(len(r) for _, r in rows)
        pad = self.tokenizer.pad_token_id
        ids = torch.full((len(rows), P + T), pad, dtype=torch.long)
        mask = torch.zeros((len(rows), P + T), dtype=torch.long)
        for i, (p, r) in enumerate(rows):
            ids[i, P - len(p):P], mask[i, P - len(p):P] = torch.tensor(p, dtype=torch.long), 1
            ids[i, P:P + len(r)], mask[i, P:P + len(r)] = torch.tensor(r, dtype=torch.long), 1
        return ids, mask

    @torch.no_grad()
    def __call__(self, input_ids, attention_mask, prompts, responses, columns=None) -> torch.Tensor:
        finished = ends_with_eos(input_ids, attention_mask, self.policy_eos_id)
        ids, mask = self.encode(prompts, responses, finished)
        return self.model.score(ids.to(input_ids.device), mask.to(input_ids.device))


class FunctionReward:
    """A rule-based / verifiable reward: ``fn(prompts, responses, **columns) -> list[float]`` on
    decoded text.

    What ``fn`` returns is checked on every call (one real number per response) and an exception
    inside it is reported as the user's (:func:`~fourfold.models.reward_fn.call_reward_fn`);
    ``name`` (default: the function's name) is how messages call it; ``plan`` (a
    :class:`~fourfold.models.reward_fn.ColumnPlan`) picks the columns of a call it receives (none
    without one: the two-list form)."""

    needs_text = True

    def __init__(self, fn: Callable[[list[str], list[str]], Sequence[float]], name: Optional[str] = None, plan=None,
                 key: str = "model.reward_fn"):
        self.fn = fn
        self.name = name or getattr(fn, "__qualname__", repr(fn))
        self.plan = plan
        self.key = key

    def __call__(self, input_ids, attention_mask, prompts, responses, columns=None) -> torch.Tensor:
        chosen = self.plan.select(columns) if self.plan is not None and columns else {}
        scores = call_reward_fn(self.fn, list(prompts), list(responses), self.name, chosen, self.key)
        return torch.as_tensor(scores, dtype=torch.float32).to(input_ids.device)


class WeightedReward:
    """Several reward roles as one: ``score = sum_i weight_i * part_i``, parts in the order given.

    ``parts``: ``(name, role, weight)`` with distinct names; each role is a reward role
    (:class:`ModelReward`, :class:`FunctionReward`, a remote one). After a call ``last_parts`` holds
    each part's scores ``[B]`` by name (the loops log ``reward/<name>_mean`` and keep them in the
    samples); columns go to the parts that take text, ``finished`` (when the caller knows it) to
    those that take it (a server's)."""

    def __init__(self, parts: Sequence[tuple[str, object, float]]):
        names = [n for n, _, _ in parts]
        if not parts or len(set(names)) != len(names):
            raise ValueError(f"WeightedReward: expected parts with distinct names, got {names}")
        self.parts = list(parts)
        self.needs_text = any(getattr(role, "needs_text", False) for _, role, _ in parts)
        self.takes_finished = any(getattr(role, "takes_finished", False) for _, role, _ in parts)
        self.last_parts: dict[str, torch.Tensor] = {}

    @property
    def names(self) -> list[str]:
        """The parts' names, in the order they are summed."""
        return [name for name, _, _ in self.parts]

    def __call__(self, input_ids, attention_mask, prompts=None, responses=None, columns=None,
                 finished=None) -> torch.Tensor:
        self.last_parts = {}
        total = None
        for name, role, weight in self.parts:
            kw = {"columns": columns} if getattr(role, "needs_text", False) else {}
            if finished is not None and getattr(role, "takes_finished", False):
                kw["finished"] = finished
            part = role(input_ids, attention_mask, prompts, responses, **kw).float()  # (B,)
            self.last_parts[name] = part
            total = weight * part if total is None else total + weight * part
        return total


# ---------------------------------------------------------------------------------------------
# Reference role: the trainer asks a role for log-probs, not "a second model object".
# ---------------------------------------------------------------------------------------------


class FrozenReference:
    """The frozen SFT copy: eval mode, no gradients, dropout off."""

    def __init__(self, model: nn.Module):
        self.model = freeze(model)

    @torch.no_grad()
    def logprobs(self, input_ids, attention_mask, n_response: int, temperature: float = 1.0) -> torch.Tensor:
        return response_logprobs(self.model, input_ids, attention_mask, n_response, temperature)[0]


class AdapterDisabledReference:
    """Shared-base (LoRA) mode: the reference is the base model with every adapter disabled.

    No second copy of the weights: ``base`` is the :class:`~fourfold.models.lora.SharedBase` the
    policy's adapter sits on; its ``adapters_disabled()`` context runs the causal LM (``base.lm``,
    through the base's ``runner`` as every role over it does) exactly as the base model, whatever
    the adapters hold. Same interface as :class:`FrozenReference`; ``model`` is the module it runs.
    """

    def __init__(self, base):
        if not hasattr(base, "adapters_disabled") or not hasattr(base, "runner"):
            raise TypeError("AdapterDisabledReference needs a shared base with adapters_disabled() and runner "
                            "(fourfold.models.lora.SharedBase)")
        self.base = base

    @property
    def model(self) -> nn.Module:
        return self.base.runner

    @torch.no_grad()
    def logprobs(self, input_ids, attention_mask, n_response: int, temperature: float = 1.0) -> torch.Tensor:
        with self.base.adapters_disabled():
            return response_logprobs(self.base.runner, input_ids, attention_mask, n_response, temperature)[0]


def freeze(model: nn.Module) -> nn.Module:
    model.eval()
    model.requires_grad_(False)
    return model
