"""Fixtures of the distributed tests: the toy data (a tokenizer, SFT examples, preference pairs)."""
import json
import random
from pathlib import Path

import pytest

WORDS = [f"w{i}" for i in range(30)]


def _write_jsonl(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


@pytest.fixture(scope="session")
def dist_data(tmp_path_factory):
    """A word tokenizer, 33 SFT examples (an epoch of batch 8 ends with one row: a rank gets none),
    8 held-out ones and 40 preference pairs."""
    from fourfold.tasks.tokenizer import build_word_tokenizer

    d = tmp_path_factory.mktemp("dist_data")
    build_word_tokenizer(WORDS + ["ask"], d / "tok")
    rng = random.Random(0)

    def text(lo, hi, words=WORDS):
        return " ".join(rng.choice(words) for _ in range(rng.randrange(lo, hi)))

    sft = [{"prompt": text(1, 4) + " ask", "completion": text(1, 6)} for _ in range(41)]
    pairs = [{"prompt": text(1, 4), "chosen": text(1, 5, WORDS[:10]), "rejected": text(1, 5, WORDS[10:])}
             for _ in range(40)]
    return {"tok": str(d / "tok"), "sft": _write_jsonl(d / "sft.jsonl", sft[:33]),
            "sft_eval": _write_jsonl(d / "sft_eval.jsonl", sft[33:]), "pairs": _write_jsonl(d / "pairs.jsonl", pairs)}

