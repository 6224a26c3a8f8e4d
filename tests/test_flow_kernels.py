"""Transition kernels: scheduler parity at zero noise, log-probs against torch.distributions, edge steps."""

import dataclasses
import math

import pytest
import torch
from diffusers import DDIMScheduler, FlowMatchEulerDiscreteScheduler
from torch.distributions import Normal

from mmgrpo.modalities.flow import kernels as K
from tests.numerics import elementwise_tol, reorder_tol

torch.manual_seed(0)
SHAPE = (3, 4, 5, 5)  # [B, C, H, W]


def _flow_schedule(steps=10, shift=3.0):
    sch = FlowMatchEulerDiscreteScheduler(shift=shift)
    sch.set_timesteps(steps)
    return sch


@pytest.mark.parametrize("name", ["ode", "flow_sde", "dance_sde", "cps"])
def test_zero_noise_reproduces_flow_match_euler_step(name):
    sch = _flow_schedule()
    sig = sch.sigmas
    x = torch.randn(SHAPE)
    for i, t in enumerate(sch.timesteps):
        v = torch.randn(SHAPE)
        expected = sch.step(v, t, x, return_dict=False)[0]
        out = K.FLOW_KERNELS[name](v, x, sig[i], sig[i + 1], noise_level=0.0, sigma_max=float(sig[1]))
        torch.testing.assert_close(out.prev_sample, expected, atol=1e-6, rtol=0)
        assert torch.all(out.std == 0) and torch.all(out.logprob == 0)
        x = expected


@pytest.mark.parametrize("prediction_type", ["epsilon", "v_prediction"])
@pytest.mark.parametrize("set_alpha_to_one", [True, False])
def test_ddim_eta0_reproduces_ddim_scheduler_step(prediction_type, set_alpha_to_one):
    sch = DDIMScheduler(
        beta_schedule="scaled_linear",
        beta_start=0.00085,
        beta_end=0.012,
        clip_sample=False,
        set_alpha_to_one=set_alpha_to_one,
        steps_offset=1,
        prediction_type=prediction_type,
    )
    sch.set_timesteps(8)
    x = torch.randn(SHAPE)
    for t in sch.timesteps:
        eps = torch.randn(SHAPE)
        prev_t = t - sch.config.num_train_timesteps // 8
        a = sch.alphas_cumprod[t]
        ap = sch.alphas_cumprod[prev_t] if prev_t >= 0 else sch.final_alpha_cumprod
        expected = sch.step(eps, t, x, eta=0.0, return_dict=False)[0]
        out = K.ddim(eps, x, a, ap, eta=0.0, prediction_type=prediction_type)
        torch.testing.assert_close(out.prev_sample, expected, atol=1e-6, rtol=0)
        # the stochastic step's mean is the scheduler's eta>0 step without its noise
        sto = K.ddim(eps, x, a, ap, eta=1.0, prediction_type=prediction_type, draw=K.Draw(noise=torch.zeros(SHAPE)))
        expected_sto = sch.step(eps, t, x, eta=1.0, variance_noise=torch.zeros(SHAPE), return_dict=False)[0]
        torch.testing.assert_close(sto.prev_sample, expected_sto, atol=1e-6, rtol=0)
        torch.testing.assert_close(sto.std, (sch._get_variance(t, prev_t) ** 0.5).expand(3).float(), atol=1e-7, rtol=0)
        x = expected


def _normal_logprob(x, mean, std):
    return Normal(mean.double(), std.double().view(-1, 1, 1, 1)).log_prob(x.double()).mean(dim=(1, 2, 3)).float()


def _density_tol(x, mean, std, reduction="mean") -> float:
    """How far the kernel's fp32 log-density may be from the fp64 one (tests/numerics.py): the elementwise
    −(x − μ)²/(2σ²) − log σ − log √(2π) (6 roundings) of terms up to the largest |term|, then a sum of D of them
    (the mean divides by D again)."""
    terms = Normal(mean.double(), std.double().view(-1, 1, 1, 1)).log_prob(x.double())
    D, scale = math.prod(x.shape[1:]), float(terms.abs().max())
    tol = elementwise_tol(ops=6, scale=scale) + reorder_tol(terms=D, scale=scale)
    return tol if reduction == "mean" else D * tol


@pytest.mark.parametrize("name,level", [("flow_sde", 0.7), ("dance_sde", 0.3), ("cps", 0.8)])
def test_logprob_is_independent_gaussian_density(name, level):
    sch = _flow_schedule()
    sig = sch.sigmas
    for i in range(len(sig) - 2):  # the last CPS step is deterministic (tested below)
        x, v = torch.randn(SHAPE), torch.randn(SHAPE)
        s, sn = sig[i].expand(3), sig[i + 1].expand(3)
        out = K.FLOW_KERNELS[name](v, x, s, sn, noise_level=level, sigma_max=float(sig[1]))
        assert torch.all(out.std > 0)
        tol = _density_tol(out.prev_sample, out.mean, out.std)
        torch.testing.assert_close(out.logprob, _normal_logprob(out.prev_sample, out.mean, out.std), atol=tol, rtol=0)
        # scoring the same sample again (training) gives the same log-prob: ratio == 1
        again = K.FLOW_KERNELS[name](
            v, x, s, sn, noise_level=level, sigma_max=float(sig[1]), draw=K.Draw(prev_sample=out.prev_sample)
        )
        assert torch.equal(again.logprob, out.logprob)
        # sum reduction is the full log-density
        full = K.gaussian_logprob(out.prev_sample, out.mean, out.std, reduction="sum")
        sum_tol = _density_tol(out.prev_sample, out.mean, out.std, reduction="sum")
        torch.testing.assert_close(full, out.logprob * math.prod(SHAPE[1:]), atol=sum_tol, rtol=0)


def test_ddim_logprob_is_independent_gaussian_density():
    sch = DDIMScheduler(beta_schedule="scaled_linear", beta_start=0.00085, beta_end=0.012, set_alpha_to_one=True)
    sch.set_timesteps(5)
    t, prev_t = int(sch.timesteps[1]), int(sch.timesteps[2])
    x, eps = torch.randn(SHAPE), torch.randn(SHAPE)
    out = K.ddim(eps, x, sch.alphas_cumprod[t], sch.alphas_cumprod[prev_t], eta=1.0)
    tol = _density_tol(out.prev_sample, out.mean, out.std)
    torch.testing.assert_close(out.logprob, _normal_logprob(out.prev_sample, out.mean, out.std), atol=tol, rtol=0)


def test_flow_sde_coefficients_by_hand():
    sigma, sigma_next, a = 0.6, 0.45, 0.7
    x, v = torch.randn(1, 2, 3, 3), torch.randn(1, 2, 3, 3)
    out = K.flow_sde(v, x, sigma, sigma_next, noise_level=a, draw=K.Draw(noise=torch.zeros_like(x)))
    s = a * math.sqrt(sigma / (1 - sigma))
    dt = sigma_next - sigma
    mean = x * (1 + s**2 * dt / (2 * sigma)) + v * (1 + s**2 * (1 - sigma) / (2 * sigma)) * dt
    torch.testing.assert_close(out.mean, mean, atol=1e-6, rtol=0)
    torch.testing.assert_close(out.std, torch.tensor([s * math.sqrt(-dt)]), atol=1e-7, rtol=0)
    # same mean as Dance-SDE with eta = s: x + v dt + (s^2 / 2σ) ε̂ dt
    dance = K.dance_sde(v, x, sigma, sigma_next, noise_level=s, draw=K.Draw(noise=torch.zeros_like(x)))
    torch.testing.assert_close(dance.mean, mean, atol=1e-6, rtol=0)


def test_flow_sde_at_sigma_one_uses_sigma_max_and_needs_it():
    x, v = torch.randn(SHAPE), torch.randn(SHAPE)
    with pytest.raises(ValueError, match="sigma_max"):
        K.flow_sde(v, x, 1.0, 0.9)
    out = K.flow_sde(v, x, 1.0, 0.9, noise_level=0.7, sigma_max=0.9)
    expected_std = 0.7 * math.sqrt(1.0 / (1 - 0.9)) * math.sqrt(0.1)
    torch.testing.assert_close(out.std, torch.full((3,), expected_std), atol=1e-6, rtol=0)


def test_flow_sde_preserves_gaussian_marginals():
    """With the exact velocity of a Gaussian data law the SDE keeps x_σ ~ N(0, (1−σ)²c² + σ²); noise without the
    score drift correction (ODE mean + the same noise) does not."""
    c, n, steps = 0.5, 20000, 50
    gen = torch.Generator().manual_seed(0)
    sig = torch.linspace(1, 0, steps + 1)

    def velocity(x, s):  # E[ε − x0 | x_σ] for x0 ~ N(0, c²)
        var = (1 - s) ** 2 * c**2 + s**2
        return (s - (1 - s) * c**2) / var * x

    x = torch.randn(n, 1, 1, 1, generator=gen)
    wrong = x.clone()
    for i in range(steps - 1):
        z = torch.randn(x.shape, generator=gen)
        out = K.flow_sde(
            velocity(x, sig[i]), x, sig[i], sig[i + 1], noise_level=1.0, sigma_max=float(sig[1]), draw=K.Draw(noise=z)
        )
        x = out.prev_sample
        ode = K.ode(velocity(wrong, sig[i]), wrong, sig[i], sig[i + 1])
        wrong = ode.prev_sample + out.std.view(-1, 1, 1, 1) * z
    s = float(sig[steps - 1])
    expected = math.sqrt((1 - s) ** 2 * c**2 + s**2)
    assert abs(float(x.std()) / expected - 1) < 0.02
    assert float(wrong.std()) / expected - 1 > 0.5


def test_cps_last_step_is_deterministic_and_flow_grpo_logprob():
    x, v = torch.randn(SHAPE), torch.randn(SHAPE)
    last = K.cps(v, x, 0.1, 0.0, noise_level=0.8)
    assert torch.all(last.std == 0) and torch.all(last.logprob == 0)
    torch.testing.assert_close(last.prev_sample, x - 0.1 * v, atol=1e-6, rtol=0)  # x̂₀ = the Euler step to 0
    out = K.cps(v, x, 0.5, 0.4, noise_level=0.8, cps_logprob="flow_grpo")
    torch.testing.assert_close(out.std, torch.full((3,), 0.4 * math.sin(0.4 * math.pi)), atol=1e-6, rtol=0)
    torch.testing.assert_close(out.logprob, -((out.prev_sample - out.mean) ** 2).mean(dim=(1, 2, 3)), atol=1e-6, rtol=0)


def test_ddim_last_step_deterministic_with_alpha_one():
    sch = DDIMScheduler(beta_schedule="scaled_linear", beta_start=0.00085, beta_end=0.012, set_alpha_to_one=True)
    sch.set_timesteps(4)
    t = int(sch.timesteps[-1])
    x, eps = torch.randn(SHAPE), torch.randn(SHAPE)
    out = K.ddim(eps, x, sch.alphas_cumprod[t], sch.final_alpha_cumprod, eta=1.0, clip_sample_range=1.0)
    assert torch.all(out.std == 0) and torch.all(out.logprob == 0)
    expected = sch.step(eps, sch.timesteps[-1], x, eta=1.0, return_dict=False)[0]  # clip_sample=True by default
    torch.testing.assert_close(out.prev_sample, expected, atol=1e-6, rtol=0)


def test_per_sample_sigmas_match_scalar_calls():
    sch = _flow_schedule()
    sig = sch.sigmas
    x, v = torch.randn(SHAPE), torch.randn(SHAPE)
    idx = torch.tensor([1, 4, 7])
    nxt = torch.randn(SHAPE)
    batched = K.flow_sde(v, x, sig[idx], sig[idx + 1], noise_level=0.7, draw=K.Draw(prev_sample=nxt))
    for j, i in enumerate(idx):
        single = K.flow_sde(
            v[j : j + 1], x[j : j + 1], sig[i], sig[i + 1], noise_level=0.7, draw=K.Draw(prev_sample=nxt[j : j + 1])
        )
        torch.testing.assert_close(batched.logprob[j : j + 1], single.logprob, atol=1e-6, rtol=0)


def test_vp_to_flow_sigma():
    a = torch.tensor([1.0, 0.5, 0.0])
    torch.testing.assert_close(K.vp_to_flow_sigma(a), torch.tensor([0.0, 0.5, 1.0]))


def test_draw_bundles_noise_source_scoring_and_reduction():
    """``Draw(generator=…)`` reproduces its draw, ``reduction="sum"`` is D× the mean, and the default draws anew."""
    x, v = torch.randn(SHAPE), torch.randn(SHAPE)
    for name in ["flow_sde", "dance_sde", "cps"]:
        kernel = K.FLOW_KERNELS[name]
        mean = kernel(v, x, 0.6, 0.5, draw=K.Draw(generator=torch.Generator().manual_seed(3)))
        full = kernel(v, x, 0.6, 0.5, draw=K.Draw(generator=torch.Generator().manual_seed(3), reduction="sum"))
        assert torch.equal(full.prev_sample, mean.prev_sample)
        tol = _density_tol(full.prev_sample, full.mean, full.std, reduction="sum")
        torch.testing.assert_close(full.logprob, mean.logprob * math.prod(SHAPE[1:]), atol=tol, rtol=0)
        assert not torch.equal(kernel(v, x, 0.6, 0.5).prev_sample, kernel(v, x, 0.6, 0.5).prev_sample)
    with pytest.raises(dataclasses.FrozenInstanceError):
        K.SAMPLE.reduction = "sum"
