"""Evaluating saved models on an embedded task: sampling, the policy's before/after numbers, and a
reward model's accuracy on preference pairs. Used by ``fourfold demo`` and ``fourfold experiments``
(and by the tools that study a finished run).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import torch

from fourfold.config import GenerationConfig


@torch.no_grad()
def load_eval_roles(reference: str, reward: str, policy: Optional[str] = None):
    """The :class:`~fourfold.models.build.Roles` of an evaluation, built by the one loader from an
    evaluation plan (:func:`~fourfold.models.plan.plan_evaluation`: every model checked, its
    embeddings fitting the tokenizer): the tokenizer and the frozen ``reference`` of the SFT
    model's directory, the reward model (in eval mode) and, when given, the ``policy`` evaluated
    (the reference's own model when it is the same directory). What the demo's evaluation stage and
    the experiments' final evaluation both load."""
    from fourfold.models.build import load_saved

    roles = load_saved(reference, reference=reference, reward=reward,
                       policy=None if policy in (None, reference) else policy)
    roles.reward_model.eval()
    if policy == reference:
        roles.policy = roles.reference.model
    return roles


def sample_texts(model, tokenizer, prompts: list[str], *, max_new_tokens: int, temperature: float,
                 max_prompt_len: int = 16, batch_size: int = 128, engine=None):
    """Responses (text) and the Samples of each batch for a list of prompts, drawn by ``engine``
    (:func:`fourfold.rollout.engine.make_engine`; None: the eager engine) with ``torch.multinomial``
    on the global generator, batch after batch."""
    from fourfold.data import left_pad, tokenize_prompts
    from fourfold.rollout.eager import EagerEngine
    from fourfold.rollout.sampling import decode_responses

    engine = engine or EagerEngine()
    ids = tokenize_prompts(prompts, tokenizer, max_prompt_len)
    texts, batches = [], []
    model.eval()
    engine.sync(model)
    for i in range(0, len(prompts), batch_size):
        pid, pmask = left_pad(ids[i : i + batch_size], tokenizer.pad_token_id)
        s = engine(model, pid, pmask, max_new_tokens=max_new_tokens, temperature=temperature,
                   eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
        texts += decode_responses(tokenizer, s)
        batches.append(s)
    return texts, batches


def sample_engine(gen: GenerationConfig, max_prompt_len: int = 16):
    """The engine of ``gen`` (``generation.engine``, ``.weights``, ``.compile``,
    ``.stop_check_every``) for :func:`sample_texts` over prompts of at most ``max_prompt_len`` tokens."""
    from fourfold.rollout.engine import make_engine

    return make_engine(gen, max_prompt_len=max_prompt_len)


@torch.no_grad()
def evaluate_policy(policy, reference, rm, tokenizer, task, prompts: list[str], gen: GenerationConfig) -> tuple[dict, list[dict]]:
    """Proxy, gold, KL to the reference, length, well-formed share, repetition on ``prompts`` (and the
    mean number of sentences when the task reports it: the review task's horizon mode), the
    responses sampled by ``gen``'s engine (``generation.engine``)."""
    from fourfold.core import kl_estimate

    texts, batches = sample_texts(policy, tokenizer, prompts, max_new_tokens=gen.max_new_tokens,
                                  temperature=gen.temperature, engine=sample_engine(gen))
    proxy, kl = [], []
    for s in batches:
        proxy += rm.score(s.sequences, s.attention_mask).tolist()
        ref_lp = reference.logprobs(s.sequences, s.attention_mask, s.n_response, gen.temperature)
        kl += (kl_estimate(s.policy_logprobs, ref_lp, "k1") * s.response_mask).sum(1).tolist()  # the full policy's
    gold = task.gold_reward(prompts, texts)
    m = task.response_metrics(prompts, texts)
    n = len(prompts)
    summary = {
        "proxy": sum(proxy) / n, "gold": sum(gold) / n, "kl": sum(kl) / n,
        "gold_std": float(torch.tensor(gold).std()), "proxy_std": float(torch.tensor(proxy).std()),
        "length": m["length"], "well_formed": m["well_formed"], "repetition": m["repetition"],
        **({"sentences": m["sentences"]} if "sentences" in m else {}),  # the task's horizon mode only
    }
    rows = [{"prompt": p, "response": r, "proxy": a, "gold": g, "kl": k}
            for p, r, a, g, k in zip(prompts, texts, proxy, gold, kl)]
    return summary, rows


def pair_accuracy(rm, tokenizer, path: Path, max_len: int) -> dict:
    """The RM's accuracy on a preference file against its labels and against gold (pairs whose
    gold differs)."""
    rows = [json.loads(line) for line in open(path)]
    sc = score_texts(rm, tokenizer, [r["prompt"] for r in rows], [r["chosen"] for r in rows], max_len)
    sr = score_texts(rm, tokenizer, [r["prompt"] for r in rows], [r["rejected"] for r in rows], max_len)
    decided = [(c > r) == (row["gold_chosen"] > row["gold_rejected"]) for c, r, row in zip(sc, sr, rows)
               if row["gold_chosen"] != row["gold_rejected"]]
    return {"accuracy_vs_labelers": sum(c > r for c, r in zip(sc, sr)) / max(1, len(rows)),
            "accuracy_vs_gold": sum(decided) / max(1, len(decided))}


@torch.no_grad()
def score_texts(rm, tokenizer, prompts, responses, max_len: int, batch_size: int = 128) -> list[float]:
    """RM scores of prompt + response + EOS (the same encoding the reward stage trains on)."""
    from fourfold.data import SFTRecord, collate_sft, encode_sft

    recs = [SFTRecord(p, r, i + 1, "eval") for i, (p, r) in enumerate(zip(prompts, responses))]
    ex = encode_sft(recs, tokenizer, max_len)
    out: list[float] = []
    for i in range(0, len(ex), batch_size):
        batch = collate_sft(ex[i : i + batch_size], tokenizer.pad_token_id)
        out += rm.score(batch["input_ids"], batch["attention_mask"]).tolist()
    return out
