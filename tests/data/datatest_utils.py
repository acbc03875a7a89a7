"""Helpers for tests/data: a tiny word-level tokenizer built in memory (no downloads), JSONL writer."""
import json

WORDS = "hello world the a b c d e f g what is two plus four yes no good bad answer question".split()
SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>"]


def make_tokenizer(*, bos: bool = True):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(SPECIALS + WORDS)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    kwargs = dict(pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")
    if bos:
        kwargs["bos_token"] = "<bos>"
    return PreTrainedTokenizerFast(tokenizer_object=tok, **kwargs)


def write_jsonl(path, rows):
    """Write rows (dicts/values as JSON, or raw str/bytes lines as they are) one per line."""
    with open(path, "wb") as f:
        for row in rows:
            if isinstance(row, bytes):
                f.write(row + b"\n")
            elif isinstance(row, str):
                f.write(row.encode("utf-8") + b"\n")
            else:
                f.write(json.dumps(row).encode("utf-8") + b"\n")
    return path
