"""The sampling filter (fourfold.rollout.sampling.truncate_logits: temperature, then top-k, then
top-p, then min-p) against hand-computed probability vectors, its properties under hypothesis, and
the pick's log-probs: of the distribution sampled from (renormalised over the kept tokens), with
the kept mass that turns them back into the policy's full-softmax log-probs."""
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fourfold.rollout.sampling import NO_TRUNCATION, Truncation, choose, kept_tokens, pick_tokens, truncate_logits

P = [0.15, 0.5, 0.05, 0.3]  # sorted: index 1 (0.5), 3 (0.3), 0 (0.15), 2 (0.05)


def _kept(probs, temperature=1.0, **kw) -> set[int]:
    logits = torch.tensor([probs], dtype=torch.float32).log()
    out = truncate_logits(logits, temperature, Truncation(**kw))
    return {i for i, v in enumerate(out[0].tolist()) if v != float("-inf")}


def test_top_k_keeps_the_k_largest_and_every_token_tied_with_the_kth():
    assert _kept(P, top_k=1) == {1}
    assert _kept(P, top_k=2) == {1, 3}
    assert _kept(P, top_k=3) == {0, 1, 3}
    assert _kept(P, top_k=4) == _kept(P, top_k=9) == _kept(P, top_k=0) == {0, 1, 2, 3}  # k >= V, or 0: off
    assert _kept([0.4, 0.2, 0.2, 0.2], top_k=2) == {0, 1, 2, 3}  # the k-th's ties (Hugging Face's threshold)
    assert _kept([0.4, 0.3, 0.15, 0.15], top_k=3) == {0, 1, 2, 3}


def test_top_p_keeps_the_smallest_set_that_reaches_p():
    # mass of the tokens above each, sorted: 0, 0.5, 0.8, 0.95
    assert _kept(P, top_p=0.01) == _kept(P, top_p=0.49) == {1}  # always the top token
    assert _kept(P, top_p=0.51) == _kept(P, top_p=0.79) == {1, 3}
    assert _kept(P, top_p=0.81) == _kept(P, top_p=0.94) == {0, 1, 3}
    assert _kept(P, top_p=0.96) == _kept(P, top_p=1.0) == {0, 1, 2, 3}  # 1: off


def test_top_p_keeps_every_token_tied_at_its_edge():
    # 0.4 alone misses 0.5; one 0.2 reaches it, and the three 0.2s are one tier: all kept
    assert _kept([0.4, 0.2, 0.2, 0.2], top_p=0.5) == {0, 1, 2, 3}
    assert _kept([0.4, 0.2, 0.2, 0.2], top_p=0.3) == {0}
    assert _kept([0.25] * 4, top_p=0.1) == {0, 1, 2, 3}  # a flat row: the top tier is everything


def test_min_p_keeps_the_tokens_at_least_min_p_times_the_top_one():
    assert _kept(P, min_p=0.61) == {1}  # 0.3 < 0.61 * 0.5
    assert _kept(P, min_p=0.5) == {1, 3}  # threshold 0.25
    assert _kept(P, min_p=0.2) == {0, 1, 3}  # 0.1
    assert _kept(P, min_p=0.09) == {0, 1, 2, 3}  # 0.045


def test_the_order_is_temperature_top_k_top_p_min_p():
    # temperature first: at T = 0.5 the probabilities are ~ p^2 renormalised, [0.062, 0.685, 0.007, 0.247]:
    # top_p 0.9 needs two tokens, where the untempered distribution needs three
    assert _kept(P, temperature=0.5, top_p=0.9) == {1, 3}
    assert _kept(P, top_p=0.9) == {0, 1, 3}
    # top-p on the distribution renormalised over top-k's tokens: 0.5 / 0.8 = 0.625 alone reaches 0.6
    assert _kept(P, top_k=2, top_p=0.6) == {1}
    assert _kept(P, top_p=0.6) == {1, 3}
    # top-p before min-p (Hugging Face's order): top-p 0.82 keeps 3 tokens of the full distribution
    # (0.8 above the third < 0.82), min-p 0.25 (threshold 0.125) keeps them; min-p first (vLLM v1)
    # would renormalise over them (0.5 / 0.95 + 0.3 / 0.95 = 0.842 >= 0.82) and keep 2
    assert _kept(P, top_p=0.82, min_p=0.25) == {0, 1, 3}


def test_off_is_the_temperature_scaled_logits_themselves():
    logits = torch.randn(3, 11, generator=torch.Generator().manual_seed(0))
    assert torch.equal(truncate_logits(logits, 0.7), logits / 0.7)
    assert torch.equal(truncate_logits(logits, 0.7, Truncation(top_k=11, top_p=1.0, min_p=0.0)), logits / 0.7)
    assert not NO_TRUNCATION.active and Truncation(top_p=0.9).active and Truncation(top_k=1).active
    assert Truncation(min_p=0.1).active


def test_the_pick_is_of_the_renormalised_distribution_and_keeps_the_mass_it_removed():
    """top_k 2 of P: the distribution sampled from is [0, 0.625, 0, 0.375]; the uniform 0.7 picks
    token 3 (the cdf is 0.625, then 1); its log-prob is log 0.375, the kept mass 0.8, the entropy that
    of (0.625, 0.375), and log 0.375 + log 0.8 = log 0.3 is the policy's full-softmax log-prob."""
    logits = torch.tensor([P]).log()
    tok, logp, ent, kept = pick_tokens(logits, 1.0, False, None, torch.tensor([0.7], dtype=torch.float64),
                                       Truncation(top_k=2))
    assert tok.tolist() == [3]
    assert logp.item() == pytest.approx(math.log(0.375), abs=1e-6)
    assert kept.item() == pytest.approx(math.log(0.8), abs=1e-6)
    assert ent.item() == pytest.approx(-(0.625 * math.log(0.625) + 0.375 * math.log(0.375)), abs=1e-6)
    assert (logp + kept).item() == pytest.approx(math.log(0.3), abs=1e-6)
    # u below 0.625 picks the top token; a removed token is never picked, whatever the uniform
    for u, want in ((0.0, 1), (0.6, 1), (0.63, 3), (0.999999, 3)):
        assert pick_tokens(logits, 1.0, False, None, torch.tensor([u], dtype=torch.float64),
                           Truncation(top_k=2))[0].tolist() == [want]


def test_without_a_filter_the_pick_is_the_pure_temperature_one_bit_for_bit():
    """The formula of the pick before the filters existed, and no kept mass."""
    g = torch.Generator().manual_seed(1)
    logits, u = torch.randn(5, 13, generator=g), torch.rand(5, generator=g, dtype=torch.float64)
    from fourfold.rollout.noise import inverse_cdf

    logp_all = torch.log_softmax(logits / 0.8, -1)
    probs = logp_all.exp()
    tok = inverse_cdf(probs, u)
    got = pick_tokens(logits, 0.8, False, None, u)
    assert torch.equal(got[0], tok)
    assert torch.equal(got[1], logp_all.gather(-1, tok[:, None]).squeeze(-1))
    assert torch.equal(got[2], -(probs * logp_all).sum(-1)) and got[3] is None
    # greedy ignores the filter (the argmax is always kept)
    greedy = pick_tokens(logits, 0.8, True, None, None, Truncation(top_p=0.5))
    assert torch.equal(greedy[0], logits.argmax(-1)) and greedy[3] is None


def test_a_finished_row_keeps_zero_mass_and_pad():
    logits = torch.tensor([P, P]).log()
    c = choose(logits, torch.tensor([False, True]), 1.0, False, None, torch.tensor([0.7, 0.7], dtype=torch.float64),
               eos_token_id=None, pad_token_id=0, truncation=Truncation(top_k=2))
    assert c.tokens.tolist() == [3, 0]
    assert c.kept[0].item() == pytest.approx(math.log(0.8), abs=1e-6) and c.kept[1].item() == 0.0
    assert c.logprobs[1].item() == 0.0 and c.entropy[1].item() == 0.0


@st.composite
def _rows(draw):
    V = draw(st.integers(2, 24))
    B = draw(st.integers(1, 4))
    values = st.floats(-6, 6, allow_nan=False, width=32)
    logits = torch.tensor(draw(st.lists(st.lists(values, min_size=V, max_size=V), min_size=B, max_size=B)))
    trunc = Truncation(top_k=draw(st.integers(0, V + 2)), top_p=draw(st.floats(0.01, 1.0)),
                       min_p=draw(st.sampled_from([0.0, 0.05, 0.3, 0.9])))
    return logits, draw(st.floats(0.3, 2.0)), trunc


@settings(max_examples=150, deadline=None)
@given(_rows())
def test_properties_of_the_filter(case):
    logits, temperature, trunc = case
    scaled = logits / temperature
    keep = kept_tokens(scaled, trunc)
    probs = torch.softmax(truncate_logits(logits, temperature, trunc), -1)
    assert torch.isfinite(probs).all()
    assert torch.allclose(probs.sum(-1), torch.ones(len(probs)), atol=1e-5)  # renormalised
    assert keep.any(-1).all()  # never empty
    assert keep.gather(-1, scaled.argmax(-1, keepdim=True)).all()  # the argmax always kept
    assert (probs[~keep] == 0).all()  # a removed token has probability 0
    # the kept set is closed upwards: no removed token is more probable than a kept one
    low_kept = torch.where(keep, scaled, torch.full_like(scaled, float("inf"))).amin(-1)
    high_removed = torch.where(keep, torch.full_like(scaled, float("-inf")), scaled).amax(-1)
    assert (high_removed < low_kept).all()
    if 0 < trunc.top_k:
        assert (keep.sum(-1) <= (scaled >= torch.topk(scaled, min(trunc.top_k, scaled.shape[-1]), -1).values[:, -1:])
                .sum(-1)).all()  # within top-k's set
        if trunc.top_p == 1.0 and trunc.min_p == 0.0:
            assert (keep.sum(-1) >= min(trunc.top_k, logits.shape[-1])).all()  # ties can add tokens, never remove
    if trunc.top_p < 1.0 and trunc.top_k == 0 and trunc.min_p == 0.0:
        full = torch.softmax(scaled, -1)
        assert ((full * keep).sum(-1) >= trunc.top_p - 1e-5).all()  # reaches p
        edge = torch.where(keep, full, torch.full_like(full, 2.0)).amin(-1, keepdim=True)  # the least probable tier
        without = (full * (keep & (full > edge))).sum(-1)
        assert (without < trunc.top_p + 1e-5).all()  # and is the smallest (tie-closed) set that does
    off = Truncation(top_k=0, top_p=1.0, min_p=0.0)
    assert torch.equal(truncate_logits(logits, temperature, off), scaled)  # off = identity
