"""Section 5 of the demo's ``report.html``: which tokens got the credit.

Freshly sampled PPO responses, scored exactly as in a PPO iteration by the trainers' own code
(:func:`fourfold.models.build.build_roles`, :func:`fourfold.trainers.rollouts.collect`,
:func:`fourfold.trainers.ppo.compute_advantages`) under the PPO stage's own config
(``stages/ppo/config.yaml``), and shown as per-token advantages (not whitened).
"""

from __future__ import annotations

import dataclasses
import math
import random
from pathlib import Path
from typing import Mapping, Optional

from fourfold.apps.report_kit import esc, html_table, mean, signed
from fourfold.apps.seeds import stream_seed
from fourfold.config import DemoConfig, PPOAlgoConfig, PPOConfig, load_config
from fourfold.reporting import token_heatmap_html

CREDIT_SEED = 1234  # the per-token view samples after torch's CPU generator is seeded with CREDIT_SEED
CREDIT_BATCH = 32  # responses sampled for the per-token statistics (the first N are drawn)


def token_pieces(tokenizer, ids: list[int]) -> list[str]:
    """The text each token adds (incremental decoding), so spaces land where the tokenizer puts them."""
    pieces, prev = [], ""
    for i in range(len(ids)):
        text = tokenizer.decode(ids[: i + 1], skip_special_tokens=False)
        pieces.append(text[len(prev):] if text.startswith(prev) else tokenizer.decode([ids[i]], skip_special_tokens=False))
        prev = text
    return pieces


def credit_config(out: Path) -> PPOConfig:
    """The PPO stage's config (``stages/ppo/config.yaml`` of the demo run ``out``), its models
    replaced by the run's finished ones: the trained policy, the SFT model as the reference, the
    reward model and the trained critic (none when ``critic/`` is missing). These are full (for a
    LoRA run: merged) models, so the roles load without LoRA."""
    cfg = load_config(PPOConfig, out / "stages" / "ppo" / "config.yaml")
    critic = out / "critic"
    model = dataclasses.replace(cfg.model, policy=str(out / "policy"), reference=str(out / "sft"),
                                reward=str(out / "reward"), reward_fn=None, tokenizer=None,
                                critic=str(critic) if (critic / "config.json").is_file() else None,
                                lora=None, critic_mode="separate")
    return dataclasses.replace(cfg, model=model)


def compute_token_credit(out: Path, prompts: list[str], task=None) -> dict:
    """Sample PPO responses for ``prompts`` and return their per-token advantages (not whitened):
    :func:`rollout_credit` under the PPO stage's config of the demo run ``out``."""
    return rollout_credit(credit_config(out), prompts, task)


def rollout_credit(cfg: PPOConfig, prompts: list[str], task=None,
                   others: Optional[Mapping[str, PPOAlgoConfig]] = None) -> dict:
    """Sample responses for ``prompts`` with ``cfg``'s roles and return their per-token advantages
    (not whitened) under ``cfg.ppo``, and under each estimator of ``others`` on the same responses
    (item key ``advantages_<name>``; e.g. a group estimator, whose K samples of a prompt must be K
    consecutive prompts).

    One PPO rollout as the trainer does it, on the CPU: the policy samples, the reference gives
    log-probs, the RM scores, the critic gives V(s_t); per-token rewards are ``-kl_coef * KL_t``
    plus the score on the last token; advantages as in training (GAE), but not whitened.
    Deterministic: torch's CPU generator is seeded with ``CREDIT_SEED`` (and restored after).
    """
    import torch

    from fourfold.data import left_pad, tokenize_prompts
    from fourfold.models.build import build_roles
    from fourfold.models.plan import plan_roles
    from fourfold.rollout.eager import EagerEngine
    from fourfold.rollout.sampling import decode_responses
    from fourfold.trainers.ppo import compute_advantages
    from fourfold.trainers.rollouts import collect

    algo, gen = dataclasses.replace(cfg.ppo, whiten_advantages=False), cfg.generation
    with torch.no_grad():
        plan = plan_roles("ppo", cfg)
        roles = build_roles(plan if cfg.model.critic is not None else plan.without("critic"), torch.device("cpu"))
        tok = roles.tokenizer
        pid, pmask = left_pad(tokenize_prompts(prompts, tok, cfg.data.max_prompt_len, truncate=True), tok.pad_token_id)
        with torch.random.fork_rng(devices=[]):
            torch.default_generator.manual_seed(CREDIT_SEED)
            col = collect(roles, list(prompts), pid, pmask, gen, engine=EagerEngine(), kl_coef=algo.kl_coef,
                          kl_estimator=algo.kl_estimator)
        rollout = compute_advantages(col.rollout, algo)
        advantages = rollout.advantages  # compute_advantages replaces the tensors: this one stays
        other = {name: compute_advantages(rollout, dataclasses.replace(a, whiten_advantages=False)).advantages
                 for name, a in (others or {}).items()}
        rollout.advantages = advantages
        responses = decode_responses(tok, col.samples)
    gold = task.gold_reward(list(prompts), responses) if task is not None and hasattr(task, "gold_reward") else None
    s, mask, kl = col.samples, rollout.mask, col.kl
    items = []
    for b, prompt in enumerate(prompts):
        n = int(mask[b].sum())
        rid = s.responses[b, :n].tolist()
        items.append({
            "prompt": prompt,
            "response": responses[b],
            "tokens": token_pieces(tok, rid),
            "token_ids": rid,
            "advantages": [float(a) for a in advantages[b, :n]],
            **{f"advantages_{name}": [float(a) for a in adv[b, :n]] for name, adv in other.items()},
            "values": [float(v) for v in rollout.values[b, :n]],
            "kl": [float(k) for k in kl[b, :n]],
            "score": float(rollout.scores[b]),
            "gold": None if gold is None else float(gold[b]),
            "kl_sum": float(kl[b, :n].sum()),
            "finished": bool(s.finished[b]),
        })
    return {"items": items, "kl_coef": algo.kl_coef, "gamma": algo.gamma, "lam": algo.lam,
            "critic": roles.critic is not None, "kl_kind": algo.kl_estimator, "whiten_rewards": algo.whiten_rewards}


def credit_prompts(cfg: DemoConfig, eval_prompts: list[str], n_show: int, task) -> list[str]:
    """The prompts of the view: the held-out evaluation's first ones, then fresh task prompts."""
    want = max(n_show, CREDIT_BATCH)
    prompts = list(eval_prompts[:want])
    if len(prompts) < want and task is not None and hasattr(task, "sample_prompts"):
        prompts += task.sample_prompts(want - len(prompts), random.Random(stream_seed(cfg.run.seed, "credit_prompts")))
    return prompts


def credit_section(out: Path, cfg: DemoConfig, eval_prompts: list[str], n_show: int, task) -> str:
    """The section's HTML: the explanation, ``n_show`` responses as token heatmaps, and the tokens
    with the most and least credit on average over every sampled response."""
    head = "<h2>5. Which tokens got the credit</h2>"
    prompts = credit_prompts(cfg, eval_prompts, n_show, task)
    if not prompts:
        return head + '<p class="note">No prompts to sample from.</p>'
    try:
        credit = compute_token_credit(out, prompts, task)
    except Exception as e:  # the report must not take a finished run down; say what failed
        print(f"fourfold demo: warning: report: per-token credit view skipped: {e}", flush=True)
        return head + f'<p class="warn">The per-token view could not be computed: {esc(type(e).__name__)}: {esc(e)}</p>'
    items = credit["items"]
    shown = items[:n_show]
    finite = [abs(a) for it in shown for a in it["advantages"] if math.isfinite(a)]
    scale = max(finite) if finite else 1.0
    parts = [head, _explanation(credit, len(shown), scale)]
    parts += [_heatmap(it, scale) for it in shown]
    parts.append(_average_credit(items))
    return "\n".join(p for p in parts if p)


def _explanation(credit: dict, n_shown: int, scale: float) -> str:
    kl_coef, gamma, lam = credit["kl_coef"], credit["gamma"], credit["lam"]
    return (
        "<p>PPO does not reward a response as a whole: it turns the sequence reward into per-token "
        f"rewards r<sub>t</sub> = &minus;{kl_coef:g}&middot;KL<sub>t</sub> (a penalty for each token's drift from the SFT "
        "model), plus the reward model's score on the last token, and then asks the <em>critic</em> how much "
        "better each token turned out than expected. That is the <em>advantage</em> "
        f"A<sub>t</sub> = &sum;<sub>k</sub> ({gamma:g}&middot;{lam:g})<sup>k</sup> &delta;<sub>t+k</sub> with "
        "&delta;<sub>t</sub> = r<sub>t</sub> + &gamma;V(s<sub>t+1</sub>) &minus; V(s<sub>t</sub>) (GAE). "
        "The policy gradient raises the probability of tokens with A &gt; 0 and lowers it for A &lt; 0.</p>"
        "\n"
        f'<p class="note">Below: {n_shown} responses freshly sampled from the PPO policy for held-out prompts '
        f"(fixed seed {CREDIT_SEED}), scored exactly as in a PPO iteration"
        + ("" if credit["critic"] else " (no critic directory found: V = 0, so A is the reward-to-go)")
        + ". The advantages are <em>not</em> whitened (training whitens them per batch), so the colours are on "
        f"the scale of the reward: one common scale for all rows, full colour at |A| = {scale:.3g}. "
        "Hover a token for its value. <code>&lt;eos&gt;</code> is the end-of-sequence token: the RM score arrives there.</p>"
        '<p class="legend"><span style="background:rgba(0,170,60,.7)">A &gt; 0: better than the critic expected</span>'
        '<span style="background:rgba(220,30,30,.7)">A &lt; 0: worse than expected</span></p>'
    )


def _heatmap(it: dict, scale: float) -> str:
    meta = (f"RM score {it['score']:+.2f} &middot; gold {signed(it['gold'])} &middot; KL {it['kl_sum']:.2f} nats &middot; "
            f"{len(it['tokens'])} tokens{'' if it['finished'] else ' (no EOS: hit the length limit)'}")
    toks = list(it["tokens"])
    if toks and not toks[0].startswith(" "):
        toks[0] = " " + toks[0]  # a space between the prompt and the response
    heat = token_heatmap_html(toks, it["advantages"], scale=scale)
    return (f'<div class="credit"><span class="prompt">{esc(it["prompt"])}</span>{heat}'
            f'<div class="meta">{meta}</div></div>')


def _average_credit(items: list[dict]) -> str:
    """Which words get credit on average, over the whole sampled batch ('' when too few repeat)."""
    per_tok: dict[str, list[float]] = {}
    for it in items:
        for t, a in zip(it["tokens"], it["advantages"]):
            if math.isfinite(a):
                per_tok.setdefault(t.strip() or t, []).append(a)
    common = [(t, mean(v), len(v)) for t, v in per_tok.items() if len(v) >= 3]
    if len(common) < 6:
        return ""
    common.sort(key=lambda x: (-x[1], x[0]))
    k = min(8, len(common) // 2)
    top, bottom = common[:k], common[-k:][::-1]
    rows = []
    for i in range(k):
        rows.append([f"<code>{esc(top[i][0])}</code>", f"{top[i][1]:+.3f}", str(top[i][2]),
                     f"<code>{esc(bottom[i][0])}</code>", f"{bottom[i][1]:+.3f}", str(bottom[i][2])])
    return (
        f"<h3>Average credit per token over {len(items)} sampled responses</h3>"
        '<p class="note">Tokens seen at least 3 times. Small samples: read this as a hint of what the reward '
        "model and critic like, not as a measurement.</p>"
        + html_table(["most credited", "mean A", "n", "least credited", "mean A", "n"], rows, num_cols=(1, 2, 4, 5))
    )
