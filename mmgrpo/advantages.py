"""Group-relative advantage estimators: rewards ``[P, G, K]`` → advantages ``[P, G]``.

What is implemented (formulas: TRL ``trl/trainer/grpo_trainer.py`` advantages and ``_compute_loss``; the R1-V /
Video-R1 GRPO trainer ``src/r1-v/src/open_r1/trainer/grpo_trainer.py``):

* ``grpo`` — group-mean baseline, A_i = (r_i − mean_G r) / (std_G r + eps)
  (Shao et al. 2024, "DeepSeekMath", arXiv 2402.03300, §4.1.2).
* ``dr_grpo`` — the same group-mean baseline; Dr.GRPO (Liu et al. 2025, "Understanding R1-Zero-Like Training",
  arXiv 2503.20783, §3.1) drops the std division, so its paper default ``scale`` is ``"none"``. The estimator
  itself is identical to ``grpo``: Dr.GRPO is a config change, not a branch.
* ``rloo`` — leave-one-out baseline, A_i = r_i − mean_{j≠i} r_j = G/(G−1)·(r_i − mean_G r)
  (Ahmadian et al. 2024, "Back to Basics: Revisiting REINFORCE Style Optimization", arXiv 2402.14740).
* ``scale`` (independent of the estimator): ``"group"`` divides by the group's std + eps, ``"batch"`` by the std
  of all P·G rewards + eps (TRL ``scale_rewards="batch"``), ``"none"`` leaves the centred reward unscaled.
  ``unbiased`` picks the (n−1) sample std (torch's default, as open-r1/Video-R1) or the population std (n, as
  Flow-GRPO's ``np.std``).
* ``compute_advantages(combine="sum_then_normalize")`` — weighted nansum over the K reward functions, then the
  estimator (TRL's default ``multi_objective_aggregation``).
* ``compute_advantages(combine="normalize_then_sum")`` — GDPO (Liu et al. 2026, "GDPO: Group reward-Decoupled
  Normalization Policy Optimization", arXiv 2601.05242): the estimator runs on each reward k separately
  (A_k, with the chosen ``scale``), the advantages are summed with the weights, A = Σ_k w_k A_k, and the sum is
  z-scored over the batch: Â = (A − mean_B A) / (std_B A + eps), mean and std over the valid samples.
* ``zero_variance_groups`` — the groups that DAPO's dynamic sampling drops (Yu et al. 2025, "DAPO",
  arXiv 2503.14476, §3.2): all rewards of the prompt equal.

Departures from the papers (all concern cases the papers do not treat):

* NaN marks "reward not applicable" (TRL's ``None``). NaN samples are excluded from every mean and std, and get
  advantage 0. In ``combine_rewards`` a sample is NaN only when all K rewards are NaN (TRL's rule); in GDPO a NaN
  reward k simply contributes 0 to that sample's Σ_k w_k A_k.
* A std over fewer than 2 valid samples (unbiased) or 0 samples (population) is taken as 0 instead of NaN, and a
  divisor std + eps that is exactly 0 (eps = 0, constant group) is replaced by 1, so such a group's advantage is
  its centred reward, 0, rather than NaN.
* RLOO: a sample that is the only valid one in its group has no leave-one-out baseline and gets advantage 0.
* The GDPO batch normalisation subtracts the batch mean as well as dividing by the batch std (the paper's
  "batch-wise advantage normalization"). For the three estimators here the mean is 0 up to rounding, because each
  A_k sums to zero over its group's valid samples; the subtraction is kept for estimators without that property.

Everything runs in fp32, without host synchronisation (no ``.item()``, masks by ``torch.where``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from mmgrpo.registry import Registry

Estimator = Callable[..., Tensor]

ESTIMATORS: Registry[Estimator] = Registry("advantage estimator")
"""``fn(rewards[P, G], *, scale, unbiased, eps) -> advantages[P, G]``; NaN rewards → advantage 0."""

SCALES = ("group", "batch", "none")

DEFAULT_SCALE: dict[str, str] = {"grpo": "group", "dr_grpo": "none", "rloo": "none"}
"""Each estimator's paper default for ``scale`` (the config's ``scale: auto`` resolves through this)."""

COMBINES = ("sum_then_normalize", "normalize_then_sum")


def _check_scale(scale: str) -> None:
    if scale not in SCALES:
        raise ValueError(f"unknown advantage scale {scale!r}; valid: {', '.join(SCALES)}")


def _group_rewards(rewards: Tensor) -> tuple[Tensor, Tensor]:
    """fp32 group rewards and their valid (not NaN) entries, after checking the shape. Shape: [P, G] → [P, G] × 2."""
    if rewards.dim() != 2:
        raise ValueError(f"group rewards must be [P, G]; got shape {tuple(rewards.shape)}")
    r = rewards.float()  # [P, G]
    return r, ~torch.isnan(r)


def _nan_stats(x: Tensor, valid: Tensor, dim: int | None, unbiased: bool) -> tuple[Tensor, Tensor, Tensor]:
    """Mean, std and count of ``x`` over its ``valid`` entries along ``dim`` (all entries if ``dim`` is None).

    Shape:
        x, valid: any shape (valid is bool); outputs keep ``dim`` (keepdim) or are scalars when ``dim`` is None.
    A std over too few samples (count ≤ 1 unbiased, count 0 population) is 0, not NaN.
    """
    w = valid.float()
    xz = torch.where(valid, x, torch.zeros_like(x))  # NaNs out before any arithmetic
    if dim is None:
        count = w.sum()
        total = xz.sum()
    else:
        count = w.sum(dim, keepdim=True)
        total = xz.sum(dim, keepdim=True)
    mean = total / torch.where(count > 0, count, torch.ones_like(count))
    sq = (xz - mean).square() * w
    sq_sum = sq.sum() if dim is None else sq.sum(dim, keepdim=True)
    dof = count - 1.0 if unbiased else count
    var = torch.where(dof > 0, sq_sum / torch.where(dof > 0, dof, torch.ones_like(dof)), torch.zeros_like(dof))
    return mean, var.sqrt(), count


def _nonzero(x: Tensor) -> Tensor:
    """``x`` with exact zeros replaced by 1: with eps = 0 a constant group divides 0 by 1, not 0 by 0."""
    return torch.where(x != 0, x, torch.ones_like(x))


def _scale(centred: Tensor, rewards: Tensor, valid: Tensor, *, scale: str, unbiased: bool, eps: float) -> Tensor:
    """Divide centred rewards by the group or batch std + eps (or not), and zero the NaN samples.

    Shape:
        centred, rewards, valid: [P, G] → [P, G]
    """
    _check_scale(scale)
    if scale == "group":
        _, std, _ = _nan_stats(rewards, valid, 1, unbiased)  # [P, 1]
        centred = centred / _nonzero(std + eps)  # [P, G]
    elif scale == "batch":
        _, std, _ = _nan_stats(rewards, valid, None, unbiased)  # []
        centred = centred / _nonzero(std + eps)  # [P, G]
    return torch.where(valid, centred, torch.zeros_like(centred))  # [P, G]


def _group_mean_baseline(rewards: Tensor, *, scale: str, unbiased: bool, eps: float) -> Tensor:
    """(r − mean_G r), then scaled; shared by ``grpo`` and ``dr_grpo``.

    Shape:
        rewards: [P, G] → advantages [P, G]
    """
    r, valid = _group_rewards(rewards)  # [P, G], [P, G]
    _check_scale(scale)
    mean, _, _ = _nan_stats(r, valid, 1, unbiased)  # [P, 1]
    return _scale(r - mean, r, valid, scale=scale, unbiased=unbiased, eps=eps)  # [P, G]


@ESTIMATORS.register("grpo")
def grpo(rewards: Tensor, *, scale: str, unbiased: bool, eps: float) -> Tensor:
    """GRPO outcome advantage (Shao et al. 2024, DeepSeekMath §4.1.2): A_i = (r_i − mean_G r) / (std_G r + eps).

    With ``scale="group"`` this is the paper's form; other scales change only the divisor.

    Shape:
        rewards: [P, G] (NaN = not applicable) → advantages [P, G] (0 where the reward is NaN)
    """
    return _group_mean_baseline(rewards, scale=scale, unbiased=unbiased, eps=eps)


@ESTIMATORS.register("dr_grpo")
def dr_grpo(rewards: Tensor, *, scale: str, unbiased: bool, eps: float) -> Tensor:
    """Dr.GRPO advantage (Liu et al. 2025, arXiv 2503.20783 §3.1): A_i = r_i − mean_G r.

    The paper removes the std division; that is ``scale="none"`` (``DEFAULT_SCALE["dr_grpo"]``). Other scales are
    honoured, which makes this numerically identical to ``grpo`` with the same scale.

    Shape:
        rewards: [P, G] → advantages [P, G]
    """
    return _group_mean_baseline(rewards, scale=scale, unbiased=unbiased, eps=eps)


@ESTIMATORS.register("rloo")
def rloo(rewards: Tensor, *, scale: str, unbiased: bool, eps: float) -> Tensor:
    """RLOO leave-one-out advantage (Ahmadian et al. 2024, arXiv 2402.14740): A_i = r_i − mean_{j≠i} r_j.

    Over the c valid samples of a group, mean_{j≠i} r_j = (Σ_j r_j − r_i) / (c − 1). A sample that is alone in its
    group (c = 1) gets advantage 0. The optional ``scale`` divides by the reward std, as for ``grpo``.

    Shape:
        rewards: [P, G] with G ≥ 2 → advantages [P, G]
    """
    r, valid = _group_rewards(rewards)  # [P, G], [P, G]
    _check_scale(scale)
    if rewards.shape[1] < 2:
        raise ValueError(f"rloo needs a group size G >= 2 for a leave-one-out baseline; got G={rewards.shape[1]}")
    rz = torch.where(valid, r, torch.zeros_like(r))  # [P, G]
    total = rz.sum(1, keepdim=True)  # [P, 1]
    others = valid.float().sum(1, keepdim=True) - 1.0  # [P, 1] valid samples other than i
    baseline = (total - rz) / torch.where(others > 0, others, torch.ones_like(others))  # [P, G]
    centred = torch.where(others > 0, r - baseline, torch.zeros_like(r))  # [P, G]
    return _scale(centred, r, valid, scale=scale, unbiased=unbiased, eps=eps)  # [P, G]


def combine_rewards(rewards: Tensor, weights: Tensor) -> Tensor:
    """Weighted sum over the K reward functions, ignoring NaN (= not applicable): r = Σ_k w_k r_k.

    A sample whose K rewards are all NaN stays NaN (it is then excluded from the group statistics).

    Shape:
        rewards: [P, G, K], weights: [K] → [P, G]
    """
    if rewards.dim() != 3:
        raise ValueError(f"rewards must be [P, G, K]; got shape {tuple(rewards.shape)}")
    if weights.shape != (rewards.shape[2],):
        raise ValueError(
            f"weights must be [K] = [{rewards.shape[2]}] (one per reward function); got shape {tuple(weights.shape)}"
        )
    r = rewards.float()  # [P, G, K]
    w = weights.to(device=r.device, dtype=torch.float32)  # [K]
    valid = ~torch.isnan(r)  # [P, G, K]
    total = torch.where(valid, r * w, torch.zeros_like(r)).sum(-1)  # [P, G]
    any_valid = valid.any(-1)  # [P, G]
    return torch.where(any_valid, total, torch.full_like(total, float("nan")))  # [P, G]


def zero_variance_groups(rewards: Tensor, *, tol: float = 1e-6) -> Tensor:
    """Groups without learning signal: max − min of the valid rewards ≤ ``tol`` (DAPO dynamic sampling, §3.2).

    NaN rewards are ignored; a group with fewer than two valid rewards counts as zero-variance.

    Shape:
        rewards: [P, G] → [P] bool
    """
    r, valid = _group_rewards(rewards)  # [P, G], [P, G]
    hi = torch.where(valid, r, torch.full_like(r, float("-inf"))).amax(1)  # [P]
    lo = torch.where(valid, r, torch.full_like(r, float("inf"))).amin(1)  # [P]
    return (hi - lo) <= tol  # [P]; all-NaN: -inf - inf = -inf → True


def compute_advantages(
    rewards: Tensor,
    weights: Tensor,
    *,
    combine: str,
    estimator: str,
    scale: str,
    unbiased: bool,
    eps: float,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Rewards of K functions → one advantage per sample, plus detached metrics.

    ``combine="sum_then_normalize"``: r = Σ_k w_k r_k (NaN-aware, ``combine_rewards``), A = estimator(r).
    ``combine="normalize_then_sum"`` (GDPO, arXiv 2601.05242): A_k = estimator(r_k) for each k (NaN samples of
    reward k excluded from its group statistics, A_k = 0 there), A = Σ_k w_k A_k, then
    Â = (A − mean_B A) / (std_B A + eps) over the samples with at least one valid reward (``unbiased`` applies).
    Samples whose K rewards are all NaN get advantage 0 in both modes.

    Metrics (scalars, detached; "valid" = at least one non-NaN reward; r is the weighted combined reward):
        reward/mean                   mean of r over valid samples
        reward/std                    std of r over valid samples (``unbiased`` as given)
        reward/std_within_group       mean over groups with a valid sample of the group std of r
        reward/nan_fraction           fraction of the P·G·K reward entries that are NaN
        advantage/mean                mean of A over all P·G samples
        advantage/abs_mean            mean of |A| over all P·G samples
        advantage/zero_std_fraction   fraction of the P groups whose r has zero variance (``zero_variance_groups``)

    Shape:
        rewards: [P, G, K], weights: [K] → advantages [P, G]
    """
    if combine not in COMBINES:
        raise ValueError(f"unknown reward combine {combine!r}; valid: {', '.join(COMBINES)}")
    _check_scale(scale)
    fn = ESTIMATORS.get(estimator)
    combined = combine_rewards(rewards, weights)  # [P, G]; validates shapes
    valid = ~torch.isnan(combined)  # [P, G]
    if combine == "sum_then_normalize":
        advantages = fn(combined, scale=scale, unbiased=unbiased, eps=eps)  # [P, G]
    else:
        r = rewards.float()  # [P, G, K]
        w = weights.to(device=r.device, dtype=torch.float32)  # [K]
        summed = torch.zeros_like(combined)  # [P, G]
        for k in range(r.shape[2]):  # K is small; "batch" scale must see reward k alone
            summed = summed + w[k] * fn(r[..., k], scale=scale, unbiased=unbiased, eps=eps)  # [P, G]
        mean, std, _ = _nan_stats(summed, valid, None, unbiased)  # [], []
        advantages = torch.where(valid, (summed - mean) / _nonzero(std + eps), torch.zeros_like(summed))  # [P, G]

    with torch.no_grad():
        r_mean, r_std, _ = _nan_stats(combined, valid, None, unbiased)  # [], []
        _, g_std, g_count = _nan_stats(combined, valid, 1, unbiased)  # [P, 1], [P, 1]
        has = (g_count > 0).float()  # [P, 1]
        metrics = {
            "reward/mean": r_mean,
            "reward/std": r_std,
            "reward/std_within_group": (g_std * has).sum() / has.sum().clamp_min(1.0),
            "reward/nan_fraction": torch.isnan(rewards.float()).float().mean(),
            "advantage/mean": advantages.mean(),
            "advantage/abs_mean": advantages.abs().mean(),
            "advantage/zero_std_fraction": zero_variance_groups(combined).float().mean(),
        }
    return advantages, {k: v.detach() for k, v in metrics.items()}


# ---------------------------------------------------------------------------------------------------------------
# advantage transforms: [P, G] → [P, G], applied in order after the estimator (``algorithm.advantage_transform``)

AdvantageTransform = Callable[..., Tensor]

ADVANTAGE_TRANSFORMS: Registry[AdvantageTransform] = Registry("advantage transform")
"""``fn(advantages[P, G], rewards[P, G], seq_logprob[P, G], **options) -> advantages[P, G]``.

``rewards`` is the weighted combined reward (NaN = not applicable), ``seq_logprob`` the mean log-probability of
each sample's valid units under the sampling policy (its "confidence" in log space; token policies)."""


def _group_mean(x: Tensor, valid: Tensor) -> Tensor:
    """Mean of ``x`` over each group's valid entries (0 for a group without one). Shape: [P, G] → [P, 1]."""
    mean, _, _ = _nan_stats(x, valid, 1, False)
    return mean


@dataclass(frozen=True)
class DifficultyOptions:
    """``algorithm.advantage_transform_args.difficulty`` (:func:`difficulty_weight`, DGRPO)."""

    offset: float = 2.0
    """c in d_g = clip(c − mean_G r, 0, 1) (the code's constant 2)."""


@ADVANTAGE_TRANSFORMS.register("difficulty", options=DifficultyOptions)
def difficulty_weight(advantages: Tensor, rewards: Tensor, seq_logprob: Tensor, *, offset: float = 2.0) -> Tensor:
    """DGRPO's difficulty weight (VITAL: Zhang et al. 2025, "Thinking With Videos: Multimodal Tool-Augmented
    Reinforcement Learning for Long Video Reasoning", arXiv 2508.04416, "DGRPO"), as the authors' verl code computes
    it (``verl/trainer/ppo/core_algos.py::compute_dgrpo_outcome_advantage``; public copy
    Jamesding000/ThinkingWithVideos)::

        d_g = clip(c − mean_G r, 0, 1)        c = ``offset`` (the code's constant 2)
        A_i ← A_i · (1 + d_g) / 2              a weight in [0.5, 1]: 1 for groups with mean ≤ c − 1, 0.5 at mean ≥ c

    ``rewards`` is the combined (total) reward, as the code's mean over format + tool + task rewards (a range of
    about [0, 4] there, hence c = 2); for a task whose reward lies in [0, 1], an ``offset`` of 1 spreads the weight
    over that range. Applied after the estimator's group normalisation, as in the code (a group-constant factor
    before the std division would cancel). Groups without a valid reward keep their advantages (0).

    Shape:
        advantages, rewards, seq_logprob: [P, G] → [P, G]
    """
    r, valid = _group_rewards(rewards)  # [P, G], [P, G]
    d = (offset - _group_mean(r, valid)).clamp(0.0, 1.0)  # [P, 1]
    w = torch.where(valid.any(1, keepdim=True), 0.5 * (1.0 + d), torch.ones_like(d))  # [P, 1]
    return advantages * w  # [P, G]


@dataclass(frozen=True)
class NegativeGroupsOptions:
    """``algorithm.advantage_transform_args.negative_groups`` (:func:`negative_group_confidence`, LENS)."""

    alpha: float = 0.25
    """Weight α of the all-wrong groups' objective (the paper's 0.25)."""
    wrong_threshold: float = 0.0
    """A combined reward above it counts as correct."""
    eps: float = 1e-6
    """Added to the std before dividing."""


@ADVANTAGE_TRANSFORMS.register("negative_groups", options=NegativeGroupsOptions)
def negative_group_confidence(
    advantages: Tensor,
    rewards: Tensor,
    seq_logprob: Tensor,
    *,
    alpha: float = 0.25,
    wrong_threshold: float = 0.0,
    eps: float = 1e-6,
) -> Tensor:
    """LENS (Feng et al. 2025, "Don't Waste Mistakes: Leveraging Negative RL-Groups via Confidence Reweighting",
    arXiv 2510.08696, its practical form): calibrated rewards for wrong answers, and all-wrong groups trained.

    With π̄_i = exp(seq_logprob_i) = π_old(o_i|q)^(1/|o_i|) (the length-normalised, geometric-mean token
    probability), c_i = 1[r_i > ``wrong_threshold``] (correct) and G the group's valid samples::

        D = 2·max_j π̄_j                              all-wrong group
        D = max(D_imp, 2·max_j π̄_j),  D_imp = [(1/G) Σ_i c_i/π̄_i]⁻¹     mixed group
        r̃_i = r_i − (1 − c_i)·(1/G)·π̄_i/(D − π̄_i)    a confident mistake is penalised more (at most 1/G)
        A_i = (r̃_i − mean_G r̃)/(std_G r̃ + eps)      mixed (and all-correct) groups: GRPO's normalisation
        A_i = α·(r̃_i − mean_G r̃)                     all-wrong groups: mean-centred only, weight α

    so the objective is J_GRPO[mixed] + α·J_GRPO[all-wrong] (the paper's α = 0.25). The std is the unbiased one
    (torch's, as GRPO's verl code). The advantages of the configured estimator are replaced, for every group.

    Departures and choices: the paper writes D_imp with π_old; the text is ambiguous between π and π̄ and π̄ is used
    here, as in the other terms. With rewards in {0, 1} and ``wrong_threshold`` 0, c_i = r_i and r̃ is the paper's;
    a combined reward with a bonus (e.g. + 0.2 format) counts as correct above ``wrong_threshold`` and the penalty is
    subtracted from the reward as it is. Meant for token policies, whose ``seq_logprob`` is a log-probability ≤ 0
    (clamped at 0). NaN rewards get advantage 0 and are left out of G, D, mean and std.

    Shape:
        advantages, rewards, seq_logprob: [P, G] → [P, G]
    """
    r, valid = _group_rewards(rewards)  # [P, G], [P, G]
    zero = torch.zeros_like(r)
    pbar = torch.where(valid, seq_logprob.float().clamp(max=0.0).exp(), zero)  # [P, G] π̄ (0 where NaN)
    correct = valid & (r > wrong_threshold)  # [P, G]
    wrong = valid & ~correct  # [P, G]
    count = valid.float().sum(1, keepdim=True).clamp_min(1.0)  # [P, 1] G
    d_conf = 2.0 * pbar.amax(1, keepdim=True)  # [P, 1]
    inv = torch.where(correct, 1.0 / pbar.clamp_min(1e-30), zero).sum(1, keepdim=True) / count  # [P, 1]
    d_imp = torch.where(inv > 0, 1.0 / inv.clamp_min(1e-30), torch.zeros_like(inv))  # [P, 1] (0: all wrong)
    d = torch.maximum(d_imp, d_conf)  # [P, 1] ≥ 2·π̄_i, so D − π̄_i ≥ π̄_i
    penalty = pbar / (count * (d - pbar).clamp_min(1e-30))  # [P, G]
    calibrated = torch.where(wrong, torch.where(valid, r, zero) - penalty, r)  # [P, G] r̃
    mean, std, _ = _nan_stats(calibrated, valid, 1, True)  # [P, 1], [P, 1]
    centred = calibrated - mean  # [P, G]
    all_wrong = valid.any(1, keepdim=True) & ~correct.any(1, keepdim=True)  # [P, 1]
    out = torch.where(all_wrong, alpha * centred, centred / _nonzero(std + eps))  # [P, G]
    return torch.where(valid, out, zero)  # [P, G]


def apply_transforms(
    names: list[str], advantages: Tensor, rewards: Tensor, seq_logprob: Tensor, options: dict[str, dict]
) -> Tensor:
    """Apply the transforms ``names`` in order, each with ``options.get(name, {})``. Shape: [P, G] → [P, G]."""
    for name in names:
        advantages = ADVANTAGE_TRANSFORMS.get(name)(advantages, rewards, seq_logprob, **options.get(name, {}))
    return advantages
