"""Scores per second of a reward scored here against the same reward served by ``fourfold
serve-reward`` (fourfold.apps.reward_server) over HTTP on 127.0.0.1: a tiny reward model (a Llama of
hidden 64, 2 layers, over a 64-word vocabulary) and a reward function (``fourfold.rewards:
answer_match`` with an ``answer`` column), the same batch, the same process and machine, one
sitting; prints one JSON line.

Local is the scorer called directly (``model_scorer(dir)`` / ``function_scorer(spec)``: the same
tokenisation and forward the server runs); served is ``RemoteReward.score_texts`` against a server
started in this process (its batching thread and HTTP handler threads), so the difference is the
HTTP round trip, JSON and the batcher's window (``--max-wait-ms``). Each figure is the median of
``--repeats`` timed calls after one warm-up call.

    python benchmarks/reward_server.py --threads 1
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from functools import partial
from pathlib import Path


def median_rate(call, rows: int, repeats: int) -> float:
    call()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    return rows / statistics.median(times)


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=64, help="rows of the batch (one request)")
    p.add_argument("--words", type=int, default=24, help="words of each prompt and each response")
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--max-wait-ms", type=float, default=10.0, help="the server's batching window")
    p.add_argument("--threads", type=int, default=1)
    a = p.parse_args(argv)

    import torch

    from fourfold.apps.provenance import machine
    from fourfold.apps.reward_server import function_scorer, model_scorer, start_server
    from fourfold.models.factory import llama_config, random_scalar_model
    from fourfold.models.remote import RemoteReward
    from fourfold.run.common import quiet_transformers
    from fourfold.tasks.tokenizer import build_word_tokenizer

    quiet_transformers()
    torch.set_num_threads(a.threads)
    rng = random.Random(0)
    words = [f"w{i}" for i in range(60)]
    prompts = [" ".join(rng.choice(words) for _ in range(a.words)) for _ in range(a.rows)]
    responses = [" ".join(rng.choice(words) for _ in range(a.words)) + f" answer: {i}" for i in range(a.rows)]
    finished = [True] * a.rows
    columns = {"answer": [str(i if i % 2 else i + 1) for i in range(a.rows)]}
    out = {"rows": a.rows, "words": a.words, "repeats": a.repeats, "max_wait_ms": a.max_wait_ms, "threads": a.threads,
           "machine": machine(), "python": sys.version.split()[0], "torch": torch.__version__}
    with tempfile.TemporaryDirectory() as tmp:
        tok = build_word_tokenizer(words + ["answer:"] + [str(i) for i in range(a.rows + 1)], Path(tmp) / "rm")
        cfg = llama_config(len(tok), hidden=a.hidden, layers=a.layers, heads=4, max_positions=4 * a.words + 16,
                           pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
        random_scalar_model(cfg, seed=0).save_pretrained(Path(tmp) / "rm")
        for name, scorer, cols in (("model", model_scorer(str(Path(tmp) / "rm")), {}),
                                   ("function", function_scorer("fourfold.rewards:answer_match"), columns)):
            server = start_server(scorer, port=0, window_s=a.max_wait_ms / 1000.0)
            try:
                client = RemoteReward(f"http://127.0.0.1:{server.server_address[1]}", retries=0)
                local = scorer(prompts, responses, finished, cols)
                served = client.score_texts(prompts, responses, finished, cols)
                if max(abs(x - y) for x, y in zip(local, served)) > 1e-5:
                    raise SystemExit(f"{name}: the served scores differ from the local ones")
                lo = median_rate(partial(scorer, prompts, responses, finished, cols), a.rows, a.repeats)
                se = median_rate(partial(client.score_texts, prompts, responses, finished, cols), a.rows, a.repeats)
            finally:
                server.shutdown()
                server.server_close()
            out[name] = {"local_scores_per_s": round(lo, 1), "served_scores_per_s": round(se, 1),
                         "served_over_local": round(se / lo, 3)}
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
