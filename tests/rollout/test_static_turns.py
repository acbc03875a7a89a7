"""The static engine's multi-turn rollout against the eager one (sample_turns with engine=...):
from the same per-row noise (and greedy, and torch.multinomial on a generator) the same
trajectories (ids, policy mask, turns, turn rewards, done / truncated), log-probs and entropies
within 1e-5 in float32 (measured: <= 1e-6), with rows that end after different numbers of turns,
turns that end at EOS at different steps, and a row cut by env.max_tokens; the static cache
holds env.max_tokens + 1 slots whatever the turns do, and its compiled step has one shape."""
import pytest
import torch

from fourfold.data.observations import ObservationEncoder
from fourfold.rollout.eager import sample
from fourfold.rollout.env import make_envs
from fourfold.rollout.noise import RowNoise
from fourfold.rollout.static import StaticEngine
from fourfold.rollout.turns import TurnSettings, sample_turns
from fourfold.tasks.tokenizer import build_word_tokenizer

WORDS = [f"w{i}" for i in range(30)]
PROMPTS = ["w1 w2 w3", "w4", "w7 w8", "w9 w10 w11 w12", "w13 w14", "w15"]
TURNS = [1, 2, 3, 0, 2, 3]  # the turn after which each row's environment says done (0: never)
TOL = dict(rtol=0, atol=1e-5)


@pytest.fixture(scope="module")
def tok():
    return build_word_tokenizer(WORDS)


def _model(tok, arch):
    from transformers import AutoModelForCausalLM, GPT2Config, LlamaConfig, Qwen2Config

    V, pad, bos, eos = len(tok), tok.pad_token_id, tok.bos_token_id, tok.eos_token_id
    small = dict(vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=128,
                 pad_token_id=pad, bos_token_id=bos, eos_token_id=eos)
    config = {
        "llama": lambda: LlamaConfig(**small, intermediate_size=48),
        "qwen2": lambda: Qwen2Config(**small, num_key_value_heads=2, intermediate_size=48, tie_word_embeddings=True),
        "gpt2": lambda: GPT2Config(vocab_size=V, n_embd=32, n_layer=2, n_head=4, n_positions=128, pad_token_id=pad,
                                   bos_token_id=bos, eos_token_id=eos),
    }[arch]()
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config).eval()


class _Game:
    """Done after the row's ``turns`` turns (0: never); the observation after turn n is n + 1 words
    (rows' chunks of different widths); the reward reads the action's text."""

    def __init__(self, row):
        self.row, self.n = row, 0

    def reset(self):
        return self.row["prompt"]

    def step(self, action):
        self.n += 1
        return " ".join(["w5", "w6", "w20"][: self.n % 3 + 1]), 0.1 * self.n + len(action.split()), self.n == self.row["turns"]


def _run(model, tok, engine=None, *, eos=None, greedy=False, generator=None, seed=3, max_tokens=30, **kw):
    rows = [{"prompt": p, "turns": t} for p, t in zip(PROMPTS, TURNS)]
    envs = make_envs(_Game, rows, [f"p.jsonl:{i + 1}" for i in range(len(rows))])
    enc = ObservationEncoder(tok)
    first = [enc.first(e.reset(), e.where, 64) for e in envs]
    s = TurnSettings(max_turns=kw.pop("max_turns", 5), max_tokens=max_tokens, max_new_tokens=kw.pop("max_new_tokens", 5),
                     temperature=1.5, eos_token_id=eos, pad_token_id=tok.pad_token_id, greedy=greedy, generator=generator,
                     decode=lambda ids: tok.decode(ids, skip_special_tokens=True), **kw)
    noise = None if greedy or generator is not None else RowNoise(seed, 0).uniforms(range(len(rows)), max_tokens)
    return sample_turns(model, envs, first, s, enc.next, noise=noise, engine=engine)


def _frequent_token(model, tok) -> int:
    """The token the model samples most often after the prompts: as EOS, turns end at different steps."""
    free = _run(model, tok, max_turns=1, max_new_tokens=8)
    return int(torch.bincount(free.samples.responses.flatten(), minlength=len(tok))[4:].argmax()) + 4


def assert_same_trajectories(got, want):
    """Ids, masks, turns, turn rewards, done / truncated / turn counts equal; log-probs and entropies within 1e-5."""
    g, w = got.samples, want.samples
    for key in ("sequences", "attention_mask", "response_mask", "finished"):
        assert torch.equal(getattr(g, key), getattr(w, key)), key
    for key in ("turn_ids", "turn_rewards", "done", "truncated", "n_turns", "observation_tokens"):
        assert torch.equal(getattr(got, key), getattr(want, key)), key
    assert [t.ids for t in got.trajectories] == [t.ids for t in want.trajectories]
    torch.testing.assert_close(g.logprobs, w.logprobs, **TOL)
    torch.testing.assert_close(g.entropy, w.entropy, **TOL)
    assert (g.kept_logmass is None) == (w.kept_logmass is None)
    if w.kept_logmass is not None:
        torch.testing.assert_close(g.kept_logmass, w.kept_logmass, **TOL)


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gpt2"])
def test_static_multi_turn_rollout_gives_the_eager_trajectories(tok, arch):
    model = _model(tok, arch)
    eos = _frequent_token(model, tok)
    want = _run(model, tok, eos=eos)
    engine = StaticEngine()
    got = _run(model, tok, engine, eos=eos)
    assert_same_trajectories(got, want)
    # the case is what it says: rows end after different numbers of turns, some turns at EOS, one
    # row cut by max_tokens (30) before its environment or max_turns (5) ended it
    n_turns = want.n_turns.tolist()
    assert len(set(n_turns)) >= 3 and want.done.any()
    assert 0 < int(want.samples.finished.sum()) and any(
        t.ids[i] == eos for t in want.trajectories for i in range(len(t.ids)) if t.policy[i] and i + 1 < len(t.ids))
    cut = [t for t in want.trajectories if t.truncated and t.n_tokens == 30 and t.n_turns < 5]
    assert cut and len(cut[0].turn_rewards) == cut[0].n_turns - 1  # its cut turn was not stepped
    assert engine.cache_positions == 30 + 1  # the cache: env.max_tokens + 1 slots, fixed up front
    # a second rollout (other noise) on the reused cache
    assert_same_trajectories(_run(model, tok, engine, eos=eos, seed=4), _run(model, tok, eos=eos, seed=4))


def _plain_rollout(model, tok, eos, **kw):
    """The plain single-turn rollout (eager.sample) of the prompts' first observations, left-padded,
    with the row noise and settings the one-turn runs use (``kw``: e.g. the truncation)."""
    enc = ObservationEncoder(tok)
    first = [enc.first(p, "p", 64) for p in PROMPTS]
    width = max(map(len, first))
    ids = torch.tensor([[tok.pad_token_id] * (width - len(f)) + f for f in first])
    mask = torch.tensor([[0] * (width - len(f)) + [1] * len(f) for f in first])
    return sample(model, ids, mask, max_new_tokens=8, temperature=1.5, eos_token_id=eos, pad_token_id=tok.pad_token_id,
                  noise=RowNoise(3, 0).uniforms(range(len(PROMPTS)), 30), **kw)


def test_turns_under_top_k_top_p_on_both_engines_and_as_one_plain_turn(tok):
    """The turn loop's picks apply the sampling filters (TurnSettings.truncation): the static
    engine's trajectories are the eager one's (kept masses too: < 0 on policy tokens somewhere, 0 on
    observations), other than unfiltered turns; one turn is the plain rollout under the same filter."""
    from fourfold.rollout.sampling import Truncation

    model = _model(tok, "llama")
    eos = _frequent_token(model, tok)
    trunc = Truncation(top_k=10, top_p=0.85)
    want = _run(model, tok, eos=eos, truncation=trunc)
    assert_same_trajectories(_run(model, tok, StaticEngine(), eos=eos, truncation=trunc), want)
    kept, policy = want.samples.kept_logmass, want.samples.response_mask.bool()
    assert (kept[policy] < -1e-3).any() and (kept[~policy] == 0).all() and (kept <= 0).all()
    assert want.samples.sequences.tolist() != _run(model, tok, eos=eos).samples.sequences.tolist()
    one = _run(model, tok, eos=eos, max_turns=1, max_new_tokens=8, truncation=trunc)
    plain = _plain_rollout(model, tok, eos, truncation=trunc)
    assert one.samples.sequences.tolist() == plain.sequences.tolist()
    torch.testing.assert_close(one.samples.logprobs, plain.logprobs, **TOL)
    torch.testing.assert_close(one.samples.kept_logmass, plain.kept_logmass, **TOL)


def test_greedy_and_multinomial_turns(tok):
    """Greedy picks, and torch.multinomial on a generator (drawn outside the step, as the eager
    path draws it): the same trajectories, and the generator left where the eager path leaves it."""
    model = _model(tok, "llama")
    eos = _frequent_token(model, tok)
    engine = StaticEngine()
    assert_same_trajectories(_run(model, tok, engine, eos=eos, greedy=True), _run(model, tok, eos=eos, greedy=True))
    g_eager, g_static = torch.Generator().manual_seed(1), torch.Generator().manual_seed(1)
    for _ in range(2):
        want = _run(model, tok, eos=eos, generator=g_eager)
        assert_same_trajectories(_run(model, tok, engine, eos=eos, generator=g_static), want)
        assert torch.equal(g_static.get_state(), g_eager.get_state())


def test_one_turn_on_the_static_engine_is_the_plain_rollout(tok):
    """With one turn and no observation the static multi-turn rollout samples the plain single-turn
    rollout's tokens (eager.sample), log-probs within 1e-5."""
    model = _model(tok, "llama")
    eos = _frequent_token(model, tok)
    batch = _run(model, tok, StaticEngine(), eos=eos, max_turns=1, max_new_tokens=8)
    plain = _plain_rollout(model, tok, eos)
    assert batch.samples.sequences.tolist() == plain.sequences.tolist()
    assert torch.equal(batch.samples.response_mask, plain.response_mask)
    torch.testing.assert_close(batch.samples.logprobs, plain.logprobs, **TOL)


def test_compiled_turn_step_traced_by_dynamo_has_one_shape(tok, monkeypatch):
    """The compiled path (dynamo's trace of the turn step, the guard stance after the first step)
    with dynamo's eager backend: the same trajectories over two rollouts, one compiled shape
    (rows, env.max_tokens + 1) for every turn. Inductor itself: the slow test below."""
    real = torch.compile
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: real(fn, backend="eager", dynamic=False))
    _assert_compiled_turns_are_eager_turns(tok)


@pytest.mark.slow  # inductor compiles the turn step: ~10-40 s on 2 cores
def test_inductor_compiled_turn_step_gives_the_eager_trajectories(tok):
    _assert_compiled_turns_are_eager_turns(tok)


def _assert_compiled_turns_are_eager_turns(tok):
    """Two rollouts of the compiled static engine (whatever torch.compile is now) give the eager
    path's trajectories, with one compiled shape (rows, env.max_tokens + 1) for every turn."""
    torch._dynamo.reset()
    model = _model(tok, "llama")
    eos = _frequent_token(model, tok)
    engine = StaticEngine(compile=True)
    for seed in (3, 4):
        assert_same_trajectories(_run(model, tok, engine, eos=eos, seed=seed), _run(model, tok, eos=eos, seed=seed))
    assert engine.compiled_shapes == {(len(PROMPTS), 31)}


def test_turns_on_an_inference_copy_follow_each_sync(tok):
    """generation.weights: copy: the turns run on the synced copy (the eager path's trajectories),
    and an update reaches them only at the next sync."""
    from fourfold.rollout.weights import CopiedWeights

    model = _model(tok, "llama")
    eos = _frequent_token(model, tok)
    engine = StaticEngine(CopiedWeights())
    engine.sync(model)
    before = _run(model, tok, eos=eos)
    assert_same_trajectories(_run(model, tok, engine, eos=eos), before)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1.5)
    assert_same_trajectories(_run(model, tok, engine, eos=eos), before)  # the copy still holds the old weights
    after = _run(model, tok, eos=eos)
    assert before.samples.logprobs.shape != after.samples.logprobs.shape or \
        not torch.allclose(before.samples.logprobs, after.samples.logprobs)
    engine.sync(model)
    assert_same_trajectories(_run(model, tok, engine, eos=eos), _run(model, tok, eos=eos))


def test_a_sliding_window_shorter_than_the_turn_cache_names_env_max_tokens(tok):
    """The static turn cache holds env.max_tokens + 1 positions; a window of 8 under 31 is refused,
    naming that key (a single-turn rollout's error names prompt + response: tests/rollout/test_engine.py)."""
    from transformers import AutoModelForCausalLM, MistralConfig

    from fourfold.errors import ConfigError

    model = AutoModelForCausalLM.from_config(MistralConfig(
        vocab_size=len(tok), hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=48, max_position_embeddings=128, sliding_window=8, pad_token_id=tok.pad_token_id)).eval()
    with pytest.raises(ConfigError, match=r"sliding window of 8 tokens, shorter than env.max_tokens \+ 1 \(31\); use "
                                          r"generation.engine=eager"):
        _run(model, tok, StaticEngine())
