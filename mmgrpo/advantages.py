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


# ---------------------------------------------------------------------------------------------------------------
# issue 51: NGRPO's virtual maximum-reward sample, the unlikeliness reward, SEED-GRPO's semantic-entropy scale

REPLACES_ADVANTAGES = {"negative_groups": "LENS", "ngrpo": "NGRPO", "unlikeliness": "Rewarding the Unlikely"}
"""Transforms that compute their own group statistics from the rewards and replace the estimator's advantages (name →
paper): listed first, at most one of them (``mmgrpo.loader`` refuses other orders at load)."""


@dataclass(frozen=True)
class NGRPOOptions:
    """``algorithm.advantage_transform_args.ngrpo`` (:func:`ngrpo_calibration`)."""

    max_reward: float = 1.0
    """r_max, the reward of the virtual sample: the largest combined reward a completion can get (the code's
    ``max_reward``; 1.2 for accuracy + 0.2 format)."""
    virtual_samples: int = 1
    """How many virtual r_max samples join each group's statistics (the code's ``add_max_reward_num``, 1)."""
    eps: float = 1e-6
    """Added to the std before dividing (the code's ``epsilon``)."""


@ADVANTAGE_TRANSFORMS.register("ngrpo", options=NGRPOOptions)
def ngrpo_calibration(
    advantages: Tensor,
    rewards: Tensor,
    seq_logprob: Tensor,
    *,
    max_reward: float = 1.0,
    virtual_samples: int = 1,
    eps: float = 1e-6,
) -> Tensor:
    """NGRPO's advantage calibration (Nan et al. 2025, "NGRPO: Negative-enhanced Group Relative Policy
    Optimization", arXiv 2509.18851 §3, "Advantage Calibration"; the authors' code nangongrui-ngr/NGRPO
    ``verl/trainer/ppo/core_algos.py::compute_ngrpo_outcome_advantage``): every group's mean and std are taken over
    its G rewards plus V = ``virtual_samples`` virtual samples of reward r_max, which are not trained::

        R' = {r_1, …, r_G} ∪ {r_max} × V
        A_i = (r_i − mean(R')) / (std(R') + eps)          std unbiased (n − 1), as the code's torch.std

    so an all-wrong group (every r_i < r_max) gets the same negative advantage for each sample instead of 0, and
    an all-correct group (every r_i = r_max) keeps 0. The paper's worked case, G = 8 with one correct answer:
    GRPO 2.47 / −0.35, NGRPO 1.76 / −0.50 (tested). The paper's second part, asymmetric clipping (a looser bound
    for positive advantages, a stricter one for negative), is ``ppo_clip``'s ``clip_high`` / ``clip_low`` (the
    authors' script: 0.24 / 0.16; ``configs/variant_ngrpo.yaml``). The estimator's advantages are replaced.

    Departures: NaN rewards (not applicable) are left out of the statistics and get advantage 0; a group with no
    valid reward keeps 0 (the code's singleton group, mean 0 and std 1, does not arise with V ≥ 1).

    Shape:
        advantages, rewards, seq_logprob: [P, G] → [P, G]
    """
    r, valid = _group_rewards(rewards)  # [P, G], [P, G]
    zero = torch.zeros_like(r)
    rz = torch.where(valid, r, zero)  # [P, G]
    v = float(virtual_samples)
    n = valid.float().sum(1, keepdim=True) + v  # [P, 1] G + V
    mean = (rz.sum(1, keepdim=True) + v * max_reward) / n  # [P, 1]
    sq = torch.where(valid, (r - mean).square(), zero).sum(1, keepdim=True) + v * (max_reward - mean) ** 2  # [P, 1]
    std = (sq / (n - 1.0).clamp_min(1.0)).sqrt()  # [P, 1]
    out = (r - mean) / _nonzero(std + eps)  # [P, G]
    return torch.where(valid, out, zero)  # [P, G]


@dataclass(frozen=True)
class UnlikelinessOptions:
    """``algorithm.advantage_transform_args.unlikeliness`` (:func:`unlikeliness_reward`)."""

    beta: float = 0.25
    """β_rank: the most likely sample's reward is scaled by 1 − β·(n−1)/n (the code's ``rank_penalty``, 0.25)."""
    wrong_threshold: float = 0.0
    """Only rewards above it (correct answers) are scaled; 0.2 for accuracy + 0.2 format, so that the format bonus
    of a wrong answer is not rank-shaped."""
    eps: float = 1e-6
    """Added to the std before dividing."""


@ADVANTAGE_TRANSFORMS.register("unlikeliness", options=UnlikelinessOptions)
def unlikeliness_reward(
    advantages: Tensor,
    rewards: Tensor,
    seq_logprob: Tensor,
    *,
    beta: float = 0.25,
    wrong_threshold: float = 0.0,
    eps: float = 1e-6,
) -> Tensor:
    """The unlikeliness reward (He, Fried & Welleck 2025, "Rewarding the Unlikely: Lifting GRPO Beyond Distribution
    Sharpening", arXiv 2506.02355 §4), as the authors' code computes it (AndreHe02/rewarding-unlikely-release
    ``verl/trainer/ppo/ray_lean_trainer.py::_compute_advantages``, ``lean.rank_penalty``, 0.25 in
    ``examples/lean/grpo.sh``)::

        k_i = rank of sample i by π_old likelihood within its group, 0 = least likely … n − 1 = most likely
        r̃_i = r_i · (1 − β · k_i / n)    for correct samples (r_i > ``wrong_threshold``); r̃_i = r_i otherwise
        A_i = (r̃_i − mean_G r̃) / (std_G r̃ + eps)        std unbiased, as the code's torch.std

    The likelihood is the mean token log-probability under the sampling policy (the code's masked mean of
    ``old_log_probs``). Only correct samples change: the improbable correct ones keep more of their reward than the
    probable ones, which counters GRPO's rank bias. The estimator's advantages are replaced.

    ``wrong_threshold`` is ours: the code scales every reward, which with its binary rewards (0 for a wrong proof)
    changes only the correct ones; with a reward that pays wrong answers something (a format bonus), scaling them too
    gives all-wrong groups advantages from the likelihood ranks alone, which the group std then blows up to the size
    of a correctness signal (measured: the quickstart's policy collapsed, docs/variants.md). With 0/1 rewards and the
    default 0 both forms are the same.

    *(our reading)*: the paper's equation was not retrieved verbatim here; the code's form is implemented. Ties in
    likelihood are ranked by sample index (the code's ``argsort`` leaves them unspecified). NaN rewards are left out
    of the ranks (n counts the valid samples) and get advantage 0.

    Shape:
        advantages, rewards, seq_logprob: [P, G] → [P, G]
    """
    r, valid = _group_rewards(rewards)  # [P, G], [P, G]
    lp = seq_logprob.float()  # [P, G]
    G = r.shape[1]
    idx = torch.arange(G, device=r.device)
    below = (lp[:, None, :] < lp[:, :, None]) | ((lp[:, None, :] == lp[:, :, None]) & (idx[None, :] < idx[:, None]))
    rank = (below & valid[:, None, :]).float().sum(-1)  # [P, G] valid samples ranked below sample i
    n = valid.float().sum(1, keepdim=True).clamp_min(1.0)  # [P, 1]
    correct = valid & (r > wrong_threshold)  # [P, G]
    shaped = torch.where(correct, r * (1.0 - beta * rank / n), r)  # [P, G] r̃ (NaN stays NaN)
    mean, std, _ = _nan_stats(shaped, valid, 1, True)  # [P, 1], [P, 1]
    out = (shaped - mean) / _nonzero(std + eps)  # [P, G]
    return torch.where(valid, out, torch.zeros_like(out))  # [P, G]


@dataclass(frozen=True)
class SemanticEntropyOptions:
    """``algorithm.advantage_transform_args.seed_grpo`` (:func:`semantic_entropy_scale`)."""

    alpha: float = 0.5
    """α: how strongly the normalised semantic entropy lowers the advantage, f = 1 − α·SE/SE_max."""
    answer_pattern: str = r"<answer>(.*?)</answer>"
    """Regular expression of a completion's answer: its last match (group 1 if it has one), stripped and compared
    case-insensitively; a completion without a match is its own cluster."""


@ADVANTAGE_TRANSFORMS.register("seed_grpo", options=SemanticEntropyOptions)
def semantic_entropy_scale(
    advantages: Tensor,
    rewards: Tensor,
    answer_ids: Tensor,
    *,
    alpha: float = 0.5,
    answer_pattern: str = r"<answer>(.*?)</answer>",
) -> Tensor:
    """SEED-GRPO (Chen, Chen, Wang & Yang 2025, "SEED-GRPO: Semantic Entropy Enhanced GRPO for Uncertainty-Aware
    Policy Optimization", arXiv 2505.12346 §3): the advantages of a prompt whose G answers disagree are scaled down::

        clusters C_1..C_K of the group's answers (same extracted answer = same meaning)
        p_k = |C_k| / n                                   n = the group's valid samples
        SE = −(1/K) Σ_k log p_k,   SE_max = log n          (all n answers different: SE = SE_max)
        Â_i = A_i · (1 − α · SE / SE_max)

    The third argument is not the log-probability but each sample's answer cluster id (``answer_ids``, NaN = no
    sample in that slot of a ragged group), filled in by ``mmgrpo.advantage_steps`` from the rollout's outputs with
    ``answer_pattern`` (``TRANSFORM_INPUTS``).

    *(our reading)*: the paper's Monte-Carlo form SE ≈ −(1/K) Σ_k log p(C_k | q) was retrieved; its p(C_k | q) is
    the policy's probability mass of the cluster, estimated here by the cluster's share of the group (the discrete
    semantic entropy of Farquhar et al. 2024), which makes SE_max = log n exact. Of the paper's scaling functions f
    only the linear one, f(x) = 1 − x, is implemented; no public code was found. Clusters are exact matches of the
    extracted answer (the paper's math-equivalence check is the task's business). A group of one sample keeps its
    advantages.

    Shape:
        advantages, rewards, answer_ids: [P, G] → [P, G]
    """
    valid = ~torch.isnan(answer_ids)  # [P, G]
    ids = torch.where(valid, answer_ids, torch.zeros_like(answer_ids))  # [P, G]
    pair = valid[:, :, None] & valid[:, None, :]  # [P, G, G]
    size = ((ids[:, :, None] == ids[:, None, :]) & pair).float().sum(-1)  # [P, G] |C| of sample i's cluster
    n = valid.float().sum(1, keepdim=True)  # [P, 1]
    inv = torch.where(valid, 1.0 / size.clamp_min(1.0), torch.zeros_like(size))  # [P, G] 1/|C|: sums to K
    K = inv.sum(1, keepdim=True)  # [P, 1]
    neg_log_p = torch.where(valid, (n / size.clamp_min(1.0)).log(), torch.zeros_like(size))  # [P, G] −log p_k
    se = (inv * neg_log_p).sum(1, keepdim=True) / K.clamp_min(1.0)  # [P, 1]
    se_max = n.clamp_min(1.0).log()  # [P, 1]
    ratio = torch.where(n > 1, se / torch.where(n > 1, se_max, torch.ones_like(se_max)), torch.zeros_like(se))
    return advantages * (1.0 - alpha * ratio)  # [P, G]
