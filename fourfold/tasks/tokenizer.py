"""A word-level tokenizer for synthetic tasks: one token per whitespace-separated word.

Ids: ``<pad>`` = 0, ``<bos>`` = 1, ``<eos>`` = 2, ``<unk>`` = 3, then the task's words in sorted
order (so the same word list always gives the same ids). Encoding adds no special tokens by itself
(no post-processor): callers put ``<bos>``/``<eos>`` where they want them. ``padding_side`` is left
at the library default; callers choose (left padding for generation).

Decoding joins the words with single spaces, so for any text made of vocabulary words separated by
single spaces, ``decode(encode(text), skip_special_tokens=True) == text``.
"""
from __future__ import annotations

import json
import os
from typing import Iterable

SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>", "<unk>")


def build_word_tokenizer(words: Iterable[str], out_dir: str | os.PathLike | None = None):
    """Build a ``transformers`` fast tokenizer over ``words`` (duplicates and order ignored).

    When ``out_dir`` is given, the tokenizer is saved there with ``save_pretrained`` and can be
    reloaded offline with ``AutoTokenizer.from_pretrained(out_dir)``.
    """
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab_words = sorted(set(words) - set(SPECIAL_TOKENS))
    for w in vocab_words:
        if not w or any(c.isspace() for c in w):
            raise ValueError(f"vocabulary word {w!r} is empty or contains whitespace")
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for w in vocab_words:
        vocab[w] = len(vocab)

    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    # no decoder: tokenizers then decodes by joining the tokens with single spaces

    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<pad>",
        bos_token="<bos>",
        eos_token="<eos>",
        unk_token="<unk>",
        clean_up_tokenization_spaces=False,
    )
    if out_dir is not None:
        save_tokenizer(fast, out_dir)
    return fast


def save_tokenizer(fast, out_dir: str | os.PathLike) -> None:
    """``fast.save_pretrained(out_dir)``, its ``tokenizer_config.json`` naming the public class:
    transformers 5 records its internal class name "TokenizersBackend", which 4.x cannot resolve;
    the public alias ``PreTrainedTokenizerFast`` loads the same tokenizer under both."""
    fast.save_pretrained(str(out_dir))
    cfg_path = os.path.join(str(out_dir), "tokenizer_config.json")
    with open(cfg_path, encoding="utf-8") as f:
        cfg = json.load(f)
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    with open(cfg_path, "w", encoding="utf-8") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")
