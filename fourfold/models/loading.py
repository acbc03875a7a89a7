"""Loading and saving the four roles' models over `transformers`, with clear errors.

* ``trust_remote_code`` stays off unless the caller turns it on; a directory whose config needs
  remote code is refused with a message saying how to allow it.
* Weights are read with safetensors (``use_safetensors`` where the files exist) and written with
  ``save_pretrained(safe_serialization=True)``; nothing here unpickles user files: a local directory
  with only pickle weights (``pytorch_model.bin``) is refused with the one-line conversion, and a
  corrupt or truncated ``.safetensors`` file is refused by name before transformers reads it.
* The loaded model's ``fourfold_missing_keys`` lists the weights the directory did not hold (they
  were initialised at random): :mod:`fourfold.models.checks` refuses a role whose weights would be
  random (a causal-LM directory given as a reward model, a classifier given as the policy).
* A tokenizer without any regular token (a directory without tokenizer files, from which
  transformers builds an empty tokenizer) is refused.
* Every tokenizer gets a dedicated pad token (added, with a warning, when it has none): EOS is never
  reused as pad, so loss masks never confuse the two.
"""

from __future__ import annotations

import json
import logging
import os
import warnings
from pathlib import Path
from typing import Any

import torch

from fourfold.errors import ModelLoadError

log = logging.getLogger(__name__)

PAD_TOKEN = "<pad>"


def resolve_device(spec: str | torch.device = "auto") -> torch.device:
    """'auto' -> cuda when available else cpu; otherwise torch.device(spec)."""
    if isinstance(spec, torch.device):
        return spec
    if spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if spec.startswith("cuda") and not torch.cuda.is_available():
        raise ModelLoadError(f"run.device={spec!r} but CUDA is not available on this machine")
    return torch.device(spec)


def resolve_dtype(name: str | torch.dtype | None) -> torch.dtype:
    if isinstance(name, torch.dtype):
        return name
    table = {None: torch.float32, "float32": torch.float32, "fp32": torch.float32,
             "bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}
    if name not in table:
        raise ModelLoadError(f"dtype {name!r}: expected one of float32, bfloat16, float16")
    return table[name]


def check_source(path: str, trust_remote_code: bool, what: str) -> None:
    """Refuse a missing local path, a config that needs remote code when it is not allowed, and a
    model directory with pickle-only or corrupt safetensors weights."""
    p = Path(path)
    looks_local = p.is_absolute() or path.startswith(".") or os.sep in path and not _looks_like_hub(path)
    if p.exists():
        if p.is_dir():
            cfg = p / "config.json"
            if what != "tokenizer" and not cfg.is_file():
                raise ModelLoadError(f"{path}: no config.json here; expected a Hugging Face model directory for the {what}")
            if cfg.is_file():
                try:
                    data = json.loads(cfg.read_text(encoding="utf-8"))
                except (json.JSONDecodeError, UnicodeDecodeError) as e:
                    raise ModelLoadError(f"{cfg}: not valid JSON ({e})") from None
                if data.get("auto_map") and not trust_remote_code:
                    raise ModelLoadError(
                        f"{path}: this model needs custom code from its repository (config.json has auto_map); "
                        f"refusing to run it. Set model.trust_remote_code=true if you trust it"
                    )
            if what != "tokenizer":
                _check_weight_files(p, what)
        return
    if looks_local:
        raise ModelLoadError(f"{path}: no such directory for the {what}")


def _check_weight_files(directory: Path, what: str) -> None:
    """Refuse pickle-only weights and corrupt or truncated safetensors files (one line, by name)."""
    files = sorted(f for f in directory.iterdir() if f.is_file())
    safetensors_files = [f for f in files if f.suffix == ".safetensors"]
    pickles = [f.name for f in files if f.name.startswith("pytorch_model") and f.suffix == ".bin"]
    if pickles and not safetensors_files:
        auto = "AutoModelForCausalLM" if what == "causal LM" else "AutoModelForSequenceClassification"
        raise ModelLoadError(
            f"{directory}: only pickle weights ({pickles[0]}); fourfold loads safetensors only. Convert once with "
            f"transformers: {auto}.from_pretrained(DIR, use_safetensors=False).save_pretrained(DIR) writes model.safetensors"
        )
    for f in safetensors_files:
        problem = safetensors_problem(f)
        if problem is not None:
            raise ModelLoadError(f"{f}: corrupt or truncated safetensors file ({problem}); save or download it again")


def safetensors_problem(path: Path) -> str | None:
    """What is wrong with a ``.safetensors`` file's framing, or None: the 8-byte header length, the
    JSON header and the data it describes must cover the file exactly (a truncated download or a
    cut-off write fails here). The tensor bytes themselves are not read."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            return f"{size} bytes: shorter than the header length field"
        n = int.from_bytes(head, "little")
        if n > size - 8:
            return f"the header claims {n} bytes but the file has {size}"
        try:
            header = json.loads(f.read(n))
            ends = [int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"]
        except (UnicodeDecodeError, ValueError, TypeError, KeyError, IndexError, AttributeError):
            return "the header is not a safetensors tensor table"
    expected = 8 + n + max(ends, default=0)
    if expected != size:
        return f"{size} bytes where the header describes {expected}"
    return None


def _looks_like_hub(path: str) -> bool:
    parts = path.split("/")
    return len(parts) == 2 and all(parts) and not path.startswith((".", "/"))


def _offline_hint(path: str, err: Exception) -> ModelLoadError:
    if os.environ.get("HF_HUB_OFFLINE") == "1" and not Path(path).exists():
        return ModelLoadError(f"{path}: not a local directory and HF_HUB_OFFLINE=1 forbids downloading it")
    return ModelLoadError(f"{path}: could not be loaded ({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''})")


def load_tokenizer(path: str, *, trust_remote_code: bool = False, padding_side: str = "left"):
    """A fast tokenizer with a dedicated pad token (added when missing, with a warning).

    Returns the tokenizer; ``tokenizer.fourfold_added_pad`` tells whether a token was added (the
    models' embeddings must then be resized with :func:`ensure_pad_embedding`).
    """
    from transformers import AutoTokenizer

    check_source(path, trust_remote_code, "tokenizer")
    try:
        tok = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    except Exception as e:  # transformers raises many types here; surface one line
        raise _offline_hint(path, e) from None
    special = set(tok.all_special_ids)
    if all(i in special for i in tok.get_vocab().values()):
        # A directory without tokenizer files makes transformers build an empty tokenizer (every
        # text -> [] or unk). Encoding a test text cannot tell: a small word-level vocabulary maps
        # any foreign text to unk too; a tokenizer without one regular token is always broken.
        raise ModelLoadError(f"{path}: the tokenizer has no tokens besides its special ones (no tokenizer files "
                             "in this directory?); set model.tokenizer to a directory with tokenizer.json")
    added = False
    if tok.pad_token_id is None or (tok.eos_token_id is not None and tok.pad_token_id == tok.eos_token_id):
        warnings.warn(f"{path}: tokenizer has no dedicated pad token; adding {PAD_TOKEN!r} (embeddings are resized)",
                      stacklevel=2)
        tok.add_special_tokens({"pad_token": PAD_TOKEN})
        added = True
    if tok.eos_token_id is None:
        raise ModelLoadError(f"{path}: tokenizer has no EOS token; responses could never end")
    tok.padding_side = padding_side
    tok.fourfold_added_pad = added
    return tok


def ensure_pad_embedding(model, tokenizer) -> None:
    """Resize the embeddings when the tokenizer grew (pad added) and record pad_token_id in the config."""
    n = len(tokenizer)
    emb = model.get_input_embeddings()
    if emb is not None and emb.num_embeddings < n:
        model.resize_token_embeddings(n)
    model.config.pad_token_id = tokenizer.pad_token_id
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id


def disable_dropout(model: torch.nn.Module) -> None:
    """Dropout off in every role: PPO's ratio and the KL must compare deterministic forwards."""
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
    for key in ("attention_dropout", "hidden_dropout", "dropout", "resid_pdrop", "embd_pdrop", "attn_pdrop"):
        if hasattr(model.config, key) and isinstance(getattr(model.config, key), float):
            setattr(model.config, key, 0.0)


def load_causal_lm(path: str, *, dtype: Any = None, device: Any = "cpu", trust_remote_code: bool = False):
    """``AutoModelForCausalLM`` from a directory (or a hub name when online), dropout disabled."""
    from transformers import AutoModelForCausalLM

    check_source(path, trust_remote_code, "causal LM")
    try:
        model, info = AutoModelForCausalLM.from_pretrained(
            path, dtype=resolve_dtype(dtype), trust_remote_code=trust_remote_code, output_loading_info=True
        )
    except ValueError as e:
        if "Unrecognized configuration class" in str(e) or "does not support" in str(e):
            raise ModelLoadError(f"{path}: not a causal language model ({str(e).splitlines()[0][:200]})") from None
        raise _offline_hint(path, e) from None
    except (OSError, EnvironmentError) as e:
        raise _offline_hint(path, e) from None
    model.fourfold_missing_keys = sorted(info["missing_keys"])  # initialised at random: see models.checks
    disable_dropout(model)
    return model.to(resolve_device(device))


def load_sequence_scorer(path: str, *, dtype: Any = None, device: Any = "cpu", trust_remote_code: bool = False):
    """``AutoModelForSequenceClassification`` with one label (reward model or critic directory).

    A plain causal-LM directory also loads: its backbone is kept and a fresh head is created
    (the caller decides how to initialise it: see ``ScalarModel.reset_head``).
    """
    from transformers import AutoModelForSequenceClassification

    check_source(path, trust_remote_code, "reward/value model")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model, info = AutoModelForSequenceClassification.from_pretrained(
                path, num_labels=1, dtype=resolve_dtype(dtype), trust_remote_code=trust_remote_code,
                output_loading_info=True,
            )
    except ValueError as e:
        raise ModelLoadError(f"{path}: cannot be used as a reward/value model ({str(e).splitlines()[0][:200]})") from None
    except (OSError, EnvironmentError) as e:
        raise _offline_hint(path, e) from None
    model.fourfold_missing_keys = sorted(info["missing_keys"])  # initialised at random: see models.checks
    disable_dropout(model)
    return model.to(resolve_device(device))
