"""Transition kernels of flow-matching and diffusion samplers, with the Gaussian log-prob of each transition.

Implements, from the equations of Flow-GRPO (arXiv 2505.05470), CPS (arXiv 2509.05952), DanceGRPO
(arXiv 2505.07818) and DDPO (kvablack/ddpo-pytorch ``ddpo_pytorch/diffusers_patch/ddim_with_logprob.py``):

- ``ode``       the Euler step of the probability-flow ODE, x' = x + v·Δ (``FlowMatchEulerDiscreteScheduler``);
                deterministic, no density.
- ``flow_sde``  Flow-GRPO's Euler–Maruyama step of the marginal-preserving reverse SDE (Liu et al. 2025,
                arXiv 2505.05470, §4.2 "ODE-to-SDE"), noise s_i = a·sqrt(σ_i / (1 − σ̃_i)).
- ``dance_sde`` DanceGRPO's step (Xue et al. 2025, arXiv 2505.07818, §3): the same mean with a constant noise
                coefficient s_i ≡ η.
- ``cps``       Coefficients-preserving sampling (arXiv 2509.05952): s_i = σ_{i+1}·sin(a·π/2); the last step
                (σ_{i+1} = 0) is deterministic.
- ``ddim``      DDPO's DDIM step with η (Black et al. 2023, arXiv 2305.13301, eq. 3), for ε-/v-/x₀-prediction UNets;
                the last step (ᾱ_prev = 1) is deterministic.

Conventions (rectified flow, as in diffusers): x_σ = (1−σ)·x₀ + σ·ε, σ = 1 is noise, the model predicts the
velocity v = ε − x₀, step i goes from σ_i to σ_{i+1} < σ_i, Δ = σ_{i+1} − σ_i < 0 and h = −Δ.

**Log-prob reduction.** Every kernel returns ``logprob`` = the Gaussian log-density of the transition
averaged over the D = C·H·W latent elements (``reduction="mean"``, the Flow-GRPO and DDPO convention; a ratio
exp(Δℓ) then never sees sum-over-D magnitudes, which is why their PPO clip ranges are ~1e-4). ``reduction="sum"``
gives the true log-density of the whole latent. Deterministic transitions (std = 0) have ``logprob`` 0 and must
be masked out by the caller.

**Departure from Flow-GRPO:** its CPS code drops the constants *and* the 1/(2s²) factor (ℓ = −mean_D (x'−μ)²).
Here ``cps`` returns the exact Gaussian density by default; ``cps_logprob="flow_grpo"`` gives their form.

All math runs in float32 whatever the model dtype ("bf16 can overflow", Flow-GRPO). What a kernel does with its
Gaussian is one ``Draw``: give ``prev_sample`` to score a stored transition (training); leave it None to sample one
(rollout), with ``noise`` or ``generator``; ``reduction`` says how the log-density reduces over D.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

_LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)


@dataclass(frozen=True)
class Draw:
    """What one transition does with its Gaussian N(μ, std² I): draw x' or score a given x', and the reduction.

    Shape:
        prev_sample: [B, *D] or None
        noise: [B, *D] or None
    """

    prev_sample: Tensor | None = None
    """x_{i+1} to score (training); None draws a new one (rollout)."""
    noise: Tensor | None = None
    """The standard-normal z of the draw x' = μ + std·z; None draws z from ``generator``. Unused when scoring."""
    generator: torch.Generator | None = None
    """The generator z is drawn from when ``noise`` is None (None: torch's global one)."""
    reduction: str = "mean"
    """How the log-density reduces over the D latent elements: "mean" (Flow-GRPO, DDPO) or "sum" (true density)."""


SAMPLE = Draw()
"""The default ``Draw``: sample x' with torch's global generator, log-prob averaged over D."""


@dataclass
class KernelOutput:
    """One transition x_i → x_{i+1} for a batch.

    Shape:
        prev_sample: [B, *D] x_{i+1} (the given ``prev_sample`` when scoring, detached)
        mean: [B, *D] μ_θ(x_i), differentiable w.r.t. the model output
        std: [B] standard deviation of the Gaussian transition (0 = deterministic)
        logprob: [B] log N(x_{i+1}; μ, std² I) reduced over D (mean by default), 0 where std = 0
    """

    prev_sample: Tensor
    mean: Tensor
    std: Tensor
    logprob: Tensor


def _per_sample(value: Tensor | float, like: Tensor) -> Tensor:
    """A scalar or [B] tensor as float32 [B, 1, 1, ...] broadcastable against ``like`` [B, *D]."""
    t = torch.as_tensor(value, dtype=torch.float32, device=like.device)
    if t.dim() == 0:
        t = t.expand(like.shape[0])
    return t.reshape(-1, *([1] * (like.dim() - 1)))


def gaussian_logprob(x: Tensor, mean: Tensor, std: Tensor, reduction: str = "mean") -> Tensor:
    """log N(x; mean, std² I) reduced over all non-batch dims; 0 where std = 0 (a deterministic transition).

    Shape:
        x, mean: [B, *D]; std: [B] -> [B]
    """
    std_b = _per_sample(std, x)  # [B, 1, ...]
    safe = torch.where(std_b > 0, std_b, torch.ones_like(std_b))
    lp = -((x.float() - mean.float()) ** 2) / (2 * safe**2) - torch.log(safe) - _LOG_SQRT_2PI  # [B, *D]
    dims = tuple(range(1, x.dim()))
    lp = lp.mean(dims) if reduction == "mean" else lp.sum(dims)  # [B]
    return torch.where(std.float().reshape(-1) > 0, lp, torch.zeros_like(lp))


def _sample_or_score(mean: Tensor, std: Tensor, draw: Draw) -> KernelOutput:
    """Draw x' = mean + std·z (or take ``draw.prev_sample``) and return its log-prob reduced by ``draw.reduction``."""
    prev_sample = draw.prev_sample
    if prev_sample is None:
        noise = draw.noise
        if noise is None:
            noise = torch.randn(mean.shape, generator=draw.generator, device=mean.device, dtype=torch.float32)
        prev_sample = mean.detach() + _per_sample(std, mean) * noise.float()  # [B, *D]
    prev_sample = prev_sample.detach().float()
    return KernelOutput(prev_sample, mean, std, gaussian_logprob(prev_sample, mean, std, draw.reduction))


def _flow_terms(velocity: Tensor, sample: Tensor, sigma, sigma_next):
    v = velocity.float()
    x = sample.float()
    s = _per_sample(sigma, x)  # [B, 1, ...]
    s_next = _per_sample(sigma_next, x)
    return v, x, s, s_next, s_next - s  # dt = Δ < 0


def ode(
    velocity: Tensor,
    sample: Tensor,
    sigma: Tensor | float,
    sigma_next: Tensor | float,
    *,
    draw: Draw = SAMPLE,
    **_: object,
) -> KernelOutput:
    """Euler ODE step x' = x + v·(σ_{i+1} − σ_i); std 0 and log-prob 0 (deterministic, masked out).

    Shape:
        velocity, sample: [B, *D]; sigma, sigma_next: scalar or [B] -> KernelOutput
    """
    v, x, _s, _s_next, dt = _flow_terms(velocity, sample, sigma, sigma_next)
    mean = x + v * dt  # [B, *D]
    zero = torch.zeros(x.shape[0], device=x.device)
    out = mean.detach() if draw.prev_sample is None else draw.prev_sample.detach().float()
    return KernelOutput(out, mean, zero, zero)


def flow_sde_noise(sigma: Tensor, noise_level: float, sigma_max: float | None) -> Tensor:
    """Flow-GRPO's SDE noise coefficient s_i = a·sqrt(σ_i/(1 − σ̃_i)), σ̃ = σ_max where σ_i = 1, else σ_i.

    The transition std is s_i·sqrt(h_i). Shape: sigma [B] -> [B].
    """
    sigma = sigma.float()
    if sigma_max is None and bool((sigma >= 1).any()):
        raise ValueError("flow_sde at σ = 1 needs sigma_max (Flow-GRPO uses the schedule's second sigma)")
    denom = 1 - torch.where(sigma >= 1, torch.full_like(sigma, sigma_max or 0.0), sigma)
    return noise_level * torch.sqrt(sigma / denom)


def flow_sde(
    velocity: Tensor,
    sample: Tensor,
    sigma: Tensor | float,
    sigma_next: Tensor | float,
    *,
    draw: Draw = SAMPLE,
    noise_level: float = 0.7,
    sigma_max: float | None = None,
    **_: object,
) -> KernelOutput:
    """Flow-GRPO SDE step (Liu et al. 2025, arXiv 2505.05470, eq. 9;
    yifan123/flow_grpo ``flow_grpo/diffusers_patch/sd3_sde_with_logprob.py``).

    μ = x·(1 + s²Δ/(2σ)) + v·(1 + s²(1−σ)/(2σ))·Δ, x' = μ + s·sqrt(h)·z, s = a·sqrt(σ/(1−σ̃)).
    ``noise_level`` a = 0 gives the ODE step exactly. ``sigma_max`` replaces σ = 1 in the denominator.

    Shape:
        velocity, sample: [B, *D]; sigma, sigma_next: scalar or [B] -> KernelOutput
    """
    v, x, s, _s_next, dt = _flow_terms(velocity, sample, sigma, sigma_next)
    s_i = _per_sample(flow_sde_noise(s.reshape(-1), noise_level, sigma_max), x)  # [B, 1, ...]
    mean = x * (1 + s_i**2 * dt / (2 * s)) + v * (1 + s_i**2 * (1 - s) / (2 * s)) * dt  # [B, *D]
    std = (s_i * (-dt).clamp_min(0).sqrt()).reshape(-1)  # [B]
    return _sample_or_score(mean, std, draw)


def dance_sde(
    velocity: Tensor,
    sample: Tensor,
    sigma: Tensor | float,
    sigma_next: Tensor | float,
    *,
    draw: Draw = SAMPLE,
    noise_level: float = 0.3,
    **_: object,
) -> KernelOutput:
    """DanceGRPO SDE step (Xue et al. 2025, arXiv 2505.07818; XueZeyue/DanceGRPO ``fastvideo/train_grpo_flux.py``),
    constant noise η = ``noise_level``.

    μ = x + v·Δ + (η²/(2σ))·ε̂·Δ with ε̂ = x + (1−σ)·v (i.e. −(η²/2)·score·Δ), x' = μ + η·sqrt(h)·z.

    Shape:
        velocity, sample: [B, *D]; sigma, sigma_next: scalar or [B] -> KernelOutput
    """
    v, x, s, _s_next, dt = _flow_terms(velocity, sample, sigma, sigma_next)
    eps_hat = x + (1 - s) * v  # [B, *D]
    mean = x + v * dt + (noise_level**2 / (2 * s)) * eps_hat * dt  # [B, *D]
    std = noise_level * torch.sqrt((-dt).reshape(-1).clamp_min(0))  # [B]
    return _sample_or_score(mean, std, draw)


def cps(
    velocity: Tensor,
    sample: Tensor,
    sigma: Tensor | float,
    sigma_next: Tensor | float,
    *,
    draw: Draw = SAMPLE,
    noise_level: float = 0.8,
    cps_logprob: str = "gaussian",
    **_: object,
) -> KernelOutput:
    """Coefficients-preserving sampling step (arXiv 2509.05952; flow_grpo ``sde_type='cps'``).

    s = σ_{i+1}·sin(a·π/2), x̂₀ = x − σv, ε̂ = x + (1−σ)v, μ = (1−σ_{i+1})·x̂₀ + sqrt(σ_{i+1}² − s²)·ε̂, x' = μ + s·z.
    The last step (σ_{i+1} = 0) is deterministic (std 0, log-prob 0). ``cps_logprob="flow_grpo"`` returns
    Flow-GRPO's −mean_D (x'−μ)² instead of the Gaussian density (no 1/(2s²), no constants).

    Shape:
        velocity, sample: [B, *D]; sigma, sigma_next: scalar or [B] -> KernelOutput
    """
    v, x, s, s_next, _dt = _flow_terms(velocity, sample, sigma, sigma_next)
    std_b = s_next * math.sin(noise_level * math.pi / 2)  # [B, 1, ...]
    x0_hat = x - s * v
    eps_hat = x + (1 - s) * v
    mean = (1 - s_next) * x0_hat + torch.sqrt((s_next**2 - std_b**2).clamp_min(0)) * eps_hat  # [B, *D]
    out = _sample_or_score(mean, std_b.reshape(-1), draw)
    if cps_logprob == "flow_grpo":
        dims = tuple(range(1, x.dim()))
        sq = (out.prev_sample - mean) ** 2
        lp = -(sq.mean(dims) if draw.reduction == "mean" else sq.sum(dims))  # [B]
        out.logprob = torch.where(out.std > 0, lp, torch.zeros_like(lp))
    elif cps_logprob != "gaussian":
        raise ValueError(f"cps_logprob must be 'gaussian' or 'flow_grpo', got {cps_logprob!r}")
    return out


def ddim_std(alpha_prod: Tensor, alpha_prod_prev: Tensor, eta: float) -> Tensor:
    """DDIM transition std η·sqrt((1−ᾱ_prev)/(1−ᾱ_t))·sqrt(1 − ᾱ_t/ᾱ_prev) (Song et al. 2021, eq. 16).

    Shape:
        alpha_prod, alpha_prod_prev: [B] -> [B]
    """
    a, ap = alpha_prod.float(), alpha_prod_prev.float()
    var = (1 - ap) / (1 - a) * (1 - a / ap)
    return eta * var.clamp_min(0).sqrt()


def ddim(
    model_output: Tensor,
    sample: Tensor,
    alpha_prod: Tensor | float,
    alpha_prod_prev: Tensor | float,
    *,
    draw: Draw = SAMPLE,
    eta: float = 1.0,
    prediction_type: str = "epsilon",
    clip_sample_range: float | None = None,
    **_: object,
) -> KernelOutput:
    """DDPO's DDIM step with log-prob (kvablack/ddpo-pytorch ``ddim_with_logprob.py``; diffusers
    ``DDIMScheduler.step`` for η = 0).

    x̂₀ from the prediction (clipped to ±``clip_sample_range`` if given), ε̂ the predicted noise,
    σ_t = ``ddim_std``, μ = sqrt(ᾱ_prev)·x̂₀ + sqrt(1 − ᾱ_prev − σ_t²)·ε̂, x' = μ + σ_t·z.
    When ᾱ_prev = 1 (the final step with ``set_alpha_to_one``) σ_t = 0: deterministic.

    Shape:
        model_output, sample: [B, *D]; alpha_prod, alpha_prod_prev: scalar or [B] -> KernelOutput
    """
    out_f, x = model_output.float(), sample.float()
    a = _per_sample(alpha_prod, x)
    ap = _per_sample(alpha_prod_prev, x)
    if prediction_type == "epsilon":
        x0_hat, eps_hat = (x - (1 - a).sqrt() * out_f) / a.sqrt(), out_f
    elif prediction_type == "v_prediction":
        x0_hat, eps_hat = a.sqrt() * x - (1 - a).sqrt() * out_f, a.sqrt() * out_f + (1 - a).sqrt() * x
    elif prediction_type == "sample":
        x0_hat, eps_hat = out_f, (x - a.sqrt() * out_f) / (1 - a).sqrt()
    else:
        raise ValueError(f"prediction_type must be epsilon | v_prediction | sample, got {prediction_type!r}")
    if clip_sample_range is not None:
        x0_hat = x0_hat.clamp(-clip_sample_range, clip_sample_range)
    std = ddim_std(a.reshape(-1), ap.reshape(-1), eta)  # [B]
    std_b = _per_sample(std, x)
    mean = ap.sqrt() * x0_hat + (1 - ap - std_b**2).clamp_min(0).sqrt() * eps_hat  # [B, *D]
    return _sample_or_score(mean, std, draw)


FlowKernel = Callable[..., KernelOutput]

FLOW_KERNELS: dict[str, FlowKernel] = {"ode": ode, "flow_sde": flow_sde, "dance_sde": dance_sde, "cps": cps}
"""Kernels over rectified-flow sigmas: ``kernel(velocity, sample, sigma, sigma_next, *, draw, **options)``."""

KERNEL_NAMES = [*FLOW_KERNELS, "ddim"]


def x0_from_velocity(velocity: Tensor, sample: Tensor, sigma: Tensor | float) -> Tensor:
    """One-step clean prediction x̂₀ = x − σ·v (for dense values and chunk weights).

    Shape:
        velocity, sample: [B, *D]; sigma: scalar or [B] -> [B, *D]
    """
    return sample.float() - _per_sample(sigma, sample) * velocity.float()


def vp_to_flow_sigma(alpha_prod: Tensor) -> Tensor:
    """The rectified-flow σ of a VP state: x_vp/(√ᾱ + √(1−ᾱ)) = (1−σ)x₀ + σε with σ = √(1−ᾱ)/(√ᾱ + √(1−ᾱ)).

    Used to report DDIM steps on the same σ ∈ [0, 1] axis as flow steps (temporal shaping). Shape: [B] -> [B].
    """
    a = alpha_prod.float()
    return (1 - a).sqrt() / (a.sqrt() + (1 - a).sqrt())


__all__ = [
    "FLOW_KERNELS",
    "KERNEL_NAMES",
    "SAMPLE",
    "Draw",
    "KernelOutput",
    "cps",
    "dance_sde",
    "ddim",
    "ddim_std",
    "flow_sde",
    "flow_sde_noise",
    "gaussian_logprob",
    "ode",
    "vp_to_flow_sigma",
    "x0_from_velocity",
]
