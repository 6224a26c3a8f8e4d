"""Per-unit advantage shaping: from one advantage per sample [P, G] to one per action unit [B, T].

Pure math (torch only). Every shaper has one signature::

    shaper(advantages: Tensor[P, G], inputs: ShapingInputs, **params) -> Tensor[B, T]

``none`` broadcasts the sample's advantage to all of its units (outcome-level GRPO). Also here:

- ``temporal``: per-unit weights on the broadcast advantage, TempFlow-GRPO's noise-aware w_t ∝ sqrt(σ_t/(1−σ_t))
  (He et al. 2025, arXiv 2508.04324 §3.2) or GRPO-Guard's 1/h_t step reweighting (arXiv 2510.22319).
- ``value_anchored``: the VGPO family (Shao et al. 2025, arXiv 2512.12387): dense per-unit values → per-unit
  advantages from value differences, mixed with an absolute (value-anchored, not group-normalised) term whose
  weight grows as the group's reward std collapses. VGPO's equations were not available; what we implement is
  written out in :func:`value_anchored` (VGPO, arXiv 2512.12387; where we looked for the paper's equations and the
  authors' code, and found neither: docs/variants.md, "VGPO as published").
- :func:`intragroup_divergence`, :func:`tw_grpo_weights`: TW-GRPO's per-position token weights from the
  divergence of the group's next-token distributions (arXiv 2505.24718), applied by the trainer to the per-unit
  advantages (``algorithm.token_weighting: tw_grpo``).
- :func:`ratio_norm`: GRPO-Guard RatioNorm of per-step log-ratios (applied by the trainer, not a shaper).
- :func:`gaussian_kl`: the exact KL between two Gaussian transitions of equal std, and Flow-GRPO's variant.

The chunk-level ratio of Chunk-GRPO is a ratio level (``mmgrpo.losses.RATIO_LEVELS["chunk"]``); chunk
subsampling weighted by relative latent change is a step selector of the flow adapter
(``mmgrpo.modalities.flow.steps``), because it needs the latents.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from mmgrpo.registry import Registry

SHAPERS: Registry = Registry("shaper")


@dataclass
class ShapingInputs:
    """What a shaper may read about a rollout (all optional beyond the mask).

    Shape:
        mask: [B, T] 1 for trained units
        rewards: [P, G] combined scalar rewards (NaN = not applicable)
        sigmas: [B, T] noise level of each unit (flow/diffusion) or None
        values: [B, T] dense per-unit value estimates or None
    """

    mask: Tensor  # [B, T]
    rewards: Tensor  # [P, G]
    sigmas: Tensor | None = None  # [B, T]
    values: Tensor | None = None  # [B, T]


@dataclass(frozen=True)
class NoOptions:
    """A component without options (``none`` shaping, ``constant`` β, the sequential sampler): its ``_args`` must
    be empty."""


@SHAPERS.register("none", options=NoOptions)
def broadcast(advantages: Tensor, inputs: ShapingInputs) -> Tensor:
    """Every unit of sample b gets the sample's advantage A_b (GRPO, Shao et al. 2024, outcome supervision).

    Shape:
        advantages: [P, G] -> [B, T], zero where mask is 0
    """
    return advantages.reshape(-1, 1).float() * inputs.mask.float()  # [B, T]


def shape_advantages(name: str, advantages: Tensor, inputs: ShapingInputs, params: dict) -> Tensor:
    """Look up shaper ``name`` and apply it; a wrong parameter name is reported with the shaper's name."""
    fn = SHAPERS.get(name)
    try:
        out = fn(advantages, inputs, **params)
    except TypeError as e:
        raise ValueError(f"algorithm.shaping_args for shaper {name!r}: {e}") from None
    return out * inputs.mask.float()  # [B, T]


# ------------------------------------------------------------------------------------------- temporal


def tempflow_weights(sigmas: Tensor) -> Tensor:
    """TempFlow-GRPO noise-aware weights sqrt(σ/(1−σ̃)) per unit, unnormalised.

    This is Flow-SDE's noise coefficient s_t/a (Flow-GRPO, arXiv 2505.05470 §4.1), the factor that cancels the
    σ-dependence of the policy gradient (TempFlow-GRPO, arXiv 2508.04324 §3; GCPO's weight in xingzhejun/GCPO
    ``fastvideo/train_grpo_flux_hpsv3.py``). σ = 1 would divide by zero; as in Flow-GRPO's kernel
    (yifan123/flow_grpo, ``flow_grpo/diffusers_patch/sd3_sde_with_logprob.py``) it is replaced in the
    denominator only by the largest σ < 1 of the same row (the schedule's second sigma), σ̃.

    Shape:
        sigmas: [B, T] -> [B, T]
    """
    s = sigmas.float()  # [B, T]
    below = torch.where(s < 1, s, torch.full_like(s, -1.0)).amax(dim=1, keepdim=True)  # [B, 1]
    s_den = torch.where(s < 1, s, below.clamp_min(0.0).expand_as(s))  # [B, T]
    return torch.sqrt(s.clamp_min(0.0) / (1 - s_den).clamp_min(1e-6))


def step_sizes(sigmas: Tensor) -> Tensor:
    """h_t = σ_t − σ_{t+1} for units that are consecutive steps of one schedule ending at σ_T = 0.

    Shape:
        sigmas: [B, T] -> [B, T]
    """
    s = sigmas.float()
    nxt = torch.cat([s[:, 1:], torch.zeros_like(s[:, :1])], dim=1)  # [B, T]
    return s - nxt


@dataclass(frozen=True)
class TemporalOptions:
    """``algorithm.shaping_args`` of ``temporal`` (:func:`temporal`)."""

    weights: Literal["tempflow", "inv_dt"] = "tempflow"
    """tempflow: TempFlow-GRPO's sqrt(σ/(1−σ)) | inv_dt: GRPO-Guard's 1/h_t."""
    normalize: bool = True
    """Scale the weights to mean 1 over each sample's valid units."""


@SHAPERS.register("temporal", options=TemporalOptions)
def temporal(
    advantages: Tensor,
    inputs: ShapingInputs,
    weights: Literal["tempflow", "inv_dt"] = "tempflow",
    normalize: bool = True,
) -> Tensor:
    """A_{b,t} = A_b · w_t: the sample's advantage re-weighted per denoising step.

    - ``weights="tempflow"``: w_t = sqrt(σ_t/(1−σ̃_t)) (TempFlow-GRPO, arXiv 2508.04324 §3.2; the same formula as
      GCPO's ``reweight loss from tempflow``, xingzhejun/GCPO ``fastvideo/train_grpo_flux_hpsv3.py``);
    - ``weights="inv_dt"``: w_t = 1/h_t, GRPO-Guard's division of each step's loss by its step size
      (arXiv 2510.22319; yifan123/flow_grpo ``scripts/train_sd3_GRPO_Guard.py``), used together with
      ``algorithm.ratio_norm``.

    With ``normalize`` the weights are divided by their mean over all trained units of the batch, so the loss
    keeps GRPO's overall scale and only the distribution over steps changes. **Departure:** the papers scale the
    loss without this normalisation (TempFlow's exact normalisation was not retrievable); a constant factor
    only rescales the step size under Adam. Scaling A by w_t equals scaling the unit's clipped loss by w_t.

    Shape:
        advantages: [P, G]; inputs.sigmas: [B, T] (required) -> [B, T]
    """
    if inputs.sigmas is None:
        raise ValueError(
            "shaping=temporal needs per-unit noise levels (Rollout.unit_sigmas); "
            "only flow/diffusion adapters provide them"
        )
    if weights == "tempflow":
        w = tempflow_weights(inputs.sigmas)  # [B, T]
    elif weights == "inv_dt":
        w = 1.0 / step_sizes(inputs.sigmas).clamp_min(1e-6)  # [B, T]
    else:
        raise ValueError(f"weights must be tempflow | inv_dt, got {weights!r}")
    m = inputs.mask.float()  # [B, T]
    if normalize:
        w = w / ((w * m).sum() / m.sum().clamp_min(1.0)).clamp_min(1e-12)
    return advantages.reshape(-1, 1).float() * w * m  # [B, T]


# ------------------------------------------------------------------------------------ value-anchored


def lambda_returns(values: Tensor, rewards: Tensor, lam: float) -> Tensor:
    """GAE(λ) advantages with γ = 1 and no intermediate reward, from per-unit state values and the outcome.

    With V_t the value of the state before unit t and V_T := R (the outcome reward), δ_t = V_{t+1} − V_t and
    Â_t = Σ_{k≥t} λ^{k−t} δ_k. λ = 1 gives R − V_t (value-baseline return), λ = 0 gives δ_t (one-step process
    reward); Σ_t δ_t = R − V_0 telescopes.

    Shape:
        values: [B, T], rewards: [B] -> [B, T]
    """
    v_ext = torch.cat([values.float(), rewards.float().reshape(-1, 1)], dim=1)  # [B, T+1]
    delta = v_ext[:, 1:] - v_ext[:, :-1]  # [B, T]
    out = torch.zeros_like(delta)
    running = torch.zeros_like(delta[:, 0])
    for t in range(delta.shape[1] - 1, -1, -1):
        running = delta[:, t] + lam * running  # [B]
        out[:, t] = running
    return out


@dataclass(frozen=True)
class ValueAnchoredOptions:
    """``algorithm.shaping_args`` of ``value_anchored`` (:func:`value_anchored`, VGPO arXiv 2512.12387)."""

    lam: float = 1.0
    """λ of the GAE-style returns over the per-unit values."""
    tau: float = 0.05
    """Group reward std below which the absolute (value-anchored) term takes over."""
    abs_scale: float = 1.0
    """Weight of the absolute term."""
    relative: Literal["per_step", "estimator"] = "per_step"
    """per_step: the value-difference advantages | estimator: the group estimator's advantage."""
    eps: float = 1e-4
    """Added to the std before dividing."""


@SHAPERS.register("value_anchored", options=ValueAnchoredOptions)
def value_anchored(
    advantages: Tensor,
    inputs: ShapingInputs,
    lam: float = 1.0,
    tau: float = 0.05,
    abs_scale: float = 1.0,
    relative: Literal["per_step", "estimator"] = "per_step",
    eps: float = 1e-4,
) -> Tensor:
    """Value-anchored per-unit advantages (the VGPO family, arXiv 2512.12387) — exactly:

    1. Dense credit ("temporal cumulative reward"): from the per-unit values V[b, t] (for flow models, the reward
       of the one-step prediction x̂₀(x_t) decoded, filled by the adapter) and the outcome R_b,
       Â[b, t] = GAE_λ(V, R) (:func:`lambda_returns`; λ = 1: R_b − V[b, t]).
    2. Relative term: ``per_step`` (default) z-scores Â over the G samples of the group at each unit t,
       Ã_rel[b, t] = (Â[b, t] − mean_g Â[·, t]) / (std_g Â[·, t] + eps) (population std); ``estimator`` uses the
       configured group estimator's outcome advantage A_b for every unit instead.
    3. Absolute term (the anchor): Ã_abs[b, t] = Â[b, t] / ``abs_scale`` — measured against the sample's own value
       estimate, in reward units, so it does not vanish when the group's rewards become identical.
    4. Adaptive mix per group p: w_p = τ / (τ + std_g R_p) (population std of the group's rewards),
       A[b, t] = (1 − w_p)·Ã_rel[b, t] + w_p·Ã_abs[b, t]. A diverse group (std ≫ τ) is plain group-relative;
       a collapsed group (std → 0) keeps the absolute value-anchored signal. τ = 0 is purely relative.

    Samples with a NaN (not applicable) reward get 0. These are our equations, not VGPO's: its §3 (the "Temporal
    Cumulative Reward Mechanism" and "Adaptive Dual Advantage Estimation", the names steps 1 and 4 stand for) and any
    code of the authors could not be retrieved (searched 2026-11-29; docs/variants.md, "VGPO as published").

    Shape:
        advantages: [P, G]; inputs.values: [B, T] (required); inputs.rewards: [P, G] -> [B, T]
    """
    if inputs.values is None:
        raise ValueError(
            "shaping=value_anchored needs per-unit values (Rollout.unit_values); for the flow "
            "adapter set model.args.value_rewards to the reward(s) that score the x̂₀ predictions"
        )
    P, G = inputs.rewards.shape
    r = inputs.rewards.float()  # [P, G]
    valid = torch.isfinite(r)  # [P, G]
    r0 = torch.where(valid, r, torch.zeros_like(r))
    a_hat = lambda_returns(inputs.values, r0.reshape(-1), lam)  # [B, T]
    T = a_hat.shape[1]
    vg = valid.reshape(P, G, 1).float()  # [P, G, 1]
    n = vg.sum(1, keepdim=True).clamp_min(1.0)  # [P, 1, 1]
    if relative == "per_step":
        ah = a_hat.reshape(P, G, T)
        mean = (ah * vg).sum(1, keepdim=True) / n  # [P, 1, T]
        std = (((ah - mean) ** 2 * vg).sum(1, keepdim=True) / n).sqrt()  # [P, 1, T]
        rel = ((ah - mean) / (std + eps)).reshape(P * G, T)  # [B, T]
    elif relative == "estimator":
        rel = advantages.reshape(-1, 1).float().expand(P * G, T)  # [B, T]
    else:
        raise ValueError(f"relative must be per_step | estimator, got {relative!r}")
    absolute = a_hat / abs_scale  # [B, T]
    rm = (r0 * valid).sum(1, keepdim=True) / valid.sum(1, keepdim=True).clamp_min(1)  # [P, 1]
    rstd = ((((r0 - rm) ** 2) * valid).sum(1, keepdim=True) / valid.sum(1, keepdim=True).clamp_min(1)).sqrt()
    w = torch.zeros_like(rstd) if tau <= 0 else tau / (tau + rstd)  # [P, 1]
    w = w.repeat_interleave(G, dim=0)  # [B, 1]
    out = (1 - w) * rel + w * absolute  # [B, T]
    return out * valid.reshape(-1, 1) * inputs.mask.float()


# ------------------------------------------------------------------------------ RatioNorm and exact KL


def ratio_norm(
    log_ratio: Tensor,
    mask: Tensor,
    sigmas: Tensor | None = None,
    *,
    std: Tensor | None = None,
    mean_sq_dist: Tensor | None = None,
) -> Tensor:
    """GRPO-Guard RatioNorm of per-step log-ratios (arXiv 2510.22319; flow_grpo ``scripts/train_sd3_GRPO_Guard.py``).

    For a Gaussian step with std s_t = s·sqrt(h) and the log-prob averaged over the D latent elements,
    log r = mean_D[(x−μ_old)·Δμ]/s_t² − mean_D[Δμ²]/(2 s_t²) with Δμ = μ_θ − μ_old. RatioNorm adds back the
    always-negative bias B = mean_D[Δμ²]/(2 s_t²) (``mean_sq_dist`` = mean_D[Δμ²]) and rescales by s_t:

        log r̃ = (log r + B) · s_t = mean_D[z ⊙ Δμ],   z = (x − μ_old)/s_t,

    so every step's log-ratio is unbiased at on-policy and on one noise-independent scale. Without
    ``mean_sq_dist`` only the rescaling is applied. **Departure:** GRPO-Guard multiplies by the batch-mean
    s̄·sqrt(h̄); in its loop all samples of a minibatch are at the same step, so that equals each unit's own s_t,
    which is what we use (it stays correct when samples train different steps). Its 1/h̄ loss reweighting is
    ``shaping: temporal`` with ``weights: inv_dt``. ``sigmas`` is accepted for the trainer's call signature and
    unused: the std depends on the kernel, so the adapter supplies it (``FlowAdapter.ratio_norm_inputs``).

    Shape:
        log_ratio, mask: [n, T]; std, mean_sq_dist: [n, T] -> [n, T] (0 where mask is 0)
    """
    if std is None:
        raise ValueError(
            "ratio_norm needs the per-unit transition std: the trainer must pass "
            "**adapter.ratio_norm_inputs(rollout, index) (flow adapters provide it)"
        )
    s = std.float()
    out = log_ratio.float()
    if mean_sq_dist is not None:
        out = out + mean_sq_dist.float() / (2 * s.clamp_min(1e-12) ** 2)
    out = out * s  # [n, T]
    return torch.where(mask > 0, out, torch.zeros_like(out))


def gaussian_kl(
    mean: Tensor,
    ref_mean: Tensor,
    std: Tensor,
    *,
    variant: str = "exact",
    dt: Tensor | None = None,
    reduction: str = "mean",
) -> Tensor:
    """KL(N(μ_θ, s²I) ‖ N(μ_ref, s²I)) of one transition, reduced over the D latent elements like the log-prob.

    - ``exact``: mean_D (μ_θ − μ_ref)² / (2 s²) with s the transition std (= s_t·sqrt(h) for Flow-SDE), i.e. the
      exact Gaussian KL ‖Δμ‖²/(2s²) divided by D (``reduction="sum"`` gives the true KL).
    - ``flow_grpo``: Flow-GRPO's code divides by 2·s_t² without the step size h, i.e. exact · h
      (yifan123/flow_grpo ``scripts/train_sd3.py``, the KL term of the loss). Needs ``dt`` = h.

    Units with std 0 (deterministic) have KL 0.

    Shape:
        mean, ref_mean: [n, *D]; std: [n]; dt: [n] -> [n]
    """
    dims = tuple(range(1, mean.dim()))
    sq = (mean.float() - ref_mean.float()) ** 2
    sq = sq.mean(dims) if reduction == "mean" else sq.sum(dims)  # [n]
    s = std.float()
    kl = sq / (2 * torch.where(s > 0, s, torch.ones_like(s)) ** 2)  # [n]
    if variant == "flow_grpo":
        if dt is None:
            raise ValueError("gaussian_kl(variant='flow_grpo') needs dt (the step size h)")
        kl = kl * dt.float()
    elif variant != "exact":
        raise ValueError(f"variant must be exact | flow_grpo, got {variant!r}")
    return torch.where(s > 0, kl, torch.zeros_like(kl))


# ------------------------------------------------------------------------ TW-GRPO intra-group token weights

TW_GRPO_CLAMP = 11.0
"""|ℓ̄ − ℓ| is clamped to this before the exp (TW-GRPO's code)."""


def intragroup_divergence(logits: Tensor, mask: Tensor, *, chunk: int = 64) -> Tensor:
    """TW-GRPO's per-position divergence of a group's next-token distributions (arXiv 2505.24718 §3; code
    longmalongma/TW-GRPO ``src/open_r1/trainer/grpo_trainer.py::compute_token_importance_kl_logs_uniform``).

    With ℓ_{i,t,·} = log_softmax(logits_{i,t,·}) for the G samples i of one prompt, replaced by the uniform
    log(1/V) where sample i has no token at t (mask 0), and ℓ̄_{t,·} = (1/G) Σ_i ℓ_{i,t,·} (the mean in log space)::

        D_t = (1/G) Σ_i Σ_v [e^d − d − 1],   d = clamp(ℓ̄_{t,v} − ℓ_{i,t,v}, −11, 11)

    i.e. the mean over the group of a KL-like divergence (the k3 form) between each sample and the group's
    log-mean distribution at position t. The fp32 log-probabilities exist for ``chunk`` positions at a time
    ([G, chunk, V]); the result does not depend on ``chunk``.

    Shape:
        logits: [G, T, V] (any float dtype), mask: [G, T] → D [T]
    """
    _, T, V = logits.shape
    valid = mask.to(logits.device) > 0  # [G, T]
    uniform = -math.log(V)
    out = []
    for lo in range(0, T, max(1, chunk)):
        hi = min(T, lo + max(1, chunk))
        lp = torch.log_softmax(logits[:, lo:hi].float(), dim=-1)  # [G, c, V] the only fp32 copy
        lp = torch.where(valid[:, lo:hi, None], lp, torch.full_like(lp, uniform))  # [G, c, V]
        d = (lp.mean(0, keepdim=True) - lp).clamp(-TW_GRPO_CLAMP, TW_GRPO_CLAMP)  # [G, c, V]
        out.append((d.exp() - d - 1.0).sum(-1).mean(0))  # [c]
    return torch.cat(out)  # [T]


def tw_grpo_weights(divergence: Tensor, mask: Tensor, *, alpha: float) -> Tensor:
    """TW-GRPO token weights from the per-group divergences: w_t = 1 + (α − 1)·(D_t − min D)/(max D − min D + 1e-8).

    Min and max are over all T positions of the group (also positions where no sample has a token, whose D is 0,
    as in the code); the weight of position t is shared by the G samples and multiplied by their mask. α is
    ``max_weight`` of the code (1.4 in its config, 1.7 in ``scripts/tw-grpo.sh``).

    Shape:
        divergence: [P, T], mask: [B, T] with B = P·G → weights [B, T]
    """
    if alpha < 1:
        raise ValueError(f"algorithm.token_weighting_args.alpha: must be >= 1 (the largest weight), got {alpha}")
    D = divergence.float()  # [P, T]
    lo, hi = D.amin(1, keepdim=True), D.amax(1, keepdim=True)  # [P, 1]
    w = 1.0 + (alpha - 1.0) * (D - lo) / (hi - lo + 1e-8)  # [P, T]
    G = mask.shape[0] // D.shape[0]
    return w.repeat_interleave(G, dim=0) * mask.float()  # [B, T]


__all__ = [
    "SHAPERS",
    "ShapingInputs",
    "broadcast",
    "gaussian_kl",
    "intragroup_divergence",
    "lambda_returns",
    "ratio_norm",
    "shape_advantages",
    "step_sizes",
    "tempflow_weights",
    "temporal",
    "tw_grpo_weights",
    "value_anchored",
]


TOKEN_WEIGHTINGS: Registry = Registry("token weighting")
"""``fn(adapter, rollout, **options) -> weights[B, T]``: per-position weights multiplied onto the per-unit
advantages (``algorithm.token_weighting``; ``none`` is no step at all)."""


@dataclass(frozen=True)
class TWGRPOOptions:
    """``algorithm.token_weighting_args`` of ``tw_grpo`` (:func:`rollout_tw_grpo_weights`)."""

    alpha: float = 1.4
    """The largest weight α (the code's ``max_weight``: 1.4 in its config, 1.7 in ``scripts/tw-grpo.sh``)."""
    chunk: int = 64
    """Positions per fp32 log-softmax (memory, not the result)."""


@TOKEN_WEIGHTINGS.register("tw_grpo", options=TWGRPOOptions)
def rollout_tw_grpo_weights(adapter, rollout, *, alpha: float = 1.4, chunk: int = 64) -> Tensor:
    """[B, T] TW-GRPO weights: one no-grad forward per group, fp32 log-probs a chunk of positions at a time."""
    G, chunk = rollout.group_size, int(chunk)
    divergence = [
        intragroup_divergence(adapter.vocab_logits(rollout, idx), rollout.mask[idx], chunk=chunk).cpu()  # [T]
        for idx in torch.arange(rollout.batch_size).split(G)
    ]
    return tw_grpo_weights(torch.stack(divergence), rollout.mask, alpha=float(alpha))
