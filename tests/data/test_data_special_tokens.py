"""User text never turns into special tokens: ``<pad>`` or ``<|endoftext|>`` typed in a prompt,
completion or response stays text, while a chat template's own special tokens stay special, and
text without special-token strings gets exactly the ids it always got."""
import pytest
from datatest_utils import write_jsonl

from fourfold.data import (
    PreferenceRecord,
    SFTRecord,
    TemplateText,
    chat_template_renderer,
    encode_preferences,
    encode_sft,
    load_prompts,
    tokenize_prompts,
)
from fourfold.errors import DataError

PAD, EOS, BOS, UNK = 0, 1, 2, 3
CHAT = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.fixture(scope="module")
def bpe():
    """A byte-level BPE tokenizer in the GPT-2 / Qwen style: one special token is EOS, BOS, UNK and
    pad at once; <|im_start|> and <|im_end|> are the chat template's."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(["hello world, the cat sat on the mat. pad pads end of text"] * 20, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", bos_token="<|endoftext|>",
                                   unk_token="<|endoftext|>", pad_token="<|endoftext|>",
                                   additional_special_tokens=["<|im_start|>", "<|im_end|>"])
    fast.chat_template = CHAT
    return fast


def _plain(tok, texts):
    return [tok(t, add_special_tokens=False)["input_ids"] for t in texts]


def test_text_without_special_strings_keeps_its_ids(bpe, tokenizer):
    texts = ["hello world", "the cat sat on the mat.", "pads pad", "end of text <", "|> im"]
    assert tokenize_prompts(texts, bpe, 64, add_bos=False) == _plain(bpe, texts)
    words = ["hello world", "what is two plus four", "a b c d e f g"]
    assert tokenize_prompts(words, tokenizer, 64, add_bos=False) == _plain(tokenizer, words)


def test_demo_vocabulary_ids_are_unchanged():
    """The demo's word-level tokenizer and texts: the ids its stage caches were built from."""
    import random

    from fourfold.tasks import get_task, task_prompts
    from fourfold.tasks.tokenizer import build_word_tokenizer

    task = get_task("review")
    vocab = list(task.tokenizer_corpus())
    tok = build_word_tokenizer(vocab)
    prompts = task_prompts(task, 64, 0)
    rng = random.Random(0)
    replies = [" ".join(rng.choice(vocab) for _ in range(12)) for _ in prompts]
    assert tokenize_prompts(prompts, tok, 64, add_bos=False) == _plain(tok, prompts)
    examples = encode_sft([SFTRecord(p, r, i + 1) for i, (p, r) in enumerate(zip(prompts, replies))], tok, 64)
    assert [e.input_ids for e in examples] == [
        [tok.bos_token_id] + p + r + [tok.eos_token_id] for p, r in zip(_plain(tok, prompts), _plain(tok, replies))]


def test_typed_special_tokens_stay_text_in_bpe(bpe):
    eot = bpe.convert_tokens_to_ids("<|endoftext|>")
    (ids,) = tokenize_prompts(["hello <|endoftext|> world <|im_end|>"], bpe, 64, add_bos=False)
    assert eot not in ids and bpe.convert_tokens_to_ids("<|im_end|>") not in ids
    assert bpe.decode(ids) == "hello <|endoftext|> world <|im_end|>"


def test_typed_special_tokens_in_a_word_vocabulary_become_unk(tokenizer):
    """A word-level vocabulary holds "<pad>" as a word: the only way to keep it text is UNK."""
    (ids,) = tokenize_prompts(["hello <pad> <eos> world"], tokenizer, 16)
    assert ids == [BOS, tokenizer.convert_tokens_to_ids("hello"), UNK, UNK, tokenizer.convert_tokens_to_ids("world")]
    (ex,) = encode_sft([SFTRecord("hello", "good <eos> <pad>", 1)], tokenizer, 16)
    assert ex.input_ids[ex.num_prompt_tokens:] == [tokenizer.convert_tokens_to_ids("good"), UNK, UNK, EOS]
    (pair,) = encode_preferences([PreferenceRecord("hello", "<bos> good", "bad", 1)], tokenizer, 16)
    assert BOS not in pair.chosen_ids[1:] and pair.chosen_ids[2] == UNK


def test_no_unk_to_fall_back_on_is_a_data_error_naming_the_line(tokenizer):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<eos>": 1, "hello": 2}
    raw = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    raw.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=raw, pad_token="<pad>", eos_token="<eos>")
    with pytest.raises(DataError, match=r"^p\.jsonl:4: the prompt contains '<eos>', which this tokenizer can only read"):
        tokenize_prompts(["hello <eos>"], tok, 8, lines=[4], source="p.jsonl")


def test_chat_template_tokens_stay_special_and_typed_ones_stay_text(bpe, tmp_path):
    im_start, im_end = bpe.convert_tokens_to_ids("<|im_start|>"), bpe.convert_tokens_to_ids("<|im_end|>")
    path = write_jsonl(tmp_path / "p.jsonl", [
        {"messages": [{"role": "user", "content": "hello world"}]},
        {"messages": [{"role": "user", "content": "hello <|im_end|> <|endoftext|> world"}]},
    ])
    records = load_prompts(path, chat_template=chat_template_renderer(bpe))
    clean, typed = records[0].prompt, records[1].prompt
    assert isinstance(clean, TemplateText) and clean.literal_spans == ()
    assert typed == "<|im_start|>user\nhello <|im_end|> <|endoftext|> world<|im_end|>\n<|im_start|>assistant\n"
    assert [typed[a:b] for a, b in typed.literal_spans] == ["<|im_end|>", "<|endoftext|>"]
    ids_clean, ids_typed = tokenize_prompts([clean, typed], bpe, 128, add_bos=False)
    assert ids_clean == bpe(str(clean), add_special_tokens=False)["input_ids"]  # the template's ids, unchanged
    assert ids_typed.count(im_start) == 2 and ids_typed.count(im_end) == 1  # only the template's own
    assert bpe.convert_tokens_to_ids("<|endoftext|>") not in ids_typed
    assert bpe.decode(ids_typed) == typed


def test_a_callers_own_template_keeps_its_special_tokens(tokenizer, tmp_path):
    from fourfold.data import load_sft

    path = write_jsonl(tmp_path / "s.jsonl", [{"messages": [{"role": "user", "content": "hello"},
                                                            {"role": "assistant", "content": "good"}]}])
    records = load_sft(path, chat_template=lambda msgs: "<bos> " + msgs[0]["content"])
    (ex,) = encode_sft(records, tokenizer, 16)
    assert ex.input_ids[:2] == [BOS, tokenizer.convert_tokens_to_ids("hello")]  # one BOS: the template's
