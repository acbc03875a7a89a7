"""The demo's stage cache keys: labeler and gold options must not invalidate the SFT stage."""
import dataclasses

from fourfold.apps.cache import stage_key
from fourfold.apps.demo.pipeline import eval_stage_settings, pairs_stage_settings, sft_stage_settings
from fourfold.config import DemoConfig
from fourfold.tasks import ReviewTaskConfig


def test_sft_key_keeps_only_corpus_options():
    cfg = DemoConfig(task_options={"labeler_length_bias": 0.0, "ill_formed_gold": -2.0, "max_review_words": 25})
    assert sft_stage_settings(cfg)["task"] == {"max_review_words": 25}
    assert sft_stage_settings(DemoConfig())["task"] == {}


def test_labeler_options_leave_the_sft_settings_unchanged_corpus_options_do_not():
    base = sft_stage_settings(DemoConfig())
    assert sft_stage_settings(DemoConfig(task_options={"labeler_length_bias": 0.0, "ill_formed_gold": -2.0})) == base
    assert sft_stage_settings(DemoConfig(task_options={"min_review_words": 10})) != base


def test_corpus_fields_are_fields_of_the_config():
    names = {f.name for f in dataclasses.fields(ReviewTaskConfig)}
    assert set(ReviewTaskConfig.CORPUS_FIELDS) <= names


def test_pairs_and_eval_keys_are_those_the_demo_always_wrote():
    """The default config's pairs and eval settings key as they did when run() wrote them inline
    (over fixed upstream keys: those test_lora_trainers pins)."""
    cfg, up = DemoConfig(), {"sft": "aaadffe7664f9a26"}
    assert stage_key(pairs_stage_settings(cfg), up) == "faee640d940a5a8f"
    assert stage_key(eval_stage_settings(cfg), {**up, "pairs": "faee640d940a5a8f"}) == "39e917ddbaeaab31"
