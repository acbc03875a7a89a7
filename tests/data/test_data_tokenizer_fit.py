"""A tokenizer that does not fit the data: text it reads as no tokens is a bad row naming file and
line (or skipped and counted with on_error="skip")."""
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
    assert len(encode_sft(recs, tokenizer, 16)) == 2 and recs.skipped == []
    r = write_jsonl(tmp_path / "rows.jsonl", [{"prompt": "hello", "response": ""}])  # an empty response: only EOS
    assert len(encode_responses(load_responses(r), tokenizer, 16)) == 1
