"""Named random streams of the applications (the demo, its report and the experiments).

Each stream draws from its own generator, seeded with ``run.seed`` plus a fixed offset, so that
no stream shifts when another draws more or less (e.g. the held-out one-slip pairs do not change
with the number of training ones). The offsets are part of what a run's outputs are: changing one
changes the outputs of every seed.

The trainers keep their own streams (``PromptStream`` samples task prompts with
``random.Random(run.seed + 7919)``; the gym trainer starts its evaluation episodes at
``run.seed + eval.seed_offset``).
"""

from __future__ import annotations

SEED_OFFSETS: dict[str, int] = {
    "sft_corpus": 0,  # demo stage 1: the SFT training corpus (random.Random)
    "sft_eval": 1,  # demo stage 1: the held-out SFT examples (random.Random)
    "pairs": 2,  # demo stage 2: prompts and labelers (random.Random) and sampling (torch.manual_seed)
    "ppo_prompts": 3,  # demo stage 4: the PPO prompts file (random.Random)
    "eval_prompts": 4,  # demo stage 5 and the experiments: the held-out evaluation prompts (random.Random)
    "eval_sampling": 5,  # demo stage 5 and the experiments: sampling the evaluated responses (torch.manual_seed)
    "slip_eval_pairs": 6,  # demo stage 2: held-out one-slip pairs (random.Random and torch.manual_seed)
    "slip_pairs": 7,  # demo stage 2: one-slip pairs added to the RM's training data (both, as above)
    "rm_growth": 8,  # demo stage 3: the new layers of a deeper reward model (reward.extra_layers)
    "credit_prompts": 6,  # the demo report: prompts of the per-token view beyond the evaluation's
    # (the same offset as slip_eval_pairs; kept so that the report's prompts stay what they were)
}
"""Offset of each named stream from ``run.seed``."""


def stream_seed(seed: int, name: str) -> int:
    """The seed of stream ``name`` (a key of :data:`SEED_OFFSETS`) for a run seeded with ``seed``."""
    if name not in SEED_OFFSETS:
        raise KeyError(f"unknown seed stream {name!r}; known: {', '.join(SEED_OFFSETS)}")
    return seed + SEED_OFFSETS[name]
