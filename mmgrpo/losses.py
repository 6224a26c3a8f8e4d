"""Per-unit policy losses: importance-ratio levels, surrogates, aggregations and KL estimators.

Four registries, one signature each; the trainer composes them as
``loss = AGGREGATIONS[a](SURROGATES[s](RATIO_LEVELS[l](logprobs − old_logprobs, mask), advantages, mask, o_s)[0],
mask, o_a)`` plus β·``KL_ESTIMATORS[k](logprobs, ref_logprobs, o_k)`` aggregated the same way. Each surrogate,
aggregation and KL estimator declares its options as a frozen dataclass, the annotation of its ``options``
parameter (``PPOClipOptions``, ``SAPOOptions``, …); ``resolve_options`` builds them from ``algorithm.surrogate_args``,
``aggregation_args`` and ``kl_args`` at config load, so a new component is one function and its dataclass. Formulas: TRL
``trl/trainer/grpo_trainer.py`` ``_compute_loss`` (each ``loss_type``) and GCPO (arXiv 2510.21583) for chunk ratios.

Ratio levels (``RATIO_LEVELS``), all one masked segment mean (``segment_mean``) over a different partition of units:
  * ``token``          — each unit is its own segment: the PPO/GRPO per-token ratio.
  * ``sequence``       — GSPO (Zheng et al. 2025, "Group Sequence Policy Optimization", arXiv 2507.18071):
    s_i = (Π_t r_{i,t})^{1/|o_i|}, i.e. the masked mean of the log-ratio over the sequence.
  * ``sequence_token`` — GSPO-token (same paper): s_{i,t} = sg[s_i]·π_θ(y_t)/sg[π_θ(y_t)], so in log space
    ``sg(seq) + log_ratio − sg(log_ratio)``: the value of the sequence ratio, the gradient of each token's own ratio.
  * ``chunk``          — Chunk-GRPO (Luo et al. 2025, arXiv 2510.21583): consecutive units grouped into chunks of
    ``chunk_sizes``; r_c = (Π_{t∈c} r_t)^{1/|c|}, the chunk's masked mean log-ratio.

Surrogates (``SURROGATES``), each returning a per-unit loss to be minimised:
  * ``ppo_clip``  — max(−A·r, −A·clip(r, 1−ε_low, 1+ε_high)) (Schulman et al. 2017; asymmetric "clip-higher" from
    DAPO, Yu et al. 2025, arXiv 2503.14476 §3.1), optionally dual-clipped at −c·A for A<0 (Ye et al. 2020,
    "Mastering Complex Control in MOBA Games with Deep RL", arXiv 1912.09729).
  * ``sapo``      — −(4/τ)·σ(τ(r−1))·A with τ = τ_pos if A>0 else τ_neg (Gao et al. 2025, "Soft Adaptive Policy
    Optimization", arXiv 2511.20347; as written in TRL ``trl/trainer/grpo_trainer.py``). At r=1 its gradient equals the
    unclipped one (σ'(0)·4 = 1).
  * ``gmpo``      — Geometric-Mean Policy Optimization (Zhao et al. 2025, arXiv 2507.20673).
  * ``cispo``     — −sg(min(r, 1+ε_high))·A·log r (MiniMax-M1, arXiv 2506.13585).
  * ``reinforce`` — −A·log r; for μ=1 (r ≡ 1) its gradient is the REINFORCE gradient −A·∇log π.
  * ``reg_grpo``  — Reg-GRPO (DeepVideo-R1, Park et al. 2025, arXiv 2506.07464 eq. 7–8): (ρ̂_i − Â_i)², the
    group-normalised sequence log-ratio (token sum; ``reduction: mean`` length-normalises) regressed onto the
    advantage, no clip and no min. Needs whole groups in every minibatch
    (``GROUP_SURROGATES``; the trainer passes ``group_size`` and the config refuses minibatches that split groups).
  * ``dgpo``      — DGPO (Luo et al. 2025, arXiv 2510.08425): the group-preference loss sg[σ(S_g)]·A_i·(ℓ_i − ℓ_i^ref)
    on the DSM units of the flow adapter's ``objective: dgpo`` (no transition log-probs); a group surrogate too.

Aggregations (``AGGREGATIONS``): ``token_mean`` (DAPO §3.3), ``seq_mean_token_mean`` (GRPO, DeepSeekMath eq. 3),
``seq_sum_const_norm`` (Dr.GRPO, Liu et al. 2025, arXiv 2503.20783 §3.1).
KL (``KL_ESTIMATORS``): k1, k2, k3 of Schulman (2020), "Approximating KL Divergence", from samples of π;
``gaussian_exact``, the closed-form KL of Gaussian transitions that flow/diffusion adapters compute (``exact_kl``).

Departures from the papers:
  * Ratio levels return 0 at units with mask 0 (so padding can never produce inf/NaN downstream), and surrogates
    zero the log-ratio and advantage there before any exp; the per-unit loss is multiplied by ``mask``.
  * A fully masked chunk or sequence gets log-ratio 0 (ratio 1).
  * ``gmpo`` needs one advantage per sequence; it takes the masked mean of ``advantages`` over the sequence (equal
    to the GRPO advantage when no per-unit shaping is applied). Its per-sequence loss is broadcast to every valid
    unit of the sequence, so ``seq_mean_token_mean`` reproduces the paper's 1/G Σ_i; ``token_mean`` weights
    sequences by length. Its bounds are on log r and named so: ``log_clip_low``/``log_clip_high`` (paper: 0.4 each).
  * ``cispo`` uses only the upper bound 1+ε_high on the IS weight, as MiniMax-M1 does in practice (ε_low unset), and
    writes the loss with log r = log π − log π_old (same gradient as log π, value 0 on-policy).
  * ``k3`` clamps (ref − logp) to [−20, 20] before the exp so that a far-off token cannot give inf.

All math in fp32; masks enter as float multiplications or ``torch.where`` (no boolean indexing, no ``.item()``).
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar

import torch
from torch import Tensor

from mmgrpo.config import Range
from mmgrpo.registry import Registry

RATIO_LEVELS: Registry[Callable[..., Tensor]] = Registry("ratio level")
"""``fn(log_ratio[n, T], mask[n, T], *, chunk_sizes) -> log_ratio[n, T]`` (0 where mask is 0)."""

SURROGATES: Registry[Callable[..., tuple[Tensor, dict[str, Tensor]]]] = Registry("surrogate")
"""``fn(log_ratio[n, T], advantages[n, T], mask[n, T], options) -> (loss[n, T], metrics)``; ``options`` is an instance
of the dataclass the function annotates (``options_class``), built from ``algorithm.surrogate_args``."""

AGGREGATIONS: Registry[Callable[..., Tensor]] = Registry("loss aggregation")
"""``fn(loss[n, T], mask[n, T], options, *, max_units) -> loss[]``; the options class's ``units(mask) -> []`` is the
count the aggregation divides by (the trainer weights minibatches by it)."""

GROUP_SURROGATES = frozenset({"reg_grpo", "dgpo"})
"""Surrogates whose loss couples the samples of a group: they take ``group_size=G`` as one more keyword and need
every minibatch to hold whole groups, in group-major order (rows [g·G, (g+1)·G) are one prompt's samples)."""

KL_ESTIMATORS: Registry[Callable[..., Tensor]] = Registry("KL estimator")
"""``fn(logprobs[n, T], reference[n, T], options) -> kl[n, T]``, KL(π‖π_ref) per unit; ``reference`` is what the
options class's ``reads`` names: ``ref_logprobs`` (sample-based estimators) or ``exact_kl`` (the adapter's closed
form, ``PolicyAdapter.exact_kl``)."""


# ---------------------------------------------------------------------------------------------------------------
# helpers


def _valid(mask: Tensor) -> tuple[Tensor, Tensor]:
    """(bool valid, float weight) views of a 0/1 (or bool) mask. Shape: [n, T] → [n, T], [n, T]."""
    m = mask.float()
    return m > 0, m


def _masked_mean(x: Tensor, m: Tensor) -> Tensor:
    """Σ x·m / Σ m over everything, 0 when Σ m = 0. Shape: [n, T] → []."""
    count = m.sum()
    return (x * m).sum() / torch.where(count > 0, count, torch.ones_like(count))


def _ratio_metrics(ratio: Tensor, valid: Tensor, m: Tensor) -> dict[str, Tensor]:
    """``loss/ratio_mean`` = masked mean of r; ``loss/ratio_max`` = max of r over valid units (0 if none)."""
    r = ratio.detach()
    return {
        "loss/ratio_mean": _masked_mean(r, m),
        "loss/ratio_max": torch.where(valid, r, torch.zeros_like(r)).amax() if r.numel() else r.sum(),
    }


def _result(loss: Tensor, m: Tensor, metrics: dict[str, Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
    """A surrogate's return value: the per-unit loss times the float mask, and its metrics detached."""
    return loss * m, {k: v.detach() for k, v in metrics.items()}


def _check_same_shape(**tensors: Tensor) -> None:
    shapes = {name: tuple(t.shape) for name, t in tensors.items()}
    if len(set(shapes.values())) != 1 or any(len(s) != 2 for s in shapes.values()):
        raise ValueError(f"expected tensors of one shape [n, T]; got {shapes}")


def segment_mean(x: Tensor, mask: Tensor, segment_ids: Tensor) -> Tensor:
    """Masked mean of ``x`` over each segment of units, broadcast back to the segment's units.

    out[i, t] = Σ_{u: seg(u)=seg(t)} x[i,u]·m[i,u] / Σ_{u: seg(u)=seg(t)} m[i,u] where m[i,t] > 0, else 0.
    A segment with no valid unit gives 0. Segments need not be contiguous; ids must lie in [0, T). Sums are a 1-D
    ``scatter_add`` (deterministic under ``torch.use_deterministic_algorithms``); no host synchronisation.

    Shape:
        x: [n, T], mask: [n, T], segment_ids: [T] (long) → [n, T]
    """
    _check_same_shape(x=x, mask=mask)
    n, T = x.shape
    if segment_ids.shape != (T,):
        raise ValueError(f"segment_ids must be [T] = [{T}]; got shape {tuple(segment_ids.shape)}")
    valid, m = _valid(mask)  # [n, T], [n, T]
    xm = torch.where(valid, x.float(), torch.zeros_like(x, dtype=torch.float32)) * m  # [n, T]
    seg = segment_ids.to(device=x.device, dtype=torch.long)  # [T]
    flat = (torch.arange(n, device=x.device).unsqueeze(1) * T + seg).reshape(-1)  # [n·T] row-major slot per unit
    sums = torch.zeros(n * T, device=x.device).scatter_add(0, flat, xm.reshape(-1))  # [n·T]
    counts = torch.zeros(n * T, device=x.device).scatter_add(0, flat, m.reshape(-1))  # [n·T]
    means = sums / torch.where(counts > 0, counts, torch.ones_like(counts))  # [n·T]
    out = means.gather(0, flat).reshape(n, T)  # [n, T]
    return torch.where(valid, out, torch.zeros_like(out))  # [n, T]


# ---------------------------------------------------------------------------------------------------------------
# ratio levels


@RATIO_LEVELS.register("token")
def token_level(log_ratio: Tensor, mask: Tensor, *, chunk_sizes: list[int] | None) -> Tensor:
    """Per-unit log-ratio log π_θ(y_t) − log π_old(y_t) (PPO/GRPO), 0 at masked units.

    Shape:
        log_ratio, mask: [n, T] → [n, T]
    """
    T = log_ratio.shape[-1]
    return segment_mean(log_ratio, mask, torch.arange(T, device=log_ratio.device))  # [n, T]


@RATIO_LEVELS.register("sequence")
def sequence_level(log_ratio: Tensor, mask: Tensor, *, chunk_sizes: list[int] | None) -> Tensor:
    """GSPO sequence log-ratio (arXiv 2507.18071): log s_i = (1/|o_i|) Σ_t log r_{i,t}, on every valid unit.

    Shape:
        log_ratio, mask: [n, T] → [n, T] (constant over each row's valid units)
    """
    T = log_ratio.shape[-1]
    return segment_mean(log_ratio, mask, torch.zeros(T, dtype=torch.long, device=log_ratio.device))  # [n, T]


@RATIO_LEVELS.register("sequence_token")
def sequence_token_level(log_ratio: Tensor, mask: Tensor, *, chunk_sizes: list[int] | None) -> Tensor:
    """GSPO-token (arXiv 2507.18071): log s_{i,t} = sg(log s_i) + log π_θ(y_t) − sg(log π_θ(y_t)).

    Because log π_old is a constant, log π_θ − sg(log π_θ) = log_ratio − sg(log_ratio). The value equals the
    sequence level; the gradient w.r.t. log π_θ(y_t) is 1 for unit t alone, so a per-unit advantage can steer each
    unit while the ratio's value is shared. With one advantage per sequence and ``seq_mean_token_mean`` it equals
    GSPO in value and gradient, as the paper notes.

    Shape:
        log_ratio, mask: [n, T] → [n, T]
    """
    valid, _ = _valid(mask)  # [n, T]
    seq = sequence_level(log_ratio, mask, chunk_sizes=None)  # [n, T]
    lr = torch.where(valid, log_ratio.float(), torch.zeros_like(log_ratio, dtype=torch.float32))  # [n, T]
    return seq.detach() + lr - lr.detach()  # [n, T]


@RATIO_LEVELS.register("chunk")
def chunk_level(log_ratio: Tensor, mask: Tensor, *, chunk_sizes: list[int] | None) -> Tensor:
    """Chunk-GRPO (arXiv 2510.21583): the geometric mean of the step ratios of each chunk of consecutive units.

    Units [0, s_0) form chunk 0, [s_0, s_0+s_1) chunk 1, …; log r_c = masked mean of log_ratio over chunk c,
    broadcast to the chunk's valid units. A fully masked chunk stays 0.

    Shape:
        log_ratio, mask: [n, T], chunk_sizes: list of positive ints summing to T → [n, T]
    """
    T = log_ratio.shape[-1]
    if chunk_sizes is None:
        raise ValueError(
            "ratio level 'chunk' needs chunk_sizes: set chunk_sizes to a list of positive chunk "
            f"lengths that sums to the number of action units T={T} (e.g. [2, 3, 4, 7] for T=16)"
        )
    sizes = [int(s) for s in chunk_sizes]
    if any(s <= 0 for s in sizes) or sum(sizes) != T:
        raise ValueError(
            f"chunk_sizes={sizes} must be positive and sum to the number of action units T={T}; "
            f"they sum to {sum(sizes)}"
        )
    ids = [c for c, s in enumerate(sizes) for _ in range(s)]
    return segment_mean(log_ratio, mask, torch.tensor(ids, dtype=torch.long, device=log_ratio.device))  # [n, T]


# ---------------------------------------------------------------------------------------------------------------
# surrogates


def _prepare(log_ratio: Tensor, advantages: Tensor, mask: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """fp32 log-ratio and advantages zeroed at masked units (before any exp), plus bool/float mask."""
    _check_same_shape(log_ratio=log_ratio, advantages=advantages, mask=mask)
    valid, m = _valid(mask)  # [n, T]
    zero = torch.zeros_like(log_ratio, dtype=torch.float32)
    lr = torch.where(valid, log_ratio.float(), zero)  # [n, T]
    adv = torch.where(valid, advantages.float(), zero)  # [n, T]
    return lr, adv, valid, m


@dataclass(frozen=True)
class PPOClipOptions:
    """``algorithm.surrogate_args`` of ``ppo_clip``."""

    clip_low: Annotated[float, Range(ge=0, lt=1)] = 0.2
    """ε_low: the ratio is clipped below at 1 − clip_low, in [0, 1) (a bound 1 − clip_low <= 0 clips nothing)."""
    clip_high: Annotated[float, Range(ge=0, le=10)] = 0.28
    """ε_high: the ratio is clipped above at 1 + clip_high; DAPO clip-higher default 0.28. At most 10: published values
    are 1e-4 (GSPO, sequence level) to 0.28; far above that the clip bounds nothing, so a huge value hides a typo (for
    no clipping use surrogate: reinforce)."""
    dual_clip: Annotated[float, Range(gt=1)] | None = None
    """Dual-clip bound c > 1 on the loss of negative-advantage units (−c·A); null disables."""


@SURROGATES.register("ppo_clip")
def ppo_clip(
    log_ratio: Tensor,
    advantages: Tensor,
    mask: Tensor,
    options: PPOClipOptions = PPOClipOptions(),
) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO-clip with asymmetric bounds and optional dual clip.

    ℓ = max(−A·r, −A·clip(r, 1−ε_low, 1+ε_high)); with dual clip c > 1, for A < 0: ℓ = min(ℓ, −c·A)
    (Ye et al. 2020), which bounds the loss of a negative-advantage unit whose ratio has exploded.

    Metrics: ``loss/clip_fraction`` = share of valid units where the clipped term is strictly larger (gradient
    cut); ``loss/dual_clip_fraction`` (only with dual clip) = share where −c·A is active; ratio mean/max.

    Shape:
        log_ratio, advantages, mask: [n, T] → loss [n, T]
    """
    clip_low, clip_high, dual_clip = options.clip_low, options.clip_high, options.dual_clip
    if clip_low < 0 or clip_high < 0:
        raise ValueError(f"clip_low and clip_high must be >= 0; got {clip_low}, {clip_high}")
    if dual_clip is not None and dual_clip <= 1.0:
        raise ValueError(f"dual_clip must be > 1 (it bounds the loss at -dual_clip*A for A<0) or None; got {dual_clip}")
    lr, adv, valid, m = _prepare(log_ratio, advantages, mask)  # [n, T] each
    ratio = lr.exp()  # [n, T]
    unclipped = -adv * ratio  # [n, T]
    clipped = -adv * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)  # [n, T]
    loss = torch.maximum(unclipped, clipped)  # [n, T]
    metrics = {"loss/clip_fraction": _masked_mean((clipped > unclipped).float(), m)}
    if dual_clip is not None:
        bound = -dual_clip * adv  # [n, T]
        dual_active = (adv < 0) & (bound < loss)  # [n, T]
        loss = torch.where(dual_active, bound, loss)  # [n, T]
        metrics["loss/dual_clip_fraction"] = _masked_mean(dual_active.float(), m)
    metrics.update(_ratio_metrics(ratio, valid, m))
    return _result(loss, m, metrics)


@dataclass(frozen=True)
class SAPOOptions:
    """``algorithm.surrogate_args`` of ``sapo`` (defaults: TRL's ``sapo_temperature_pos/neg``)."""

    tau_pos: Annotated[float, Range(gt=0)] = 1.0
    """τ for units with positive advantage."""
    tau_neg: Annotated[float, Range(gt=0)] = 1.05
    """τ for units with zero or negative advantage."""


@SURROGATES.register("sapo")
def sapo(
    log_ratio: Tensor,
    advantages: Tensor,
    mask: Tensor,
    options: SAPOOptions = SAPOOptions(),
) -> tuple[Tensor, dict[str, Tensor]]:
    """SAPO soft gate (arXiv 2511.20347): ℓ = −(4/τ)·σ(τ(r − 1))·A, τ = τ_pos if A > 0 else τ_neg.

    The gradient is −4σ(1−σ)·A·r·∇log π: equal to the plain policy gradient at r = 1 and decaying smoothly as r
    leaves 1 (instead of PPO's hard cut).

    Shape:
        log_ratio, advantages, mask: [n, T] → loss [n, T]
    """
    tau_pos, tau_neg = options.tau_pos, options.tau_neg
    if tau_pos <= 0 or tau_neg <= 0:
        raise ValueError(f"SAPO temperatures must be > 0; got tau_pos={tau_pos}, tau_neg={tau_neg}")
    lr, adv, valid, m = _prepare(log_ratio, advantages, mask)  # [n, T] each
    ratio = lr.exp()  # [n, T]
    tau = torch.where(adv > 0, torch.full_like(adv, tau_pos), torch.full_like(adv, tau_neg))  # [n, T]
    loss = -(4.0 / tau) * torch.sigmoid(tau * (ratio - 1.0)) * adv  # [n, T]
    return _result(loss, m, _ratio_metrics(ratio, valid, m))


@dataclass(frozen=True)
class GMPOOptions:
    """``algorithm.surrogate_args`` of ``gmpo``: bounds on the log-ratio, not on the ratio (paper: 0.4 each)."""

    log_clip_low: Annotated[float, Range(ge=0, le=10)] = 0.4
    """ε_low: each token's log r is clipped below at −log_clip_low, i.e. r >= e^−log_clip_low."""
    log_clip_high: Annotated[float, Range(ge=0, le=10)] = 0.4
    """ε_high: each token's log r is clipped above at log_clip_high, i.e. r <= e^log_clip_high (e^10 ≈ 2·10^4
    already bounds nothing)."""


@SURROGATES.register("gmpo")
def gmpo(
    log_ratio: Tensor,
    advantages: Tensor,
    mask: Tensor,
    options: GMPOOptions = GMPOOptions(),
) -> tuple[Tensor, dict[str, Tensor]]:
    """GMPO (Zhao et al. 2025, arXiv 2507.20673): maximise the geometric mean of clipped token ratios.

    With Â_i the masked mean advantage of sequence i and s = sign(Â_i), each token's log-ratio is clipped in log
    space, sign-aware: ℓ̃_t = s·min(s·log r_t, s·clip(log r_t, −ε_low, ε_high)) (the pessimistic side, as PPO's
    min), and the sequence loss is −Â_i·exp((1/|o_i|) Σ_t ℓ̃_t), broadcast to every valid unit of the sequence.
    ``log_clip_low``/``log_clip_high`` are bounds on log r: r_t ∈ [e^−ε_low, e^ε_high] (paper: 0.4 each).

    Metrics: ``loss/clip_fraction`` = share of valid units where the clipped side was taken (gradient cut); token
    ratio mean/max; ``loss/seq_ratio_mean`` = mean over sequences with a valid unit of exp(mean_t ℓ̃_t).

    Shape:
        log_ratio, advantages, mask: [n, T] → loss [n, T] (constant over each row's valid units)
    """
    low, high = options.log_clip_low, options.log_clip_high
    if low < 0 or high < 0:
        raise ValueError(f"log_clip_low and log_clip_high must be >= 0; got {low}, {high}")
    lr, adv, valid, m = _prepare(log_ratio, advantages, mask)  # [n, T] each
    count = m.sum(-1, keepdim=True)  # [n, 1]
    denom = torch.where(count > 0, count, torch.ones_like(count))  # [n, 1]
    seq_adv = (adv * m).sum(-1, keepdim=True) / denom  # [n, 1]
    sign = torch.sign(seq_adv)  # [n, 1]
    lr_clip = lr.clamp(-low, high)  # [n, T]
    lr_pess = sign * torch.minimum(sign * lr, sign * lr_clip)  # [n, T]
    seq_ratio = ((lr_pess * m).sum(-1, keepdim=True) / denom).exp()  # [n, 1]
    loss = (-seq_adv * seq_ratio).expand_as(lr)  # [n, T]
    has = (count > 0).float()  # [n, 1]
    metrics = {
        "loss/clip_fraction": _masked_mean((sign * lr_clip < sign * lr).float(), m),
        "loss/seq_ratio_mean": (seq_ratio.detach() * has).sum() / has.sum().clamp_min(1.0),
        **_ratio_metrics(lr.exp(), valid, m),
    }
    return _result(loss, m, metrics)


@dataclass(frozen=True)
class CISPOOptions:
    """``algorithm.surrogate_args`` of ``cispo``: only the upper bound (MiniMax-M1 leaves ε_low unset)."""

    clip_high: Annotated[float, Range(ge=0, le=10)] = 0.28
    """ε_high: the detached IS weight is min(r, 1 + clip_high)."""


@SURROGATES.register("cispo")
def cispo(
    log_ratio: Tensor,
    advantages: Tensor,
    mask: Tensor,
    options: CISPOOptions = CISPOOptions(),
) -> tuple[Tensor, dict[str, Tensor]]:
    """CISPO (MiniMax-M1, arXiv 2506.13585): ℓ = −sg(min(r, 1 + ε_high))·A·log r.

    The IS weight is clipped and detached, never the token's gradient: ∇ℓ = −min(r, 1+ε_high)·A·∇log π_θ.

    Metrics: ``loss/clip_fraction`` = share of valid units with r > 1 + ε_high; ratio mean/max.

    Shape:
        log_ratio, advantages, mask: [n, T] → loss [n, T]
    """
    clip_high = options.clip_high
    if clip_high < 0:
        raise ValueError(f"clip_high must be >= 0; got {clip_high}")
    lr, adv, valid, m = _prepare(log_ratio, advantages, mask)  # [n, T] each
    ratio = lr.exp()  # [n, T]
    weight = ratio.clamp(max=1.0 + clip_high).detach()  # [n, T]
    loss = -weight * adv * lr  # [n, T]
    metrics = {
        "loss/clip_fraction": _masked_mean((ratio > 1.0 + clip_high).float(), m),
        **_ratio_metrics(ratio, valid, m),
    }
    return _result(loss, m, metrics)


@dataclass(frozen=True)
class ReinforceOptions:
    """``reinforce`` takes no options."""


@SURROGATES.register("reinforce")
def reinforce(
    log_ratio: Tensor,
    advantages: Tensor,
    mask: Tensor,
    options: ReinforceOptions = ReinforceOptions(),
) -> tuple[Tensor, dict[str, Tensor]]:
    """REINFORCE with a group baseline: ℓ = −A·log r, gradient −A·∇log π_θ (unweighted, even off-policy).

    Shape:
        log_ratio, advantages, mask: [n, T] → loss [n, T]
    """
    lr, adv, valid, m = _prepare(log_ratio, advantages, mask)  # [n, T] each
    loss = -adv * lr  # [n, T]
    return _result(loss, m, _ratio_metrics(lr.exp(), valid, m))


REG_GRPO_EPS = 1e-4
"""Added to the group std of the sequence log-ratios in ``reg_grpo`` (the estimator's ``eps`` default)."""


@dataclass(frozen=True)
class RegGRPOOptions:
    """``algorithm.surrogate_args`` of ``reg_grpo``."""

    eps: Annotated[float, Range(gt=0)] = REG_GRPO_EPS
    """Added to the group std of the sequence log-ratios before dividing (sets the on-policy gradient scale 2/eps)."""
    reduction: typing.Literal["sum", "mean"] = "sum"
    """How ρ_i reduces the token log-ratios of sequence i: sum (log π_θ(y|x) − log π_old(y|x), the paper's eq. 7 read
    literally) | mean (length-normalised, GSPO's sequence ratio; the earlier reading here)."""


@SURROGATES.register("reg_grpo")
def reg_grpo(
    log_ratio: Tensor,
    advantages: Tensor,
    mask: Tensor,
    options: RegGRPOOptions = RegGRPOOptions(),
    *,
    group_size: int,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Reg-GRPO (DeepVideo-R1: Park, Na, Kim, Kim 2025, arXiv 2506.07464, NeurIPS 2025, eq. 7–8): regress the
    advantage.

    With ρ_i = log π_θ(y_i|x) − log π_old(y_i|x) the whole response's log-ratio (eq. 7: one value per response; here
    the sum of ``log_ratio`` over its valid units, or their mean with ``options.reduction = "mean"``), Â_i its
    advantage (masked mean of ``advantages``: the GRPO advantage (r_i − μ_r)/σ_r) and the group statistics taken
    over the samples of the group that have a valid unit::

        Â_θ,i = (ρ_i − mean_G ρ) / (std_G ρ + eps)          std with (n−1), eps = ``options.eps``
        ℓ_i = (Â_θ,i − Â_i)²                                  broadcast to every valid unit of sequence i

    so ``seq_mean_token_mean`` gives eq. 8's (1/G) Σ_i (Â_θ,i − Â_i)². No clip, no min, and no 1/β or 1/λ factor:
    the KL-regularised optimum π* = π_old·exp(R/λ)/Z(x) gives R = λ(log Z + log π*/π_old), and the group
    standardisation removes both Z(x) and λ. Eq. 8 writes its KL term as "− β·KL" inside an expectation it
    minimises; the trainer adds the usual penalty + β·KL (``algorithm.beta``; the paper's runs: 0.1).

    Choices where the paper is silent: whether log π(y|x) is the token sum or length-normalised (the sum is the
    literal reading and the default; ``reduction: mean`` keeps the length-normalised one), and ``eps``. On-policy
    every ρ_i is 0, std is 0 and the gradient of Â_θ is (∇ρ_i − mean ∇ρ)/eps: the first update's direction is the
    policy gradient −Σ_i Â_i ∇ρ_i at a scale of 2/eps, so keep ``optim.max_grad_norm`` > 0. The variance is clamped
    at 1e-12 before the square root so that its gradient is finite at 0.

    Shape:
        log_ratio, advantages, mask: [n, T] with n = k·G (whole groups, group-major) → loss [n, T]
    """
    lr, adv, valid, m = _prepare(log_ratio, advantages, mask)  # [n, T] each
    n, T = lr.shape
    if group_size < 2 or n % group_size:
        raise ValueError(
            f"reg_grpo normalises over whole groups: the minibatch has {n} samples, not a multiple of group_size="
            f"{group_size}; set algorithm.minibatch_size to a multiple of group_size and prompts_per_step to a "
            "multiple of updates_per_epoch"
        )
    count = m.sum(-1)  # [n]
    has = (count > 0).float().view(-1, group_size)  # [n/G, G]
    denom = torch.where(count > 0, count, torch.ones_like(count))  # [n]
    rho = (lr * m).sum(-1)  # [n] sequence log-ratio: token sum
    if options.reduction == "mean":
        rho = rho / denom  # [n] length-normalised
    rho = rho.view(-1, group_size)  # [n/G, G]
    seq_adv = ((adv * m).sum(-1) / denom).view(-1, group_size)  # [n/G, G]
    k = has.sum(-1, keepdim=True)  # [n/G, 1]
    mean = (rho * has).sum(-1, keepdim=True) / k.clamp_min(1.0)  # [n/G, 1]
    var = ((rho - mean).square() * has).sum(-1, keepdim=True) / (k - 1.0).clamp_min(1.0)  # [n/G, 1]
    std = var.clamp_min(1e-12).sqrt()  # [n/G, 1]
    rho_hat = (rho - mean) / (std + options.eps)  # [n/G, G]
    per_seq = (rho_hat - seq_adv).square() * has  # [n/G, G]
    loss = per_seq.reshape(n, 1).expand(n, T)  # [n, T]
    metrics = {
        "loss/reg_target_abs_mean": (seq_adv.abs() * has).sum() / has.sum().clamp_min(1.0),
        "loss/reg_pred_abs_mean": (rho_hat.detach().abs() * has).sum() / has.sum().clamp_min(1.0),
        **_ratio_metrics(lr.exp(), valid, m),
    }
    return _result(loss, m, metrics)


@dataclass(frozen=True)
class DGPOOptions:
    """``algorithm.surrogate_args`` of ``dgpo``."""

    beta_dpo: Annotated[float, Range(gt=0)] = 100.0
    """β_dpo, the scale of the group score S (the code's 100 for SD3.5 GenEval/OCR, 10 for PickScore)."""


@SURROGATES.register("dgpo")
def dgpo(
    log_ratio: Tensor,
    advantages: Tensor,
    mask: Tensor,
    options: DGPOOptions = DGPOOptions(),
    *,
    group_size: int,
) -> tuple[Tensor, dict[str, Tensor]]:
    """DGPO group preference loss (Luo, Hu & Tang 2025, arXiv 2510.08425; Luo-Yihong/DGPO
    ``scripts/train_sd3_dgpo.py::compute_group_dgpo_loss_allreduce``), on the units of ``objective: dgpo``.

    The flow adapter's units are u = −ℓ (ℓ the DSM loss of a sample at one noise level) with ``old_logprobs`` −ℓ^ref,
    so ``log_ratio`` = −(ℓ − ℓ^ref). Per unit column j (noise level) and group g of G samples::

        S_{g,j} = (β_dpo/G) Σ_{i∈g} A_i·(ℓ_{i,j} − ℓ^ref_{i,j})      (no gradient)
        loss_{i,j} = sg[σ(S_{g,j})]·A_i·(ℓ_{i,j} − ℓ^ref_{i,j})

    The code's loss is mean(sg[σ(S)]·A·ℓ); ℓ^ref carries no gradient, so the gradients are equal (the value differs
    by sg[σ(S)]·A·ℓ^ref). Minimising pushes ℓ down for A > 0 and up for A < 0; σ(S) shrinks as the group's
    preference is already met (the gradient of −log σ(−S)). With ``token_mean`` over the M all-valid units this is
    the code's mean over samples and noise levels (it accumulates the M levels into one update). The code's
    optional EMA-based stop-gradient is not implemented; β_dpo is ``options.beta_dpo``.

    Shape:
        log_ratio, advantages, mask: [n, M] with n = k·G (whole groups, group-major) → loss [n, M]
    """
    lr, adv, valid, m = _prepare(log_ratio, advantages, mask)  # [n, M] each (ratio: exp(ℓ^ref − ℓ))
    n, M = lr.shape
    if group_size < 1 or n % group_size:
        raise ValueError(
            f"dgpo scores whole groups: the minibatch has {n} samples, not a multiple of group_size={group_size}; "
            "set algorithm.minibatch_size to a multiple of group_size"
        )
    delta = -lr  # [n, M] ℓ − ℓ^ref
    score = (options.beta_dpo / group_size) * (adv * delta.detach() * m).view(-1, group_size, M).sum(1)  # [n/G, M]
    weight = torch.sigmoid(score).repeat_interleave(group_size, 0)  # [n, M]
    loss = weight.detach() * adv * delta  # [n, M]
    metrics = {
        "loss/dgpo_weight_mean": _masked_mean(weight, m),
        "loss/dsm_delta_mean": _masked_mean(delta, m),
        **_ratio_metrics(lr.exp(), valid, m),
    }
    return _result(loss, m, metrics)


# ---------------------------------------------------------------------------------------------------------------
# aggregations


@dataclass(frozen=True)
class TokenMeanOptions:
    """``token_mean`` takes no options; it divides by the valid units."""

    @staticmethod
    def units(mask: Tensor) -> Tensor:
        """Σ m: the valid units (TRL's ``dapo`` loss type normalises by the global count). Shape: [n, T] → []."""
        return mask.float().sum()


@AGGREGATIONS.register("token_mean")
def token_mean(loss: Tensor, mask: Tensor, options: TokenMeanOptions = TokenMeanOptions(), *, max_units: int) -> Tensor:
    """DAPO token-level mean (arXiv 2503.14476 §3.3): Σ_{i,t} ℓ·m / Σ_{i,t} m; 0 if nothing is valid.

    Shape:
        loss, mask: [n, T] → []
    """
    _check_same_shape(loss=loss, mask=mask)
    return _masked_mean(loss.float(), mask.float())


@dataclass(frozen=True)
class SeqMeanTokenMeanOptions:
    """``seq_mean_token_mean`` takes no options; it divides by the sequences with a valid unit."""

    @staticmethod
    def units(mask: Tensor) -> Tensor:
        """The number of sequences with a valid unit. Shape: [n, T] → []."""
        return (mask.float().sum(-1) > 0).float().sum()


@AGGREGATIONS.register("seq_mean_token_mean")
def seq_mean_token_mean(
    loss: Tensor, mask: Tensor, options: SeqMeanTokenMeanOptions = SeqMeanTokenMeanOptions(), *, max_units: int
) -> Tensor:
    """GRPO (DeepSeekMath eq. 3): (1/n') Σ_i (1/|o_i|) Σ_t ℓ_{i,t} over the n' sequences with a valid unit.

    Shape:
        loss, mask: [n, T] → []
    """
    _check_same_shape(loss=loss, mask=mask)
    m = mask.float()  # [n, T]
    count = m.sum(-1)  # [n]
    per_seq = (loss.float() * m).sum(-1) / torch.where(count > 0, count, torch.ones_like(count))  # [n]
    has = (count > 0).float()  # [n]
    n_seq = has.sum()  # []
    return (per_seq * has).sum() / torch.where(n_seq > 0, n_seq, torch.ones_like(n_seq))


@dataclass(frozen=True)
class SeqSumConstNormOptions:
    """``seq_sum_const_norm`` takes no options; it divides by the sequences (times the constant ``max_units``)."""

    @staticmethod
    def units(mask: Tensor) -> Tensor:
        """The number of sequences n. Shape: [n, T] → []."""
        return torch.tensor(float(mask.shape[0]), device=mask.device)


@AGGREGATIONS.register("seq_sum_const_norm")
def seq_sum_const_norm(
    loss: Tensor, mask: Tensor, options: SeqSumConstNormOptions = SeqSumConstNormOptions(), *, max_units: int
) -> Tensor:
    """Dr.GRPO (arXiv 2503.20783 §3.1): Σ_{i,t} ℓ·m / (n · max_units), a length-independent constant normaliser.

    ``max_units`` is the largest possible number of units (e.g. max_completion_length), not this batch's T.

    Shape:
        loss, mask: [n, T] → []
    """
    _check_same_shape(loss=loss, mask=mask)
    if max_units <= 0:
        raise ValueError(
            f"seq_sum_const_norm needs max_units > 0 (the maximum number of action units); got {max_units}"
        )
    n = max(loss.shape[0], 1)
    return (loss.float() * mask.float()).sum() / float(n * max_units)


# ---------------------------------------------------------------------------------------------------------------
# KL estimators (Schulman 2020, "Approximating KL Divergence"; samples y ~ π, x = log π_ref(y) − log π(y))


@dataclass(frozen=True)
class SampleKLOptions:
    """k1, k2 and k3 take no options; they read the reference log-probs of the sampled units."""

    reads: ClassVar[str] = "ref_logprobs"


@KL_ESTIMATORS.register("k1")
def kl_k1(logprobs: Tensor, ref_logprobs: Tensor, options: SampleKLOptions = SampleKLOptions()) -> Tensor:
    """k1 = −x = log π − log π_ref: unbiased, high variance, can be negative. Shape: [n, T] → [n, T]."""
    _check_same_shape(logprobs=logprobs, ref_logprobs=ref_logprobs)
    return logprobs.float() - ref_logprobs.float()  # [n, T]


@KL_ESTIMATORS.register("k2")
def kl_k2(logprobs: Tensor, ref_logprobs: Tensor, options: SampleKLOptions = SampleKLOptions()) -> Tensor:
    """k2 = ½x²: biased, low variance, ≥ 0. Shape: [n, T] → [n, T]."""
    _check_same_shape(logprobs=logprobs, ref_logprobs=ref_logprobs)
    return 0.5 * (logprobs.float() - ref_logprobs.float()).square()  # [n, T]


@KL_ESTIMATORS.register("k3")
def kl_k3(logprobs: Tensor, ref_logprobs: Tensor, options: SampleKLOptions = SampleKLOptions()) -> Tensor:
    """k3 = eˣ − x − 1: unbiased, low variance, ≥ 0 (GRPO's KL, DeepSeekMath eq. 4).

    x = ref − logp is clamped to [−20, 20] first (e²⁰ ≈ 4.9e8 stays finite in fp32); outside that range the value
    saturates and the gradient is 0.

    Shape:
        logprobs, ref_logprobs: [n, T] → [n, T]
    """
    _check_same_shape(logprobs=logprobs, ref_logprobs=ref_logprobs)
    x = (ref_logprobs.float() - logprobs.float()).clamp(-20.0, 20.0)  # [n, T]
    return x.exp() - x - 1.0  # [n, T]


@dataclass(frozen=True)
class GaussianExactOptions:
    """``gaussian_exact`` takes no options here (the flow adapter's ``model.args.kl_variant`` picks the exact KL or
    Flow-GRPO's); it reads the adapter's closed form (``PolicyAdapter.exact_kl``) instead of reference log-probs."""

    reads: ClassVar[str] = "exact_kl"


@KL_ESTIMATORS.register("gaussian_exact")
def kl_gaussian_exact(
    logprobs: Tensor, exact_kl: Tensor, options: GaussianExactOptions = GaussianExactOptions()
) -> Tensor:
    """KL(π_θ‖π_ref) of Gaussian transitions in closed form (flow/diffusion, ``shaping.gaussian_kl``), as computed by
    the adapter's ``exact_kl(rollout, index)`` from the policy's and the reference's transition means; no sampling
    estimate. ``logprobs`` only fixes the shape. Shape: [n, T], [n, T] → [n, T]."""
    _check_same_shape(logprobs=logprobs, exact_kl=exact_kl)
    return exact_kl.float()  # [n, T]


# ---------------------------------------------------------------------------------------------------------------
# options: each component's dataclass, built from algorithm.surrogate_args / aggregation_args / kl_args


def options_class(fn: Callable[..., object]) -> type:
    """The options dataclass a registered component declares: the annotation of its ``options`` parameter."""
    return typing.get_type_hints(fn)["options"]


def _resolve(registry: Registry, name: str, args: dict[str, Any] | None, where: str) -> Any:
    """``args`` checked against component ``name``'s options dataclass; unknown keys and bad values raise
    ``ConfigError`` naming the key, the component and the allowed keys."""
    from mmgrpo.config import ConfigError, from_dict

    cls = options_class(registry.get(name))
    allowed = [f.name for f in dataclasses.fields(cls)]
    for key in args or {}:
        if key not in allowed:
            raise ConfigError(
                f"{where}.{key}: not an option of {registry.kind} {name!r}; allowed: {', '.join(allowed) or '(none)'}"
            )
    return from_dict(cls, args or {}, where)


@dataclass(frozen=True)
class LossOptions:
    """The options objects of the configured surrogate, aggregation and KL estimator."""

    surrogate: Any
    aggregation: Any
    kl: Any
    terms: dict[str, Any] = dataclasses.field(default_factory=dict)
    """``algorithm.loss_terms``: each extra loss term's options, by name (``LOSS_TERMS``)."""


def resolve_options(algorithm: Any) -> LossOptions:
    """Each loss component's options from ``algorithm`` (an ``AlgorithmConfig``): ``surrogate_args`` against the
    surrogate's dataclass, ``aggregation_args`` the aggregation's, ``kl_args`` the KL estimator's. Called at
    config load (``mmgrpo.loader.validate``) and by the trainer."""
    a = algorithm
    return LossOptions(
        surrogate=_resolve(SURROGATES, a.surrogate, a.surrogate_args, "algorithm.surrogate_args"),
        aggregation=_resolve(AGGREGATIONS, a.aggregation, a.aggregation_args, "algorithm.aggregation_args"),
        kl=_resolve(KL_ESTIMATORS, a.kl, a.kl_args, "algorithm.kl_args"),
        terms=resolve_loss_terms(a),
    )


# ---------------------------------------------------------------------------------------------------------------
# extra loss terms: algorithm.loss_terms (LLDS, mmgrpo/llds.py; ...)


@dataclass
class LossTermInputs:
    """What an extra loss term may read about one minibatch of n samples.

    Shape:
        logprobs: [n, T] the current policy's, with grad
        old_logprobs, advantages, mask: [n, T] (advantages after shaping; mask after the filters)
    """

    logprobs: Tensor  # [n, T]
    old_logprobs: Tensor  # [n, T]
    advantages: Tensor  # [n, T]
    mask: Tensor  # [n, T]
    rollout: Any = None
    """The step's Rollout (all B samples); ``index`` picks the minibatch's rows."""
    index: Tensor | None = None
    """[n] rows of ``rollout`` in this minibatch."""
    adapter: Any = None
    """The policy adapter, for a term that needs another forward (e.g. an entropy term)."""


@dataclass(frozen=True)
class LossTerm:
    """A registered extra loss term: ``fn(inputs, options) -> (loss[n, T], metrics)``, the per-unit loss to minimise
    (its coefficient is one of its options), aggregated by the trainer like the policy loss and added to it; and
    ``check(algorithm)``, which raises ``ConfigError`` at load for a combination the term does not support."""

    fn: Callable[..., tuple[Tensor, dict[str, Tensor]]]
    check: Callable[[Any], None] | None = None


LOSS_TERMS: Registry[LossTerm] = Registry("loss term")
"""Extra loss terms by name (``algorithm.loss_terms: {name: {options}}``); register with
``LOSS_TERMS.add(name, LossTerm(fn, check), OptionsDataclass)``."""


def resolve_loss_terms(algorithm: Any) -> dict[str, Any]:
    """``algorithm.loss_terms`` checked against each term's options dataclass and its ``check``; ConfigError in one
    line for an unknown term, key or value."""
    from mmgrpo.config import ConfigError
    from mmgrpo.options import resolve

    terms = {}
    for name, args in (algorithm.loss_terms or {}).items():
        if name not in LOSS_TERMS:
            raise ConfigError(f"algorithm.loss_terms: unknown loss term {name!r}; valid: {', '.join(LOSS_TERMS)}")
        terms[name] = resolve(LOSS_TERMS, name, args, f"algorithm.loss_terms.{name}")
        term = LOSS_TERMS.get(name)
        if term.check is not None:
            term.check(algorithm)
    return terms


def apply_loss_terms(
    terms: dict[str, Any], inputs: LossTermInputs, aggregate: Callable[..., Tensor], aggregation: Any
) -> tuple[Tensor, dict[str, Tensor]]:
    """Σ over the configured terms of aggregate(term's per-unit loss): the same aggregation (and so the same
    minibatch weighting) as the policy loss. Logs each term's aggregated value as ``loss/<name>`` plus the term's own
    metrics. No terms: a zero without grad, which leaves the loss unchanged.

    Shape:
        inputs: [n, T] tensors → [] and metrics of []
    """
    m = inputs.mask.float()  # [n, T]
    total = inputs.logprobs.new_zeros(())
    metrics: dict[str, Tensor] = {}
    for name, options in terms.items():
        per_unit, mets = LOSS_TERMS.get(name).fn(inputs, options)  # [n, T]
        value = aggregate(per_unit * m, m, aggregation, max_units=m.shape[1])  # []
        total = total + value
        metrics[f"loss/{name}"] = value.detach()
        metrics.update({k: v.detach() for k, v in mets.items()})
    return total, metrics
