"""Tokenisation boundaries, padding and masks (1 = valid), with a tiny in-memory word-level tokenizer."""
import pytest
import torch
from datatest_utils import write_jsonl

from fourfold.data import (
    PreferenceRecord,
    PromptRecord,
    SFTRecord,
    TemplateText,
    encode_preferences,
    encode_prompts,
    encode_sft,
    left_pad,
    load_prompts,
    load_sft,
    tokenize_preferences,
    tokenize_prompts,
    tokenize_sft,
)
from fourfold.errors import DataError

PAD, EOS, BOS, UNK = 0, 1, 2, 3


def ids(tok, text):
    return tok(text, add_special_tokens=False)["input_ids"]


def test_specials(tokenizer, tokenizer_no_bos):
    assert (tokenizer.pad_token_id, tokenizer.eos_token_id, tokenizer.bos_token_id) == (PAD, EOS, BOS)
    assert tokenizer_no_bos.bos_token_id is None


def test_tokenize_prompts_and_left_pad(tokenizer):
    seqs = tokenize_prompts(["hello world", "what is two plus four"], tokenizer, 8)
    assert seqs == [[BOS] + ids(tokenizer, "hello world"), [BOS] + ids(tokenizer, "what is two plus four")]
    input_ids, mask = left_pad(seqs, PAD)
    assert input_ids.dtype == mask.dtype == torch.long and input_ids.shape == mask.shape == (2, 6)
    assert input_ids[0].tolist() == [PAD, PAD, PAD] + seqs[0]
    assert mask.tolist() == [[0, 0, 0, 1, 1, 1], [1] * 6]
    assert input_ids[1].tolist() == seqs[1]


def test_prompt_too_long_names_file_and_line(tokenizer, tmp_path):
    p = write_jsonl(tmp_path / "prompts.jsonl", [{"prompt": "a b"}, {"prompt": "a b c d e f"}])
    recs = load_prompts(p)
    with pytest.raises(DataError) as info:
        tokenize_prompts(recs, tokenizer, 4)
    assert str(info.value) == f"{p}:2: prompt has 7 tokens, more than data.max_prompt_len=4"
    # plain strings with explicit lines and source
    with pytest.raises(DataError, match=r"^data\.jsonl:9: prompt has 7 tokens, more than data\.max_prompt_len=4$"):
        tokenize_prompts(["a", "a b c d e f"], tokenizer, 4, lines=[3, 9], source="data.jsonl")


def test_prompt_truncation_keeps_bos_and_the_end(tokenizer):
    (seq,) = tokenize_prompts(["a b c d e f"], tokenizer, 4, truncate=True)
    assert seq == [BOS] + ids(tokenizer, "d e f")
    (ex,) = encode_prompts(["a b c"], tokenizer, 4, truncate=True)
    assert not ex.truncated and ex.input_ids == [BOS] + ids(tokenizer, "a b c")


def test_prompt_skip_mode_appends_to_load_result(tokenizer, tmp_path):
    p = write_jsonl(tmp_path / "prompts.jsonl", [{"prompt": "a"}, {"prompt": "a b c d e f"}, {"prompt": "b"}])
    recs = load_prompts(p)
    out = encode_prompts(recs, tokenizer, 4, on_error="skip")
    assert [(e.index, e.line) for e in out] == [(0, 1), (2, 3)]
    assert recs.skipped == [f"{p}:2: prompt has 7 tokens, more than data.max_prompt_len=4"]


def test_no_bos_tokenizer_and_add_bos_false(tokenizer, tokenizer_no_bos):
    assert tokenize_prompts(["a b"], tokenizer_no_bos, 4) == [ids(tokenizer, "a b")]
    assert tokenize_prompts(["a b"], tokenizer, 4, add_bos=False) == [ids(tokenizer, "a b")]
    # a prompt that already starts with BOS (a chat template writing it) does not get a second one
    assert tokenize_prompts([TemplateText("<bos> a b")], tokenizer, 4) == [[BOS] + ids(tokenizer, "a b")]
    # typed by a user, "<bos>" is text (this word-level vocabulary can only write it as UNK)
    assert tokenize_prompts(["<bos> a b"], tokenizer, 4) == [[BOS, UNK] + ids(tokenizer, "a b")]
    with pytest.raises(DataError, match="empty after tokenisation"):
        tokenize_prompts([""], tokenizer_no_bos, 4)


def test_sft_loss_mask_covers_exactly_completion_and_eos(tokenizer):
    recs = [SFTRecord("what is two plus two", "four", 1), SFTRecord("hello", "good answer yes", 2), SFTRecord("", "a b", 3)]
    batch = tokenize_sft(recs, tokenizer, 16)
    assert set(batch) == {"input_ids", "attention_mask", "loss_mask", "truncated"}
    x, am, lm = batch["input_ids"], batch["attention_mask"], batch["loss_mask"]
    assert x.shape == am.shape == lm.shape == (3, 8) and x.dtype == am.dtype == lm.dtype == torch.long
    for b, r in enumerate(recs):
        p = [BOS] + ids(tokenizer, r.prompt)
        c = ids(tokenizer, r.completion) + [EOS]
        n = len(p) + len(c)
        assert x[b, :n].tolist() == p + c  # ids of prompt and completion concatenated, BOS only at start
        assert (x[b, n:] == PAD).all()
        assert am[b].tolist() == [1] * n + [0] * (8 - n)  # right padding
        assert lm[b].tolist() == [0] * len(p) + [1] * len(c) + [0] * (8 - n)
        assert x[b, lm[b].bool()].tolist() == c
    assert batch["truncated"].tolist() == [False] * 3


def test_sft_no_eos_and_truncation(tokenizer):
    batch = tokenize_sft([SFTRecord("a", "b c", 1)], tokenizer, 8, eos=False)
    assert batch["input_ids"][0].tolist() == [BOS] + ids(tokenizer, "a b c")
    assert batch["loss_mask"][0].tolist() == [0, 0, 1, 1]
    (ex,) = encode_sft([SFTRecord("a", "b c d e", 1)], tokenizer, 4)
    assert ex.truncated and ex.input_ids == [BOS] + ids(tokenizer, "a b c") and ex.num_prompt_tokens == 2
    with pytest.raises(DataError, match=r"^<records>:1: prompt \+ completion have 7 tokens, more than max_len=4$"):
        encode_sft([SFTRecord("a", "b c d e", 1)], tokenizer, 4, truncate=False)
    with pytest.raises(DataError, match=r"leaving no room for the completion within max_len=4"):
        encode_sft([SFTRecord("a b c d", "e", 1)], tokenizer, 4)


def test_sft_max_prompt_len_and_skip(tokenizer, tmp_path):
    p = write_jsonl(tmp_path / "sft.jsonl", [{"prompt": "a b c d", "completion": "e"}, {"prompt": "a", "completion": "b"}])
    recs = load_sft(p)
    with pytest.raises(DataError, match=rf"^{p}:1: prompt has 5 tokens, more than data\.max_prompt_len=3$"):
        encode_sft(recs, tokenizer, 16, max_prompt_len=3)
    out = encode_sft(recs, tokenizer, 16, max_prompt_len=3, on_error="skip")
    assert [e.line for e in out] == [2] and len(recs.skipped) == 1


def test_preferences_right_padded_with_eos(tokenizer):
    recs = [PreferenceRecord("what is two plus two", "four", "a b c d", 1), PreferenceRecord("hello", "good", "bad", 2)]
    batch = tokenize_preferences(recs, tokenizer, 16)
    L = batch["chosen_input_ids"].shape[1]
    assert batch["rejected_input_ids"].shape[1] == L == 1 + 5 + 4 + 1
    for b, r in enumerate(recs):
        p = [BOS] + ids(tokenizer, r.prompt)
        for side, text in (("chosen", r.chosen), ("rejected", r.rejected)):
            seq = p + ids(tokenizer, text) + [EOS]
            x, m = batch[f"{side}_input_ids"][b], batch[f"{side}_attention_mask"][b]
            assert x[: len(seq)].tolist() == seq and (x[len(seq):] == PAD).all()
            assert m.tolist() == [1] * len(seq) + [0] * (L - len(seq))
            last = int(m.sum()) - 1  # where a reward model scores: the last non-pad token is EOS
            assert x[last].item() == EOS


def test_preferences_same_tokens_and_truncation_are_ties_left_out(tokenizer):
    # different strings, same ids (both unknown words -> <unk>): a tie, whatever on_error says
    good = PreferenceRecord("hello", "a", "b", 1)
    for on_error in ("raise", "skip"):
        ties, skipped = [], []
        out = encode_preferences([good, PreferenceRecord("hello", "zzz", "yyy", 5)], tokenizer, 16, on_error=on_error,
                                 ties=ties, skipped=skipped)
        assert [e.line for e in out] == [1] and skipped == []
        assert ties == ["<records>:5: 'chosen' and 'rejected' are the same tokens"]
    ties = []
    assert encode_preferences([PreferenceRecord("hello", "a b c", "a b d", 5)], tokenizer, 4, ties=ties) == []
    assert ties == ["<records>:5: 'chosen' and 'rejected' are the same tokens after truncation to max_len=4"]
    (ex,) = encode_preferences([PreferenceRecord("hello", "a b", "a c d", 5)], tokenizer, 4)
    assert ex.truncated and ex.chosen_ids == [BOS, 4] + ids(tokenizer, "a b") and ex.rejected_ids == [BOS, 4] + ids(tokenizer, "a c")


class _Exploding:
    """A tokenizer that fails on one text, as a real one might on odd input."""

    pad_token_id, eos_token_id, bos_token_id = PAD, EOS, None

    def __call__(self, texts, add_special_tokens):
        batch = [texts] if isinstance(texts, str) else texts
        if any("boom" in t for t in batch):
            raise TypeError("TextEncodeInput must be Union[...]")
        out = [[4] * len(t.split()) for t in batch]
        return {"input_ids": out[0] if isinstance(texts, str) else out}


def test_tokenizer_failure_is_a_data_error_naming_the_line():
    recs = [SFTRecord("a", "b", 1, "sft.jsonl"), SFTRecord("a", "boom", 2, "sft.jsonl")]
    with pytest.raises(DataError, match=r"^sft\.jsonl:2: tokenizer failed on the completion: TypeError: "):
        tokenize_sft(recs, _Exploding(), 8)
    skipped = []
    assert len(encode_sft(recs, _Exploding(), 8, on_error="skip", skipped=skipped)) == 1 and len(skipped) == 1
    with pytest.raises(DataError, match=r"^p\.jsonl:1: tokenizer failed on the prompt"):
        tokenize_prompts([PromptRecord("boom", 1, "p.jsonl")], _Exploding(), 8)
