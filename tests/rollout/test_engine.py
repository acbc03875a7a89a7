"""The static engine against the eager one: the same tokens, masks and finished flags from the same
per-row noise (and greedy), log-probs and entropies within 1e-5 in float32, over left-padded
prompts of mixed lengths with rows that stop early, for every supported architecture, LoRA (merged
into an inference copy, and not), and compiled. Plus the engine's weights (live / copy) and sync."""
import pytest
import torch

from fourfold.rollout.eager import EagerEngine, sample
from fourfold.rollout.engine import make_engine
from fourfold.rollout.noise import RowNoise
from fourfold.rollout.static import StaticEngine
from fourfold.rollout.weights import AutoWeights, CopiedWeights, GatheredWeights, LiveWeights

V, PAD = 60, 0
TOL = dict(rtol=0, atol=1e-5)


def _model(arch: str, seed: int = 0):
    from transformers import AutoModelForCausalLM, GPT2Config, LlamaConfig, MistralConfig, Qwen2Config

    small = dict(vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=128,
                 pad_token_id=PAD)
    config = {
        "llama": lambda: LlamaConfig(**small, intermediate_size=48),
        "qwen2": lambda: Qwen2Config(**small, num_key_value_heads=2, intermediate_size=48, tie_word_embeddings=True),
        "mistral": lambda: MistralConfig(**small, num_key_value_heads=1, intermediate_size=40, sliding_window=None),
        "mistral-window": lambda: MistralConfig(**small, num_key_value_heads=2, intermediate_size=40, sliding_window=4096),
        "gpt2": lambda: GPT2Config(vocab_size=V, n_embd=32, n_layer=2, n_head=4, n_positions=128, pad_token_id=PAD,
                                   bos_token_id=1, eos_token_id=2),
    }[arch]()
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config).eval()


def _prompts(rows: int = 12, width: int = 7):
    """Left-padded prompts of lengths 1 .. width (mixed)."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, V, (rows, width), generator=g)
    lengths = torch.arange(rows) % width + 1
    mask = (torch.arange(width)[None, :] >= width - lengths[:, None]).long()
    return ids * mask, mask


def _frequent_token(model, ids, mask, T: int, greedy: bool = False) -> int:
    """The token the model samples (or picks greedily) most often: as EOS, rows stop early and at
    different steps."""
    s = sample(model, ids, mask, max_new_tokens=T, temperature=2.0, eos_token_id=None, pad_token_id=PAD,
               noise=None if greedy else RowNoise(0, 9).uniforms(range(ids.shape[0]), T), greedy=greedy)
    return int(torch.bincount(s.responses.flatten(), minlength=V)[3:].argmax()) + 3


def _kw(ids, T: int, eos, greedy: bool) -> dict:
    noise = None if greedy else RowNoise(1, 2).uniforms(range(ids.shape[0]), T)
    return dict(max_new_tokens=T, temperature=2.0, eos_token_id=eos, pad_token_id=PAD, noise=noise)


def assert_same_samples(got, want):
    """Tokens, masks and finished flags equal; log-probs and entropies within 1e-5."""
    assert got.response_mask.shape == want.response_mask.shape
    for key in ("sequences", "attention_mask", "response_mask", "finished"):
        assert torch.equal(getattr(got, key), getattr(want, key)), key
    torch.testing.assert_close(got.logprobs, want.logprobs, **TOL)
    torch.testing.assert_close(got.entropy, want.entropy, **TOL)
    assert (got.kept_logmass is None) == (want.kept_logmass is None)
    if want.kept_logmass is not None:
        torch.testing.assert_close(got.kept_logmass, want.kept_logmass, **TOL)


@pytest.mark.parametrize("arch", ["llama", "qwen2", "mistral", "mistral-window", "gpt2"])
@pytest.mark.parametrize("greedy", [False, True], ids=["sampled", "greedy"])
def test_static_engine_gives_the_eager_tokens(arch, greedy):
    model = _model(arch)
    ids, mask = _prompts()
    T = 24
    eos = _frequent_token(model, ids, mask, T, greedy)
    kw = _kw(ids, T, eos, greedy)
    if greedy:
        kw.pop("noise")
        want = sample(model, ids, mask, greedy=True, **kw)
        got = StaticEngine(check_every=5)(model, ids, mask, greedy=True, **kw)
    else:
        want = sample(model, ids, mask, **kw)
        got = StaticEngine(check_every=5)(model, ids, mask, **kw)
    assert want.finished.any()
    assert_same_samples(got, want)


FILTERS = {"top-k": dict(top_k=8), "top-p": dict(top_p=0.9), "top-k-top-p-min-p": dict(top_k=20, top_p=0.8, min_p=0.05)}


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("filters", list(FILTERS))
def test_static_engine_gives_the_eager_tokens_under_top_k_top_p_min_p(arch, filters):
    """Both engines built from one generation section with the filters on (make_engine): the same
    tokens from the same per-row noise, and from torch.multinomial on the same generator (left
    where the eager engine leaves it); log-probs, entropies and kept masses within 1e-5. The filters
    change the samples (other tokens than unfiltered sampling) and remove mass (kept < 1)."""
    model = _model(arch)
    ids, mask = _prompts()
    T = 24
    eos = _frequent_token(model, ids, mask, T)
    kw = _kw(ids, T, eos, greedy=False)
    eager = make_engine(_gen(**FILTERS[filters]))
    static = make_engine(_gen(engine="static", stop_check_every=5, **FILTERS[filters]), max_prompt_len=ids.shape[1])
    want = eager(model, ids, mask, **kw)
    assert want.finished.any() and bool((want.kept_logmass < -1e-3).any())
    assert bool((want.kept_logmass <= 0).all()) and bool((want.kept_logmass * (1 - want.response_mask) == 0).all())
    assert not torch.equal(want.sequences, sample(model, ids, mask, **kw).sequences)
    assert_same_samples(static(model, ids, mask, **kw), want)
    kw["noise"] = None
    g_eager, g_static = torch.Generator().manual_seed(4), torch.Generator().manual_seed(4)
    for _ in range(2):
        assert_same_samples(static(model, ids, mask, generator=g_static, **kw), eager(model, ids, mask, generator=g_eager, **kw))
        assert torch.equal(g_static.get_state(), g_eager.get_state())


def test_rows_that_all_stop_early_cut_the_response_where_the_eager_engine_stops():
    """Every row emits EOS before max_new_tokens: the eager engine stops at the last one; the static
    engine, which looks only every k tokens, steps on but returns the same columns, for every k."""
    model = _model("llama")
    ids, mask = _prompts(rows=6)
    T = 100
    eos = _frequent_token(model, ids, mask, 24)
    kw = _kw(ids, T, eos, greedy=False)
    want = sample(model, ids, mask, **kw)
    assert bool(want.finished.all()) and want.n_response < T
    for k in (1, 3, want.n_response, T):
        assert_same_samples(StaticEngine(check_every=k)(model, ids, mask, **kw), want)
    # without EOS every row runs to the limit
    kw["eos_token_id"] = None
    assert_same_samples(StaticEngine()(model, ids, mask, **kw), sample(model, ids, mask, **kw))


@pytest.mark.parametrize("check_every", [1, 3, 8])
def test_multinomial_on_a_generator_gives_the_eager_tokens_and_leaves_the_generator_where_eager_does(check_every):
    """Without noise both engines draw with torch.multinomial (generate's and the evaluation's way):
    the same tokens, and after a rollout whose rows all stop early (the static engine stepped past
    the last EOS) the generator is where the eager engine left it, so the next rollout agrees too;
    the same on the global generator."""
    model = _model("llama")
    ids, mask = _prompts(rows=4)
    eos = _frequent_token(model, ids, mask, 24)
    kw = dict(max_new_tokens=100, temperature=2.0, eos_token_id=eos, pad_token_id=PAD)
    g_eager, g_static = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    engine = StaticEngine(check_every=check_every)
    stopped_early = 0
    for _ in range(4):
        want = sample(model, ids, mask, generator=g_eager, **kw)
        assert_same_samples(engine(model, ids, mask, generator=g_static, **kw), want)
        assert torch.equal(g_static.get_state(), g_eager.get_state())
        stopped_early += int(bool(want.finished.all()) and want.n_response < 100)
    assert stopped_early >= 1
    torch.manual_seed(5)  # the global generator: its first rollout is the one above that stopped at step 52
    want, after_eager = sample(model, ids, mask, **kw), torch.rand(4)
    torch.manual_seed(5)
    got, after_static = engine(model, ids, mask, **kw), torch.rand(4)
    assert_same_samples(got, want)
    assert want.finished.all() and want.n_response < 100 and torch.equal(after_static, after_eager)


def test_the_cache_is_reused_across_rollouts_of_one_shape_and_any_prompt_width():
    model = _model("llama")
    engine = StaticEngine(cache_len=7 + 10)
    for width in (7, 4, 7):
        ids, mask = _prompts(rows=5, width=width)
        kw = _kw(ids, 10, None, greedy=False)
        assert_same_samples(engine(model, ids, mask, **kw), sample(model, ids, mask, **kw))
        assert engine.cache_positions == 17  # one cache length for every prompt width
    ids, mask = _prompts(rows=5, width=9)  # longer than the configured length: a bucket of 64
    kw = _kw(ids, 10, None, greedy=False)
    assert_same_samples(engine(model, ids, mask, **kw), sample(model, ids, mask, **kw))
    assert engine.cache_positions == 64


def _lora_policy():
    """A LoRA policy (AdapterLM over a shared base) whose adapter is not zero (B random)."""
    from fourfold.models.factory import llama_config, random_causal_lm
    from fourfold.models.lora import POLICY, AdapterLM, LoraSettings, SharedBase

    lm = random_causal_lm(llama_config(V, 32, 2, 4, 48, 128, pad_token_id=PAD), seed=0)
    base = SharedBase(lm, LoraSettings(r=4))
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in base.parameters_of(POLICY).values():
            p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    return AdapterLM(base).eval()


@pytest.mark.parametrize("weights", ["live", "copy"], ids=["lora-unmerged", "lora-merged"])
def test_lora_policy_unmerged_and_merged_into_a_copy(weights):
    policy = _lora_policy()
    ids, mask = _prompts()
    T = 20
    kw = _kw(ids, T, _frequent_token(policy, ids, mask, T), greedy=False)
    want = sample(policy, ids, mask, **kw)
    engine = make_engine(_gen(engine="static", weights=weights), max_prompt_len=ids.shape[1])
    engine.sync(policy)
    assert_same_samples(engine(policy, ids, mask, **kw), want)
    eager = make_engine(_gen(weights=weights))
    eager.sync(policy)
    assert_same_samples(eager(policy, ids, mask, **kw), want)


def _gen(**kw):
    from fourfold.config import GenerationConfig

    return GenerationConfig(**kw)


def test_a_copy_follows_the_policy_at_each_sync():
    policy = _model("qwen2")
    ids, mask = _prompts()
    kw = _kw(ids, 12, None, greedy=False)
    weights = CopiedWeights()
    engine = StaticEngine(weights)
    with pytest.raises(RuntimeError, match="never synced"):
        engine(policy, ids, mask, **kw)
    engine.sync(policy)
    assert weights.copy is not policy and weights.copy.dtype == torch.float32
    assert sum(p.numel() for p in weights.copy.parameters()) == sum(p.numel() for p in policy.parameters())
    assert_same_samples(engine(policy, ids, mask, **kw), sample(policy, ids, mask, **kw))
    with torch.no_grad():  # an "update": the copy keeps the old weights until the next sync
        for p in policy.parameters():
            p.mul_(1.5)
    stale = engine(policy, ids, mask, **kw)
    assert not torch.allclose(stale.logprobs, sample(policy, ids, mask, **kw).logprobs)
    before = [p.data_ptr() for p in weights.copy.parameters()]
    engine.sync(policy)
    assert [p.data_ptr() for p in weights.copy.parameters()] == before  # refreshed in place
    assert_same_samples(engine(policy, ids, mask, **kw), sample(policy, ids, mask, **kw))


def test_a_bf16_copy_under_bf16_mixed_runs_without_autocast():
    policy = _model("llama")
    engine = make_engine(_gen(engine="static", weights="copy"), precision="bf16-mixed")
    engine.sync(policy)
    assert engine.weights.copy.dtype == torch.bfloat16
    assert next(policy.parameters()).dtype == torch.float32  # the policy itself is untouched
    ids, mask = _prompts()
    kw = _kw(ids, 8, None, greedy=False)
    with torch.autocast("cpu", dtype=torch.bfloat16):  # the trainer's region: the copy turns it off
        with engine.weights.model(policy) as m:
            assert not torch.is_autocast_enabled("cpu") and m is engine.weights.copy
        s = engine(policy, ids, mask, **kw)
    assert s.logprobs.dtype == torch.float32 and s.response_mask.shape == (12, 8)


def test_make_engine_reads_the_generation_config():
    assert isinstance(make_engine(_gen()), EagerEngine) and isinstance(make_engine(_gen()).weights, AutoWeights)
    assert isinstance(make_engine(_gen(weights="live")).weights, LiveWeights)
    static = make_engine(_gen(engine="static", weights="gathered", stop_check_every=3, max_new_tokens=5),
                         max_prompt_len=11)
    assert isinstance(static, StaticEngine) and isinstance(static.weights, GatheredWeights)
    assert (static.check_every, static.cache_len, static.compile) == (3, 16, False)
    from fourfold.rollout.sampling import NO_TRUNCATION, Truncation

    assert make_engine(_gen()).truncation == static.truncation == NO_TRUNCATION
    assert make_engine(_gen(top_k=5, top_p=0.9, min_p=0.1)).truncation == Truncation(5, 0.9, 0.1)
    assert make_engine(_gen(engine="static", top_p=0.7)).truncation == Truncation(top_p=0.7)


def test_auto_weights_are_gathered_for_a_sharded_policy_and_live_otherwise():
    """The default, auto: resolve_weights gives gathered exactly when the policy is FSDP-sharded;
    on a policy without FSDP units the engine samples what live gives, bit for bit (the torchrun
    half, gathered = live on a sharded policy: tests/distributed/test_rollout_dist.py)."""
    from fourfold.config import GenerationConfig
    from fourfold.config.ppo import resolve_weights

    assert GenerationConfig().weights == "auto"
    assert [resolve_weights("auto", sharded) for sharded in (True, False)] == ["gathered", "live"]
    assert [resolve_weights(w, True) for w in ("live", "gathered", "copy")] == ["live", "gathered", "copy"]
    policy = _model("llama")
    ids, mask = _prompts()
    kw = _kw(ids, 12, None, greedy=False)
    for engine_name in ("eager", "static"):
        auto = make_engine(_gen(engine=engine_name), max_prompt_len=ids.shape[1])
        assert auto.weights.resolved is None
        auto.sync(policy)
        assert auto.weights.resolved == "live"
        live = make_engine(_gen(engine=engine_name, weights="live"), max_prompt_len=ids.shape[1])
        live.sync(policy)
        got, want = auto(policy, ids, mask, **kw), live(policy, ids, mask, **kw)
        for name in ("sequences", "response_mask", "finished", "logprobs", "entropy"):
            assert torch.equal(getattr(got, name), getattr(want, name)), (engine_name, name)


def test_the_config_refuses_what_the_engines_cannot_do():
    from fourfold.config import GenerationConfig
    from fourfold.config.inference import GenerateSamplingConfig
    from fourfold.errors import ConfigError

    with pytest.raises(ConfigError, match="generation.compile"):
        GenerationConfig(compile=True).validate()
    with pytest.raises(ConfigError, match="generation.stop_check_every"):
        GenerationConfig(engine="static", stop_check_every=0).validate()
    with pytest.raises(ConfigError, match="generation.compile"):  # generate reads PPO's rules
        GenerateSamplingConfig(compile=True).validate()
    GenerateSamplingConfig(engine="static", compile=True, stop_check_every=2, weights="copy").validate()


def test_a_sliding_window_shorter_than_the_rollout_is_refused():
    from fourfold.errors import ConfigError

    model = _model("mistral")
    model.config.sliding_window = 8
    ids, mask = _prompts()
    with pytest.raises(ConfigError, match="sliding window"):
        StaticEngine()(model, ids, mask, **_kw(ids, 6, None, greedy=False))


def test_compiled_step_traced_by_dynamo(monkeypatch):
    """The compiled path (dynamo's trace of the step, the guard stance after the first step) with
    dynamo's eager backend: the same samples. Inductor itself: the slow test below."""
    real = torch.compile
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: real(fn, backend="eager", dynamic=False))
    torch._dynamo.reset()
    model = _model("llama")
    ids, mask = _prompts()
    kw = _kw(ids, 16, _frequent_token(model, ids, mask, 16), greedy=False)
    engine = StaticEngine(compile=True, check_every=4)
    for _ in range(2):  # the second rollout reuses the compiled step
        assert_same_samples(engine(model, ids, mask, **kw), sample(model, ids, mask, **kw))
    assert engine.compiled_shapes == {(12, 64)}
    kw["noise"] = None  # the forward alone compiled, the multinomial pick outside it
    for seed in (1, 2):
        want = sample(model, ids, mask, generator=torch.Generator().manual_seed(seed), **kw)
        assert_same_samples(engine(model, ids, mask, generator=torch.Generator().manual_seed(seed), **kw), want)
    # the filters inside the compiled step (sort, cumsum, masks): the eager engine's samples
    from fourfold.rollout.sampling import Truncation

    trunc = Truncation(top_k=20, top_p=0.8, min_p=0.05)
    engine = StaticEngine(compile=True, check_every=4, truncation=trunc)
    kw = _kw(ids, 16, _frequent_token(model, ids, mask, 16), greedy=False)
    assert_same_samples(engine(model, ids, mask, **kw), sample(model, ids, mask, truncation=trunc, **kw))


@pytest.mark.slow  # inductor compiles the step: ~10-40 s on 2 cores
def test_inductor_compiled_step_gives_the_eager_tokens():
    torch._dynamo.reset()
    model = _model("llama")
    ids, mask = _prompts()
    kw = _kw(ids, 16, _frequent_token(model, ids, mask, 16), greedy=False)
    engine = StaticEngine(compile=True, check_every=4, cache_len=ids.shape[1] + 16)
    for _ in range(2):
        assert_same_samples(engine(model, ids, mask, **kw), sample(model, ids, mask, **kw))
    kw["noise"] = None  # the compiled forward alone, the multinomial pick outside it
    g_eager, g_static = torch.Generator().manual_seed(1), torch.Generator().manual_seed(1)
    for _ in range(2):
        assert_same_samples(engine(model, ids, mask, generator=g_static, **kw), sample(model, ids, mask, generator=g_eager, **kw))
        assert torch.equal(g_static.get_state(), g_eager.get_state())
    # the filters compiled into the step by inductor (sort, cumsum, masks): the eager engine's samples
    from fourfold.rollout.sampling import Truncation

    trunc = Truncation(top_k=20, top_p=0.8, min_p=0.05)
    engine = StaticEngine(compile=True, check_every=4, cache_len=ids.shape[1] + 16, truncation=trunc)
    kw = _kw(ids, 16, _frequent_token(model, ids, mask, 16), greedy=False)
    assert_same_samples(engine(model, ids, mask, **kw), sample(model, ids, mask, truncation=trunc, **kw))
