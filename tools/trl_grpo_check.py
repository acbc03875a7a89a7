"""One update of TRL 1.12.0's own GRPOTrainer code against fourfold's losses, on the fixed batch and
for every case of tests/core/test_practice_losses.py (issue 32). Not part of the suite: TRL is not
a dependency of fourfold, so this needs TRL on PYTHONPATH, installed apart from the venv:

    pip download --no-deps trl==1.12.0 -d /tmp/trl        # the wheel from PyPI
    .venv/bin/pip install --no-deps --target /tmp/trl/site /tmp/trl/trl-1.12.0-py3-none-any.whl
    .venv/bin/pip install --no-deps --target /tmp/trl/site --only-binary=:all: --platform any \\
        --implementation py --abi none requests urllib3 certifi charset-normalizer
    PYTHONPATH=$PWD:/tmp/trl/site .venv/bin/python tools/trl_grpo_check.py

(trl's import needs requests, which the venv lacks; transformers, accelerate, datasets come from it.)

What runs is TRL's code, not a transcription: the unbound ``GRPOTrainer._compute_loss`` is called
with a ``types.SimpleNamespace`` standing in for the trainer (the attributes the method reads: one
process, no gradient accumulation, beta 0, no entropy terms, train mode), whose
``_get_per_token_logps_and_entropies`` returns the batch's new log-probs (requires_grad). The
inputs it reads come from ``_generate_and_score_completions``' own source lines, taken with
``inspect.getsource`` and executed on the batch: the ``mask_truncated_completions`` block (from
each completion's last token id, eos or not) with ``num_items_in_batch``, and the vLLM
importance-sampling block (``vllm_importance_sampling_mode``, cap ``vllm_importance_sampling_clip_max``).

Prints one JSON line: the TRL version, the number of cases, and the max abs difference of the loss
and of its gradient in the new log-probs, TRL's real code against fourfold's losses (after the
test's two documented rescalings, grpo and dr_grpo) and against the test's transcription; exit 1
when a loss differs by more than 1e-6 or a gradient by more than 1e-6.
"""
from __future__ import annotations

import importlib.util
import inspect
import json
import math
import sys
import textwrap
import types
from collections import defaultdict
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
EOS, PAD, TOKEN = 2, 0, 5
TOL = 1e-6


def _load_test_module():
    path = ROOT / "tests" / "core" / "test_practice_losses.py"
    spec = importlib.util.spec_from_file_location("test_practice_losses", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _block(source: str, start: str, stop: str, through: bool = False) -> str:
    """The lines of ``source`` from the one containing ``start`` to the one before (or, with
    ``through``, including) the first line after it containing ``stop``, dedented."""
    lines = source.splitlines()
    i = next(k for k, line in enumerate(lines) if start in line)
    j = next(k for k in range(i + 1, len(lines)) if stop in lines[k])
    return textwrap.dedent("\n".join(lines[i:j + 1 if through else j]))


def _trainer_stub(trainer_cls, loss_type, level, delta, is_mode, cap, eps_low, eps_high, logps, max_len):
    def per_token_logps_and_entropies(model, input_ids, attention_mask, logits_to_keep, **kwargs):
        assert logits_to_keep == logps.shape[1]
        return logps, torch.zeros_like(logps.detach()), None

    accelerator = types.SimpleNamespace(num_processes=1, sync_gradients=True, gather=lambda x: x,
                                        gather_for_metrics=lambda x: x, reduce=lambda x, reduction="sum": x)
    args = types.SimpleNamespace(delta=delta, steps_per_generation=1, use_bias_correction_kl=True)
    return types.SimpleNamespace(
        _get_per_token_logps_and_entropies=per_token_logps_and_entropies,
        get_off_policy_mask=trainer_cls.get_off_policy_mask, get_gamma_weights=trainer_cls.get_gamma_weights,
        aux_loss_enabled=False, top_entropy_quantile=1.0, off_policy_mask_threshold=None, beta=0.0,
        importance_sampling_level=level, loss_type=loss_type, epsilon_low=eps_low, epsilon_high=eps_high, args=args,
        use_vllm=True, vllm_importance_sampling_correction=is_mode is not None,
        vllm_importance_sampling_mode=is_mode, vllm_importance_sampling_clip_max=cap,
        vllm_importance_sampling_clip_min=None, mask_truncated_completions=True,
        _tokenizer=types.SimpleNamespace(eos_token_id=EOS, pad_token_id=PAD),
        model=types.SimpleNamespace(training=True), current_gradient_accumulation_steps=1,
        max_completion_length=max_len, accelerator=accelerator, _entropy_bonus_enabled=False,
        _metrics={"train": defaultdict(list), "eval": defaultdict(list)},
    )


def trl_update(trainer_cls, t, loss_type, agg, level, delta, with_is):
    """TRL's loss on the test's fixed batch and d loss / d new, from TRL's own code."""
    new, old, engine, adv, mask, truncated = t.fixed_batch()
    B, T = mask.shape
    lengths = mask.sum(-1).tolist()
    completion_ids_list = [[TOKEN] * (n - 1) + [TOKEN if cut else EOS] for n, cut in zip(lengths, truncated.tolist())]
    completion_ids = torch.tensor([ids + [PAD] * (T - len(ids)) for ids in completion_ids_list])
    is_mode = t.IS_MODES[with_is]
    logps = new.clone().requires_grad_(True)
    eps_high = 1 + t.EPS_HIGH if loss_type == "cispo" else t.EPS_HIGH
    stub = _trainer_stub(trainer_cls, loss_type, level, delta, is_mode, t.CAP, t.EPS_LOW, eps_high, logps, T)

    generate = inspect.getsource(trainer_cls._generate_and_score_completions)
    scope = {"self": stub, "torch": torch, "math": math, "device": "cpu", "tool_mask": None,
             "completion_mask": mask.clone(), "completion_ids_list": completion_ids_list}
    exec(_block(generate, "If mask_truncated_completions is enabled", "num_items_in_batch = ", through=True), scope)
    if is_mode is not None:
        scope.update(old_per_token_logps=old, sampling_per_token_logps=engine)
        exec(_block(generate, "Compute the importance sampling ratio when using vLLM",
                    "Compute the per-token log probabilities for the reference model"), scope)
    inputs = {"prompt_ids": torch.full((B, 1), TOKEN), "prompt_mask": torch.ones(B, 1, dtype=torch.int),
              "completion_ids": completion_ids, "completion_mask": scope["completion_mask"], "advantages": adv,
              "old_per_token_logps": old, "num_items_in_batch": scope["num_items_in_batch"]}
    if is_mode is not None:
        inputs["importance_sampling_ratio"] = scope["vllm_importance_sampling_ratio"]
    loss = trainer_cls._compute_loss(stub, None, inputs)
    loss.backward()
    return loss.detach(), logps.grad


def main() -> int:
    import trl
    from trl.trainer.grpo_trainer import GRPOTrainer

    t = _load_test_module()
    diffs = {"loss_vs_fourfold": 0.0, "grad_vs_fourfold": 0.0, "loss_vs_transcription": 0.0,
             "grad_vs_transcription": 0.0}
    n = 0
    for case in t.CASES:
        for with_is in t.IS_MODES:
            real, real_grad = trl_update(GRPOTrainer, t, *case, with_is)
            for name, (loss, grad) in (("fourfold", t.fourfold_update(*case, with_is)),
                                       ("transcription", t.trl_formula_update(*case, with_is))):
                diffs[f"loss_vs_{name}"] = max(diffs[f"loss_vs_{name}"], abs(float(real) - float(loss)))
                diffs[f"grad_vs_{name}"] = max(diffs[f"grad_vs_{name}"], float((real_grad - grad).abs().max()))
            n += 1
    print(json.dumps({"trl": trl.__version__, "cases": n, "max_abs_diff": diffs}))
    return 0 if max(diffs.values()) <= TOL else 1


if __name__ == "__main__":
    sys.exit(main())
