"""Do the models given for the roles fit the role and each other? Checked when they are loaded,
before the first step, so a run never trains against a random head or another vocabulary.

:class:`RoleChecker` holds the run's tokenizer; each model is handed to it right after loading and
before its embeddings are resized for an added pad token:

* a causal LM (policy, reference, SFT model) must have its trained LM head: a sequence classifier
  (a reward-model directory) given as the policy is refused;
* a scalar model (reward model, critic) must have its trained score head: a causal-LM directory
  given as ``model.reward`` or ``model.critic`` would score with a random head;
* any other weight the directory did not hold (``fourfold_missing_keys``, recorded by
  :mod:`fourfold.models.loading`) is refused: it would be random;
* the embedding must have a row for every token of the tokenizer (the pad fourfold adds excepted:
  that row is added by the resize);
* a directory with its own tokenizer files must hold the same tokenizer as the run's (the same
  vocabulary, the pad token aside, and the same BOS/EOS ids); a directory without them must have
  as many embedding rows as the first model checked (the policy). The exception: a full reward
  model of an RL run with a tokenizer of its own is checked against that tokenizer and scores the
  text encoded again (:class:`~fourfold.models.roles.RetokenizingReward`, built by
  :mod:`fourfold.models.build`);
* every causal LM of a run (policy, reference) has as many token embeddings as the first: their
  log-probs are compared token by token.

Every refusal is one :class:`~fourfold.errors.ModelLoadError` line naming the config key and path.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Optional

from torch import nn

from fourfold.errors import ModelLoadError

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "vocab.txt",
                   "spiece.model", "merges.txt")
"""Files any of which makes a directory carry its own tokenizer."""

_HEADS = ("score", "classifier")  # the scalar head of an AutoModelForSequenceClassification


def has_tokenizer_files(path: str) -> bool:
    """Whether the local directory ``path`` holds tokenizer files (False for a hub name)."""
    p = Path(path)
    return p.is_dir() and any((p / name).is_file() for name in TOKENIZER_FILES)


def _vocab_without_pad(tokenizer) -> dict[str, int]:
    vocab = tokenizer.get_vocab()
    pad = tokenizer.pad_token
    if pad is not None and pad not in (tokenizer.bos_token, tokenizer.eos_token, tokenizer.unk_token):
        vocab.pop(pad, None)  # a pad that is another special token (EOS as pad) stays: it is a real token
    return vocab


def tokenizer_difference(a, b) -> Optional[str]:
    """How tokenizer ``b`` differs from ``a`` (vocabulary without the pad token, BOS and EOS ids), or None."""
    va, vb = _vocab_without_pad(a), _vocab_without_pad(b)
    if va != vb:
        differing = sorted(set(va.items()) ^ set(vb.items()), key=lambda kv: (kv[1], kv[0]))
        token, index = differing[0]
        return f"another vocabulary ({len(vb)} tokens vs {len(va)}; first difference: {token!r} at id {index})"
    for name in ("bos_token_id", "eos_token_id"):
        if getattr(a, name) != getattr(b, name):
            return f"{name} {getattr(b, name)} vs {getattr(a, name)}"
    return None


def tokenizer_fingerprint(tokenizer) -> str:
    """A short hash of what a token id means to ``tokenizer``: its whole vocabulary (added and
    special tokens included) and its BOS, EOS and pad ids. Two tokenizers with the same fingerprint
    give every id the same token, so ids sent between processes (a reward server's client and the
    server: :mod:`fourfold.models.remote`) are read alike."""
    import hashlib
    import json

    vocab = sorted(tokenizer.get_vocab().items(), key=lambda kv: (kv[1], kv[0]))
    specials = [getattr(tokenizer, name, None) for name in ("bos_token_id", "eos_token_id", "pad_token_id")]
    return hashlib.sha256(json.dumps([vocab, specials]).encode()).hexdigest()[:16]


class RoleChecker:
    """Checks each model a run loads against the run's ``tokenizer`` (loaded from ``tokenizer_path``,
    the value of config key ``tokenizer_key``) and against the first model checked."""

    def __init__(self, tokenizer, tokenizer_key: str, tokenizer_path: str, *, trust_remote_code: bool = False):
        self.tokenizer = tokenizer
        self.tokenizer_key, self.tokenizer_path = tokenizer_key, tokenizer_path
        self.trust_remote_code = trust_remote_code
        self.first_rows: Optional[int] = None
        self.first_lm: Optional[tuple[str, int]] = None  # (key, embedding rows) of the first causal LM checked
        self._differences: dict[str, Optional[str]] = {}

    def causal_lm(self, model: nn.Module, key: str, path: str) -> None:
        """A policy, reference or SFT model: a trained LM head, no random weights, the run's vocabulary."""
        archs = getattr(model.config, "architectures", None) or []
        missing = list(getattr(model, "fourfold_missing_keys", []))
        if any(a.endswith("ForSequenceClassification") for a in archs) or any(k.startswith("lm_head.") for k in missing):
            raise ModelLoadError(f"{key}: {path} is not a causal language model (architectures {archs}, "
                                 f"no trained lm_head): a reward model or classifier directory? Give the causal LM")
        self._no_random_weights(missing, key, path)
        self._vocabulary(model, key, path)
        rows = model.get_input_embeddings().num_embeddings
        if self.first_lm is None:
            self.first_lm = (key, rows)
        elif rows != self.first_lm[1]:
            raise ModelLoadError(f"{key}: {path} has {rows} token embeddings, {self.first_lm[0]} {self.first_lm[1]}: "
                                 "their log-probs would be over different vocabularies; give a model of the same vocabulary")

    def scorer(self, model: nn.Module, key: str, path: str, *, head_required: bool = True) -> None:
        """A reward model or critic (``AutoModelForSequenceClassification``): a trained score head
        unless ``head_required`` is False (the reward trainer starts a fresh head on a causal LM),
        no other random weight, the run's vocabulary."""
        missing = list(getattr(model, "fourfold_missing_keys", []))
        head = [k for k in missing if k.split(".")[0] in _HEADS]
        if head and head_required:
            raise ModelLoadError(
                f"{key}: {path} has no trained score head ({head[0]} would be random): a causal-LM directory? "
                "Give a reward model trained with `fourfold reward` (its model/ directory)"
                + ("; or leave model.critic unset to start the critic from model.critic_init" if key == "model.critic" else "")
            )
        self._no_random_weights([k for k in missing if k not in head], key, path)
        self._vocabulary(model, key, path)

    def same_tokenizer(self, key: str, path: str) -> None:
        """A LoRA adapter directory (it holds no embedding): the tokenizer saved beside it, when there
        is one, must be the run's."""
        if has_tokenizer_files(path):
            difference = self._tokenizer_difference(path)
            if difference is not None:
                raise ModelLoadError(f"{key}: {path}: its tokenizer differs from {self.tokenizer_key} "
                                     f"({self.tokenizer_path}): {difference}")

    def differs(self, path: str) -> Optional[str]:
        """How the tokenizer saved in directory ``path`` differs from the run's (None: the same, or
        no tokenizer files there)."""
        if path == self.tokenizer_path or not has_tokenizer_files(path):
            return None
        return self._tokenizer_difference(path)

    @staticmethod
    def _no_random_weights(missing: list[str], key: str, path: str) -> None:
        if missing:
            raise ModelLoadError(f"{key}: {path} holds no weights for {len(missing)} parameters "
                                 f"({', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''}): they would be random")

    def _vocabulary(self, model: nn.Module, key: str, path: str) -> None:
        tok = self.tokenizer
        rows = model.get_input_embeddings().num_embeddings
        needed = len(tok) - int(getattr(tok, "fourfold_added_pad", False))
        if rows < needed:
            raise ModelLoadError(f"{key}: {path}: the embedding has {rows} rows but the tokenizer "
                                 f"({self.tokenizer_key}: {self.tokenizer_path}) has {needed} tokens: another vocabulary")
        if self.first_rows is None:
            self.first_rows = rows
        if path == self.tokenizer_path:
            return
        if has_tokenizer_files(path):
            self.same_tokenizer(key, path)
        elif rows != self.first_rows:
            raise ModelLoadError(f"{key}: {path}: the embedding has {rows} rows, the first model's {self.first_rows} "
                                 "(another vocabulary?); save the tokenizer with the model to compare them")

    def _tokenizer_difference(self, path: str) -> Optional[str]:
        if path not in self._differences:
            from transformers import AutoTokenizer

            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    other = AutoTokenizer.from_pretrained(path, trust_remote_code=self.trust_remote_code)
            except Exception as e:  # transformers raises many types here; one line
                raise ModelLoadError(f"{path}: its tokenizer files cannot be loaded ({type(e).__name__}: "
                                     f"{str(e).splitlines()[0] if str(e) else ''})") from None
            self._differences[path] = tokenizer_difference(self.tokenizer, other)
        return self._differences[path]


def checker(tokenizer, model_cfg) -> RoleChecker:
    """The :class:`RoleChecker` of a one-model stage (SFT, reward model): ``model_cfg`` has ``path``,
    ``tokenizer`` (null: the tokenizer is the one in ``path``) and ``trust_remote_code``."""
    key = "model.tokenizer" if model_cfg.tokenizer else "model.path"
    return RoleChecker(tokenizer, key, model_cfg.tokenizer or model_cfg.path, trust_remote_code=model_cfg.trust_remote_code)
