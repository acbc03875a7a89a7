"""The error-case tests' models: tiny Llamas saved to a temporary directory (helpers to run the CLI
are in errortest_utils)."""
import json
import random
from pathlib import Path

import pytest
from errortest_utils import WORDS


def _save(model, tok, path: Path) -> str:
    model.save_pretrained(path)
    if tok is not None:
        tok.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="session")
def zoo(tmp_path_factory):
    """Tiny Llama models (hidden 16, one layer) and data files, each a path in a dict:
    ``lm``/``rm`` (causal LM / reward model over WORDS), ``lm_other``/``rm_other`` (the same sizes
    over another vocabulary), ``lm_small`` (an embedding smaller than its tokenizer),
    ``lm_notok`` (no tokenizer files), ``tok_other`` (only the other tokenizer), ``prompts``,
    ``sft`` and ``prefs`` (JSONL files)."""
    from fourfold.models.factory import llama_config, random_causal_lm, random_scalar_model
    from fourfold.tasks.tokenizer import build_word_tokenizer

    root = tmp_path_factory.mktemp("error_zoo")
    tok = build_word_tokenizer(WORDS)
    other = build_word_tokenizer([f"v{i}" for i in range(20)])

    def cfg(vocab, hidden=16):
        return llama_config(vocab, hidden=hidden, layers=1, heads=2, max_positions=128, pad_token_id=0,
                            bos_token_id=1, eos_token_id=2)

    z = {
        "lm": _save(random_causal_lm(cfg(len(tok)), seed=0), tok, root / "lm"),
        "rm": _save(random_scalar_model(cfg(len(tok)), seed=1), tok, root / "rm"),
        "lm_other": _save(random_causal_lm(cfg(len(other)), seed=2), other, root / "lm_other"),
        "rm_other": _save(random_scalar_model(cfg(len(other)), seed=3), other, root / "rm_other"),
        "lm_small": _save(random_causal_lm(cfg(len(tok) - 8), seed=4), tok, root / "lm_small"),
        "lm_notok": _save(random_causal_lm(cfg(len(tok)), seed=0), None, root / "lm_notok"),
        "lm_wide": _save(random_causal_lm(cfg(len(tok), hidden=32), seed=5), tok, root / "lm_wide"),
    }
    other.save_pretrained(root / "tok_other")
    z["tok_other"] = str(root / "tok_other")
    rng = random.Random(0)
    rows = [{"prompt": " ".join(rng.choice(WORDS) for _ in range(3))} for _ in range(8)]
    z["prompts"] = _jsonl(root / "prompts.jsonl", rows)
    z["sft"] = _jsonl(root / "sft.jsonl", [{"prompt": r["prompt"], "completion": "w1 w2"} for r in rows])
    z["prefs"] = _jsonl(root / "prefs.jsonl", [{"prompt": r["prompt"], "chosen": "w1", "rejected": "w2 w3"}
                                               for r in rows])
    return z


def _jsonl(path: Path, rows) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)
