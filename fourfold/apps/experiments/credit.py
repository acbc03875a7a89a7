"""The horizon family's token-credit view: on the same responses, the per-token advantages PPO's
critic gives (GAE) beside the flat per-sequence advantage of the group baseline (``python -m
fourfold.apps.experiments credit SPEC.json``, one job of the sweep; the report only reads its JSON).

Responses are sampled from the longest horizon's ``ppo`` run (first seed) and from its group arm's
run, K = ``group_size`` responses per prompt on K consecutive rows, and each response is scored as
in a PPO iteration (:func:`fourfold.apps.demo.credit.rollout_credit`): the reference's log-probs (the KL
penalty per token), the reward model's score on the last token, and the ``ppo`` run's trained critic.
Its advantages come twice from that one rollout: GAE with the critic (what ``ppo`` trained on; not
whitened) and the group estimator (what the group arm trained on: (R - group mean) / group std of
the K responses of the prompt, the same on every token). On the group arm's own responses the critic
is ``ppo``'s, trained on another policy's samples: what a critic would have said, not what trained it.

Each token is assigned to the sentence it ends or lies in (a ``.`` or ``!`` ends one), and each
sentence carries the polarity the gold reward reads from it, so the report can say how much credit
the tokens of positive, neutral and negative sentences got under each estimator.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, Mapping

from fourfold.atomic import write_text_atomic
from fourfold.tasks.review_grammar import TERMINATORS


def token_sentences(tokens: list[str]) -> list[int]:
    """The index of the sentence each token belongs to (0-based; a terminator belongs to the sentence
    it ends), -1 for tokens after the last terminator (the end-of-sequence token, an unfinished tail)."""
    ends = [k for k, t in enumerate(tokens) if t.strip() in TERMINATORS]
    out, i = [], 0
    for k in range(len(tokens)):
        out.append(i if ends and k <= ends[-1] else -1)
        i += k in ends
    return out


def credit_items(credit: Mapping[str, Any], task) -> list[dict]:
    """The view's items: per response its tokens, both advantages, score, gold, and each token's
    sentence with each sentence's polarity (empty when the review does not parse)."""
    items = []
    for it in credit["items"]:
        parsed = task.parse(it["prompt"], it["response"])
        items.append({
            "prompt": it["prompt"], "response": it["response"], "tokens": it["tokens"],
            "gae": it["advantages"], "group": it["advantages_group"], "score": it["score"], "gold": it["gold"],
            "kl_sum": it["kl_sum"], "finished": it["finished"], "sentence": token_sentences(it["tokens"]),
            "sentence_polarity": list(parsed.sentence_polarities) if parsed is not None else [],
        })
    return items


def credit_spec(spec: Mapping[str, Any]) -> dict:
    """Compute the view as ``spec`` says; writes and returns {key, views, ...}.

    spec: config (the ppo run's resolved config), policies ([label, policy directory] pairs), critic,
    reference, reward (directories), group_ppo (the group arm's PPO settings over ppo's), prompts (each
    K times in a row), task_options, horizon, out (JSON path), key, threads."""
    import torch

    from fourfold.apps.demo.credit import rollout_credit
    from fourfold.config import PPOConfig, load_config
    from fourfold.run.common import quiet_transformers
    from fourfold.tasks import get_task

    quiet_transformers()
    torch.set_num_threads(int(spec.get("threads") or 1))
    cfg = load_config(PPOConfig, spec["config"])
    group = dataclasses.replace(cfg.ppo, **spec["group_ppo"])
    task = get_task("review", **spec["task_options"])
    views = []
    for label, policy in spec["policies"]:
        model = dataclasses.replace(cfg.model, policy=policy, reference=spec["reference"], reward=spec["reward"],
                                    critic=spec["critic"], reward_fn=None, tokenizer=None, lora=None,
                                    critic_mode="separate")
        credit = rollout_credit(dataclasses.replace(cfg, model=model), list(spec["prompts"]), task, {"group": group})
        views.append({"label": label, "policy": policy, "items": credit_items(credit, task)})
    result = {"key": spec["key"], "views": views, "horizon": spec["horizon"], "K": group.samples_per_prompt,
              "group_advantage": group.advantage, "kl_coef": cfg.ppo.kl_coef, "gamma": cfg.ppo.gamma,
              "lam": cfg.ppo.lam}
    write_text_atomic(Path(spec["out"]), json.dumps(result, sort_keys=True))
    return result
