"""A reward role served by another process (``model.reward_url``): the client of
``fourfold serve-reward`` (:mod:`fourfold.apps.reward_server`).

The protocol, JSON over HTTP (docs/rewards.md):

* ``POST /score`` with ``{"prompts": [str], "responses": [str], "finished": [bool], "columns":
  {name: [value]}}`` (every list one entry per response; ``finished``: the response ended with
  EOS; ``columns`` optional) answers ``{"scores": [float]}``; a bad request answers 400 with
  ``{"error": str}``, a failure of the scorer 500 with the same.
  A request may also hold ``"input_ids": [[int]]`` (each row's valid tokens, prompt + response as
  the run laid them out, a sampled special token included) and ``"tokenizer": str`` (their
  tokenizer's :func:`~fourfold.models.checks.tokenizer_fingerprint`): a reward-model server whose
  tokenizer has that fingerprint scores those ids, exactly the tokens a local reward model would
  score, instead of encoding the decoded text again (which drops a sampled pad or BOS).
* ``GET /health`` answers ``{"status": "ok", "scorer": str, "tokenizer": str or null}`` (the
  fingerprint of the tokenizer a reward-model server scores with; null for a function).

The client sends ids only when the server's fingerprint (asked once, at its first request) is its
run's tokenizer's; otherwise it sends the text as the loop decoded it, which the server's tokenizer
encodes again, as a local reward model with a tokenizer of its own does
(:class:`~fourfold.models.roles.RetokenizingReward`).

A request that times out, cannot connect or gets a 5xx answer is retried ``retries`` times, waiting
``backoff_s`` and then twice as long each time; a 4xx answer is not retried. When every try has
failed the role raises :class:`~fourfold.errors.RewardServerError` naming the URL and the last error.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from typing import Callable, Optional, Sequence

import torch

from fourfold.errors import RewardServerError
from fourfold.models.checks import tokenizer_fingerprint
from fourfold.models.reward_fn import check_scores
from fourfold.models.roles import ends_with_eos


def post_json(url: str, payload: dict, timeout_s: float) -> dict:
    """One POST of ``payload`` as JSON; the decoded JSON answer. Raises urllib's errors as they are."""
    data = json.dumps(payload).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(request, timeout=timeout_s) as answer:
        return json.loads(answer.read())


def get_json(url: str, timeout_s: float) -> dict:
    with urllib.request.urlopen(url, timeout=timeout_s) as answer:
        return json.loads(answer.read())


def with_retries(call: Callable[[], dict], url: str, retries: int, backoff_s: float,
                 sleep: Callable[[float], None] = time.sleep) -> dict:
    """``call()``, tried ``1 + retries`` times while it fails for a reason worth another try (no
    connection, a timeout, a 5xx answer), sleeping ``backoff_s * 2**k`` before try ``k + 2``; a 4xx
    answer or the last failure is a RewardServerError naming ``url``."""
    last = ""
    for attempt in range(retries + 1):
        if attempt:
            sleep(backoff_s * 2 ** (attempt - 1))
        try:
            return call()
        except urllib.error.HTTPError as e:
            last = f"HTTP {e.code}: {_error_text(e)}"
            if e.code < 500:
                raise RewardServerError(f"model.reward_url: {url} refused the request ({last})") from None
        except (urllib.error.URLError, TimeoutError, ConnectionError, OSError) as e:
            last = f"{type(e).__name__}: {getattr(e, 'reason', e)}"
        except json.JSONDecodeError as e:
            last = f"an answer that is not JSON ({e})"
    raise RewardServerError(f"model.reward_url: {url} did not answer after {retries + 1} tries (last: {last})")


def _error_text(e: urllib.error.HTTPError) -> str:
    try:
        return str(json.loads(e.read()).get("error", e.reason))
    except (ValueError, AttributeError, OSError):
        return str(e.reason)


class RemoteReward:
    """The reward role of ``model.reward_url``: responses scored by a reward server.

    ``url``: the server's base URL (``http://127.0.0.1:8000``); ``timeout_s`` per request;
    ``retries`` and ``backoff_s`` as :func:`with_retries`; ``eos_token_id``: the policy's EOS, to
    tell the server which responses finished (from the token at each row's last valid position);
    ``tokenizer``: the run's, whose fingerprint decides whether the rows' ids are sent (module
    docstring)."""

    needs_text = True
    takes_finished = True

    def __init__(self, url: str, *, timeout_s: float = 60.0, retries: int = 3, backoff_s: float = 1.0,
                 eos_token_id: Optional[int] = None, tokenizer=None):
        self.url = url.rstrip("/")
        self.timeout_s, self.retries, self.backoff_s, self.eos_token_id = timeout_s, retries, backoff_s, eos_token_id
        self.name = self.url
        self.fingerprint = tokenizer_fingerprint(tokenizer) if tokenizer is not None else None
        self.sends_ids: Optional[bool] = None if self.fingerprint is not None else False  # None: not asked yet

    def health(self, retries: Optional[int] = None) -> dict:
        """The server's ``GET /health`` answer, tried as a request is (``retries``: this many instead)."""
        retries = self.retries if retries is None else retries
        return with_retries(lambda: get_json(self.url + "/health", self.timeout_s), self.url, retries, self.backoff_s)

    def _sends_ids(self) -> bool:
        """Whether the server scores with the run's tokenizer, asked once (a server that cannot say,
        or is not up yet, gets text now and is asked again at the next request)."""
        if self.sends_ids is None:
            try:
                answer = self.health(retries=0)
            except RewardServerError:
                return False
            self.sends_ids = isinstance(answer, dict) and answer.get("tokenizer") == self.fingerprint
        return self.sends_ids

    def finished(self, input_ids: torch.Tensor, attention_mask: Optional[torch.Tensor]) -> list[bool]:
        """Whether each row's last valid token is EOS (all true without an ``eos_token_id``)."""
        if attention_mask is None:
            return [True] * input_ids.shape[0]
        return ends_with_eos(input_ids, attention_mask, self.eos_token_id)

    def score_texts(self, prompts: Sequence[str], responses: Sequence[str], finished: Sequence[bool],
                    columns: Optional[dict] = None, input_ids: Optional[list] = None) -> list[float]:
        payload = {"prompts": list(prompts), "responses": list(responses), "finished": [bool(f) for f in finished]}
        if columns:
            payload["columns"] = {k: list(v) for k, v in columns.items()}
        if input_ids is not None:
            payload["input_ids"], payload["tokenizer"] = input_ids, self.fingerprint
        answer = with_retries(lambda: post_json(self.url + "/score", payload, self.timeout_s), self.url, self.retries,
                              self.backoff_s)
        scores = answer.get("scores") if isinstance(answer, dict) else answer
        return check_scores(scores, len(responses), "the server", key=f"model.reward_url: {self.url}")

    def __call__(self, input_ids, attention_mask, prompts, responses, columns=None, finished=None) -> torch.Tensor:
        """The server's scores of the rows; ``finished`` (one bool per row) when the caller knows
        it, else read from the ids (:meth:`finished`)."""
        if finished is None:
            finished = self.finished(input_ids, attention_mask)
        ids = None
        if attention_mask is not None and input_ids.shape[1] > 0 and self._sends_ids():
            ids = [row[m > 0].tolist() for row, m in zip(input_ids.cpu(), attention_mask.cpu())]
        scores = self.score_texts(prompts, responses, finished, columns, ids)
        return torch.as_tensor(scores, dtype=torch.float32).to(input_ids.device)
