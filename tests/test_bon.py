"""`fourfold bon` on tiny random models: the choice, n = 1 as plain sampling, scores as `fourfold
score` gives them, the gold columns, the analytic KL in the summary, one-line errors."""
import json
import math
from pathlib import Path

import pytest

from fourfold.apps.bon import best_of_n, pick_best
from fourfold.cli import main
from fourfold.config import BonConfig, load_config


def _rows(path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


def _cli(stage, args, out, capsys):
    rc = main([stage, *args, "run.threads=1", "--output-dir", str(out)])
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def _base(tiny_lm, *extra):
    return [f"model.path={tiny_lm / 'sft'}", f"data.prompts={tiny_lm / 'prompts.jsonl'}",
            "generation.max_new_tokens=5", *extra]


def test_pick_best_hand_cases():
    assert pick_best([0.1, 0.7, 0.3]) == 1
    assert pick_best([0.5, 0.9, 0.9, 0.2]) == 1  # ties: the first sampled
    assert pick_best([2.0]) == 0
    assert pick_best([math.nan, -1.0, math.nan]) == 1  # a nan never wins
    with pytest.raises(ValueError, match="no candidates"):
        pick_best([])


def test_n1_is_plain_sampling(tiny_lm, tmp_path, capsys):
    """Same seed and settings: bon with n = 1 writes generate's completions as its responses."""
    rc, _, err = _cli("generate", _base(tiny_lm, "run.seed=5", "data.batch_size=8"), tmp_path / "g", capsys)
    assert rc == 0, err
    rc, out, err = _cli("bon", _base(tiny_lm, "run.seed=5", "data.batch_size=8", "bon.n=1",
                                     f"scorer.reward_fn={tiny_lm / 'reward_fn.py'}:reward"), tmp_path / "b", capsys)
    assert rc == 0, err
    gen, bon = _rows(tmp_path / "g" / "completions.jsonl"), _rows(tmp_path / "b" / "bon.jsonl")
    assert [(r["prompt"], r["response"], r["finished"]) for r in gen] == \
        [(r["prompt"], r["response"], r["finished"]) for r in bon]
    assert all(len(r["candidates"]) == 1 and r["chosen"] == 0 for r in bon)
    assert "KL = log n - (n-1)/n = 0.0000 nats" in out


def test_bon_takes_the_sampling_filters_as_generate_does(tiny_lm, tmp_path, capsys):
    """generation.top_k/top_p/min_p reach bon's sampling: with n = 1 its responses are generate's
    under the same filters (and not the unfiltered ones)."""
    filters = ("generation.top_p=0.6", "generation.top_k=8")
    common = _base(tiny_lm, "run.seed=5", "data.batch_size=8")
    rows = {}
    for name, extra in (("plain", ()), ("filtered", filters)):
        rc, _, err = _cli("generate", [*common, *extra], tmp_path / name, capsys)
        assert rc == 0, err
        rows[name] = [(r["prompt"], r["response"]) for r in _rows(tmp_path / name / "completions.jsonl")]
    rc, _, err = _cli("bon", [*common, *filters, "bon.n=1", f"scorer.reward_fn={tiny_lm / 'reward_fn.py'}:reward"],
                      tmp_path / "b", capsys)
    assert rc == 0, err
    bon = [(r["prompt"], r["response"]) for r in _rows(tmp_path / "b" / "bon.jsonl")]
    assert bon == rows["filtered"] != rows["plain"]


def test_the_best_is_chosen_and_scored_as_fourfold_score_scores(tiny_lm, tmp_path, capsys):
    rc, out, err = _cli("bon", _base(tiny_lm, "bon.n=4", "data.batch_size=16", f"scorer.reward={tiny_lm / 'rm'}"),
                        tmp_path / "b", capsys)
    assert rc == 0, err
    rows = _rows(tmp_path / "b" / "bon.jsonl")
    assert len(rows) == 64 and all(len(r["candidates"]) == 4 for r in rows)
    for r in rows:
        scores = [c["score"] for c in r["candidates"]]
        assert r["chosen"] == scores.index(max(scores)) and r["score"] == max(scores)
        assert r["response"] == r["candidates"][r["chosen"]]["response"]
    assert f"KL = log n - (n-1)/n = {math.log(4) - 0.75:.4f} nats" in out
    # every candidate's score is what `fourfold score` gives the same prompt/response rows
    flat = [{"prompt": r["prompt"], "response": c["response"], "finished": c["finished"]}
            for r in rows for c in r["candidates"]]
    (tmp_path / "cands.jsonl").write_text("".join(json.dumps(x) + "\n" for x in flat))
    rc, _, err = _cli("score", [f"model.reward={tiny_lm / 'rm'}", f"data.rows={tmp_path / 'cands.jsonl'}"],
                      tmp_path / "s", capsys)
    assert rc == 0, err
    scored = [x["score"] for x in _rows(tmp_path / "s" / "scores.jsonl")]
    assert [c["score"] for r in rows for c in r["candidates"]] == pytest.approx(scored, abs=1e-5)


def test_weighted_reward_functions_and_a_column_reading_function(tiny_lm, tmp_path, capsys):
    """Through the CLI, the scorer is the one reward role of PPO and `fourfold score`: weighted
    reward_fns (each candidate's score is the weighted sum of its parts, written beside it), and a
    function that reads a column of the prompts file (each candidate gets its own prompt row's)."""
    (tmp_path / "a.py").write_text(
        "def good(prompts, responses):\n    return [float('w1' in r) for r in responses]\n"
        "def length(prompts, responses):\n    return [float(len(r.split())) for r in responses]\n"
        "def score(prompts, responses, answer):\n    return [float(a) * len(r) for r, a in zip(responses, answer)]\n")
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"w{i} w{i + 1}", "answer": i % 3}) + "\n" for i in range(6)))
    over = [f"model.path={tiny_lm / 'sft'}", f"data.prompts={prompts}", "generation.max_new_tokens=5", "bon.n=3"]
    fns = f"scorer.reward_fns=[{{fn: '{tmp_path / 'a.py'}:good', weight: 1.0}}, {{fn: '{tmp_path / 'a.py'}:length', weight: 0.5}}]"
    rc, _, err = _cli("bon", [*over, fns], tmp_path / "w", capsys)
    assert rc == 0, err
    rows = _rows(tmp_path / "w" / "bon.jsonl")
    assert len(rows) == 6
    for r in rows:
        for c in r["candidates"]:
            assert set(c["parts"]) == {"good", "length"}
            assert c["parts"]["length"] == float(len(c["response"].split()))
            assert c["score"] == pytest.approx(c["parts"]["good"] + 0.5 * c["parts"]["length"], abs=1e-6)
    rc, _, err = _cli("bon", [*over, f"scorer.reward_fn={tmp_path / 'a.py'}:score"], tmp_path / "c", capsys)
    assert rc == 0, err
    for i, r in enumerate(_rows(tmp_path / "c" / "bon.jsonl")):
        assert [c["score"] for c in r["candidates"]] == [float(i % 3) * len(c["response"]) for c in r["candidates"]]
        assert "parts" not in r["candidates"][0] and "columns" not in r["candidates"][0]
    rc, _, err = _cli("bon", [*over, f"scorer.reward_fn={tmp_path / 'a.py'}:score", f"data.prompts={tiny_lm / 'prompts.jsonl'}"],
                      tmp_path / "m", capsys)
    assert rc == 2 and "answer" in err and len(err.strip().splitlines()) == 1, err  # the column missing: one line


def _review_prompts(path, n=64):
    """The review world's prompts (what its gold reads), one a row."""
    import random

    from fourfold.tasks.review import ReviewTask

    prompts = ReviewTask().sample_prompts(n, random.Random(0))
    path.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
    return path


def test_python_api_gold_and_datasets(tiny_lm, tmp_path, capsys):
    cfg = load_config(BonConfig, None, _base(tiny_lm, "bon.n=3", "bon.task=review", "run.threads=1",
                                             f"scorer.reward_fn={tiny_lm / 'reward_fn.py'}:reward",
                                             f"run.output_dir={tmp_path / 'b'}",
                                             f"data.prompts={_review_prompts(tmp_path / 'review.jsonl')}"))
    res = best_of_n(cfg)
    rows = _rows(res["output"])
    assert res["n"] == 3 and res["kl"] == pytest.approx(math.log(3) - 2 / 3) and res["prompts"] == 64
    assert all("gold" in c for r in rows for c in r["candidates"])
    assert res["gold"] == pytest.approx(sum(r["gold"] for r in rows) / 64)
    assert res["gold_plain"] == pytest.approx(sum(c["gold"] for r in rows for c in r["candidates"]) / 192)
    assert res["score"] >= res["score_plain"]
    assert "gold" in capsys.readouterr().out
    import datasets

    ds = datasets.load_dataset("json", data_files=res["output"], split="train")
    assert len(ds) == 64 and len(ds[0]["candidates"]) == 3 and set(ds.column_names) >= {"response", "score"}


@pytest.mark.parametrize("args,needle", [
    (["bon.n=0"], "bon.n: must be >= 1"),
    (["generation.greedy=true", "bon.n=2"], "generation.greedy: greedy decoding gives n identical candidates"),
    (["bon.task_options={labeler_noise: 0.1}"], "bon.task_options: are options of bon.task"),
    (["scorer.reward=null"], "scorer.reward: no reward: set scorer.reward"),
    (["bon.task=nope"], "unknown task 'nope'"),
])
def test_bad_input_is_one_line(tiny_lm, tmp_path, capsys, args, needle):
    rc, _, err = _cli("bon", _base(tiny_lm, f"scorer.reward={tiny_lm / 'rm'}", *args), tmp_path / "b", capsys)
    assert rc == 2 and needle in err and len(err.strip().splitlines()) == 1, err


def test_the_example_loads_and_the_cli_lists_bon():
    from fourfold.cli import build_parser

    cfg = load_config(BonConfig, Path(__file__).resolve().parents[1] / "examples" / "bon.yaml")
    assert cfg.bon.n == 8 and cfg.scorer.reward == "path/to/reward/model"
    assert "best-of-n" in build_parser().format_help()


def test_progress_lines_at_most_every_interval_with_an_eta_from_the_rate():
    """Hand clock: a line at t = 10 (40 of 100 done: 10 s, 15 s left), none at t = 15, one at t = 21,
    and the last one (100/100)."""
    from fourfold.apps.inference import Progress

    t = [0.0]
    lines = []
    p = Progress("fourfold bon: sampled", "candidates", every_s=10.0, clock=lambda: t[0])
    p.line = (lambda f: (lambda d, n: lines.append(f(d, n)) or lines[-1]))(p.line)
    for now, done in ((4, 10), (10, 40), (15, 60), (21, 84), (22, 100)):
        t[0] = float(now)
        p(done, 100)
    assert lines == ["fourfold bon: sampled 40/100 candidates (10 s, about 15 s left)",
                     "fourfold bon: sampled 84/100 candidates (21 s, about 4 s left)",
                     "fourfold bon: sampled 100/100 candidates (22 s, about 0 s left)"]


def test_bon_says_its_progress(tiny_lm, tmp_path, capsys, monkeypatch):
    from fourfold.apps.inference import Progress

    monkeypatch.setattr(Progress, "EVERY_S", 0.0)  # a line after every batch
    rc, out, err = _cli("bon", _base(tiny_lm, "bon.n=2", "data.batch_size=32", f"scorer.reward={tiny_lm / 'rm'}"),
                        tmp_path / "b", capsys)
    assert rc == 0, err
    assert "fourfold bon: sampled 32/128 candidates (" in out and "fourfold bon: sampled 128/128 candidates" in out
    assert "fourfold bon: scored 128/128 candidates" in out


def test_a_candidate_count_that_cannot_fit_is_refused_before_anything_loads(tiny_lm, tmp_path, capsys):
    from fourfold.apps.bon import check_candidates

    rc, _, err = _cli("bon", _base(tiny_lm, "bon.n=1000000000", f"scorer.reward={tiny_lm / 'rm'}"), tmp_path / "n", capsys)
    assert rc == 2 and err.count("\n") == 1 and "bon.n: 1000000000 candidates for each of 64 prompts" in err, err
    cfg = load_config(BonConfig, None, _base(tiny_lm, "bon.n=100", f"scorer.reward={tiny_lm / 'rm'}"))
    check_candidates(cfg, available=2**30)  # 64 x 100 x (700 + 8 x 5) bytes: 4.7 MB fits in 1 GiB
    with pytest.raises(Exception, match=r"at most 13 fits here"):  # 0.8 x 800 000 / (64 x 740 bytes) = 13.5
        check_candidates(cfg, available=800_000)


def test_a_task_that_reads_none_of_the_prompts_is_refused(tiny_lm, tmp_path, capsys):
    rc, _, err = _cli("bon", _base(tiny_lm, "bon.n=2", "bon.task=review", f"scorer.reward={tiny_lm / 'rm'}"),
                      tmp_path / "t", capsys)
    assert rc == 2 and err.count("\n") == 1 and "bon.task: review reads none of the prompts" in err, err
    mixed = _review_prompts(tmp_path / "mixed.jsonl", 8)
    mixed.write_text(mixed.read_text() + json.dumps({"prompt": "w1 w2"}) + "\n")
    rc, out, err = _cli("bon", _base(tiny_lm, "bon.n=2", "bon.task=review", f"scorer.reward={tiny_lm / 'rm'}",
                                     f"data.prompts={mixed}"), tmp_path / "m", capsys)
    assert rc == 0, err
    assert "fourfold bon: warning: bon.task: review cannot read 1 of 9 prompts" in out
