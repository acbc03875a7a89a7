"""Token in, token out (fourfold.rollout.turns.Trajectory, fourfold.data.observations) and the
batched multi-turn rollout of the eager path (sample_turns): the sampled ids are kept as sampled,
observations are tokenised on their own, one environment turn equals the plain rollout scored by
the same reward function, and the KV cache kept across turns gives the log-probs of a fresh
forward over the whole trajectory."""

import pytest
import torch

from fourfold.data.observations import ObservationEncoder
from fourfold.errors import ConfigError
from fourfold.models.factory import llama_config, random_causal_lm
from fourfold.models.roles import position_ids_from_mask
from fourfold.rollout.eager import sample
from fourfold.rollout.env import make_envs
from fourfold.rollout.noise import RowNoise
from fourfold.rollout.sampling import decode_responses
from fourfold.rollout.turns import Trajectory, TurnSettings, sample_turns, stack_trajectories
from fourfold.tasks.tokenizer import build_word_tokenizer

WORDS = [f"w{i}" for i in range(30)] + ["user", "tool", "assistant", "q1", "t1"]
TEMPLATE = ("{% for m in messages %}<bos>{{ m['role'] }} {{ m['content'] }}<eos> {% endfor %}"
            "{% if add_generation_prompt %}<bos>assistant {% endif %}")


@pytest.fixture(scope="module")
def tok():
    return build_word_tokenizer(WORDS)


@pytest.fixture(scope="module")
def model(tok):
    cfg = llama_config(len(tok), hidden=32, layers=2, heads=4, max_positions=256, pad_token_id=tok.pad_token_id,
                       bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    return random_causal_lm(cfg, seed=0).eval()


def _bpe():
    """A BPE tokenizer with tokens 'a', 'b' and their merge 'ab', decoding by concatenation: the
    sampled ids [a, b] decode to 'ab', which encodes as [ab]."""
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<bos>": 1, "<eos>": 2, "a": 3, "b": 4, "ab": 5}
    t = Tokenizer(models.BPE(vocab=vocab, merges=[("a", "b")]))
    t.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=t, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>")


def test_the_builder_keeps_the_sampled_ids_where_re_encoding_would_not():
    tok = _bpe()
    a, b, ab = 3, 4, 5
    assert tok(tok.decode([a, b]), add_special_tokens=False)["input_ids"] == [ab]  # re-encoding differs
    enc = ObservationEncoder(tok)
    traj = Trajectory(prompt=enc.first("ab", "p.jsonl:1", 16))
    traj.add_turn([a, b], [-1.0, -2.0])
    traj.add_observation(enc.next("ab", "p.jsonl:1"))
    traj.add_turn([b, a, 2], [-0.5, -0.5, -0.1])
    assert traj.prompt == [1, ab]
    assert traj.ids == [a, b, ab, b, a, 2]  # the turns as sampled, the observation tokenised on its own
    assert traj.policy == [True, True, False, True, True, True]
    assert traj.turn == [0, 0, -1, 1, 1, 1]
    assert traj.logprobs == [-1.0, -2.0, 0.0, -0.5, -0.5, -0.1]
    batch = stack_trajectories([traj, Trajectory(prompt=[1, a, b])], tok.pad_token_id)
    assert batch.samples.sequences.tolist() == [[0, 1, ab, a, b, ab, b, a, 2], [1, a, b, 0, 0, 0, 0, 0, 0]]
    assert batch.samples.attention_mask.tolist() == [[0, 1, 1, 1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0, 0, 0, 0]]
    assert batch.samples.response_mask.tolist() == [[1, 1, 0, 1, 1, 1], [0] * 6]
    assert batch.turn_ids.tolist() == [[0, 0, -1, 1, 1, 1], [-1] * 6]
    assert batch.observation_tokens.tolist() == [1, 0] and batch.n_turns.tolist() == [2, 0]


def test_observations_through_the_chat_template(tok):
    tok = build_word_tokenizer(WORDS)
    tok.chat_template = TEMPLATE
    ids = {w: tok.convert_tokens_to_ids(w) for w in WORDS}
    bos, eos, unk = tok.bos_token_id, tok.eos_token_id, tok.unk_token_id
    enc = ObservationEncoder(tok)
    first = enc.first([{"role": "user", "content": "q1"}], "p.jsonl:2", 32)
    assert first == [bos, ids["user"], ids["q1"], eos, bos, ids["assistant"]]
    # after the policy's own EOS: the tool message and the next assistant prompt, nothing before them
    cont = enc.next([{"role": "tool", "content": "t1"}], "p.jsonl:2")
    assert cont == [bos, ids["tool"], ids["t1"], eos, bos, ids["assistant"]]
    assert ObservationEncoder(tok, role="tool").next("t1", "p.jsonl:2") == cont
    # a turn that ended without EOS (cut, or at a stop string): the template's EOS closes it
    assert enc.next([{"role": "tool", "content": "t1"}], "p.jsonl:2", after_eos=False) == [eos] + cont
    # a string observation is text: a special-token string in it stays text (no injected EOS)
    assert enc.next("t1 <eos>", "p.jsonl:2") == [ids["t1"], unk]


class _Echo:
    """Answers every turn with the observation 'w5 w6'; done after ``turns`` turns (never: 0)."""

    def __init__(self, row, turns):
        self.row, self.turns, self.n = row, turns, 0

    def reset(self):
        return self.row["prompt"]

    def step(self, action):
        self.n += 1
        return "w5 w6", 0.1 * self.n, self.n == self.turns


def _settings(tok, **kw):
    base = dict(max_turns=3, max_tokens=64, max_new_tokens=4, temperature=1.5, eos_token_id=None,
                pad_token_id=tok.pad_token_id, decode=lambda ids: tok.decode(ids, skip_special_tokens=True))
    base.update(kw)
    return TurnSettings(**base)


PROMPTS = ["w1 w2 w3", "w4", "w7 w8", "w9 w10 w11 w12"]


def _run(model, tok, turns, prompts=PROMPTS, seed=3, **kw):
    rows = [{"prompt": p} for p in prompts]
    envs = make_envs(lambda row: _Echo(row, turns), rows, [f"p.jsonl:{i + 1}" for i in range(len(rows))])
    enc = ObservationEncoder(tok)
    first = [enc.first(e.reset(), e.where, 64) for e in envs]
    s = _settings(tok, **kw)
    noise = RowNoise(seed, 0).uniforms(range(len(rows)), s.max_tokens)
    return sample_turns(model, envs, first, s, enc.next, noise=noise), first


def _fresh_logprobs(model, batch, temperature):
    """Log-probs of every trajectory token from one forward over the stacked trajectory."""
    seq, attn = batch.samples.sequences, batch.samples.attention_mask
    T = batch.samples.response_mask.shape[1]
    with torch.no_grad():
        logits = model(input_ids=seq, attention_mask=attn, position_ids=position_ids_from_mask(attn)).logits
    logp = torch.log_softmax(logits[:, -T - 1:-1].float() / temperature, -1)
    return logp.gather(-1, seq[:, -T:, None])[..., 0]


def test_turns_observations_and_the_cache_kept_across_turns(model, tok):
    batch, first = _run(model, tok, turns=3)
    w5, w6 = tok.convert_tokens_to_ids(["w5", "w6"])
    s = batch.samples
    for b, traj in enumerate(batch.trajectories):
        assert traj.prompt == first[b] and traj.n_turns == 3 and traj.done and not traj.truncated
        # 4 tokens per turn (no EOS), the observation after turns 0 and 1 only
        assert traj.turn == [0] * 4 + [-1, -1] + [1] * 4 + [-1, -1] + [2] * 4
        assert [i for i, p in zip(traj.ids, traj.policy) if not p] == [w5, w6, w5, w6]
        assert traj.turn_rewards == pytest.approx([0.1, 0.2, 0.3])
    assert batch.turn_rewards.shape == (4, 3) and batch.done.all() and not batch.truncated.any()
    assert batch.observation_tokens.tolist() == [4] * 4
    # the sampled log-probs are those of one fresh forward over the whole trajectory
    fresh = _fresh_logprobs(model, batch, 1.5)
    m = s.response_mask.bool()
    assert torch.allclose(fresh[m], s.logprobs[m], atol=1e-5)
    assert bool((s.logprobs[~m] == 0).all())


def test_rows_that_finish_early_wait_and_the_others_go_on(model, tok):
    # a row-dependent end: rows whose prompt has one word end after one turn
    rows = [{"prompt": p, "turns": 1 if len(p.split()) == 1 else 3} for p in PROMPTS]
    envs = make_envs(lambda row: _Echo(row, row["turns"]), rows, [f"p.jsonl:{i + 1}" for i in range(4)])
    enc = ObservationEncoder(tok)
    first = [enc.first(e.reset(), e.where, 64) for e in envs]
    s = _settings(tok)
    batch = sample_turns(model, envs, first, s, enc.next, noise=RowNoise(5, 0).uniforms(range(4), 64))
    assert batch.n_turns.tolist() == [3, 1, 3, 3]
    assert batch.trajectories[1].ids == batch.trajectories[1].turn_ids_of(0)
    fresh = _fresh_logprobs(model, batch, 1.5)
    m = batch.samples.response_mask.bool()
    assert torch.allclose(fresh[m], batch.samples.logprobs[m], atol=1e-5)


def test_truncation_by_max_turns_and_by_max_tokens(model, tok):
    never, _ = _run(model, tok, turns=0, max_turns=2)
    assert never.truncated.all() and not never.done.any() and never.n_turns.tolist() == [2] * 4
    assert never.observation_tokens.tolist() == [2] * 4  # no observation after the last turn
    assert torch.allclose(never.turn_rewards, torch.tensor([[0.1, 0.2]] * 4))
    short, first = _run(model, tok, turns=0, max_turns=5, max_tokens=15)
    for traj in short.trajectories:
        assert traj.truncated and traj.n_tokens <= 15
    # row 1 (2 prompt tokens): 2 + 4 + 2 + 4 + 2 = 14, so 1 token left: its third turn is cut after one token and not stepped
    t1 = short.trajectories[1]
    assert len(first[1]) == 2 and t1.n_turns == 3 and len(t1.turn_ids_of(2)) == 1 and len(t1.turn_rewards) == 2
    with pytest.raises(ConfigError, match="env.max_tokens: the first observation of row p.jsonl:4 has 5 tokens"):
        _run(model, tok, turns=1, max_tokens=5)


def test_every_row_s_last_turn_cut_by_max_tokens_still_has_its_reward_column():
    """A batch whose every row ends in a turn cut by max_tokens (not stepped: no reward) stacks to
    ``turn_rewards`` with a column per turn (0 on the cut one), so rule 3 can place them."""
    from fourfold.core.turns import place_turn_rewards

    rows = []
    for r in (0.5, -1.0):
        traj = Trajectory(prompt=[1, 5])
        traj.add_turn([6, 7], [-0.1, -0.2])
        traj.turn_rewards.append(r)
        traj.add_observation([8])
        traj.add_turn([9], [-0.3])  # cut: never stepped
        traj.truncated = True
        rows.append(traj)
    batch = stack_trajectories(rows, 0)
    assert batch.turn_rewards.tolist() == [[0.5, 0.0], [-1.0, 0.0]] and batch.n_turns.tolist() == [2, 2]
    placed = place_turn_rewards(batch.turn_rewards, batch.turn_ids)
    assert placed.tolist() == [[0.0, 0.5, 0.0, 0.0], [0.0, -1.0, 0.0, 0.0]]  # over ids: turn 0 ends at 1


def test_one_turn_is_the_plain_rollout_scored_by_the_reward_function(model, tok):
    """A single-turn environment whose reward is a reward function: the same tokens, masks,
    log-probs, entropies and scores as the plain eager rollout scored by that function."""
    def reward_fn(prompts, responses):
        return [r.split().count("w7") + 0.01 * len(p) for p, r in zip(prompts, responses)]

    class OneTurn:
        def __init__(self, row):
            self.prompt = row["prompt"]

        def reset(self):
            return self.prompt

        def step(self, action):
            return "", reward_fn([self.prompt], [action])[0], True

    T = 6
    enc = ObservationEncoder(tok)
    envs = make_envs(OneTurn, [{"prompt": p} for p in PROMPTS], [f"p.jsonl:{i + 1}" for i in range(4)])
    first = [enc.first(e.reset(), e.where, 64) for e in envs]
    noise = RowNoise(7, 1).uniforms(range(4), T)
    width = max(map(len, first))
    ids = torch.tensor([[tok.pad_token_id] * (width - len(f)) + f for f in first])
    mask = torch.tensor([[0] * (width - len(f)) + [1] * len(f) for f in first])
    # the token sampled most often as EOS, so rows stop at different steps
    free = sample(model, ids, mask, max_new_tokens=T, temperature=1.5, pad_token_id=tok.pad_token_id, noise=noise)
    eos = int(torch.bincount(free.responses.flatten(), minlength=len(tok))[4:].argmax()) + 4
    s = _settings(tok, max_turns=1, max_new_tokens=T, eos_token_id=eos)
    batch = sample_turns(model, envs, first, s, enc.next, noise=noise)
    plain = sample(model, ids, mask, max_new_tokens=T, temperature=1.5, eos_token_id=eos,
                   pad_token_id=tok.pad_token_id, noise=noise)
    got = batch.samples
    assert got.sequences.tolist() == plain.sequences.tolist()
    assert torch.equal(got.attention_mask, plain.attention_mask) and torch.equal(got.response_mask, plain.response_mask)
    assert torch.equal(got.finished, plain.finished) and 0 < int(plain.finished.sum()) < 4
    assert torch.equal(got.logprobs, plain.logprobs) and torch.equal(got.entropy, plain.entropy)
    scores = reward_fn(PROMPTS, decode_responses(tok, plain))
    assert torch.equal(batch.turn_rewards[:, 0], torch.tensor(scores, dtype=torch.float32))  # as FunctionReward gives them
    assert batch.done.all() and batch.n_turns.tolist() == [1] * 4


def test_a_stop_string_ends_a_turn_and_stays_in_the_action(model, tok):
    free, _ = _run(model, tok, turns=1, max_turns=1, max_new_tokens=6)
    counts = torch.bincount(free.samples.responses.flatten(), minlength=len(tok))
    word = tok.convert_ids_to_tokens(int(counts[4:].argmax()) + 4)
    batch, _ = _run(model, tok, turns=2, max_turns=2, max_new_tokens=6, stop=[word])
    stopped = 0
    for traj in batch.trajectories:
        for k in range(traj.n_turns):
            words = tok.decode(traj.turn_ids_of(k)).split()
            assert len(words) == 6 or words[-1] == word
            assert word not in words[:-1]  # the first occurrence ends the turn
            stopped += words[-1] == word
    assert stopped > 0
    m = batch.samples.response_mask.bool()
    assert torch.allclose(_fresh_logprobs(model, batch, 1.5)[m], batch.samples.logprobs[m], atol=1e-5)
