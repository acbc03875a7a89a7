"""`fourfold score`, `fourfold bon` and `fourfold serve-reward` build their scorer through the one
loader and reward role, so each takes what the others take, through the CLI: `reward_url` in score
and bon (the same scores as the local reward model, `finished` as read), a served weighted scorer
(reward model + a column-reading function, given as `model.*` keys) that scores what `fourfold
score` scores with the same keys, and a LoRA reward adapter in `fourfold score` that scores as the
served adapter."""

import json
import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from fourfold.apps.reward_server import model_scorer
from fourfold.cli import main

ROOT = Path(__file__).resolve().parents[2]
ROWS = [{"prompt": "w1 w2", "response": "w7 w8 w9", "finished": True, "answer": "w9"},
        {"prompt": "w3", "response": "w10", "finished": False, "answer": "w3"},
        {"prompt": "w4 w5 w6", "response": "", "finished": True, "answer": "w1"}]
RULE = "def hit(prompts, responses, answer):\n    return [float(r.endswith(a)) for r, a in zip(responses, answer)]\n"



def _rows(path):
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


def _score(tmp_path, name, *keys, capsys):
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    rc = main(["score", f"data.rows={rows}", "run.threads=1", "--output-dir", str(tmp_path / name), *keys])
    assert rc == 0, capsys.readouterr().err
    return [r["score"] for r in _rows(tmp_path / name / "scores.jsonl")]


def test_score_through_reward_url_is_the_local_reward_models(tiny_lm, tmp_path, served, capsys):
    _, url = served(model_scorer(str(tiny_lm / "rm")))
    local = _score(tmp_path, "local", f"model.reward={tiny_lm / 'rm'}", capsys=capsys)
    text = _score(tmp_path, "text", f"model.reward_url={url}", capsys=capsys)  # no tokenizer here: text
    ids = _score(tmp_path, "ids", f"model.reward_url={url}", f"model.tokenizer={tiny_lm / 'rm'}", capsys=capsys)
    assert text == pytest.approx(local, abs=1e-6) and ids == pytest.approx(local, abs=1e-6)
    assert len({round(s, 4) for s in local}) == 3  # three rows, three scores
    # `finished` is sent as read: the row cut at the length limit scores without EOS, as locally
    flipped = [dict(r, finished=True) for r in ROWS]
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in flipped))
    rc = main(["score", f"data.rows={tmp_path / 'rows.jsonl'}", "run.threads=1", "--output-dir",
               str(tmp_path / "flipped"), f"model.reward_url={url}"])
    assert rc == 0
    assert _rows(tmp_path / "flipped" / "scores.jsonl")[1]["score"] != pytest.approx(text[1], abs=1e-4)


def test_bon_through_reward_url_chooses_as_the_local_reward_model(tiny_lm, tmp_path, served, capsys):
    _, url = served(model_scorer(str(tiny_lm / "rm")))
    base = [f"model.path={tiny_lm / 'sft'}", f"data.prompts={tiny_lm / 'prompts.jsonl'}", "generation.max_new_tokens=5",
            "bon.n=3", "data.batch_size=12", "run.threads=1", "run.seed=3"]
    runs = {}
    for name, key in (("local", f"scorer.reward={tiny_lm / 'rm'}"), ("served", f"scorer.reward_url={url}")):
        assert main(["bon", *base, key, "--output-dir", str(tmp_path / name)]) == 0, capsys.readouterr().err
        runs[name] = _rows(tmp_path / name / "bon.jsonl")
    local, remote = runs["local"], runs["served"]
    assert [r["chosen"] for r in local] == [r["chosen"] for r in remote]
    assert [c["score"] for r in remote for c in r["candidates"]] == \
        pytest.approx([c["score"] for r in local for c in r["candidates"]], abs=1e-5)


def test_a_served_weighted_scorer_scores_what_fourfold_score_scores(tiny_lm, tmp_path, capsys):
    (tmp_path / "rule.py").write_text(RULE)
    keys = [f"model.reward={tiny_lm / 'rm'}", "model.reward_weight=0.5",
            f"model.reward_fns=[{{fn: '{tmp_path / 'rule.py'}:hit', weight: 2.0}}]"]
    scored = _score(tmp_path, "score", *keys, capsys=capsys)
    env = dict(os.environ, PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    proc = subprocess.Popen([sys.executable, "-m", "fourfold.cli", "serve-reward", *keys, "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        line = proc.stdout.readline()
        assert line.startswith("fourfold serve-reward: serving weighted reward 0.5 x rm (reward model "), \
            line + proc.stderr.read() if not line else line
        url = line.split(" at http")[1].split()[0]
        payload = {
            "prompts": [r["prompt"] for r in ROWS], "responses": [r["response"] for r in ROWS],
            "finished": [r["finished"] for r in ROWS], "columns": {"answer": [r["answer"] for r in ROWS]}}
        request = urllib.request.Request("http" + url + "/score", data=json.dumps(payload).encode(), method="POST",
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as answer:
            served_scores = json.loads(answer.read())["scores"]
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=20)
    assert served_scores == pytest.approx(scored, abs=1e-6)
    assert [round(s - 0.5 * m, 6) for s, m in zip(scored, _score(tmp_path, "rm", f"model.reward={tiny_lm / 'rm'}",
                                                                   capsys=capsys))] == [2.0, 0.0, 0.0]


def test_fourfold_score_takes_a_lora_reward_adapter_as_the_server_does(tiny_lm, tmp_path, capsys):
    from tests.rewards.test_serve_reward_cli import _write_lora_reward

    _write_lora_reward(tiny_lm, tmp_path / "rm-adapter")
    local = _score(tmp_path, "adapter", f"model.reward={tmp_path / 'rm-adapter'}", capsys=capsys)
    served = model_scorer(str(tmp_path / "rm-adapter"))([r["prompt"] for r in ROWS], [r["response"] for r in ROWS],
                                                        [r["finished"] for r in ROWS], {})
    assert served == pytest.approx(local, abs=1e-6) and len({round(s, 4) for s in local}) == 3
