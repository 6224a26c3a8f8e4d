"""The rounding tolerances of tests/numerics.py: the bound by hand, that it holds for sums in other orders, that it
still rejects a small real error, and the budget read from a composite model's config."""

import math

import pytest
import torch

from mmgrpo.modalities.tokens.logprobs import linear_token_logprobs, token_logprobs
from tests.numerics import Reductions, gamma_tilde, logprob_scale, model_reductions, reorder_tol, unit_roundoff


def test_bound_by_hand():
    u = 2.0**-24
    assert unit_roundoff(torch.float32) == u and unit_roundoff(torch.bfloat16) == 2.0**-8
    assert gamma_tilde(100) == pytest.approx(math.expm1(8 * 10 * u + 100 * u * u / (1 - u)), rel=1e-12)
    assert gamma_tilde(100) == pytest.approx(80 * u, rel=1e-5)  # λ√n·u to first order
    assert reorder_tol(terms=100, depth=3, scale=2.0) == pytest.approx(2 * 3 * 80 * u * 2.0, rel=1e-5)
    assert Reductions(100, 3).backward() == Reductions(100, 6)
    assert logprob_scale(torch.tensor([-0.1, float("-inf")])) == 1.0  # floor of one; -inf left out
    assert logprob_scale(torch.tensor([-7.5, -0.2])) == 7.5


def test_the_bound_holds_for_sums_in_other_orders():
    """fp32 sums of n terms in four orders (sequential both ways, torch's vectorised sum, blocks of 37) against the
    fp64 sum: every error within γ̃_n(λ)·Σ|x|, over 200 draws of heavy-tailed and same-sign data."""
    g = torch.Generator().manual_seed(0)
    n, worst = 2000, 0.0
    for trial in range(200):
        x = torch.randn(n, generator=g, dtype=torch.float64) * torch.rand(n, generator=g, dtype=torch.float64) ** -2
        x = x.abs() if trial % 2 else x
        exact, bound = float(x.sum()), gamma_tilde(n) * float(x.abs().sum())
        x32 = x.float()
        seq = torch.zeros((), dtype=torch.float32)
        for v in x32[:200]:  # a sequential sum of the first 200 terms (Python loop kept short)
            seq = seq + v
        orders = [x32.sum(), x32.flip(0).sum(), x32.view(-1, 40).sum(0).sum(), x32[:1998].view(-1, 37).sum(1).sum()]
        orders[-1] = orders[-1] + x32[1998:].sum()
        for s in orders:
            worst = max(worst, abs(float(s) - exact) / bound)
        assert abs(float(seq) - float(x[:200].sum())) <= gamma_tilde(200) * float(x[:200].abs().sum())
    assert worst <= 1.0
    assert worst < 0.5  # not loose by accident of one draw: the observed worst case sits well inside the bound


def test_the_kernel_budget_rejects_a_small_real_error():
    """The budget the fused log-prob tests use (V = 1000, depth 2) passes a reordering and fails a temperature off by
    one part in 10⁴: loose enough for another summation order, tight enough for a real mistake."""
    g = torch.Generator().manual_seed(0)
    hidden, weight = torch.randn(3, 5, 16, generator=g), torch.randn(1000, 16, generator=g) * 0.75
    tokens = torch.randint(0, 1000, (3, 5), generator=g)
    ref = token_logprobs(hidden @ weight.T, tokens, temperature=0.7)
    budget = Reductions(terms=1000, depth=2)
    budget.assert_logprobs_close(linear_token_logprobs(hidden, weight, tokens, temperature=0.7, chunk=37), ref)
    off = linear_token_logprobs(hidden, weight, tokens, temperature=0.7 * (1 + 1e-4), chunk=37)
    with pytest.raises(AssertionError):
        budget.assert_logprobs_close(off, ref)


def test_model_reductions_reads_every_tower():
    """Qwen2.5-VL: terms = the longest reduction of any tower; depth = 1 + the composite config's own 1 + (2·2 + 1)
    for the 2 text layers + (2·3 + 1) for the 3 vision blocks = 14; the composite's forwarded text sizes are not
    counted twice."""
    from transformers import Qwen2_5_VLConfig

    text = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, vocab_size=500, num_attention_heads=4)
    vision = dict(depth=3, hidden_size=32, intermediate_size=96, out_hidden_size=64, num_heads=2)
    config = Qwen2_5_VLConfig(text_config=text, vision_config=vision)
    assert model_reductions(config) == Reductions(terms=500, depth=14)
    assert model_reductions(config, positions=4096).terms == 4096  # a sequence longer than any width
