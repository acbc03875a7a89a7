"""A tokenizer that does not fit the data: text it reads as no tokens is a bad row naming file and
line (or skipped and counted with on_error="skip"); data it reads as mostly UNK gets one warning
line in ``notes`` (the caller shows it)."""
from types import SimpleNamespace

import pytest
from datatest_utils import WORDS, write_jsonl

from fourfold.data import (
    encode_preferences,
    encode_prompts,
    encode_responses,
    encode_sft,
    load_preferences,
    load_prompts,
    load_responses,
    load_sft,
)
from fourfold.data.encoding import UNKNOWN_CHECK_ROWS, unknown_token_note
from fourfold.errors import DataError

NO_TOKENS = "encodes to no tokens: the tokenizer reads nothing in its {n} characters (is it the model's own tokenizer?)"


@pytest.fixture(scope="module")
def misfit(tmp_path_factory):
    """The real failure: a word-level tokenizer's files saved into a tiny Qwen2 model directory load
    back (fourfold's own load_tokenizer) as Qwen2Tokenizer, a byte-level BPE without merges or UNK
    over that vocabulary: it drops every character it has no token for, so with no one-letter word
    in the vocabulary it reads plain words as nothing."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from fourfold.models.loading import load_tokenizer
    from fourfold.tasks.tokenizer import build_word_tokenizer

    d = tmp_path_factory.mktemp("qwen2_misfit")
    words = build_word_tokenizer([w for w in WORDS if len(w) > 1])
    cfg = Qwen2Config(vocab_size=len(words), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64)
    Qwen2ForCausalLM(cfg).save_pretrained(d)
    words.save_pretrained(d)
    tok = load_tokenizer(str(d))
    assert tok("hello world", add_special_tokens=False)["input_ids"] == []  # the failure itself
    assert tok.bos_token_id is not None and tok.eos_token_id is not None  # so BOS / EOS alone would train
    return tok


def _error(fn, *args, **kw) -> str:
    with pytest.raises(DataError) as info:
        fn(*args, **kw)
    msg = str(info.value)
    assert "\n" not in msg
    return msg


def test_sft_rows_read_as_no_tokens_name_file_and_line(misfit, tmp_path):
    p = write_jsonl(tmp_path / "sft.jsonl", [{"prompt": "hello world", "completion": "yes"}, {"text": "a b c"}])
    assert _error(encode_sft, load_sft(p), misfit, 32) == f"{p}:1: the prompt " + NO_TOKENS.format(n=11)
    recs = load_sft(p, on_error="skip")
    assert encode_sft(recs, misfit, 32, on_error="skip") == []
    # a text row has the prompt "": no text, nothing to miss; its completion is the problem
    assert recs.skipped == [f"{p}:1: the prompt " + NO_TOKENS.format(n=11), f"{p}:2: the completion " + NO_TOKENS.format(n=5)]


def test_ppo_prompt_rows_read_as_no_tokens_name_file_and_line(misfit, tmp_path):
    p = write_jsonl(tmp_path / "prompts.jsonl", [{"prompt": "what is two plus two"}, {"prompt": "hello"}])
    assert _error(encode_prompts, load_prompts(p), misfit, 16) == f"{p}:1: the prompt " + NO_TOKENS.format(n=20)
    recs = load_prompts(p)
    assert encode_prompts(recs, misfit, 16, on_error="skip") == [] and len(recs.skipped) == 2
    # prompts given as strings (the trainer's prompts=...): named by source and position
    assert _error(encode_prompts, ["hello", "world"], misfit, 16, source="prompts").startswith("prompts:1: the prompt")


def test_pairs_and_rows_to_score_read_as_no_tokens_name_file_and_line(misfit, tmp_path):
    p = write_jsonl(tmp_path / "prefs.jsonl", [{"prompt": "question", "chosen": "good", "rejected": "bad"}])
    assert _error(encode_preferences, load_preferences(p), misfit, 32) == f"{p}:1: the prompt " + NO_TOKENS.format(n=8)
    r = write_jsonl(tmp_path / "rows.jsonl", [{"prompt": "question", "response": "yes"}])
    assert _error(encode_responses, load_responses(r), misfit, 32) == f"{r}:1: the prompt " + NO_TOKENS.format(n=8)


def test_a_fitting_tokenizer_keeps_every_row_and_blank_text_stays_legal(tokenizer, tmp_path):
    p = write_jsonl(tmp_path / "sft.jsonl", [{"prompt": "hello", "completion": "yes"}, {"text": "a b"}])
    recs = load_sft(p)
    assert len(encode_sft(recs, tokenizer, 16)) == 2 and recs.skipped == [] and recs.notes == []
    r = write_jsonl(tmp_path / "rows.jsonl", [{"prompt": "hello", "response": ""}])  # an empty response: only EOS
    assert len(encode_responses(load_responses(r), tokenizer, 16)) == 1


# --------------------------------------------------------------------------- mostly unknown tokens


def _note(p, unknown, total, rows):
    return (f"{p}: {unknown} of the {total} tokens of the first {rows} rows are the tokenizer's unknown token '<unk>': "
            "it does not know most of this text (is it the model's own tokenizer?)")


def test_mostly_unknown_prompts_get_one_note(tokenizer, tmp_path):
    p = write_jsonl(tmp_path / "prompts.jsonl", [{"prompt": "zebra quokka hello"}, {"prompt": "wombat world ibis"}])
    recs = load_prompts(p)
    assert len(encode_prompts(recs, tokenizer, 16)) == 2  # a warning, not an error
    assert recs.notes == [_note(p, 4, 6, 2)]  # BOS is not counted: only the text's own tokens
    notes: list[str] = []
    encode_prompts(["zebra hello", "quokka"], tokenizer, 16, source="prompts", notes=notes)
    assert notes == [_note("prompts", 2, 3, 2)]


def test_sft_pairs_and_rows_to_score_count_every_text_field(tokenizer, tmp_path):
    p = write_jsonl(tmp_path / "sft.jsonl", [{"prompt": "hello", "completion": "zebra quokka"}])
    recs = load_sft(p)
    encode_sft(recs, tokenizer, 16)
    assert recs.notes == [_note(p, 2, 3, 1)]
    p = write_jsonl(tmp_path / "prefs.jsonl", [{"prompt": "hello world", "chosen": "zebra ibis", "rejected": "quokka"}])
    recs = load_preferences(p)
    encode_preferences(recs, tokenizer, 16)
    assert recs.notes == [_note(p, 3, 5, 1)]
    p = write_jsonl(tmp_path / "rows.jsonl", [{"prompt": "hello", "response": "zebra quokka"}])
    recs = load_responses(p)
    encode_responses(recs, tokenizer, 16)
    assert recs.notes == [_note(p, 2, 3, 1)]


def test_half_unknown_or_unknown_after_the_first_rows_is_no_note(tokenizer, tmp_path):
    p = write_jsonl(tmp_path / "half.jsonl", [{"prompt": "zebra hello"}])
    recs = load_prompts(p)
    encode_prompts(recs, tokenizer, 16)
    assert recs.notes == []  # 1 of 2: not more than half
    rows = [{"prompt": "hello world"}] * UNKNOWN_CHECK_ROWS + [{"prompt": "zebra quokka ibis"}] * 300
    p = write_jsonl(tmp_path / "late.jsonl", rows)
    recs = load_prompts(p)
    encode_prompts(recs, tokenizer, 16)
    assert recs.notes == []  # only the first rows are read


def test_no_unk_token_no_check():
    assert unknown_token_note(SimpleNamespace(unk_token_id=None), [[[5, 5, 5]]], "x") is None
    tok = SimpleNamespace(unk_token_id=5, unk_token="<unk>")
    assert unknown_token_note(tok, [[[5, 5, 1], "a problem row"]], "x") == _note("x", 2, 3, 2)
    assert unknown_token_note(tok, [[]], "x") is None  # no rows

