"""LoRA in the trainers: ``model.lora`` to :class:`~fourfold.models.lora.LoraSettings`, and the final
export of a trained model, LoRA or not.

A LoRA run writes two directories for each trained model (atomically, through ``run.write``): the
**merged** model under the usual name (``model/`` for sft and reward, ``policy/`` and ``critic/``
for ppo and reinforce), loadable with plain ``from_pretrained`` and what the next stage loads, and
the **adapter** beside it with ``-adapter`` appended (``model-adapter/``, ``policy-adapter/``,
``critic-adapter/``), loadable with ``PeftModel.from_pretrained`` over the base. The tokenizer is
saved in both. A full-fine-tuning run writes the one HF directory it always wrote.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional

from fourfold.config import LoraConfig
from fourfold.models.lora import AdapterLM, AdapterScalarModel, LoraScalarModel, LoraSettings, SharedBase
from fourfold.models.roles import ScalarModel
from fourfold.trainers.common import save_hf
from fourfold.trainers.fsdp import export_state_dict

ADAPTER_SUFFIX = "-adapter"


def lora_settings(cfg: Optional[LoraConfig]) -> Optional[LoraSettings]:
    """The models-level settings of a ``model.lora`` section (None: full fine-tuning)."""
    if cfg is None:
        return None
    targets = cfg.target_modules if isinstance(cfg.target_modules, str) else list(cfg.target_modules)
    return LoraSettings(r=cfg.r, alpha=float(cfg.alpha), dropout=float(cfg.dropout), target_modules=targets)


def adapted_lm(lm, cfg: Optional[LoraConfig]):
    """The causal LM a stage trains: ``lm`` itself, or with ``model.lora`` an
    :class:`~fourfold.models.lora.AdapterLM` (a fresh adapter over ``lm``, which stays frozen)."""
    settings = lora_settings(cfg)
    return lm if settings is None else AdapterLM(SharedBase(lm, settings))


def adapter_path(path: str | Path) -> Path:
    """Where the adapter of the model exported to ``path`` goes: ``path`` + ``-adapter``."""
    path = Path(path)
    return path.with_name(path.name + ADAPTER_SUFFIX)


def _writers(model) -> tuple[Callable[[Path], None], Optional[Callable[[Path], None]]]:
    """(write the merged or full model into a directory, write the adapter or None)."""
    if isinstance(model, AdapterLM):
        return model.save_merged, model.save_adapter
    if isinstance(model, LoraScalarModel):
        return model.save_merged, model.save_pretrained
    if isinstance(model, AdapterScalarModel):
        from fourfold.models.lora_export import save_scalar_adapter, save_scalar_merged

        return (lambda d: save_scalar_merged(model, d)), (lambda d: save_scalar_adapter(model, d))
    return None, None


def save_trained(run, model, tokenizer, path: str | Path) -> dict[str, str]:
    """Export a trained model at the end of a run: a full model (causal LM or :class:`ScalarModel`)
    as one HF directory at ``path`` (:func:`~fourfold.trainers.common.save_hf`; a model sharded
    under torchrun is gathered first, by every rank, and written by rank 0); a LoRA role as the
    merged directory at ``path`` and its adapter at :func:`adapter_path` (module docstring).
    Returns ``{"model": path}`` plus ``"adapter"`` for a LoRA role."""
    merged, adapter = _writers(model)
    if merged is None:
        hf = model.hf if isinstance(model, ScalarModel) else model
        gathered = export_state_dict(model)  # sharded under torchrun: every rank gathers, rank 0 writes
        run.write(save_hf, hf, tokenizer, path, **({} if gathered is None else {"state_dict": gathered}))
        return {"model": str(path)}
    from fourfold.checkpoint import save_pretrained_atomic

    written = {}
    for key, writer, where in (("model", merged, Path(path)), ("adapter", adapter, adapter_path(path))):
        def save(tmp: Path, writer=writer) -> None:
            writer(tmp)
            tokenizer.save_pretrained(tmp)

        run.write(save_pretrained_atomic, save, where)
        written[key] = str(where)
    return written
