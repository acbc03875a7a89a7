"""Test-wide settings: no network, one torch thread per process (much faster for tiny models)."""
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

torch.set_num_threads(1)


import json  # noqa: E402
import random  # noqa: E402

import pytest  # noqa: E402

TARGET_WORD = "w7"


def _write_tiny_lm(root, vocab_words=60, hidden=64, layers=2, heads=4):
    """A word-level tokenizer, a random causal LM (the 'SFT model') and a random 1-label reward
    model, all saved as HF directories; plus a prompts file and a rule-based reward function."""
    from fourfold.models.factory import llama_config, random_causal_lm, random_scalar_model
    from fourfold.tasks.tokenizer import build_word_tokenizer

    tok = build_word_tokenizer([f"w{i}" for i in range(vocab_words)])
    cfg = llama_config(len(tok), hidden=hidden, layers=layers, heads=heads, max_positions=128,
                       pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    random_causal_lm(cfg, seed=0).save_pretrained(root / "sft")
    tok.save_pretrained(root / "sft")
    random_scalar_model(cfg, seed=1).save_pretrained(root / "rm")
    tok.save_pretrained(root / "rm")
    rng = random.Random(0)
    with open(root / "prompts.jsonl", "w") as f:
        for _ in range(64):
            words = " ".join(f"w{rng.randrange(vocab_words)}" for _ in range(rng.randrange(2, 6)))
            f.write(json.dumps({"prompt": words}) + "\n")
    (root / "reward_fn.py").write_text(
        "def reward(prompts, responses):\n"
        f"    return [r.split().count({TARGET_WORD!r}) / 4.0 for r in responses]\n"
    )
    return root


@pytest.fixture(scope="session")
def tiny_lm(tmp_path_factory):
    """Directory with sft/, rm/, prompts.jsonl and reward_fn.py (tiny random models, no downloads)."""
    return _write_tiny_lm(tmp_path_factory.mktemp("tiny_lm"))


def _assert_seq_ratios_within_token_bound(row: dict, max_tokens: int) -> None:
    """What the method guarantees of a low-precision copy's sequence ratios rho_i = exp(sum_t d_t)
    (``mismatch/seq_ratio_*`` of a metrics ``row``): some row's moves off 1 (the copy's rounding
    reaches the sequences) and none further than its tokens allow, |log rho_i| <= ``max_tokens`` x
    the largest token difference. Not their direction: whether some ratio lies above 1 and some below
    is one CPU's rounding (on an AVX2-only AMD EPYC every one of a bf16 run's is below 1)."""
    import math

    lo, hi = math.log(row["mismatch/seq_ratio_min"]), math.log(row["mismatch/seq_ratio_max"])
    bound = max_tokens * row["mismatch/token_abs_diff_max"] * (1 + 1e-5)
    assert lo <= hi and max(-lo, hi) > 1e-6, (lo, hi)
    assert -bound <= lo and hi <= bound, (lo, hi, bound)


@pytest.fixture
def seq_ratios_within_token_bound():
    """:func:`_assert_seq_ratios_within_token_bound`, for the tests of a bf16 copy's mismatch."""
    return _assert_seq_ratios_within_token_bound
