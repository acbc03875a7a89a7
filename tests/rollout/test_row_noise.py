"""Per-row sampling noise: a row's uniforms depend on (seed, iteration, global row) only, the
inverse-CDF pick, and sampling a batch in two slices (as two ranks do) gives the one call's tokens."""
import torch

from fourfold.models.loading import load_causal_lm
from fourfold.rollout.eager import sample
from fourfold.rollout.noise import RowNoise, inverse_cdf, row_seed


def test_row_seed_is_a_fixed_function_of_seed_iteration_and_row():
    # BLAKE2b-64 of "fourfold/row-noise/0/1/2" is bcd47407c8dc1b4a, read little-endian: pinned, so
    # the noise of a run (and its resume) never drifts with the code around it
    assert row_seed(0, 1, 2) == 0x4A1BDCC80774D4BC
    first = RowNoise(0, 1).uniforms(range(2, 3), 3)
    torch.testing.assert_close(first, torch.tensor([[0.0093, 0.0837, 0.4727]], dtype=torch.float64), rtol=0, atol=1e-4)
    seeds = {row_seed(s, i, r) for s in range(3) for i in range(3) for r in range(3)}
    assert len(seeds) == 27


def test_uniforms_of_a_row_do_not_depend_on_the_slice_that_asks():
    noise = RowNoise(seed=5, iteration=3)
    whole = noise.uniforms(range(0, 8), 6)
    assert whole.shape == (8, 6) and whole.dtype == torch.float64
    assert bool((whole >= 0).all() and (whole < 1).all())
    torch.testing.assert_close(noise.uniforms(range(4, 8), 6), whole[4:], rtol=0, atol=0)
    torch.testing.assert_close(noise.uniforms(range(2, 3), 6), whole[2:3], rtol=0, atol=0)
    assert not torch.equal(RowNoise(5, 4).uniforms(range(0, 8), 6), whole)  # another iteration
    assert not torch.equal(RowNoise(6, 3).uniforms(range(0, 8), 6), whole)  # another seed
    assert torch.equal(noise.uniforms(range(0, 8), 6), whole)  # and no global state moved


def test_inverse_cdf_picks_by_hand():
    probs = torch.tensor([[0.25, 0.0, 0.5, 0.25]] * 8)  # cdf 0.25, 0.25, 0.75, 1 (exact in binary)
    u = torch.tensor([0.0, 0.2499, 0.25, 0.5, 0.7499, 0.75, 0.9999, 1.0], dtype=torch.float64)
    # u = 0.25 is past token 0's cdf: the next token with cdf > 0.25 is 2, never the zero-probability
    # 1; u = 1 (out of [0, 1), as rounding at the top end can make it) is clamped to the last token
    assert inverse_cdf(probs, u).tolist() == [0, 0, 2, 2, 2, 3, 3, 3]


def test_inverse_cdf_never_picks_a_zero_probability_token():
    probs = torch.tensor([[0.0, 0.625, 0.375, 0.0, 0.0]] * 4)
    u = torch.tensor([0.0, 0.625, 1.0 - 2 ** -53, 1.0], dtype=torch.float64)
    assert inverse_cdf(probs, u).tolist() == [1, 2, 2, 2]
    # a row whose probabilities sum to less than 1 (cdf 0.5, 0.75, 0.75): u is scaled by the
    # row's total, and the top end is clamped to the last token of positive probability
    short = torch.tensor([[0.5, 0.25, 0.0]] * 4)
    u = torch.tensor([0.6, 0.7, 0.999, 1.0], dtype=torch.float64)
    assert inverse_cdf(short, u).tolist() == [0, 1, 1, 1]


def test_inverse_cdf_samples_the_distribution():
    g = torch.Generator().manual_seed(0)
    probs = torch.tensor([0.1, 0.0, 0.6, 0.3])
    u = torch.rand(20000, generator=g, dtype=torch.float64)
    picks = inverse_cdf(probs.expand(20000, 4), u)
    freq = torch.bincount(picks, minlength=4).double() / 20000
    torch.testing.assert_close(freq, probs.double(), atol=0.015, rtol=0)
    assert int((picks == 1).sum()) == 0


def test_two_slices_of_a_batch_sample_the_tokens_of_one_call(tiny_lm):
    """Rows 0-3 and rows 4-7 sampled apart (each with the uniforms of its global rows, as two
    ranks do) give exactly the tokens and masks of sampling the 8 rows in one call."""
    model = load_causal_lm(str(tiny_lm / "sft")).eval()
    prompt = torch.tensor([[0, 0, 1, 10], [1, 12, 13, 14], [0, 1, 9, 8], [1, 4, 5, 6],
                           [0, 0, 0, 1], [1, 20, 21, 22], [0, 1, 30, 31], [0, 0, 1, 7]])
    mask = (prompt != 0).long()
    noise = RowNoise(seed=0, iteration=1)
    kw = dict(max_new_tokens=24, temperature=1.5, eos_token_id=2, pad_token_id=0)
    whole = sample(model, prompt, mask, noise=noise.uniforms(range(8), 24), **kw)
    halves = [sample(model, prompt[r], mask[r], noise=noise.uniforms(range(r.start, r.stop), 24), **kw)
              for r in (slice(0, 4), slice(4, 8))]
    T = whole.n_response
    assert T > 1 and bool(whole.finished.any())  # some rows stop at EOS before the others
    for r, half in zip((slice(0, 4), slice(4, 8)), halves):
        t = half.n_response
        assert t <= T
        assert torch.equal(half.responses, whole.responses[r, :t])
        assert torch.equal(half.response_mask, whole.response_mask[r, :t])
        assert not bool(whole.response_mask[r, t:].any())  # the one call's extra steps are padding
        torch.testing.assert_close(half.logprobs, whole.logprobs[r, :t], rtol=0, atol=1e-6)
    # the noise decides the tokens: another iteration's uniforms sample other responses
    other = sample(model, prompt, mask, noise=RowNoise(0, 2).uniforms(range(8), 24), **kw)
    assert not torch.equal(other.responses[:, :2], whole.responses[:, :2])
