"""`fourfold serve-reward`: a reward model (a directory ``fourfold reward`` wrote, a LoRA adapter
included) or a reward function served over HTTP, for ``model.reward_url`` (the client and the
protocol: :mod:`fourfold.models.remote`; docs/rewards.md).

The server is the standard library's threading HTTP server: each connection its own thread, so
requests from several trainers (or ranks) are read at once; a single scoring thread takes what has
arrived (:class:`Batcher`: everything queued within ``window_s`` of the first request, up to
``max_rows`` rows) and scores it in one batch, so concurrent requests share a forward pass. A
request waits at most ``request_timeout_s`` for its scores. It listens on 127.0.0.1 unless told
otherwise: a reward server has no authentication.
"""

from __future__ import annotations

import json
import queue
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Callable, Optional

import torch

from fourfold.data import ResponseRecord, collate_responses, encode_responses
from fourfold.errors import ConfigError, DataError, FourfoldError
from fourfold.models.checks import RoleChecker, has_tokenizer_files
from fourfold.models.loading import ensure_pad_embedding, load_causal_lm, load_sequence_scorer, load_tokenizer
from fourfold.models.lora import REWARD, LoraSettings, SharedBase, is_adapter_dir, load_reward_adapter
from fourfold.models.lora.files import ADAPTER_CONFIG, resolvable_base
from fourfold.models.reward_fn import call_reward_fn, column_plan, load_reward_fn
from fourfold.models.roles import ModelReward, ScalarModel
from fourfold.run.common import quiet_transformers

Scorer = Callable[[list[str], list[str], list[bool], dict], list[float]]
"""``scorer(prompts, responses, finished, columns) -> scores``: what the server serves."""


class BadRequest(ValueError):
    """A request the server cannot score (answered 400 with its message)."""


def parse_request(body: bytes) -> dict:
    """The request's fields, checked: ``prompts``, ``responses`` (strings) and ``finished`` (bools,
    default all true) of one length, ``columns`` a dict of lists of that length."""
    try:
        req = json.loads(body)
    except (ValueError, UnicodeDecodeError) as e:
        raise BadRequest(f"the body is not JSON ({e})") from None
    if not isinstance(req, dict):
        raise BadRequest("expected a JSON object with prompts and responses")
    prompts, responses = req.get("prompts"), req.get("responses")
    for key, value in (("prompts", prompts), ("responses", responses)):
        if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
            raise BadRequest(f"{key}: expected a list of strings")
    n = len(responses)
    if len(prompts) != n:
        raise BadRequest(f"{len(prompts)} prompts for {n} responses")
    finished = req.get("finished", [True] * n)
    if not isinstance(finished, list) or len(finished) != n or not all(isinstance(f, bool) for f in finished):
        raise BadRequest(f"finished: expected a list of {n} booleans")
    columns = req.get("columns") or {}
    if not isinstance(columns, dict) or not all(isinstance(v, list) and len(v) == n for v in columns.values()):
        raise BadRequest(f"columns: expected an object of lists of {n} values")
    return {"prompts": prompts, "responses": responses, "finished": finished, "columns": columns}


@dataclass
class Pending:
    request: dict
    done: threading.Event = field(default_factory=threading.Event)
    scores: Optional[list[float]] = None
    error: Optional[Exception] = None


class Batcher:
    """One scoring thread over a queue of requests: it waits for the first, takes every other that
    arrives within ``window_s`` (up to ``max_rows`` rows, requests with the same column names), scores
    them in one call and hands each its share."""

    def __init__(self, scorer: Scorer, *, window_s: float = 0.01, max_rows: int = 512):
        self.scorer, self.window_s, self.max_rows = scorer, window_s, max_rows
        self.queue: "queue.Queue[Pending]" = queue.Queue()
        self.batches = 0  # scorer calls so far (the tests read it)
        self.thread = threading.Thread(target=self._loop, name="fourfold-reward-batcher", daemon=True)
        self.thread.start()

    def submit(self, request: dict, timeout_s: float) -> list[float]:
        item = Pending(request)
        self.queue.put(item)
        if not item.done.wait(timeout_s):
            raise TimeoutError(f"no scores within {timeout_s} s")
        if item.error is not None:
            raise item.error
        return item.scores

    def _take(self) -> list[Pending]:
        first = self.queue.get()
        batch, rows, keys = [first], len(first.request["responses"]), set(first.request["columns"])
        deadline = time.monotonic() + self.window_s
        while rows < self.max_rows:
            try:
                item = self.queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                break
            if set(item.request["columns"]) != keys:  # another shape of columns: the next batch
                self.queue.put(item)
                break
            batch.append(item)
            rows += len(item.request["responses"])
        return batch

    def _loop(self) -> None:
        while True:
            batch = self._take()
            joined = {k: [] for k in ("prompts", "responses", "finished")}
            columns = {k: [] for k in batch[0].request["columns"]}
            for item in batch:
                for k in joined:
                    joined[k] += item.request[k]
                for k in columns:
                    columns[k] += item.request["columns"][k]
            try:
                scores = self.scorer(joined["prompts"], joined["responses"], joined["finished"], columns)
                self.batches += 1
            except (ConfigError, DataError) as e:  # rows or columns it cannot score: the request's fault
                self._fail(batch, BadRequest(str(e)))
                continue
            except Exception as e:  # the scorer's own failure goes back to every waiting request
                self._fail(batch, RuntimeError(f"{type(e).__name__}: {e}"))
                continue
            start = 0
            for item in batch:
                n = len(item.request["responses"])
                item.scores, start = scores[start:start + n], start + n
                item.done.set()


    @staticmethod
    def _fail(batch: list[Pending], error: Exception) -> None:
        for item in batch:
            item.error = error
            item.done.set()


def load_reward_model(model_dir: str, *, device: str = "cpu", dtype: str = "float32", tokenizer: Optional[str] = None,
                      trust_remote_code: bool = False):
    """(tokenizer, frozen reward model) of a reward-model directory: a full one (a one-label sequence
    classifier, as ``fourfold reward`` writes ``model/``) or a LoRA reward adapter (``model-adapter/``:
    loaded on the causal LM its ``adapter_config.json`` names, as PPO loads ``model.reward`` with
    ``model.lora``; the tokenizer saved beside the adapter, else the base's)."""
    if not Path(model_dir).is_dir():
        raise ConfigError(f"--model: {model_dir}: no such directory (a reward model `fourfold reward` wrote)")
    if not is_adapter_dir(model_dir):
        tok = load_tokenizer(tokenizer or model_dir, trust_remote_code=trust_remote_code)
        hf = load_sequence_scorer(model_dir, dtype=dtype, device=torch.device(device),
                                  trust_remote_code=trust_remote_code)
        # PPO's check of model.reward: a trained score head, no other random weight, the tokenizer's vocabulary
        RoleChecker(tok, "--tokenizer" if tokenizer else "--model", tokenizer or model_dir,
                    trust_remote_code=trust_remote_code).scorer(hf, "--model", model_dir)
        ensure_pad_embedding(hf, tok)
        return tok, ScalarModel(hf)
    config = json.loads((Path(model_dir) / ADAPTER_CONFIG).read_text())
    base = resolvable_base(config.get("base_model_name_or_path"))
    if not base:
        raise ConfigError(f"--model: {model_dir}: the adapter names no base model (base_model_name_or_path)")
    tok = load_tokenizer(tokenizer or (model_dir if has_tokenizer_files(model_dir) else base),
                         trust_remote_code=trust_remote_code)
    lm = load_causal_lm(base, dtype=dtype, device=torch.device(device), trust_remote_code=trust_remote_code)
    ensure_pad_embedding(lm, tok)
    # the shared base starts with an adapter of its own (B = 0: the base model itself), never active here
    shared = SharedBase(lm, LoraSettings(r=1, alpha=1.0), adapter="served-base")
    return tok, load_reward_adapter(shared, model_dir, REWARD)


def model_scorer(model_dir: str, *, device: str = "cpu", dtype: str = "float32", tokenizer: Optional[str] = None,
                 max_len: int = 512, trust_remote_code: bool = False) -> Scorer:
    """The scorer of a reward-model directory (:func:`load_reward_model`): each row tokenised as
    ``fourfold score`` and PPO lay out a rollout (prompt with BOS, left-padded; response then EOS
    when finished, right-padded), scored at the last valid token with the model's normalisation shift."""
    tok, model = load_reward_model(model_dir, device=device, dtype=dtype, tokenizer=tokenizer,
                                   trust_remote_code=trust_remote_code)
    reward = ModelReward(model)
    lock = threading.Lock()

    @torch.no_grad()
    def score(prompts, responses, finished, columns):
        records = [ResponseRecord(p, r, f, line=i + 1, source="request") for i, (p, r, f) in
                   enumerate(zip(prompts, responses, finished))]
        examples = encode_responses(records, tok, max_len)
        ids, mask = collate_responses(examples, tok.pad_token_id)
        with lock:
            return reward(ids.to(device), mask.to(device)).float().cpu().tolist()

    score.description = f"reward model {model_dir}"
    return score


def function_scorer(spec) -> Scorer:
    """The scorer of a reward function (``file.py:name``, ``module:name`` or a callable): called with
    the request's columns as keyword arguments (those its signature takes). The signature is matched
    once per set of column names (so a defaulted parameter's warning is said once, not per batch)."""
    fn = load_reward_fn(spec) if isinstance(spec, str) else spec
    name = spec if isinstance(spec, str) else getattr(fn, "__qualname__", repr(fn))
    plans = {}  # column names -> ColumnPlan (the batcher's one thread reads and writes it)

    def score(prompts, responses, finished, columns):
        key = tuple(columns)
        if key not in plans:
            plans[key] = column_plan(fn, name, key, "the request")
        return call_reward_fn(fn, prompts, responses, name, plans[key].select(columns))

    score.description = f"reward function {name}"
    return score


def make_handler(batcher: Batcher, description: str, request_timeout_s: float):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _reply(self, code: int, payload: dict) -> None:
            body = json.dumps(payload).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):  # noqa: N802 (the standard library's name)
            if self.path.rstrip("/") == "/health":
                self._reply(200, {"status": "ok", "scorer": description})
            else:
                self._reply(404, {"error": f"no such path {self.path}; GET /health, POST /score"})

        def do_POST(self):  # noqa: N802
            if self.path.rstrip("/") != "/score":
                self._reply(404, {"error": f"no such path {self.path}; POST /score"})
                return
            length = int(self.headers.get("Content-Length") or 0)
            try:
                request = parse_request(self.rfile.read(length))
                scores = batcher.submit(request, request_timeout_s)
            except BadRequest as e:
                self._reply(400, {"error": str(e)})
                return
            except (RuntimeError, TimeoutError, FourfoldError) as e:
                self._reply(500, {"error": str(e)})
                return
            self._reply(200, {"scores": scores})

        timeout = 60  # a client that opens a connection and sends nothing frees its thread after a minute

        def log_message(self, format, *args):  # one line per request is noise for a trainer's server
            pass

    return Handler


class RewardHTTPServer(ThreadingHTTPServer):
    """The standard library's threading server, except that a client hanging up in the middle of a
    request (a reset or broken connection while its request is read or its answer written) is one
    warning line on stderr, not socketserver's traceback; the server keeps serving either way."""

    def handle_error(self, request, client_address) -> None:
        error = sys.exc_info()[1]
        if isinstance(error, (ConnectionError, TimeoutError)):
            host = client_address[0] if isinstance(client_address, tuple) else client_address
            print(f"fourfold serve-reward: warning: a client at {host} hung up mid-request "
                  f"({type(error).__name__}); still serving", file=sys.stderr, flush=True)
            return
        super().handle_error(request, client_address)


def start_server(scorer: Scorer, *, host: str = "127.0.0.1", port: int = 8000, window_s: float = 0.01,
                 max_rows: int = 512, request_timeout_s: float = 600.0) -> ThreadingHTTPServer:
    """A server of ``scorer`` bound to ``host:port`` (port 0: any free one; ``server.server_address``
    says which), serving in a background thread; ``server.shutdown()`` stops it."""
    batcher = Batcher(scorer, window_s=window_s, max_rows=max_rows)
    handler = make_handler(batcher, getattr(scorer, "description", "a scorer"), request_timeout_s)
    server = RewardHTTPServer((host, port), handler)
    server.daemon_threads = True
    server.batcher = batcher
    threading.Thread(target=server.serve_forever, name="fourfold-reward-server", daemon=True).start()
    return server


def serve(*, model: Optional[str] = None, fn: Optional[str] = None, host: str = "127.0.0.1", port: int = 8000,
          batch_size: int = 512, max_wait_ms: float = 10.0, request_timeout_s: float = 600.0, device: str = "cpu",
          dtype: str = "float32", tokenizer: Optional[str] = None, max_len: int = 512, out=None) -> int:
    """``fourfold serve-reward``: serve ``model`` (a reward-model directory) or ``fn`` (a reward
    function) on ``host:port`` until SIGINT or SIGTERM; one line on ``out`` (stdout) when it listens:
    ``fourfold serve-reward: serving <scorer> at http://host:port (POST /score, GET /health)``.
    Bad arguments and a port in use are a ConfigError (the CLI's one line, exit 2)."""
    if (model is None) == (fn is None):
        raise ConfigError("give exactly one of --model DIR (a reward model) and --fn file.py:name (a reward function)")
    if batch_size < 1:
        raise ConfigError(f"--batch-size: expected an integer >= 1, got {batch_size}")
    if max_wait_ms < 0:
        raise ConfigError(f"--max-wait-ms: expected a number >= 0, got {max_wait_ms}")
    if not 0 <= port <= 65535:
        raise ConfigError(f"--port: expected 0..65535, got {port}")
    if model is not None:
        quiet_transformers()  # no load report or progress bar on stderr, which holds errors only (as the trainers')
        scorer = model_scorer(model, device=device, dtype=dtype, tokenizer=tokenizer, max_len=max_len)
    else:
        scorer = function_scorer(fn)
    try:
        server = start_server(scorer, host=host, port=port, window_s=max_wait_ms / 1000.0, max_rows=batch_size,
                              request_timeout_s=request_timeout_s)
    except OSError as e:
        raise ConfigError(f"--host/--port: cannot listen on {host}:{port} ({e.strerror or e})") from None
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        bound_host, bound_port = server.server_address[:2]
        url = f"http://{bound_host}:{bound_port}"
        print(f"fourfold serve-reward: serving {scorer.description} at {url} (POST /score, GET /health)",
              file=out or sys.stdout, flush=True)
        while not stop.wait(0.5):
            pass
        print("fourfold serve-reward: stopped", file=out or sys.stdout, flush=True)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        server.shutdown()
        server.server_close()
    return 0
