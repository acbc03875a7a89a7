"""The applications' named seed streams: the offsets are part of every run's outputs, so they are
pinned here (the values the demo and the experiments have always used)."""
import pytest

from fourfold.apps.seeds import SEED_OFFSETS, stream_seed


def test_offsets_are_the_historical_ones():
    assert SEED_OFFSETS == {"sft_corpus": 0, "sft_eval": 1, "pairs": 2, "ppo_prompts": 3, "eval_prompts": 4,
                            "eval_sampling": 5, "slip_eval_pairs": 6, "slip_pairs": 7, "rm_growth": 8,
                            "credit_prompts": 6}


def test_stream_seed_adds_the_offset_and_names_unknown_streams():
    assert stream_seed(10, "eval_prompts") == 14 and stream_seed(0, "sft_corpus") == 0
    with pytest.raises(KeyError, match="eval_prompt.*known: sft_corpus"):
        stream_seed(0, "eval_prompt")
