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
from typing import Callable, Optional, Sequence

import torch

from fourfold.apps.inference import Scorer as InferenceScorer
from fourfold.apps.inference import load_scorer, score_records
from fourfold.config import ScoreModelConfig, ServeRewardConfig, load_config
from fourfold.data import ResponseRecord
from fourfold.errors import ConfigError, DataError, FourfoldError
from fourfold.models.checks import tokenizer_fingerprint
from fourfold.models.plan import FUNCTION_PART, MODEL, REMOTE, is_weighted, reward_parts
from fourfold.models.reward_fn import load_reward_fn
from fourfold.run.common import quiet_transformers

Scorer = Callable[..., list[float]]
"""``scorer(prompts, responses, finished, columns, input_ids=None, tokenizer=None) -> scores``:
what the server serves (:func:`config_scorer`)."""


class BadRequest(ValueError):
    """A request the server cannot score (answered 400 with its message)."""


def parse_request(body: bytes) -> dict:
    """The request's fields, checked: ``prompts``, ``responses`` (strings) and ``finished`` (bools,
    default all true) of one length, ``columns`` a dict of lists of that length, and optionally
    ``input_ids`` (a list of token ids per row) with ``tokenizer`` (their tokenizer's fingerprint)."""
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
    input_ids, tokenizer = req.get("input_ids"), req.get("tokenizer")
    if input_ids is not None:
        if not (isinstance(input_ids, list) and len(input_ids) == n and all(
                isinstance(row, list) and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in row)
                for row in input_ids)):
            raise BadRequest(f"input_ids: expected a list of {n} lists of token ids (integers >= 0)")
        if not isinstance(tokenizer, str):
            raise BadRequest("tokenizer: expected the fingerprint (a string) of the tokenizer of input_ids")
    return {"prompts": prompts, "responses": responses, "finished": finished, "columns": columns,
            "input_ids": input_ids, "tokenizer": tokenizer if input_ids is not None else None}


def request_shape(request: dict) -> tuple:
    """What requests scored in one batch share: their column names, and whether they bring ids
    (and of which tokenizer)."""
    return tuple(sorted(request["columns"])), request.get("input_ids") is not None, request.get("tokenizer")


@dataclass
class Pending:
    request: dict
    done: threading.Event = field(default_factory=threading.Event)
    scores: Optional[list[float]] = None
    error: Optional[Exception] = None


class Batcher:
    """One scoring thread over a queue of requests: it waits for the first, takes every other that
    arrives within ``window_s`` (up to ``max_rows`` rows, requests of one :func:`request_shape`), scores
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
        batch, rows, shape = [first], len(first.request["responses"]), request_shape(first.request)
        deadline = time.monotonic() + self.window_s
        while rows < self.max_rows:
            try:
                item = self.queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                break
            if request_shape(item.request) != shape:  # other columns, or ids beside text: the next batch
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
            ids = [] if batch[0].request.get("input_ids") is not None else None
            for item in batch:
                for k in joined:
                    joined[k] += item.request[k]
                for k in columns:
                    columns[k] += item.request["columns"][k]
                if ids is not None:
                    ids += item.request["input_ids"]
            kw = {"input_ids": ids, "tokenizer": batch[0].request.get("tokenizer")} if ids is not None else {}
            try:
                scores = self.scorer(joined["prompts"], joined["responses"], joined["finished"], columns, **kw)
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


def describe(scorer: InferenceScorer) -> str:
    """How the ready line and ``/health`` name a scorer: ``reward model DIR``, ``reward function
    NAME``, ``reward server URL``, or the weighted sum of those parts."""
    def one(part) -> str:
        if part.kind == MODEL:
            return f"reward model {part.source}"
        if part.kind == REMOTE:
            return f"reward server {part.source}"
        return f"reward function {part.source if isinstance(part.source, str) else part.source.__qualname__}"

    if not is_weighted(scorer.parts):
        return one(scorer.parts[0])
    return "weighted reward " + " + ".join(f"{p.weight:g} x {p.name} ({one(p)})" for p in scorer.parts)


def config_scorer(m: ScoreModelConfig, *, device: str = "cpu", max_len: Optional[int] = 512,
                  keys: Optional[dict] = None) -> Scorer:
    """The scorer of a score model section ``m`` (`fourfold score`'s keys: a reward model, a LoRA
    reward adapter, functions, a server, weighted), built through the one loader and role
    (:func:`fourfold.apps.inference.load_scorer`), each request's rows scored as `fourfold score`
    scores a file's (:func:`~fourfold.apps.inference.score_records`: laid out as PPO lays out a
    rollout, the functions given the request's columns, matched once per set of column names so a
    defaulted parameter's warning is said once). A request's ``input_ids`` are scored as they are
    when its ``tokenizer`` is this scorer's fingerprint (:mod:`fourfold.models.remote`)."""
    dev = torch.device(device)
    for part in reward_parts(m):  # each function found now; its columns are matched when requests bring them
        if part.kind == FUNCTION_PART and isinstance(part.source, str):
            load_reward_fn(part.source, part.key)
    base = load_scorer(m, dev, None, [], keys=keys)
    fingerprint = tokenizer_fingerprint(base.tokenizer) if base.model is not None else None
    by_columns: dict[tuple, InferenceScorer] = {}
    lock = threading.Lock()

    @torch.no_grad()
    def score(prompts, responses, finished, columns, input_ids=None, tokenizer=None):
        key = tuple(columns)
        if key not in by_columns:
            by_columns[key] = base.for_columns(key, "the request")
            for note in by_columns[key].notes:
                print(f"fourfold serve-reward: warning: {note}", file=sys.stderr, flush=True)
        if input_ids is not None and fingerprint is not None and tokenizer != fingerprint:
            raise DataError(f"input_ids: of the tokenizer {tokenizer}; this server scores with {fingerprint}: send the text only")
        ids_rows = input_ids if fingerprint is not None else None
        records = [ResponseRecord(p, r, f, line=i + 1, source="request", row={c: v[i] for c, v in columns.items()})
                   for i, (p, r, f) in enumerate(zip(prompts, responses, finished))]
        with lock:
            _, scores, _ = score_records(records, by_columns[key], dev, key, max(1, len(records)), max_len,
                                         ids_rows=ids_rows)
        return scores

    score.description = describe(base)
    score.fingerprint = fingerprint
    return score


def model_scorer(model_dir: str, *, device: str = "cpu", dtype: str = "float32", tokenizer: Optional[str] = None,
                 max_len: int = 512, trust_remote_code: bool = False) -> Scorer:
    """The scorer of a reward-model directory (a full one, or a LoRA reward adapter on the base its
    adapter_config names): :func:`config_scorer` of ``model.reward``, checked as PPO checks it
    (a trained score head, no other random weight, the tokenizer's vocabulary), messages naming
    the command's flags."""
    if not Path(model_dir).is_dir():
        raise ConfigError(f"--model: {model_dir}: no such directory (a reward model `fourfold reward` wrote)")
    m = ScoreModelConfig(reward=model_dir, tokenizer=tokenizer, dtype=dtype, trust_remote_code=trust_remote_code)
    return config_scorer(m, device=device, max_len=max_len, keys=FLAG_KEYS)


def function_scorer(spec) -> Scorer:
    """The scorer of a reward function (``file.py:name``, ``module:name`` or a callable):
    :func:`config_scorer` of ``model.reward_fn``, called with the request's columns as keyword
    arguments (those its signature takes)."""
    return config_scorer(ScoreModelConfig(reward_fn=spec))


FLAG_KEYS = {"model.reward": "--model", "model.tokenizer": "--tokenizer"}
"""How messages name the keys `fourfold serve-reward`'s flags set."""


def make_handler(batcher: Batcher, description: str, request_timeout_s: float, fingerprint: Optional[str] = None):
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
                self._reply(200, {"status": "ok", "scorer": description, "tokenizer": fingerprint})
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
    handler = make_handler(batcher, getattr(scorer, "description", "a scorer"), request_timeout_s,
                           getattr(scorer, "fingerprint", None))
    server = RewardHTTPServer((host, port), handler)
    server.daemon_threads = True
    server.batcher = batcher
    threading.Thread(target=server.serve_forever, name="fourfold-reward-server", daemon=True).start()
    return server


def serve(*, model: Optional[str] = None, fn: Optional[str] = None, host: str = "127.0.0.1", port: int = 8000,
          batch_size: int = 512, max_wait_ms: float = 10.0, request_timeout_s: float = 600.0, device: str = "cpu",
          dtype: str = "float32", tokenizer: Optional[str] = None, max_len: int = 512, out=None,
          config: Optional[str] = None, overrides: Sequence[str] = ()) -> int:
    """``fourfold serve-reward``: serve ``model`` (a reward-model directory), ``fn`` (a reward
    function) or the score model section of ``config`` / ``overrides`` (``model.reward_fns=[...]``:
    :class:`~fourfold.config.ServeRewardConfig`) on ``host:port`` until SIGINT or SIGTERM; one line
    on ``out`` (stdout) when it listens: ``fourfold serve-reward: serving <scorer> at
    http://host:port (POST /score, GET /health)``. Bad arguments and a port in use are a
    ConfigError (the CLI's one line, exit 2)."""
    keyed = config is not None or bool(overrides)
    if (model is not None and fn is not None) or (model is None and fn is None and not keyed):
        raise ConfigError("give exactly one of --model DIR (a reward model) and --fn file.py:name (a reward function), "
                          "or the scorer's keys (model.reward_fns=[...], --config FILE)")
    if batch_size < 1:
        raise ConfigError(f"--batch-size: expected an integer >= 1, got {batch_size}")
    if max_wait_ms < 0:
        raise ConfigError(f"--max-wait-ms: expected a number >= 0, got {max_wait_ms}")
    if not 0 <= port <= 65535:
        raise ConfigError(f"--port: expected 0..65535, got {port}")
    quiet_transformers()  # no load report or progress bar on stderr, which holds errors only (as the trainers')
    if keyed:
        flags = [f"model.reward={model}"] * (model is not None) + [f"model.reward_fn={fn}"] * (fn is not None) + \
                [f"model.tokenizer={tokenizer}"] * (tokenizer is not None) + [f"model.dtype={dtype}"]
        m = load_config(ServeRewardConfig, config, [*flags, *overrides]).model
        scorer = config_scorer(m, device=device, max_len=max_len)
    elif model is not None:
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
