"""``fourfold serve-reward``: the command in a subprocess on a free port answers /health and scores
as the local reward model (or function) does, stops cleanly on SIGTERM and SIGINT; a LoRA reward
adapter serves the scores PPO's adapter role gives; bad arguments are one line and exit 2."""

import json
import os
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import torch

from fourfold.apps.reward_server import model_scorer
from fourfold.checkpoint import save_pretrained_atomic
from fourfold.cli import main
from fourfold.config import PPOConfig, RewardConfig, load_config
from fourfold.data import ResponseRecord, collate_responses, encode_responses
from fourfold.models.build import load_roles
from fourfold.models.checks import tokenizer_fingerprint
from fourfold.models.loading import load_sequence_scorer, load_tokenizer
from fourfold.models.lora import save_adapter
from fourfold.models.roles import ModelReward, ScalarModel

ROOT = Path(__file__).resolve().parents[2]
PROMPTS = ["w1 w2", "w3", "w4 w5 w6"]
RESPONSES = ["w7 w8 w9", "w10", ""]
FINISHED = [True, False, True]


def _start(*args):
    """``fourfold serve-reward ARGS --port 0`` in a subprocess; (process, URL from its ready line)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    proc = subprocess.Popen([sys.executable, "-m", "fourfold.cli", "serve-reward", *args, "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    line = proc.stdout.readline()
    if not line:
        proc.kill()
        raise AssertionError(f"no ready line; stderr: {proc.stderr.read()}")
    assert line.startswith("fourfold serve-reward: serving ") and line.rstrip().endswith("(POST /score, GET /health)")
    return proc, line.split(" at ")[1].split()[0]


def _post(url, payload):
    request = urllib.request.Request(url + "/score", data=json.dumps(payload).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(request, timeout=30) as answer:
        return json.loads(answer.read())


def _stop(proc, sig):
    """Stop the server: exit 0, its last stdout line, and nothing at all on stderr (errors only: no
    transformers load report or weight-loading progress bar)."""
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err
    assert out.strip() == "fourfold serve-reward: stopped" and err == "", err


def _local_scores(rm_dir):
    """The rows scored here, laid out as `fourfold score` and PPO lay them out."""
    tok = load_tokenizer(str(rm_dir))
    hf = load_sequence_scorer(str(rm_dir), dtype="float32", device=torch.device("cpu"))
    records = [ResponseRecord(p, r, f, line=i) for i, (p, r, f) in enumerate(zip(PROMPTS, RESPONSES, FINISHED))]
    ids, mask = collate_responses(encode_responses(records, tok, 512), tok.pad_token_id)
    return ModelReward(ScalarModel(hf))(ids, mask).tolist()


def test_a_served_reward_model_answers_health_and_scores_as_the_local_one(tiny_lm):
    proc, url = _start("--model", str(tiny_lm / "rm"), "--max-wait-ms", "5")
    try:
        with urllib.request.urlopen(url + "/health", timeout=10) as answer:
            health = json.loads(answer.read())
        assert health == {"status": "ok", "scorer": f"reward model {tiny_lm / 'rm'}",
                          "tokenizer": tokenizer_fingerprint(load_tokenizer(str(tiny_lm / "rm")))}
        served = _post(url, {"prompts": PROMPTS, "responses": RESPONSES, "finished": FINISHED})["scores"]
    except BaseException:
        proc.kill()
        raise
    _stop(proc, signal.SIGINT)
    assert served == pytest.approx(_local_scores(tiny_lm / "rm"), abs=1e-5)


def test_a_served_function_sees_the_columns_and_stops_on_sigterm(tmp_path):
    (tmp_path / "fn.py").write_text("def f(prompts, responses, answer):\n"
                                    "    return [float(r.endswith(a)) + 0.25 * len(p) for p, r, a in "
                                    "zip(prompts, responses, answer)]\n")
    proc, url = _start("--fn", f"{tmp_path / 'fn.py'}:f")
    try:
        served = _post(url, {"prompts": ["ab", "c"], "responses": ["x 3", "y 4"], "columns": {"answer": ["3", "5"]}})
    except BaseException:
        proc.kill()
        raise
    _stop(proc, signal.SIGTERM)
    assert served == {"scores": [1.5, 0.25]}


def _write_lora_reward(tiny_lm, out):
    """What a LoRA `fourfold reward` run writes as model-adapter/: an adapter role on the SFT model,
    'trained' (random B), normalised (a shift)."""
    torch.manual_seed(5)
    cfg = load_config(RewardConfig, None, [f"model.path={tiny_lm / 'sft'}", "data.train=p", "model.lora.r=4",
                                           "model.lora.alpha=8"])
    rm = load_roles("reward", cfg, torch.device("cpu")).reward_model
    with torch.no_grad():
        for name, p in rm.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.05)
    rm.set_affine(2.0, 0.5)
    save_pretrained_atomic(lambda d: save_adapter(rm, d), out)


def test_a_lora_reward_adapter_serves_the_scores_of_ppos_adapter_role(tiny_lm, tmp_path):
    _write_lora_reward(tiny_lm, tmp_path / "rm-adapter")
    served = model_scorer(str(tmp_path / "rm-adapter"))(PROMPTS, RESPONSES, FINISHED, {})
    cfg = load_config(PPOConfig, None, [f"model.policy={tiny_lm / 'sft'}", f"model.reward={tmp_path / 'rm-adapter'}",
                                        "data.prompts=p", "model.lora.r=4", "model.lora.alpha=8",
                                        "model.critic_init=policy", "run.concurrent_roles=false"])
    roles = load_roles("ppo", cfg, torch.device("cpu"))
    records = [ResponseRecord(p, r, f, line=i) for i, (p, r, f) in enumerate(zip(PROMPTS, RESPONSES, FINISHED))]
    ids, mask = collate_responses(encode_responses(records, roles.tokenizer, 512), roles.tokenizer.pad_token_id)
    local = roles.reward(ids, mask).tolist()
    assert served == pytest.approx(local, abs=1e-5)
    assert len(set(round(s, 4) for s in served)) == 3  # three rows, three scores: not a constant


def test_bad_arguments_are_one_line_and_exit_2(tmp_path, tiny_lm, capsys):
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    port = busy.getsockname()[1]
    (tmp_path / "fn.py").write_text("def f(prompts, responses):\n    return [0.0] * len(responses)\n")
    cases = {
        ("--model", str(tmp_path / "nope")): f"--model: {tmp_path / 'nope'}: no such directory",
        ("--model", str(tiny_lm / "sft")): f"--model: {tiny_lm / 'sft'} has no trained score head",  # as model.reward is
        ("--model", str(tiny_lm / "rm"), "--fn", f"{tmp_path / 'fn.py'}:f"): "give exactly one of --model",
        (): "give exactly one of --model",
        ("--fn", f"{tmp_path / 'fn.py'}:f", "--port", str(port)): f"cannot listen on 127.0.0.1:{port}",
        ("--fn", f"{tmp_path / 'fn.py'}:g"): "has no function 'g'",
        ("--fn", f"{tmp_path / 'fn.py'}:f", "--batch-size", "0"): "--batch-size: expected an integer >= 1",
    }
    try:
        for args, message in cases.items():
            assert main(["serve-reward", *args]) == 2, args
            err = capsys.readouterr().err
            assert err.count("\n") == 1 and err.startswith("fourfold serve-reward: error: ") and message in err, err
    finally:
        busy.close()
