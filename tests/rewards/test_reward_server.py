"""``fourfold serve-reward`` and ``model.reward_url``: the served scores are the local ones, concurrent
requests share a batch, bad requests are 400s, a server that stays down is one line naming it."""

import json
import threading
import urllib.request

import pytest
import torch

from fourfold.apps.reward_server import BadRequest, Batcher, function_scorer, model_scorer, parse_request
from fourfold.data import ResponseRecord, collate_responses, encode_responses
from fourfold.errors import RewardServerError
from fourfold.models.factory import llama_config, random_scalar_model
from fourfold.models.loading import load_sequence_scorer, load_tokenizer
from fourfold.models.remote import RemoteReward, with_retries
from fourfold.models.roles import ModelReward, ScalarModel
from fourfold.tasks.tokenizer import build_word_tokenizer

WORDS = [f"w{i}" for i in range(30)]


def exact(prompts, responses, answer):
    return [float(r.split()[-1] == a) for r, a in zip(responses, answer)]


def test_a_served_function_sees_the_columns_and_scores_as_called_here(served):
    server, url = served(function_scorer(exact))
    client = RemoteReward(url, retries=0)
    assert client.health() == {"status": "ok", "scorer": "reward function exact", "tokenizer": None}
    scores = client.score_texts(["p", "p", "q"], ["w1 w2", "w1 w3", "w4"], [True, True, False],
                                {"answer": ["w2", "w2", "w4"]})
    assert scores == [1.0, 0.0, 1.0]


def test_a_client_hanging_up_mid_request_is_one_warning_line(served, capfd):
    """A client that sends half a body and resets the connection: one warning line on the server's
    stderr (no socketserver traceback), and the server keeps answering."""
    import socket
    import struct
    import time

    server, url = served(function_scorer(exact))
    sock = socket.create_connection(server.server_address[:2])
    sock.sendall(b"POST /score HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n{\"pro")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close with a reset
    sock.close()
    deadline = time.monotonic() + 10
    err = ""
    while time.monotonic() < deadline and "hung up" not in err:
        time.sleep(0.05)
        err += capfd.readouterr().err
    assert "Traceback" not in err and err.count("\n") == 1, err
    assert err.startswith("fourfold serve-reward: warning: a client at 127.0.0.1 hung up mid-request ("), err
    client = RemoteReward(url, retries=0)
    assert client.health()["status"] == "ok"  # still serving


def test_a_defaulted_column_is_warned_once_not_per_batch():
    def hinted(prompts, responses, hint="none"):
        return [float(hint == "none")] * len(responses)

    score = function_scorer(hinted)
    with pytest.warns(UserWarning, match="takes 'hint' but the request has no such column") as seen:
        for _ in range(3):
            assert score(["p"], ["r"], [True], {}) == [1.0]
    assert len(seen) == 1


def test_a_served_reward_model_equals_the_local_one(served, tmp_path):
    tok = build_word_tokenizer(WORDS, tmp_path / "rm")
    cfg = llama_config(len(tok), hidden=32, layers=1, heads=2, pad_token_id=tok.pad_token_id,
                       bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    random_scalar_model(cfg, seed=3).save_pretrained(tmp_path / "rm")
    prompts, responses, finished = ["w1 w2", "w3", "w4 w5 w6"], ["w7 w8 w9", "w10", ""], [True, False, True]
    server, url = served(model_scorer(str(tmp_path / "rm")))
    served_scores = RemoteReward(url, retries=0).score_texts(prompts, responses, finished)
    # the local scoring of the same rows, as `fourfold score` and PPO lay them out
    hf = load_sequence_scorer(str(tmp_path / "rm"), dtype="float32", device=torch.device("cpu"))
    records = [ResponseRecord(p, r, f, line=i) for i, (p, r, f) in enumerate(zip(prompts, responses, finished))]
    ids, mask = collate_responses(encode_responses(records, load_tokenizer(str(tmp_path / "rm")), 512),
                                  tok.pad_token_id)
    local = ModelReward(ScalarModel(hf))(ids, mask).tolist()
    assert served_scores == pytest.approx(local, abs=1e-6)
    # the client reads `finished` from the ids: EOS at the last valid position
    client = RemoteReward(url, eos_token_id=tok.eos_token_id)
    assert client.finished(torch.tensor([[0, 5, 2], [5, 6, 7]]), torch.tensor([[0, 1, 1], [1, 1, 1]])) == [True, False]


def test_concurrent_requests_share_a_batch():
    calls = []
    gate = threading.Event()

    def scorer(prompts, responses, finished, columns):
        calls.append(len(responses))
        gate.wait(5)
        return [float(len(r)) for r in responses]

    batcher = Batcher(scorer, window_s=0.5, max_rows=100)
    results = {}

    def ask(i):
        results[i] = batcher.submit({"prompts": ["p"] * 2, "responses": ["x" * i] * 2, "finished": [True] * 2,
                                     "columns": {}}, timeout_s=10)

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(1, 6)]
    for t in threads:
        t.start()
    gate.set()
    for t in threads:
        t.join()
    assert results == {i: [float(i)] * 2 for i in range(1, 6)}
    assert sum(calls) == 10 and len(calls) < 5  # five requests, fewer scorer calls


@pytest.mark.parametrize("body, message", [
    (b"not json", "the body is not JSON"),
    (b'{"prompts": ["a"], "responses": ["b", "c"]}', "1 prompts for 2 responses"),
    (b'{"prompts": ["a"], "responses": [3]}', "responses: expected a list of strings"),
    (b'{"prompts": ["a"], "responses": ["b"], "finished": [1]}', "finished: expected a list of 1 booleans"),
    (b'{"prompts": ["a"], "responses": ["b"], "columns": {"answer": []}}', "columns: expected an object of lists of 1"),
])
def test_bad_requests(body, message):
    with pytest.raises(BadRequest, match=message):
        parse_request(body)


def test_a_bad_request_is_a_400_and_not_retried(served):
    server, url = served(function_scorer(exact))
    request = urllib.request.Request(url + "/score", data=b"[]", method="POST")
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(request, timeout=5)
    assert e.value.code == 400 and "expected a JSON object" in json.loads(e.value.read())["error"]
    # a function that needs a column the request lacks: a 400 with the function's one line, not retried
    with pytest.raises(RewardServerError) as e:
        RemoteReward(url, retries=5, backoff_s=60).score_texts(["p"], ["w1"], [True])
    assert str(e.value) == (f"model.reward_url: {url} refused the request (HTTP 400: model.reward_fn: python:test_reward_server.exact takes 'answer', "
                            "but the request has no column 'answer' (its columns: none besides the prompt))")


def test_a_server_that_stays_down_is_one_line_after_the_retries():
    waits = []
    calls = []

    def down():
        calls.append(1)
        raise urllib.error.URLError(ConnectionRefusedError(111, "Connection refused"))

    with pytest.raises(RewardServerError) as e:
        with_retries(down, "http://127.0.0.1:9", retries=3, backoff_s=0.5, sleep=waits.append)
    assert len(calls) == 4 and waits == [0.5, 1.0, 2.0]
    assert str(e.value).startswith("model.reward_url: http://127.0.0.1:9 did not answer after 4 tries (last: URLError: ")
    answers = iter([urllib.error.URLError("refused"), {"scores": [1.0]}])

    def flaky():
        a = next(answers)
        if isinstance(a, Exception):
            raise a
        return a

    assert with_retries(flaky, "u", retries=2, backoff_s=0.0, sleep=waits.append) == {"scores": [1.0]}
