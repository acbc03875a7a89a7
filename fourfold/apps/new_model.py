"""``fourfold new-model``: a small model of one's own, offline (docs/new-model.md).

A tokenizer trained on the user's corpus with the ``tokenizers`` library (byte-level BPE, or one
token per word), wrapped as a transformers ``PreTrainedTokenizerFast`` with ``<pad>`` ``<bos>``
``<eos>`` ``<unk>``, the chat roles' tokens and a chat template; and a randomly initialised causal LM
of the sizes asked, from a transformers config (:func:`fourfold.models.factory.causal_lm_config`).
Both are saved (safetensors) into one directory, which every stage loads as ``model.path`` or
``model.policy``. Nothing is downloaded.

The corpus: a text file, one document a line (blank lines skipped), or a JSONL / Parquet file whose
rows have a ``text``, ``prompt``, ``completion``, ``response``, ``chosen`` or ``rejected`` string or
``messages`` (every one of them a row has is read).

The directory is written into a temporary sibling and renamed into place once whole: an ``--out``
that holds anything is replaced only with ``--force``, and only after the new model is written; a
failure leaves it as it was. Bad flags are one :class:`~fourfold.errors.ConfigError` line naming
the flag and what was expected.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from pathlib import Path
from typing import Optional

from fourfold.errors import ConfigError, DataError, OutputError
from fourfold.models.factory import ARCHITECTURES
from fourfold.tasks.tokenizer import SPECIAL_TOKENS

ROLE_TOKENS = ("<|system|>", "<|user|>", "<|assistant|>", "<|tool|>")
"""Special tokens that open a chat message of each role (:data:`CHAT_TEMPLATE`)."""
CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}"
                 "{% if m['role'] == 'assistant' %}{{ eos_token }}{% endif %}{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>{% endif %}")
"""Each message as its role's token then its content; an assistant message ends with EOS."""
BYTES = 256  # the byte-level BPE's initial alphabet: any text encodes, nothing is <unk>
TOKENIZERS = ("bpe", "word")
TEXT_FIELDS = ("text", "prompt", "completion", "response", "chosen", "rejected")
ROPE_ARCHS = ("llama", "qwen2", "mistral")


@dataclasses.dataclass
class NewModelSpec:
    """What ``fourfold new-model`` builds; each field is the flag of the same name."""

    corpus: str
    """Text file (one document a line) or JSONL/Parquet with a text field."""
    out: str
    """Directory to write the tokenizer and the model into."""
    vocab: int = 1024
    """Most tokens of the tokenizer, special ones included (a small corpus may give fewer)."""
    layers: int = 2
    """Decoder layers."""
    hidden: int = 128
    """Hidden size."""
    heads: int = 4
    """Attention heads (they divide --hidden)."""
    intermediate: Optional[int] = None
    """MLP width."""
    positions: int = 256
    """Longest sequence the model takes (prompt + response, or a whole trajectory)."""
    arch: str = "llama"
    """The decoder family: llama, qwen2, mistral or gpt2."""
    tokenizer: str = "bpe"
    """bpe: byte-level BPE (any text encodes); word: one token per whitespace-separated word."""
    min_frequency: int = 2
    """Least count of a merge (bpe) or a word (word) to enter the vocabulary."""
    seed: int = 0
    """Seed of the model's random initial weights."""
    force: bool = False
    """Replace an --out that already holds files."""

    def min_vocab(self) -> int:
        """The least --vocab: the special tokens, and the 256 bytes of byte-level BPE or one word."""
        return len(SPECIAL_TOKENS) + len(ROLE_TOKENS) + (BYTES if self.tokenizer == "bpe" else 1)

    def check(self) -> None:
        """Every flag's own check, one ConfigError line naming the flag (the corpus is read later)."""
        _require(self.tokenizer in TOKENIZERS, "--tokenizer", f"{self.tokenizer!r}: expected one of {', '.join(TOKENIZERS)}")
        _require(self.arch in ARCHITECTURES, "--arch", f"{self.arch!r}: expected one of {', '.join(ARCHITECTURES)}")
        for flag in ("layers", "hidden", "heads", "positions", "min_frequency"):
            value = getattr(self, flag)
            _require(value >= 1, f"--{flag.replace('_', '-')}", f"{value}: expected an integer >= 1")
        _require(self.intermediate is None or self.intermediate >= 1, "--intermediate",
                 f"{self.intermediate}: expected an integer >= 1 (or leave it out: 4 x --hidden)")
        specials = len(SPECIAL_TOKENS) + len(ROLE_TOKENS)
        what = f"{specials} special tokens and the {BYTES} bytes of byte-level BPE" if self.tokenizer == "bpe" \
            else f"{specials} special tokens and at least one word"
        _require(self.vocab >= self.min_vocab(), "--vocab",
                 f"{self.vocab} is too small for the {what}: expected at least {self.min_vocab()}"
                 + (" (or --tokenizer word)" if self.tokenizer == "bpe" else ""))
        _require(self.hidden % self.heads == 0, "--hidden",
                 f"{self.hidden} is not divisible by --heads {self.heads}: expected a multiple of it")
        head = self.hidden // self.heads
        _require(self.arch not in ROPE_ARCHS or head % 2 == 0, "--hidden",
                 f"{self.hidden} / --heads {self.heads} = {head} per head; {self.arch}'s rotary positions need an "
                 "even head size")
        out = Path(self.out)
        _require(not out.exists() or out.is_dir(), "--out", f"{self.out} is a file: expected a directory")
        _require(self.force or not out.is_dir() or not any(out.iterdir()), "--out",
                 f"{self.out} exists and is not empty: expected a new or empty directory (or --force to replace it)")


def _require(ok: bool, flag: str, problem: str) -> None:
    if not ok:
        raise ConfigError(f"{flag}: {problem}")


def read_corpus(path: str) -> list[str]:
    """The corpus's documents: a text file's non-blank lines, or every text field of a JSONL or
    Parquet file's rows (:data:`TEXT_FIELDS`, ``messages``' contents)."""
    from fourfold.data.io import JSONL_SUFFIXES, PARQUET_SUFFIXES

    p = Path(path)
    expected = "a text file (one document a line) or a JSONL file with a 'text' or 'prompt' field"
    _require(not p.is_dir(), "--corpus", f"{path} is a directory; expected {expected}")
    _require(p.is_file(), "--corpus", f"{path}: no such file; expected {expected}")
    if p.suffix in JSONL_SUFFIXES + PARQUET_SUFFIXES:
        texts = _record_texts(path)
    else:
        try:
            raw = p.read_text(encoding="utf-8-sig")  # a byte-order mark is not text
        except UnicodeDecodeError as e:
            raise ConfigError(f"--corpus: {path}: not UTF-8 text (byte {e.start}); expected {expected}") from None
        except OSError as e:
            raise ConfigError(f"--corpus: {path}: cannot be read ({e.strerror or e})") from None
        texts = [line for line in raw.splitlines() if line.strip()]
    _require(bool(texts), "--corpus", f"{path}: no text in it (empty, or every line blank); expected {expected}")
    return texts


def _record_texts(path: str) -> list[str]:
    from fourfold.data.io import location, read_source

    try:
        source, records = read_source(path)
    except DataError as e:
        raise ConfigError(f"--corpus: {e}") from None
    texts = []
    for line, rec in records:
        found = [rec[k] for k in TEXT_FIELDS if isinstance(rec.get(k), str)]
        messages = rec.get("messages")
        if isinstance(messages, list):
            found += [m["content"] for m in messages if isinstance(m, dict) and isinstance(m.get("content"), str)]
        _require(bool(found), "--corpus", f"{location(source, line)}: no text field; expected a string in one of "
                 f"{', '.join(repr(k) for k in TEXT_FIELDS)} or 'messages'")
        texts += [t for t in found if t.strip()]
    return texts


def train_tokenizer(texts: list[str], spec: NewModelSpec):
    """A ``PreTrainedTokenizerFast`` trained on ``texts`` (at most ``spec.vocab`` tokens), with the
    special and role tokens and :data:`CHAT_TEMPLATE`. Encoding adds no special tokens by itself
    (the stages put BOS and EOS where they belong), as the demos' tokenizers do."""
    fast = _bpe_tokenizer(texts, spec) if spec.tokenizer == "bpe" else _word_tokenizer(texts, spec)
    fast.chat_template = CHAT_TEMPLATE
    return fast


def _bpe_tokenizer(texts: list[str], spec: NewModelSpec):
    """Byte-level BPE, the specials first (ids 0-3 as in the demos' tokenizers, then the roles)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=spec.vocab, min_frequency=spec.min_frequency, show_progress=False,
                                  special_tokens=[*SPECIAL_TOKENS, *ROLE_TOKENS],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>",
                                   unk_token="<unk>", extra_special_tokens=list(ROLE_TOKENS),
                                   clean_up_tokenization_spaces=False)


def _word_tokenizer(texts: list[str], spec: NewModelSpec):
    """The demos' word-level tokenizer (:func:`~fourfold.tasks.tokenizer.build_word_tokenizer`) over
    the corpus's most frequent words, which the ``tokenizers`` WordLevel trainer picks; the role
    tokens after them."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    from fourfold.tasks.tokenizer import build_word_tokenizer

    counter = Tokenizer(models.WordLevel(unk_token="<unk>"))
    counter.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    trainer = trainers.WordLevelTrainer(vocab_size=spec.vocab - len(ROLE_TOKENS), min_frequency=spec.min_frequency,
                                        special_tokens=list(SPECIAL_TOKENS), show_progress=False)
    counter.train_from_iterator(texts, trainer)
    words = [w for w in counter.get_vocab() if w not in SPECIAL_TOKENS and w not in ROLE_TOKENS]
    _require(bool(words), "--min-frequency", f"{spec.min_frequency}: no word of the corpus occurs that often; "
             "expected a smaller count")
    fast = build_word_tokenizer(words)
    fast.add_special_tokens({"additional_special_tokens": list(ROLE_TOKENS)})
    return fast


def build_model(spec: NewModelSpec, tokenizer):
    """The random causal LM of ``spec``'s sizes over ``tokenizer``'s vocabulary (seeded)."""
    from fourfold.models.factory import causal_lm_config, random_causal_lm

    config = causal_lm_config(spec.arch, len(tokenizer), spec.hidden, spec.layers, spec.heads, spec.intermediate,
                              spec.positions, pad_token_id=tokenizer.pad_token_id,
                              bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    return random_causal_lm(config, seed=spec.seed)


def new_model(spec: NewModelSpec) -> str:
    """Build and save ``spec``'s tokenizer and model into ``spec.out``; the one line that says what
    was written (the vocabulary reached, the parameter count)."""
    from fourfold.tasks.tokenizer import save_tokenizer

    spec.check()
    texts = read_corpus(spec.corpus)
    tokenizer = train_tokenizer(texts, spec)
    model = build_model(spec, tokenizer)
    out = Path(spec.out)

    def write(tmp: Path) -> None:
        model.save_pretrained(str(tmp))  # model.safetensors, config.json, generation_config.json
        save_tokenizer(tokenizer, tmp)

    replace_dir(out, write)
    params = sum(p.numel() for p in model.parameters())
    reached = len(tokenizer)
    short = "" if reached == spec.vocab else f" (of --vocab {spec.vocab}: the corpus gives no more)"
    return (f"wrote {out}: a {spec.tokenizer} tokenizer of {reached} tokens{short} and a random {spec.arch} "
            f"({spec.layers} layers, hidden {spec.hidden}, {spec.heads} heads, {spec.positions} positions) of "
            f"{params:,} parameters; use it as model.path / model.policy={out}")


def replace_dir(out: Path, write) -> None:
    """``write(tmp)`` into a temporary sibling of ``out``, then ``tmp`` renamed to ``out`` (an
    existing ``out`` moved aside first and removed last): ``out`` is the old directory or the new
    one, never a part of either; when ``write`` fails, ``out`` is left as it was."""
    from fourfold.atomic import fsync_dir

    out = Path(os.path.abspath(out))  # "." or "a/.." named by their real name
    parent = out.parent
    tmp, old = parent / f".{out.name}.new-{os.getpid()}", parent / f".{out.name}.old-{os.getpid()}"
    try:
        parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        write(tmp)
        if out.exists():
            os.replace(out, old)
        os.replace(tmp, out)
        fsync_dir(parent)
    except OSError as e:
        if old.exists() and not out.exists():
            os.replace(old, out)
        raise OutputError(f"--out: {out}: cannot be written ({e.strerror or e})") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    shutil.rmtree(old, ignore_errors=True)


def add_parser(sub) -> None:
    """The ``new-model`` subcommand's flags, their defaults and help from :class:`NewModelSpec`."""
    help_text = "a tokenizer trained on your text and a random causal LM, saved for every stage (docs/new-model.md)"
    from fourfold.config.keys import field_docs

    p = sub.add_parser("new-model", help=help_text, description=help_text)
    docs = field_docs(NewModelSpec)
    for f in dataclasses.fields(NewModelSpec):
        flag = "--" + f.name.replace("_", "-")
        if f.name == "force":
            p.add_argument(flag, action="store_true", help=docs[f.name])
            continue
        required = f.default is dataclasses.MISSING
        kind = int if f.name not in ("corpus", "out", "arch", "tokenizer") else str
        choices = {"arch": ARCHITECTURES, "tokenizer": TOKENIZERS}.get(f.name)
        default = "" if required else f" (default: {f.default if f.default is not None else '4 x --hidden'})"
        p.add_argument(flag, type=kind, required=required, default=None if required else f.default,
                       choices=choices, metavar=None if choices else {"corpus": "FILE", "out": "DIR"}.get(f.name, "N"),
                       help=docs[f.name] + default)


def main(args) -> int:
    """``fourfold new-model``: :func:`new_model` of the command's flags; prints its line."""
    if getattr(args, "overrides", None):
        raise ConfigError(f"unexpected arguments {' '.join(args.overrides)} (new-model takes flags only)")
    from fourfold.run.common import quiet_transformers

    quiet_transformers()  # no progress bar on stderr, which holds errors only (as the trainers')
    spec = NewModelSpec(**{f.name: getattr(args, f.name) for f in dataclasses.fields(NewModelSpec)})
    print(f"fourfold new-model: {new_model(spec)}", flush=True)
    return 0
