"""`fourfold generate` and `fourfold score`: a trained model used on its own, with the conventions
of training.

* :func:`generate` - a causal LM and a prompts source in, ``run.output_dir/completions.jsonl`` out:
  one row per prompt, in order, with ``prompt`` (the text the model saw: a chat ``messages`` row is
  rendered with the tokenizer's chat template, as PPO renders it), ``response`` (decoded, special
  tokens skipped, nothing after EOS), ``finished`` (the response ended with EOS) and
  ``response_tokens`` (generated tokens, EOS included). Prompts are read and tokenised as PPO reads
  ``data.prompts`` (:func:`fourfold.data.load_prompts`, :func:`fourfold.data.encode_prompts`), left-
  padded in batches of ``data.batch_size`` and sampled by the engine of ``generation.engine``
  (:func:`fourfold.rollout.engine.make_engine`: eager by default, or static) under PPO's generation
  settings (or greedily), with ``torch.multinomial`` on one generator seeded with ``run.seed``: the
  same config gives the same completions, with either engine.
* :func:`score` - a reward model (or a reward function) and prompt/response rows in,
  ``run.output_dir/scores.jsonl`` out: each row as read plus ``score``. A reward model scores a row
  exactly as PPO's :func:`fourfold.rollout.score.score_rollout` scores a rollout: prompt ids as PPO tokenises
  them (BOS first), response ids followed by EOS when the row is ``finished`` (default true),
  prompt left-padded and response right-padded (:mod:`fourfold.data.responses`), the score read at
  the last valid token by :class:`~fourfold.models.roles.ModelReward`, with the normalisation shift
  (``fourfold_score_shift`` in ``config.json``) added as in training. A reward function gets the
  prompt texts and responses and the rows' other columns, as in PPO; chat rows are rendered with
  ``model.tokenizer``'s chat template (the reward model's tokenizer by default), as PPO renders them
  with the policy's: a reward function without a tokenizer refuses chat rows. Several weighted
  parts (``model.reward_fns``, ``model.reward_weight``) write each part beside the score (``parts``).

The model is built as the trainers build theirs (:func:`fourfold.models.build.build_roles` over
:func:`fourfold.models.plan.plan_inference`) and checked by the same
:class:`~fourfold.models.checks.RoleChecker` (the role's head, no random weights, the tokenizer's
vocabulary). Both commands start as one-process runs (:func:`fourfold.run.scaffold.one_process_start`),
write their file atomically (a reader never sees half of it) with the resolved config beside it,
and print one summary line.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Optional

import torch

from fourfold.atomic import write_text_atomic
from fourfold.config import GenerateConfig, RunConfig, ScoreConfig, save_config
from fourfold.data import (
    RESPONSE_FIELDS,
    LoadResult,
    ResponseExample,
    chat_template_renderer,
    collate_responses,
    encode_prompts,
    encode_responses,
    left_pad,
    load_prompts,
    load_responses,
    location,
    other_columns,
)
from fourfold.errors import ConfigError, DataError
from fourfold.models.build import build_roles
from fourfold.models.loading import load_tokenizer
from fourfold.models.plan import REMOTE, plan_inference, reward_parts
from fourfold.models.reward_parts import load_functions, reward_role
from fourfold.rollout.engine import make_engine
from fourfold.rollout.sampling import decode_responses
from fourfold.run.common import skipped_lines
from fourfold.run.scaffold import one_process_start
from fourfold.sinks import eta_s

__all__ = ["generate", "sample_completions", "score"]


# ---------------------------------------------------------------------------------------------
# shared pieces
# ---------------------------------------------------------------------------------------------


def _prepare(cfg, run: RunConfig) -> tuple[Path, torch.device]:
    """The one-process start (torchrun refused, threads, the device), then the output directory
    (created; a rerun writes its files again) with the resolved config."""
    device = one_process_start(cfg)
    out = Path(run.output_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
        save_config(cfg, out / "config.yaml")
    except OSError as e:
        raise ConfigError(f"run.output_dir: {out}: cannot write there ({e.strerror or e})") from None
    return out, device


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    """All rows at once, atomically (values JSON cannot hold, e.g. dates from Parquet, as strings)."""
    text = "".join(json.dumps(row, ensure_ascii=False, default=str) + "\n" for row in rows)
    try:
        write_text_atomic(path, text)
    except OSError as e:
        raise ConfigError(f"run.output_dir: {path}: cannot write ({e.strerror or e})") from None


def _warn_skipped(command: str, loaded: LoadResult) -> None:
    """One warning line on stdout (where every line of a run goes) for the rows skipped, then one per
    note on the data as a whole."""
    for line in skipped_lines(loaded.skipped, loaded.notes):
        print(f"fourfold {command}: warning: {line}", flush=True)


def _max_positions(model) -> int | None:
    n = getattr(model.config, "max_position_embeddings", None)
    return int(n) if isinstance(n, int) else None


# ---------------------------------------------------------------------------------------------
# generate
# ---------------------------------------------------------------------------------------------


def load_generator(cfg: GenerateConfig, device: torch.device):
    """(tokenizer, causal LM in eval mode) as the trainers build and check a policy: a sequence
    classifier, a model with random weights or another vocabulary is refused."""
    roles = build_roles(plan_inference("generate", cfg.model), device)
    return roles.tokenizer, roles.policy.eval()


def _check_room(examples, loaded: LoadResult, max_new_tokens: int, n_positions: int | None) -> None:
    """A prompt that, with max_new_tokens, would run past the model's positions is an error."""
    if n_positions is None:
        return
    for e in examples:
        if len(e.input_ids) + max_new_tokens > n_positions:
            raise DataError(f"{location(loaded.source, e.line)}: prompt has {len(e.input_ids)} tokens; with "
                            f"generation.max_new_tokens={max_new_tokens} that is more than the model's "
                            f"max_position_embeddings={n_positions}")


class Progress:
    """A progress line of a long loop on stdout (where every line of a command goes), at most one
    each ``every_s`` seconds and one at the end when any was printed: ``<prefix> done/total <unit>
    (elapsed s, about eta s left)``, the ETA from the rate so far. ``clock``: seconds (tests give their own)."""

    EVERY_S = 10.0
    """The default interval between two lines, in seconds."""

    def __init__(self, prefix: str, unit: str, every_s: Optional[float] = None, clock=None):
        import time

        self.prefix, self.unit = prefix, unit
        self.every_s = self.EVERY_S if every_s is None else every_s
        self.clock = clock or time.monotonic
        self.start = self.last = self.clock()
        self.printed = 0

    def line(self, done: int, total: int) -> str:
        elapsed = self.clock() - self.start
        eta = eta_s(elapsed, done, total - done) or 0.0  # the rate so far, as the trainers' lines
        return f"{self.prefix} {done}/{total} {self.unit} ({elapsed:.0f} s, about {eta:.0f} s left)"

    def __call__(self, done: int, total: int) -> None:
        now = self.clock()
        if now - self.last >= self.every_s or (done == total and self.printed):
            print(self.line(done, total), flush=True)
            self.last, self.printed = now, self.printed + 1


def sample_completions(cfg, tok, model, device: torch.device, repeat: int = 1, with_columns: bool = False,
                       progress=None) -> tuple[LoadResult, list[dict]]:
    """(the prompts as loaded, one row per sampled response): ``cfg.data``'s prompts read and tokenised
    as PPO reads them, each ``repeat`` times in a row, sampled by ``cfg.generation``'s engine in
    batches of ``data.batch_size`` with one generator seeded with ``cfg.run.seed``. A row holds
    ``prompt``, ``response``, ``finished``, ``response_tokens``. What `fourfold generate` writes
    (``repeat`` = 1) and `fourfold bon` draws its candidates from (``repeat`` = bon.n); with
    ``with_columns`` a row also holds ``columns``, its prompt row's other columns (for a reward
    function that reads them); ``progress(done, total)`` is called after each batch (:class:`Progress`)."""
    data, gen = cfg.data, cfg.generation
    # the prompts, rendered and tokenised as PPO does (chat messages through the chat template)
    loaded = load_prompts(data.prompts, on_error=data.on_error, chat_template=chat_template_renderer(tok))
    examples = encode_prompts(loaded.records, tok, data.max_prompt_len, on_error=data.on_error,
                              skipped=loaded.skipped, notes=loaded.notes)
    if not examples:
        raise DataError(f"{loaded.source}: no usable prompts ({loaded.num_skipped} skipped; first: {loaded.skipped[0]})")
    _check_room(examples, loaded, gen.max_new_tokens, _max_positions(model))
    examples = [e for e in examples for _ in range(repeat)]
    generator = torch.Generator(device=device)
    generator.manual_seed(cfg.run.seed)
    engine = make_engine(gen, max_prompt_len=data.max_prompt_len)
    engine.sync(model)
    rows = []
    for start in range(0, len(examples), data.batch_size):
        batch = examples[start : start + data.batch_size]
        ids, mask = left_pad([e.input_ids for e in batch], tok.pad_token_id)  # (B, P)
        samples = engine(
            model, ids.to(device), mask.to(device),
            max_new_tokens=gen.max_new_tokens, temperature=gen.temperature,
            eos_token_id=tok.eos_token_id if gen.stop_at_eos else None, pad_token_id=tok.pad_token_id,
            generator=generator, greedy=gen.greedy,
        )
        texts = decode_responses(tok, samples)
        lengths = samples.response_mask.sum(1).long().tolist()
        for e, text, done, n in zip(batch, texts, samples.finished.tolist(), lengths):
            rows.append({"prompt": loaded[e.index].prompt, "response": text, "finished": bool(done),
                         "response_tokens": int(n), **({"columns": loaded[e.index].columns} if with_columns else {})})
        if progress is not None:
            progress(len(rows), len(examples))
    return loaded, rows


def generate(cfg: GenerateConfig) -> dict:
    """Write ``completions.jsonl`` (see the module docstring); returns ``{"output", "completions",
    "skipped", "finished"}`` (finished: the share of responses that ended with EOS)."""
    out, device = _prepare(cfg, cfg.run)
    tok, model = load_generator(cfg, device)
    loaded, rows = sample_completions(cfg, tok, model, device)
    path = out / "completions.jsonl"
    _write_jsonl(path, rows)
    _warn_skipped("generate", loaded)
    finished = sum(r["finished"] for r in rows) / len(rows)
    print(f"fourfold generate: {len(rows)} completions ({finished:.0%} ended with EOS) -> {path}")
    return {"output": str(path), "completions": len(rows), "skipped": loaded.num_skipped, "finished": finished}


# ---------------------------------------------------------------------------------------------
# score
# ---------------------------------------------------------------------------------------------


def load_reward_scorer(cfg: ScoreConfig, device: torch.device, keys: Optional[dict] = None):
    """(tokenizer, :class:`ModelReward`) as PPO builds and checks ``model.reward``: a model without
    a trained score head (a causal LM would score with a random one), with other random weights
    or another vocabulary is refused; a LoRA reward adapter is loaded on its base. ``keys``: how
    messages name the config keys (:func:`~fourfold.models.plan.plan_inference`)."""
    roles = build_roles(plan_inference("score", cfg.model, keys), device)
    return roles.tokenizer, roles.reward


def _max_len(cfg: ScoreConfig, model) -> int:
    """``data.max_len``, or the model's max_position_embeddings (512 without one); a max_len the
    model cannot take is an error before any row is read."""
    n_positions = _max_positions(model)
    if cfg.data.max_len is None:
        return n_positions or 512
    if n_positions is not None and cfg.data.max_len > n_positions:
        raise ConfigError(f"data.max_len: {cfg.data.max_len} is more than the reward model's "
                          f"max_position_embeddings={n_positions}")
    return cfg.data.max_len


@dataclass
class Scorer:
    """What `fourfold score`, `fourfold bon` and `fourfold serve-reward` score with: the reward role
    built as PPO builds it (:func:`fourfold.models.reward_parts.reward_role`: a reward model,
    functions, a server, their weighted sum), the tokenizer that lays rows out (the reward model's,
    ``model.tokenizer``'s, or None), the reward model (its role's ``model``; None without one), the
    warning lines on columns a function cannot get, and what :meth:`for_columns` rebuilds the role
    from (the parts, the reward model's role)."""

    reward: object
    tokenizer: object
    model: object
    notes: list
    parts: tuple = ()
    model_role: object = None

    def with_functions(self, functions: dict, notes: list) -> "Scorer":
        """The same scorer with its reward role put together from ``functions`` (the function
        parts loaded and matched against some columns: :func:`load_functions`) and ``notes``."""
        reward = reward_role(self.parts, model_role=self.model_role, functions=functions,
                             eos_token_id=getattr(self.tokenizer, "eos_token_id", None), tokenizer=self.tokenizer)
        return replace(self, reward=reward, notes=list(notes))

    def for_columns(self, columns: tuple, source: str) -> "Scorer":
        """The same scorer with its functions matched against ``columns`` (the reward server's
        requests bring their own), and the warning lines of that match."""
        return self.with_functions(*load_functions(self.parts, columns, source))

    @property
    def lays_out_rows(self) -> bool:
        """Whether the rows are tokenised for the role (a reward model's, or a server's ids and
        EOS): with a tokenizer and a model or a server part."""
        return self.tokenizer is not None and (self.model is not None or any(p.kind == REMOTE for p in self.parts))


def scorer_functions(m, columns: tuple, source: str) -> tuple[dict, list]:
    """Before any model loads or anything is written: each function part of the score model section
    ``m`` (`fourfold score`'s ``model``, `fourfold bon`'s ``scorer``) loaded and its parameters matched
    against ``columns``, the data file ``source``'s other columns (a function naming one the file
    lacks, or an option it does not take, is one ConfigError line); and the warning lines."""
    return load_functions(reward_parts(m), columns, str(source))


def load_scorer(m, device: torch.device, functions: Optional[dict], notes: list, keys: Optional[dict] = None) -> Scorer:
    """The :class:`Scorer` of a score model section ``m``, its functions from
    :func:`scorer_functions`: the reward model built and checked as PPO builds it, and the parts put
    together in the one reward role (``keys``: how messages name the keys, as
    :func:`load_reward_scorer`; ``functions`` None: no role yet, :meth:`Scorer.for_columns` builds it
    once the columns are known)."""
    model_role = None
    if m.reward is not None:
        tok, model_role = load_reward_scorer(ScoreConfig(model=m), device, keys)
    else:
        tok = load_tokenizer(m.tokenizer, trust_remote_code=m.trust_remote_code) if m.tokenizer else None
    model = model_role.model if model_role is not None else None
    scorer = Scorer(None, tok, model, list(notes), reward_parts(m), model_role)
    return scorer if functions is None else scorer.with_functions(functions, notes)


def _examples(records: list, scorer: Scorer, max_len: Optional[int], on_error: str, skipped, notes, ids_rows):
    """The rows as the role reads them: tokenised as PPO lays out a rollout (``ids_rows``, a
    server's request's token ids, taken as they are), or None when no part reads ids."""
    if not scorer.lays_out_rows:
        return None
    if max_len is None:
        max_len = (_max_positions(scorer.model) or 512) if scorer.model is not None else 1 << 30
    if ids_rows is not None:
        for i, row in enumerate(ids_rows):
            if not 0 < len(row) <= max_len:
                raise DataError(f"input_ids[{i}]: {len(row)} tokens; expected 1 to max_len={max_len}")
        return [ResponseExample(prompt_ids=list(row), response_ids=[], index=i, line=i + 1)
                for i, row in enumerate(ids_rows)]
    return encode_responses(records, scorer.tokenizer, max_len, on_error=on_error,
                            skipped=skipped if skipped is not None else [], notes=notes if notes is not None else [])


@torch.no_grad()
def score_records(records: list, scorer: Scorer, device: torch.device, columns: tuple, batch_size: int,
                  max_len: int | None = None, on_error: str = "raise", skipped=None, notes=None, progress=None,
                  ids_rows: Optional[list] = None):
    """(records scored, scores, parts) in batches of ``batch_size``: with a reward model or a server
    and a tokenizer each batch laid out as PPO lays out a rollout (rows longer than ``max_len``,
    default the model's positions, refused or skipped by ``on_error``; ``ids_rows``: each row's
    tokens given as they are, a reward server's request's), the reward role given the rows' texts,
    ``columns`` (from each record's ``row``) and ``finished`` as PPO gives them; ``parts``: a
    weighted reward's, name -> scores (empty for one source)."""
    tok, reward = scorer.tokenizer, scorer.reward
    examples = _examples(records, scorer, max_len, on_error, skipped, notes, ids_rows)
    indices = [e.index for e in examples] if examples is not None else list(range(len(records)))
    done, scores, parts = [], [], {}
    for start in range(0, len(indices), batch_size):
        batch = [records[i] for i in indices[start : start + batch_size]]
        if examples is not None:
            ids, mask = collate_responses(examples[start : start + batch_size], tok.pad_token_id)
        else:  # a function reads only the placeholder's device
            ids, mask = torch.zeros((len(batch), 0), dtype=torch.long), None
        mask = mask.to(device) if mask is not None else None
        cols = {c: [r.row.get(c) for r in batch] for c in columns}
        kw = {"columns": cols} if cols and getattr(reward, "needs_text", False) else {}
        if getattr(reward, "takes_finished", False):
            kw["finished"] = [r.finished for r in batch]
        scores += reward(ids.to(device), mask, [r.prompt for r in batch], [r.response for r in batch], **kw
                         ).float().cpu().tolist()
        for name, part in getattr(reward, "last_parts", {}).items():
            parts.setdefault(name, []).extend(part.float().cpu().tolist())
        done += batch
        if progress is not None:
            progress(len(done), len(indices))
    return done, scores, parts


def _chat_refuser(seen: list):
    """A stand-in chat template for a reward function without a tokenizer: it notes that a chat row
    came (the caller refuses the file) and renders nothing."""
    def render(messages):
        seen.append(True)
        return "chat"

    return render


def score(cfg: ScoreConfig) -> dict:
    """Write ``scores.jsonl`` (see the module docstring); returns ``{"output", "scored", "skipped",
    "mean"}``."""
    m, data = cfg.model, cfg.data
    # the reward functions against the rows' columns, before any model loads or anything is written
    columns = other_columns(data.rows, RESPONSE_FIELDS)
    functions, notes = scorer_functions(m, columns, str(data.rows))
    out, device = _prepare(cfg, cfg.run)
    scorer = load_scorer(m, device, functions, notes)
    tok = scorer.tokenizer
    chat = []
    render = chat_template_renderer(tok) if tok is not None else _chat_refuser(chat)
    loaded = load_responses(data.rows, on_error=data.on_error, chat_template=render)
    if chat:
        raise ConfigError(f"model.tokenizer: {data.rows} has chat rows ('messages'), which PPO renders with the "
                          "policy tokenizer's chat template: set model.tokenizer (the policy's directory) to score "
                          "them as it does")
    loaded.notes.extend(scorer.notes)
    max_len = _max_len(cfg, scorer.model) if scorer.model is not None else None
    records, scores, parts_scored = score_records(loaded.records, scorer, device, columns, data.batch_size, max_len,
                                                  data.on_error, loaded.skipped, loaded.notes)
    if not records:
        raise DataError(f"{loaded.source}: no usable rows ({loaded.num_skipped} skipped; first: {loaded.skipped[0]})")
    path = out / "scores.jsonl"
    rows = [{**r.row, "score": s} for r, s in zip(records, scores)]
    for name, values in parts_scored.items():
        for row, value in zip(rows, values):
            row.setdefault("parts", {})[name] = value
    _write_jsonl(path, rows)
    _warn_skipped("score", loaded)
    mean = sum(scores) / len(scores)
    print(f"fourfold score: {len(scores)} rows scored (mean {mean:.4g}) -> {path}")
    return {"output": str(path), "scored": len(scores), "skipped": loaded.num_skipped, "mean": mean}
