"""The demo's stage cache keys: labeler and gold options must not invalidate the SFT stage."""
import dataclasses

from fourfold.config import DemoConfig
from fourfold.demo import sft_stage_settings
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
