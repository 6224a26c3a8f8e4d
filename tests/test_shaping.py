"""Per-unit shaping (temporal, value-anchored), RatioNorm and the Gaussian KL, against hand-computed values."""

import math

import pytest
import torch
from torch.distributions import Normal, kl_divergence

from mmgrpo import shaping
from mmgrpo.modalities.flow import kernels as K
from mmgrpo.shaping import ShapingInputs
from tests.numerics import elementwise_tol, reorder_tol


def test_none_broadcasts():
    adv = torch.tensor([[1.0, -1.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    out = shaping.shape_advantages("none", adv, ShapingInputs(mask, torch.zeros(1, 2)), {})
    assert out.tolist() == [[1.0, 1.0, 0.0], [-1.0, 0.0, 0.0]]


def test_temporal_tempflow_weights_by_hand():
    # σ = 1 is replaced by the row's largest σ < 1 (0.8) in the denominator only: sqrt(1/0.2) = √5, then
    # sqrt(σ/(1−σ)) = [2, 1, 0.5]
    sig = torch.tensor([[1.0, 0.8, 0.5, 0.2]])
    torch.testing.assert_close(shaping.tempflow_weights(sig), torch.tensor([[5.0**0.5, 2.0, 1.0, 0.5]]))
    # sigmas [1, 0.96, 0.5, 0.1]: first weight sqrt(1/(1−0.96)) = 5 (not sqrt(0.96/0.04) = 4.899)
    w = shaping.tempflow_weights(torch.tensor([[1.0, 0.96, 0.5, 0.1]]))
    torch.testing.assert_close(w, torch.tensor([[5.0, 0.96**0.5 / 0.04**0.5, 1.0, (0.1 / 0.9) ** 0.5]]))
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    inputs = ShapingInputs(mask, torch.zeros(1, 1), sigmas=sig)
    out = shaping.shape_advantages("temporal", torch.tensor([[2.0]]), inputs, {})
    # mean of the trained weights (√5+2+1)/3 -> A·w/mean = 2·[√5, 2, 1]·3/(√5+3)
    r5 = 5.0**0.5
    torch.testing.assert_close(out, torch.tensor([[6 * r5 / (r5 + 3), 12 / (r5 + 3), 6 / (r5 + 3), 0.0]]))
    raw = shaping.shape_advantages("temporal", torch.tensor([[2.0]]), inputs, {"normalize": False})
    torch.testing.assert_close(raw, torch.tensor([[2 * r5, 4.0, 2.0, 0.0]]))


def test_temporal_inv_dt_by_hand_and_batch_normalisation():
    sig = torch.tensor([[1.0, 0.8, 0.5, 0.2], [1.0, 0.8, 0.5, 0.2]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0]])
    inputs = ShapingInputs(mask, torch.zeros(1, 2), sigmas=sig)
    out = shaping.temporal(torch.tensor([[1.0, 5.0]]), inputs, weights="inv_dt")
    # h = [0.2, 0.3, 0.3, 0.2] -> 1/h = [5, 10/3, 10/3, 5], mean 25/6 -> [1.2, 0.8, 0.8, 1.2]
    torch.testing.assert_close(out, torch.tensor([[1.2, 0.8, 0.8, 1.2], [0.0, 0.0, 0.0, 0.0]]))
    with pytest.raises(ValueError, match="unit_sigmas"):
        shaping.temporal(torch.ones(1, 2), ShapingInputs(mask, torch.zeros(1, 2)))


def test_lambda_returns_by_hand():
    values = torch.tensor([[0.2, 0.5], [0.4, 0.3]])
    rewards = torch.tensor([1.0, 0.0])
    torch.testing.assert_close(shaping.lambda_returns(values, rewards, 1.0), torch.tensor([[0.8, 0.5], [-0.4, -0.3]]))
    torch.testing.assert_close(shaping.lambda_returns(values, rewards, 0.0), torch.tensor([[0.3, 0.5], [-0.1, -0.3]]))
    torch.testing.assert_close(shaping.lambda_returns(values, rewards, 0.5), torch.tensor([[0.55, 0.5], [-0.25, -0.3]]))


def test_value_anchored_by_hand():
    values = torch.tensor([[0.2, 0.5], [0.4, 0.3]])
    rewards = torch.tensor([[1.0, 0.0]])  # population std 0.5
    inputs = ShapingInputs(torch.ones(2, 2), rewards, values=values)
    out = shaping.value_anchored(torch.zeros(1, 2), inputs, lam=1.0, tau=0.5, eps=0.0)
    # Â = [[0.8, 0.5], [-0.4, -0.3]]; per-step z-scores [[1, 1], [-1, -1]]; w = 0.5/(0.5+0.5) = 0.5
    torch.testing.assert_close(out, torch.tensor([[0.9, 0.75], [-0.7, -0.65]]))
    relative_only = shaping.value_anchored(torch.zeros(1, 2), inputs, tau=0.0, eps=0.0)
    torch.testing.assert_close(relative_only, torch.tensor([[1.0, 1.0], [-1.0, -1.0]]))
    est = shaping.value_anchored(torch.tensor([[0.7, -0.7]]), inputs, tau=0.0, relative="estimator")
    torch.testing.assert_close(est, torch.tensor([[0.7, 0.7], [-0.7, -0.7]]))


def test_value_anchored_keeps_signal_when_group_std_collapses():
    values = torch.tensor([[0.2, 0.5], [0.4, 0.3]])
    rewards = torch.tensor([[0.5, 0.5]])  # identical rewards: group-normalised GRPO advantage is 0
    inputs = ShapingInputs(torch.ones(2, 2), rewards, values=values)
    out = shaping.shape_advantages("value_anchored", torch.zeros(1, 2), inputs, {"tau": 0.05, "abs_scale": 0.5})
    torch.testing.assert_close(out, torch.tensor([[0.6, 0.0], [0.2, 0.4]]))  # (R − V_t) / 0.5, w = 1


def test_value_anchored_nan_reward_and_missing_values():
    values = torch.zeros(2, 2)
    inputs = ShapingInputs(torch.ones(2, 2), torch.tensor([[1.0, float("nan")]]), values=values)
    out = shaping.value_anchored(torch.zeros(1, 2), inputs)
    assert torch.isfinite(out).all() and out[1].abs().sum() == 0
    with pytest.raises(ValueError, match="value_rewards"):
        shaping.value_anchored(torch.zeros(1, 2), ShapingInputs(torch.ones(2, 2), torch.zeros(1, 2)))


def test_ratio_norm_by_hand():
    log_ratio = torch.tensor([[0.1, -0.2, 5.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    std = torch.tensor([[0.5, 2.0, 1.0]])
    msd = torch.tensor([[0.02, 0.4, 1.0]])
    out = shaping.ratio_norm(log_ratio, mask, None, std=std, mean_sq_dist=msd)
    # (0.1 + 0.02/(2·0.25))·0.5 = 0.07; (−0.2 + 0.4/(2·4))·2 = −0.3; masked -> 0
    torch.testing.assert_close(out, torch.tensor([[0.07, -0.3, 0.0]]))
    torch.testing.assert_close(shaping.ratio_norm(log_ratio, mask, std=std), torch.tensor([[0.05, -0.4, 0.0]]))
    with pytest.raises(ValueError, match="ratio_norm_inputs"):
        shaping.ratio_norm(log_ratio, mask, None)


def test_ratio_norm_equals_mean_noise_times_mean_shift():
    """GRPO-Guard on a real Flow-SDE step: log r̃ = mean_D(z ⊙ (μ_θ − μ_old)), z = (x' − μ_old)/std."""
    torch.manual_seed(0)
    x, v = torch.randn(4, 2, 3, 3), torch.randn(4, 2, 3, 3)
    old = K.flow_sde(v, x, 0.7, 0.6, noise_level=0.7)
    new = K.flow_sde(
        v + 0.05 * torch.randn_like(v), x, 0.7, 0.6, noise_level=0.7, draw=K.Draw(prev_sample=old.prev_sample)
    )
    dmu = new.mean - old.mean
    log_ratio = (new.logprob - old.logprob).view(4, 1)
    msd = (dmu**2).mean(dim=(1, 2, 3)).view(4, 1)
    out = shaping.ratio_norm(log_ratio, torch.ones(4, 1), std=old.std.view(4, 1), mean_sq_dist=msd)
    z = (old.prev_sample - old.mean) / old.std.view(-1, 1, 1, 1)
    # the identity is exact, its evaluations are not (tests/numerics.py): each log-prob is a mean over D = 18
    # log-density terms (6 elementwise roundings each), the two are subtracted, ratio_norm rescales the difference
    std = old.std.double().view(-1, 1, 1, 1)
    x = old.prev_sample.double()
    scale = max(float(Normal(m.double(), std).log_prob(x).abs().max()) for m in (new.mean, old.mean))
    tol = 2 * (elementwise_tol(ops=6, scale=scale) + reorder_tol(terms=18, scale=scale)) + elementwise_tol(ops=4)
    torch.testing.assert_close(out.flatten(), (z * dmu).mean(dim=(1, 2, 3)), atol=tol, rtol=0)


def test_gaussian_kl_exact_and_flow_grpo_variant():
    torch.manual_seed(0)
    mean, ref = torch.randn(3, 2, 4, 4), torch.randn(3, 2, 4, 4)
    std = torch.tensor([0.3, 0.5, 0.0])
    exact = shaping.gaussian_kl(mean, ref, std)
    for i in range(2):
        kl = kl_divergence(Normal(mean[i], std[i]), Normal(ref[i], std[i])).mean()
        # a mean over D = 32 of (μ − μ_ref)²/(2s²), against torch's per-element KL: the terms' size sets the rounding
        scale = float(((mean[i] - ref[i]) ** 2 / (2 * std[i] ** 2)).abs().max())
        tol = elementwise_tol(ops=6, scale=scale) + reorder_tol(terms=32, scale=scale)
        torch.testing.assert_close(exact[i], kl, atol=tol, rtol=0)
    assert exact[2] == 0  # deterministic unit
    total = shaping.gaussian_kl(mean, ref, std, reduction="sum")
    torch.testing.assert_close(total[:2], exact[:2] * 32)
    dt = torch.tensor([0.1, 0.2, 0.1])
    fg = shaping.gaussian_kl(mean, ref, std, variant="flow_grpo", dt=dt)
    torch.testing.assert_close(fg, exact * dt)
    # Flow-GRPO form with std = s·sqrt(h): ‖Δμ‖²/(2 s²) averaged over D
    s = std[0] / math.sqrt(0.1)
    torch.testing.assert_close(fg[0], ((mean[0] - ref[0]) ** 2).mean() / (2 * s**2))


def test_unknown_shaper_parameter_is_reported():
    inputs = ShapingInputs(torch.ones(2, 2), torch.zeros(1, 2), sigmas=torch.full((2, 2), 0.5))
    with pytest.raises(ValueError, match="temporal"):
        shaping.shape_advantages("temporal", torch.zeros(1, 2), inputs, {"weight": "tempflow"})
