"""The final export of a trained model, LoRA or not, as directories plain ``transformers`` loads.

A full model is one HF directory (safetensors, the tokenizer beside it; a model sharded under
torchrun is gathered first). A LoRA role is two: the **merged** model under the usual name
(``model/`` for sft, reward and dpo, ``policy/`` and ``critic/`` for ppo and reinforce), loadable
with plain ``from_pretrained`` and what the next stage loads, and the **adapter** beside it with
``-adapter`` appended (``model-adapter/``, ``policy-adapter/``, ``critic-adapter/``), loadable with
``PeftModel.from_pretrained`` over the base (:mod:`fourfold.models.lora.files`); a LoRA role over a
base sharded under torchrun is written from the base's tensors gathered whole. Every directory is
written atomically (a temporary sibling swapped into place) by rank 0.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

from fourfold.models.lora import is_lora_role, save_adapter, save_merged
from fourfold.models.roles import ScalarModel
from fourfold.run.fsdp import export_state_dict

ADAPTER_SUFFIX = "-adapter"


def save_hf(model, tokenizer, out_dir: str | Path, state_dict: Optional[dict] = None) -> Path:
    """Write a HF directory (safetensors) atomically: temp sibling dir, swapped into place.

    Next to a generative model (policy, SFT model) the tokenizer is saved with
    ``padding_side: left``, so that batched ``generate`` works in plain transformers; next to a
    classifier (reward model, critic) it keeps the library default (right padding, which
    ``AutoModelForSequenceClassification`` handles: it scores the last non-pad token). fourfold's
    own loading sets the side itself and pads with its own helpers, so it reads either the same.
    ``state_dict``: the weights to write instead of the model's own (the gathered whole of a
    sharded model, :func:`fourfold.run.fsdp.export_state_dict`)."""
    from fourfold.checkpoint import save_pretrained_atomic

    def _save(tmp: Path) -> None:
        if state_dict is None:
            model.save_pretrained(tmp, safe_serialization=True)
        else:
            model.save_pretrained(tmp, safe_serialization=True, state_dict=state_dict)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
            if getattr(model, "can_generate", lambda: False)():
                _set_padding_side(Path(tmp) / "tokenizer_config.json", "left")

    return save_pretrained_atomic(_save, out_dir)


def _set_padding_side(tokenizer_config: Path, side: str) -> None:
    """Record ``padding_side`` in a saved ``tokenizer_config.json`` (transformers writes it only
    when it was an explicit init argument)."""
    cfg = json.loads(tokenizer_config.read_text(encoding="utf-8"))
    cfg["padding_side"] = side
    tokenizer_config.write_text(json.dumps(cfg, indent=2, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")


def adapter_path(path: str | Path) -> Path:
    """Where the adapter of the model exported to ``path`` goes: ``path`` + ``-adapter``."""
    path = Path(path)
    return path.with_name(path.name + ADAPTER_SUFFIX)


def save_trained(run, model, tokenizer, path: str | Path) -> dict[str, str]:
    """Export a trained model at the end of a run (module docstring) through ``run.write`` (rank 0,
    a failed write one OutputError line). Returns ``{"model": path}`` plus ``"adapter"`` for a
    LoRA role."""
    if not is_lora_role(model):
        hf = model.hf if isinstance(model, ScalarModel) else model
        gathered = export_state_dict(model)  # sharded under torchrun: every rank gathers, rank 0 writes
        run.write(save_hf, hf, tokenizer, path, **({} if gathered is None else {"state_dict": gathered}))
        return {"model": str(path)}
    from fourfold.checkpoint import save_pretrained_atomic

    gathered = export_state_dict(model)  # a sharded base: every rank gathers, rank 0 writes from the whole tensors
    written = {}
    for key, writer, where in (("model", save_merged, Path(path)), ("adapter", save_adapter, adapter_path(path))):
        def save(tmp: Path, writer=writer) -> None:
            writer(model, tmp, gathered)
            tokenizer.save_pretrained(tmp)

        run.write(save_pretrained_atomic, save, where)
        written[key] = str(where)
    return written
