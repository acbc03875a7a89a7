"""Sampling: EOS handling, masks, stopping, pi_old log-probs, and scoring."""
from types import SimpleNamespace

import torch

from fourfold.models.loading import load_causal_lm, load_sequence_scorer
from fourfold.models.roles import FrozenReference, ModelReward, ScalarModel, response_logprobs
from fourfold.rollout.eager import sample
from fourfold.rollout.score import score_rollout

EOS, PAD, V = 2, 0, 8


class ScriptedLM(torch.nn.Module):
    """Row b emits token 5 until its step reaches stop[b], then EOS (logits strongly peaked);
    counts its forward calls so the early stop can be checked."""

    def __init__(self, stop):
        super().__init__()
        self.stop = stop
        self.calls = 0
        self.dummy = torch.nn.Parameter(torch.zeros(()))

    def forward(self, input_ids, attention_mask=None, position_ids=None, use_cache=False, cache=None, logits_to_keep=0):
        self.calls += 1
        B = input_ids.shape[0]
        step = attention_mask.shape[1] - self.prompt_len  # tokens generated so far
        logits = torch.full((B, 1, V), -30.0)
        for b in range(B):
            logits[b, 0, EOS if step >= self.stop[b] else 5] = 30.0
        return SimpleNamespace(logits=logits, cache=None)


def test_eos_at_different_positions_masks_the_rest():
    model = ScriptedLM(stop=[0, 2, 4])
    model.prompt_len = 3
    prompt = torch.tensor([[0, 1, 4], [1, 4, 4], [0, 0, 1]])
    s = sample(model, prompt, (prompt != 0).long(), max_new_tokens=10,
               temperature=1.0, eos_token_id=EOS, pad_token_id=PAD)
    # stops after the slowest row's EOS (5 tokens), not at max_new_tokens
    assert s.responses.tolist() == [[EOS, PAD, PAD, PAD, PAD], [5, 5, EOS, PAD, PAD], [5, 5, 5, 5, EOS]]
    assert s.response_mask.tolist() == [[1, 0, 0, 0, 0], [1, 1, 1, 0, 0], [1, 1, 1, 1, 1]]
    assert s.finished.tolist() == [True, True, True]
    assert model.calls == 5
    # log-probs are ~0 (peaked) on valid tokens and exactly 0 where masked
    assert torch.all(s.logprobs[s.response_mask == 0] == 0)
    assert torch.all(s.logprobs[s.response_mask == 1] > -1e-6)
    assert s.attention_mask[:, 3:].tolist() == s.response_mask.long().tolist()


def test_no_eos_runs_to_the_limit():
    model = ScriptedLM(stop=[100, 100])
    model.prompt_len = 2
    prompt = torch.tensor([[1, 4], [1, 4]])
    s = sample(model, prompt, torch.ones_like(prompt), max_new_tokens=6, eos_token_id=EOS, pad_token_id=PAD)
    assert s.response_mask.shape == (2, 6) and bool(s.response_mask.all())
    assert s.finished.tolist() == [False, False]


def test_sampling_logprobs_equal_recomputed_logprobs(tiny_lm):
    """pi_old kept at sampling time equals a fresh full forward (so the first PPO ratio is 1)."""
    torch.manual_seed(0)
    model = load_causal_lm(str(tiny_lm / "sft")).eval()
    prompt = torch.tensor([[0, 0, 1, 10, 11], [1, 12, 13, 14, 15]])
    mask = (prompt != 0).long()
    s = sample(model, prompt, mask, max_new_tokens=12, temperature=0.7, eos_token_id=2, pad_token_id=0)
    with torch.no_grad():
        again, _ = response_logprobs(model, s.sequences, s.attention_mask, s.n_response, 0.7)
    m = s.response_mask.bool()
    torch.testing.assert_close(again[m], s.logprobs[m], atol=1e-4, rtol=1e-4)


def test_score_shapes_and_masking(tiny_lm):
    torch.manual_seed(0)
    policy = load_causal_lm(str(tiny_lm / "sft")).eval()
    rm = ScalarModel(load_sequence_scorer(str(tiny_lm / "rm")))
    prompt = torch.tensor([[1, 10, 11], [1, 12, 13]])
    s = sample(policy, prompt, torch.ones_like(prompt), max_new_tokens=8, temperature=1.0, eos_token_id=2, pad_token_id=0)
    sc = score_rollout(s, reference=FrozenReference(load_causal_lm(str(tiny_lm / "sft"))), reward=ModelReward(rm), critic=rm)
    B, T = s.response_mask.shape
    assert sc.ref_logprobs.shape == (B, T) and sc.values.shape == (B, T) and sc.scores.shape == (B,)
    # the reference is the same weights as the policy here: per-token KL is ~0
    torch.testing.assert_close(sc.ref_logprobs, s.logprobs, atol=1e-4, rtol=1e-4)
    assert torch.all(sc.values[s.response_mask == 0] == 0)
