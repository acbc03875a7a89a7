"""Multi-turn trajectories, token in and token out, and their batched rollout on either engine
(docs/environments.md).

:class:`Trajectory` is one row's trajectory as ids: the first observation (the prompt), then the
policy's turns, kept exactly as sampled, and the environment's later observations, each
tokenised on its own and appended (``encode_next``). Nothing already in it is tokenised again,
so the ids trained on are the ids sampled even where decoding and re-encoding the text would give
others. :func:`stack_trajectories` lays a batch out as the single-turn rollouts do, ``[left-padded
first observation | right-padded rest]``, with ``response_mask`` = the policy mask over the rest.

:func:`sample_turns` runs the turns of a batch: every running row's environment steps after each
turn, the model samples the next turn for the rows still running (the others wait as padding,
attention 0), and one KV cache is kept across turns: only the new observation tokens (and a
turn's last token) are prefilled. A row's n-th policy token is picked at column n of its noise,
so with one turn it samples exactly what :func:`fourfold.rollout.eager.sample` does. The KV cache
is the engine's (``engine.turns``: the eager engine's growing cache, or the static engine's
preallocated one of ``max_tokens`` + 1 slots); the turn loop here is the same for both. Under
torchrun (``sync_stop``) each rank runs its own rows and every rank makes the same forwards (a
sharded model's forward is a collective): a turn's token loop and the turn loop stop only when
every rank's rows have, and an environment's error on one rank is raised on every rank at the
turn's sync (its flag on the same all-reduce).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

import torch

from fourfold import dist
from fourfold.errors import ConfigError
from fourfold.rollout.eager import EagerEngine
from fourfold.rollout.sampling import NO_TRUNCATION, Samples, Truncation, all_finished, choose

EncodeNext = Callable[[object, str, bool], list[int]]
"""``encode_next(observation, where, after_eos) -> ids``: a later observation's ids, ``after_eos``
= the turn before it ended with EOS (``ObservationEncoder.next``)."""


@dataclass
class Trajectory:
    """One row's trajectory: ``prompt`` (the first observation's ids), then ``ids`` with, per id,
    ``policy`` (sampled by the policy), ``turn`` (its turn number, -1 on an observation),
    ``logprobs`` and ``entropy`` (0 on an observation), ``kept`` (under a sampling filter, the log
    of the mass it kept per id up to the last policy turn, 0 on an observation; [] without one);
    ``turn_rewards`` one per stepped turn;
    ``done`` (the environment ended it), ``truncated`` (a limit cut it), ``ended`` (its last turn
    ended by EOS or a stop string)."""

    prompt: list[int]
    ids: list[int] = field(default_factory=list)
    policy: list[bool] = field(default_factory=list)
    turn: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    entropy: list[float] = field(default_factory=list)
    kept: list[float] = field(default_factory=list)
    turn_rewards: list[float] = field(default_factory=list)
    done: bool = False
    truncated: bool = False
    ended: bool = False
    n_turns: int = 0

    @property
    def n_tokens(self) -> int:
        return len(self.prompt) + len(self.ids)

    def add_turn(self, ids: Sequence[int], logprobs: Sequence[float], entropy: Optional[Sequence[float]] = None,
                 kept: Optional[Sequence[float]] = None) -> None:
        """Append a policy turn: its sampled ids as they are, with their log-probs (and entropies,
        and under a sampling filter the log of the mass it kept)."""
        if len(ids) != len(logprobs) or any(x is not None and len(x) != len(ids) for x in (entropy, kept)):
            raise ValueError(f"a turn of {len(ids)} ids needs as many log-probs (and entropies, kept masses)")
        if kept is not None:  # 0 on the observations since the last turn
            self.kept += [0.0] * (len(self.ids) - len(self.kept)) + [float(x) for x in kept]
        self.ids += list(ids)
        self.policy += [True] * len(ids)
        self.turn += [self.n_turns] * len(ids)
        self.logprobs += [float(x) for x in logprobs]
        self.entropy += [float(x) for x in entropy] if entropy is not None else [0.0] * len(ids)
        self.n_turns += 1

    def add_observation(self, ids: Sequence[int]) -> None:
        """Append an observation's ids (tokenised on their own), after everything already there."""
        self.ids += list(ids)
        self.policy += [False] * len(ids)
        self.turn += [-1] * len(ids)
        self.logprobs += [0.0] * len(ids)
        self.entropy += [0.0] * len(ids)

    def turn_ids_of(self, k: int) -> list[int]:
        """The ids of policy turn ``k``."""
        return [i for i, t in zip(self.ids, self.turn) if t == k]


@dataclass
class TurnBatch:
    """A batch of trajectories as tensors. ``samples``: the single-turn layout (``response_mask``
    = policy mask over the rest, ``attention_mask`` 1 on every real token, ``finished`` = the last
    turn ended by EOS or a stop string); ``turn_ids [B, T]`` (-1 off the policy tokens);
    ``turn_rewards [B, N]`` (N: the most turns of a row, stepped or not; 0 past a row's stepped
    turns); ``done``, ``truncated`` ``[B]`` bool; ``n_turns [B]``; ``observation_tokens [B]`` (the later observations' tokens)."""

    samples: Samples
    turn_ids: torch.Tensor
    turn_rewards: torch.Tensor
    done: torch.Tensor
    truncated: torch.Tensor
    n_turns: torch.Tensor
    observation_tokens: torch.Tensor
    trajectories: list[Trajectory]


def _pad(rows: Sequence[Sequence], value, left: bool, dtype, width: int = 0) -> torch.Tensor:
    width = max(width, max((len(r) for r in rows), default=0))
    out = torch.full((len(rows), width), value, dtype=dtype)
    for i, r in enumerate(rows):
        if r:
            if left:
                out[i, width - len(r):] = torch.tensor(list(r), dtype=dtype)
            else:
                out[i, : len(r)] = torch.tensor(list(r), dtype=dtype)
    return out


def stack_trajectories(trajs: Sequence[Trajectory], pad_token_id: int, device=None) -> TurnBatch:
    """The :class:`TurnBatch` of ``trajs``: first observations left-padded, the rest right-padded."""
    prompt = _pad([t.prompt for t in trajs], pad_token_id, True, torch.long)
    prompt_mask = _pad([[1] * len(t.prompt) for t in trajs], 0, True, torch.long)
    rest = _pad([t.ids for t in trajs], pad_token_id, False, torch.long)
    real = _pad([[1] * len(t.ids) for t in trajs], 0, False, torch.long)
    policy = _pad([t.policy for t in trajs], False, False, torch.bool)
    samples = Samples(
        sequences=torch.cat([prompt, rest], 1), attention_mask=torch.cat([prompt_mask, real], 1),
        response_mask=policy.float(), logprobs=_pad([t.logprobs for t in trajs], 0.0, False, torch.float32),
        finished=torch.tensor([t.ended for t in trajs]), entropy=_pad([t.entropy for t in trajs], 0.0, False, torch.float32),
        kept_logmass=_pad([t.kept for t in trajs], 0.0, False, torch.float32, rest.shape[1])
        if any(t.kept for t in trajs) else None)
    # every turn has a column, a last one cut by max_tokens (never stepped: no reward) too
    n_max = max((max(len(t.turn_rewards), t.n_turns) for t in trajs), default=0)
    batch = TurnBatch(
        samples=samples, turn_ids=_pad([t.turn for t in trajs], -1, False, torch.long),
        turn_rewards=_pad([t.turn_rewards + [0.0] * (n_max - len(t.turn_rewards)) for t in trajs], 0.0, False, torch.float32),
        done=torch.tensor([t.done for t in trajs]), truncated=torch.tensor([t.truncated for t in trajs]),
        n_turns=torch.tensor([t.n_turns for t in trajs]),
        observation_tokens=torch.tensor([sum(1 for p in t.policy if not p) for t in trajs]), trajectories=list(trajs))
    if device is not None:
        batch.samples = Samples(*(x.to(device) if x is not None else None for x in (
            samples.sequences, samples.attention_mask, samples.response_mask, samples.logprobs, samples.finished,
            samples.entropy, samples.kept_logmass)))
    return batch


def _widest(lengths: Sequence[int], sync: bool, error: Optional[BaseException] = None) -> int:
    """The longest of ``lengths`` (0 for none), with ``sync`` over every rank's: each rank then pads
    its chunk to the width the one-process batch has, so its rows' forwards are computed on the
    same columns (and round alike). ``error``: this rank's, raised on every rank with any other's
    (:func:`fourfold.dist.all_reduce_checked`: the same all-reduce)."""
    n = max(lengths, default=0)
    return dist.all_reduce_checked([n], error, "MAX")[0] if sync else n


def _all_ended(running: torch.Tensor, sync: bool, error: Optional[BaseException] = None) -> bool:
    """Whether no row is running (with ``sync``: on any rank); ``error``, this rank's environments'
    (None: none), rides on the same all-reduce, and any rank's is raised on every rank."""
    alive = int(running.sum())
    return (dist.all_reduce_checked([alive], error)[0] if sync else alive) == 0


@dataclass
class TurnSettings:
    """How the turns of :func:`sample_turns` run: the ``env`` section's limits, the engine's
    sampling settings (``truncation``: the picks' filters, as the single-turn engines apply them)
    and the tokenizer's ``decode`` (ids -> the action text)."""

    max_turns: int
    max_tokens: int
    max_new_tokens: int
    decode: Callable[[list[int]], str]
    temperature: float = 1.0
    eos_token_id: Optional[int] = None
    pad_token_id: int = 0
    stop: Sequence[str] = ()
    greedy: bool = False
    generator: Optional[torch.Generator] = None
    truncation: Truncation = NO_TRUNCATION


def _sample_turn(cache, trajs: list[Trajectory], running: torch.Tensor, s: TurnSettings,
                 noise: Optional[torch.Tensor], used: torch.Tensor, sync_stop: bool = False):
    """One turn for the ``running`` rows: ``(ids, logprobs, entropies, kept masses per row (None
    without a filter), ended [B], pending [B], used [B])``; ``pending`` = the row's last token is
    not in the cache yet (the loop ends without feeding the final step). ``used [B]``: each row's policy tokens so far (its noise column).
    ``sync_stop``: the loop ends when every rank's rows have finished (finished rows feed padding)."""
    B, device = running.shape[0], running.device
    budget = torch.tensor([min(s.max_new_tokens, s.max_tokens - t.n_tokens) for t in trajs], device=device)
    finished = ~running
    ended = torch.zeros(B, dtype=torch.bool, device=device)
    count = torch.zeros(B, dtype=torch.long, device=device)
    toks, lps, ents, kepts = ([[] for _ in range(B)] for _ in range(4))
    for _ in range(s.max_new_tokens):
        u = None if noise is None else noise.to(device).gather(1, used.clamp(max=noise.shape[1] - 1)[:, None])[:, 0]
        c = choose(cache.logits, finished, s.temperature, s.greedy, s.generator, u, s.eos_token_id, s.pad_token_id,
                   s.truncation)
        alive = c.alive
        used, count = used + alive.long(), count + alive.long()
        for b in alive.nonzero()[:, 0].tolist():
            toks[b].append(int(c.tokens[b]))
            lps[b].append(float(c.logprobs[b]))
            ents[b].append(float(c.entropy[b]))
            if c.kept is not None:
                kepts[b].append(float(c.kept[b]))
            if s.stop and not bool(c.finished[b]) and s.decode(toks[b]).endswith(tuple(s.stop)):
                c.finished[b] = True
        ended = ended | (alive & c.finished)
        finished = c.finished | (count >= budget)
        if all_finished(finished, sync_stop):
            return toks, lps, ents, kepts if s.truncation.active else None, ended, alive, used
        cache.step(c.tokens, alive)
    raise AssertionError("unreachable: every row's budget is at most max_new_tokens")


def _step_envs(envs, trajs: list[Trajectory], running: torch.Tensor, turn: int, s: TurnSettings,
               encode_next: EncodeNext, pending: list[list[int]]) -> list[list[int]]:
    """After a turn: each running row's environment steps on the turn's text (a turn cut by
    ``max_tokens`` is not stepped: the trajectory is truncated), and the rows that go on get their
    observation's ids appended. Returns each row's chunk to prefill (its pending last token and its
    observation's ids; [] for a row that stopped) and updates ``running`` in place."""
    chunks: list[list[int]] = [[] for _ in trajs]
    for b in running.nonzero()[:, 0].tolist():
        traj = trajs[b]
        if not traj.ended and traj.n_tokens >= s.max_tokens:
            traj.truncated, running[b] = True, False
            continue
        obs, reward, done = envs[b].step(s.decode(traj.turn_ids_of(turn)), turn)
        traj.turn_rewards.append(reward)
        if done or turn + 1 == s.max_turns:
            traj.done, traj.truncated, running[b] = done, not done, False
            continue
        turn_ids = traj.turn_ids_of(turn)
        ids = encode_next(obs, envs[b].where, bool(turn_ids) and turn_ids[-1] == s.eos_token_id)
        if traj.n_tokens + len(ids) >= s.max_tokens:  # no room left for a policy token
            traj.truncated, running[b] = True, False
            continue
        traj.add_observation(ids)
        chunks[b] = pending[b] + ids
    return chunks


@torch.no_grad()
def sample_turns(model: torch.nn.Module, envs: Sequence, first_ids: Sequence[list[int]], s: TurnSettings,
                 encode_next: EncodeNext, *, noise: Optional[torch.Tensor] = None, device=None,
                 engine=None, sync_stop: bool = False, failed: Optional[BaseException] = None) -> TurnBatch:
    """The batched multi-turn rollout of ``envs`` (:class:`~fourfold.rollout.env.BoundEnv`, one per
    row, already reset) from their first observations' ids ``first_ids``: turns until each row's
    environment says done or a limit truncates it (``max_turns`` turns; ``max_tokens`` tokens in
    all, a turn cut where they run out). ``noise [B, W]``: a row's n-th policy token is picked at
    ``noise[b, n]`` (:meth:`fourfold.rollout.noise.RowNoise.uniforms`, W >= the most policy tokens
    of a row); without it, ``torch.multinomial`` on ``s.generator``. ``engine``: the rollout
    engine whose turn cache (``engine.turns``) holds the KV cache across turns (None: the eager
    engine over ``model`` itself); the picks, the stop checks and the environments are the same
    code for every engine. ``sync_stop`` (under torchrun,
    ``envs`` this rank's rows): every rank makes the same model calls, a turn's token loop ending
    when every rank's rows have finished it and the turns when every rank's trajectories have
    ended; a rank whose rows wait feeds padding (attention 0). An error of this rank's (a first
    observation too long, ``failed``: one met preparing its rows, an environment's in a turn) is
    then kept until the next all-reduce every rank makes anyway, which carries its flag: every
    rank raises the first failing rank's error there (:func:`fourfold.dist.all_reduce_checked`),
    none waits for the others in a collective until the group's timeout. Returns the :class:`TurnBatch`."""
    device = device or next(model.parameters()).device
    error = failed
    for env, ids in zip(envs, first_ids):
        if error is None and len(ids) >= s.max_tokens:
            error = ConfigError(f"env.max_tokens: the first observation of row {env.where} has {len(ids)} tokens, "
                                f"leaving none of the {s.max_tokens} for the policy")
    if error is not None and not sync_stop:
        raise error
    trajs = [Trajectory(prompt=list(ids)) for ids in first_ids]
    width = _widest([len(i) for i in first_ids], sync_stop, error)  # any rank's error: raised here
    prompt_ids = _pad(first_ids, s.pad_token_id, True, torch.long, width).to(device)
    prompt_mask = _pad([[1] * len(i) for i in first_ids], 0, True, torch.long, width).to(device)
    running = torch.ones(len(trajs), dtype=torch.bool, device=device)
    used = torch.zeros(len(trajs), dtype=torch.long, device=device)
    with (engine or EagerEngine()).turns(model, prompt_ids, prompt_mask, max_tokens=s.max_tokens) as cache:
        for turn in range(s.max_turns):
            toks, lps, ents, kepts, ended, last_alive, used = _sample_turn(cache, trajs, running, s, noise, used,
                                                                           sync_stop)
            for b in running.nonzero()[:, 0].tolist():
                trajs[b].add_turn(toks[b], lps[b], ents[b], None if kepts is None else kepts[b])
                trajs[b].ended = bool(ended[b])
            pending = [toks[b][-1:] if bool(last_alive[b]) else [] for b in range(len(trajs))]
            error = None
            try:
                chunks = _step_envs(envs, trajs, running, turn, s, encode_next, pending)
            except Exception as e:  # one rank's environment: every rank raises it at the sync below
                if not sync_stop:
                    raise
                error = e
            if _all_ended(running, sync_stop, error):  # every trajectory (of every rank) has ended
                break
            width = max(1, _widest([len(c) for c in chunks], sync_stop))  # rows that wait: padding
            ids = _pad(chunks, s.pad_token_id, True, torch.long, width).to(device)
            mask = _pad([[1] * len(c) for c in chunks], 0, True, torch.long, width).to(device)
            cache.feed(ids, mask)
    return stack_trajectories(trajs, s.pad_token_id, device)
