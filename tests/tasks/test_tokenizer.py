"""The word-level tokenizer: ids, round trip, save and offline reload."""
import json
import random

from fourfold.tasks import ReviewTask, build_word_tokenizer

TASK = ReviewTask()


def test_special_tokens_and_round_trip():
    tok = build_word_tokenizer(TASK.tokenizer_corpus())
    vocab = list(TASK.tokenizer_corpus())
    assert len(tok) == len(vocab) + 4
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id, tok.unk_token_id) == (0, 1, 2, 3)
    assert (tok.pad_token, tok.bos_token, tok.eos_token, tok.unk_token) == ("<pad>", "<bos>", "<eos>", "<unk>")
    ids = tok(" ".join(vocab), add_special_tokens=False)["input_ids"]
    assert len(ids) == len(vocab) and tok.unk_token_id not in ids
    for ex in TASK.sft_examples(100, random.Random(0)):
        text = ex["prompt"] + " " + ex["completion"]
        ids = tok(text)["input_ids"]
        assert len(ids) == len(text.split())  # one token per word, no special tokens added
        assert tok.decode(ids) == text
        assert tok.decode([tok.bos_token_id] + ids + [tok.eos_token_id, 0, 0], skip_special_tokens=True) == text
    assert tok("the zebra")["input_ids"][1] == tok.unk_token_id


def test_save_and_reload_offline(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    from transformers import AutoTokenizer

    tok = build_word_tokenizer(TASK.tokenizer_corpus(), out_dir=tmp_path)
    cfg = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert cfg["clean_up_tokenization_spaces"] is False
    again = AutoTokenizer.from_pretrained(str(tmp_path))
    text = "my new kettle is very sturdy , but the lid feels flimsy . i would recommend it !"
    assert again(text)["input_ids"] == tok(text)["input_ids"]
    assert again.decode(again(text)["input_ids"], skip_special_tokens=True) == text
    assert (again.pad_token_id, again.bos_token_id, again.eos_token_id, again.unk_token_id) == (0, 1, 2, 3)
    assert again.get_vocab() == tok.get_vocab()


def test_ids_do_not_depend_on_word_order():
    words = list(TASK.tokenizer_corpus())
    a = build_word_tokenizer(words)
    b = build_word_tokenizer(reversed(words + words[:10]))
    assert a.get_vocab() == b.get_vocab()
