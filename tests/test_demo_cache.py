"""The demo's stage cache keys: labeler and gold options must not invalidate the SFT stage."""
from fourfold.demo import corpus_options
from fourfold.tasks import ReviewTaskConfig, get_task


def test_sft_key_keeps_only_corpus_options():
    opts = {"labeler_length_bias": 0.0, "ill_formed_gold": -2.0, "max_review_words": 25}
    task = get_task("review", **opts)
    assert corpus_options(task, opts) == {"max_review_words": 25}
    assert corpus_options(get_task("review"), {}) == {}


def test_corpus_fields_are_fields_of_the_config():
    import dataclasses

    names = {f.name for f in dataclasses.fields(ReviewTaskConfig)}
    assert set(ReviewTaskConfig.CORPUS_FIELDS) <= names


def test_task_without_declared_corpus_fields_keys_on_everything():
    class Plain:  # a user task with no config object
        pass

    opts = {"a": 1, "b": [2]}
    assert corpus_options(Plain(), opts) == opts
