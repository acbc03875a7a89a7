"""The engine of `generation.engine` reaches the samplers above the trainers: the held-out
evaluation (the demo's eval stage, the experiments' final evaluation) and the demo's preference
pairs sample through it, and the static engine gives the eager engine's tokens there (on the global
generator, as those stages draw). `fourfold generate`: tests/test_generate_score.py."""
import dataclasses
import json
import time

import pytest
import torch

from fourfold.apps.demo import pipeline as demo
from fourfold.apps.evaluation import evaluate_policy, sample_engine, sample_texts
from fourfold.config import DemoConfig, GenerationConfig
from fourfold.models.loading import ensure_pad_embedding, load_causal_lm, load_sequence_scorer, load_tokenizer
from fourfold.models.roles import FrozenReference, ScalarModel
from fourfold.rollout.eager import EagerEngine
from fourfold.rollout.static import StaticEngine
from fourfold.tasks import ReviewTask

STATIC = dict(engine="static", stop_check_every=3)


@pytest.fixture(scope="module")
def roles(tiny_lm):
    tok = load_tokenizer(str(tiny_lm / "sft"))
    policy = load_causal_lm(str(tiny_lm / "sft"))
    ensure_pad_embedding(policy, tok)
    rm = ScalarModel(load_sequence_scorer(str(tiny_lm / "rm")))
    ensure_pad_embedding(rm.hf, tok)
    return tok, policy.eval(), FrozenReference(policy), rm.eval()


def test_sample_engine_is_the_generation_sections_engine():
    assert isinstance(sample_engine(GenerationConfig()), EagerEngine)
    static = sample_engine(GenerationConfig(max_new_tokens=8, **STATIC))
    assert isinstance(static, StaticEngine) and (static.check_every, static.cache_len) == (3, 16 + 8)


def test_sample_texts_draws_what_it_drew_before_the_engines_reached_it(roles):
    """The default engine is the eager sampler on the global generator, batch after batch."""
    from fourfold.data import left_pad, tokenize_prompts
    from fourfold.rollout.eager import sample
    from fourfold.rollout.sampling import decode_responses

    tok, policy, _, _ = roles
    prompts = [f"w{i} w{i + 1}" for i in range(10)]
    torch.manual_seed(3)
    texts, _ = sample_texts(policy, tok, prompts, max_new_tokens=8, temperature=1.0, batch_size=4)
    torch.manual_seed(3)
    ids, want = tokenize_prompts(prompts, tok, 16), []
    for i in range(0, 10, 4):
        pid, pmask = left_pad(ids[i : i + 4], tok.pad_token_id)
        want += decode_responses(tok, sample(policy, pid, pmask, max_new_tokens=8, temperature=1.0,
                                             eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id))
    assert texts == want and len(set(texts)) > 5


def test_held_out_evaluation_with_the_static_engine_gives_the_eager_numbers(roles):
    tok, policy, reference, rm = roles
    task = ReviewTask()
    prompts = task.sample_prompts(24, __import__("random").Random(0))
    results = {}
    for name, gen in (("eager", GenerationConfig(max_new_tokens=10)),
                      ("static", GenerationConfig(max_new_tokens=10, **STATIC))):
        torch.manual_seed(11)
        results[name] = evaluate_policy(policy, reference, rm, tok, task, prompts, gen)
    (eager, eager_rows), (static, static_rows) = results["eager"], results["static"]
    assert [r["response"] for r in static_rows] == [r["response"] for r in eager_rows]
    for key in ("response", "proxy", "gold"):  # the same sequences: the same scores, exactly
        assert [r[key] for r in static_rows] == [r[key] for r in eager_rows], key
    # KL reads the sampled log-probs: the static engine's attention sums in another order
    torch.testing.assert_close(torch.tensor([r["kl"] for r in static_rows]),
                               torch.tensor([r["kl"] for r in eager_rows]), rtol=0, atol=1e-4)
    assert {k: v for k, v in static.items() if k != "kl"} == {k: v for k, v in eager.items() if k != "kl"}
    assert len({r["response"] for r in eager_rows}) > 12


def _pairs(tiny_lm, out, **generation) -> tuple[dict, dict]:
    """The demo's pairs stage on tiny_lm's model as the SFT model: (its result, its data files)."""
    cfg = DemoConfig()
    cfg.pairs = dataclasses.replace(cfg.pairs, pairs=30, eval_pairs=6, slip_pairs=4, slip_eval_pairs=4)
    cfg.generation = dataclasses.replace(cfg.generation, max_new_tokens=10, **generation)
    (out / "data").mkdir(parents=True)
    (out / "sft").symlink_to(tiny_lm / "sft")
    run = demo.DemoRun(cfg, out, ReviewTask(), None, print, time.perf_counter())
    result = demo.stage_pairs(run, out / "stages" / "pairs")
    return result, {p.name: p.read_bytes() for p in sorted((out / "data").iterdir())}


def test_the_demos_pairs_with_the_static_engine_are_the_eager_pairs(tiny_lm, tmp_path):
    eager, eager_files = _pairs(tiny_lm, tmp_path / "eager")
    static, static_files = _pairs(tiny_lm, tmp_path / "static", **STATIC)
    assert static == eager and static_files == eager_files  # byte for byte
    rows = [json.loads(line) for line in eager_files["preferences.jsonl"].decode().splitlines()]
    assert eager["pairs"] >= 10 and any("slip" in r for r in rows) and len(eager_files) == 3
