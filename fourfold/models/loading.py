"""Loading and saving the four roles' models over `transformers`, with clear errors.

* ``trust_remote_code`` stays off unless the caller turns it on; a directory whose config needs
  remote code is refused with a message saying how to allow it.
* Weights are read with safetensors (``use_safetensors`` where the files exist) and written with
  ``save_pretrained(safe_serialization=True)``; nothing here unpickles user files.
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


def _check_source(path: str, trust_remote_code: bool, what: str) -> None:
    """Refuse a missing local path, and a config that needs remote code when it is not allowed."""
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
        return
    if looks_local:
        raise ModelLoadError(f"{path}: no such directory for the {what}")


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

    _check_source(path, trust_remote_code, "tokenizer")
    try:
        tok = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    except Exception as e:  # transformers raises many types here; surface one line
        raise _offline_hint(path, e) from None
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

    _check_source(path, trust_remote_code, "causal LM")
    try:
        model = AutoModelForCausalLM.from_pretrained(
            path, dtype=resolve_dtype(dtype), trust_remote_code=trust_remote_code
        )
    except ValueError as e:
        if "Unrecognized configuration class" in str(e) or "does not support" in str(e):
            raise ModelLoadError(f"{path}: not a causal language model ({str(e).splitlines()[0][:200]})") from None
        raise _offline_hint(path, e) from None
    except (OSError, EnvironmentError) as e:
        raise _offline_hint(path, e) from None
    disable_dropout(model)
    return model.to(resolve_device(device))


def load_sequence_scorer(path: str, *, dtype: Any = None, device: Any = "cpu", trust_remote_code: bool = False):
    """``AutoModelForSequenceClassification`` with one label (reward model or critic directory).

    A plain causal-LM directory also loads: its backbone is kept and a fresh head is created
    (the caller decides how to initialise it: see ``ScalarModel.reset_head``).
    """
    from transformers import AutoModelForSequenceClassification

    _check_source(path, trust_remote_code, "reward/value model")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = AutoModelForSequenceClassification.from_pretrained(
                path, num_labels=1, dtype=resolve_dtype(dtype), trust_remote_code=trust_remote_code
            )
    except ValueError as e:
        raise ModelLoadError(f"{path}: cannot be used as a reward/value model ({str(e).splitlines()[0][:200]})") from None
    except (OSError, EnvironmentError) as e:
        raise _offline_hint(path, e) from None
    disable_dropout(model)
    return model.to(resolve_device(device))
