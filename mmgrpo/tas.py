"""Temporal Advantage Shaping (TAS) of AVATAR (Kulkarni & Fazli 2025, "AVATAR: Reinforcement Learning to See, Hear,
and Reason Over Video", arXiv 2508.03100): the sample's advantage, re-weighted per token so that the early
(planning) and late (synthesis) phases of a completion count more than its middle.

Registered as the shaper ``tas`` (``algorithm.shaping: tas``, ``shaping_args: {alpha, normalize}``), so it runs where
GRPO broadcasts the sample's advantage to its tokens (:mod:`mmgrpo.advantage_steps`, step 3).

**From the authors' code** (github.com/yogkul2000/AVATAR, ``ms-swift/swift/rlhf_trainers/grpo_tas_trainer.py``,
``GRPOTASTrainer._compute_tas_weights``; λ_TAS = ``tas_lambda`` = 0.3 in ``ms-swift/swift/rlhf_trainers/
args_mixin.py``). The paper's abstract (v4) says TAS "emphasizes early (planning) and late (synthesis) reasoning
phases"; the code makes that a parabola in the normalised position u = t / (L − 1) of the token in its completion
(u = 0 for a one-token completion), multiplying each token's clipped surrogate:

    w(u) = 1 + λ · (2u − 1)²,      loss_{b,t} = w(u_{b,t}) · ℓ^{clip}_{b,t}

which is 1 + λ at the first and last token and 1 in the middle. For the clipped surrogates here
−min(r·A·w, clip(r)·A·w) = w · (−min(r·A, clip(r)·A)) since w > 0, so TAS is registered as a shaper that multiplies the
broadcast advantage: A_{b,t} = A_b · w(u_{b,t}), the same update. ``normalize`` (ours, off by default as in the code)
divides the weights by their mean over each sample's trained tokens, so the sample's total advantage stays GRPO's. In
multi-turn rollouts (``rollout.tools``) u runs over all of a trajectory's action tokens (observation tokens have mask
0), so the first turn's opening and the final answer get the weight.

Pure torch, no config objects.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

from torch import Tensor

from mmgrpo.config import ConfigError, Range
from mmgrpo.shaping import SHAPERS, ShapingInputs

SEQUENCE_ADVANTAGE_SURROGATES = ("gmpo", "reg_grpo", "dgpo")
"""Surrogates that reduce the per-unit advantages to one per sequence (their masked mean), which averages TAS's
position weights away."""


def unit_positions(mask: Tensor) -> Tensor:
    """u_{b,t} = k / max(L_b − 1, 1): the rank k = 0..L_b−1 of unit t among sample b's L_b valid units, in [0, 1] (0
    for a sample with one valid unit, as the authors' ``positions / (lengths − 1).clamp(min=1)``); 0 where the mask
    is 0.

    Shape:
        mask: [B, T] -> [B, T]
    """
    m = (mask > 0).float()  # [B, T]
    rank = m.cumsum(dim=1) - 1  # [B, T] k at valid units
    length = m.sum(dim=1, keepdim=True)  # [B, 1]
    u = rank / (length - 1).clamp_min(1.0)  # [B, T]
    return u * m


def tas_weights(mask: Tensor, alpha: float, normalize: bool) -> Tensor:
    """w_{b,t} = 1 + α·(2u_{b,t} − 1)² at valid units (0 elsewhere); with ``normalize`` divided by the mean of w over
    sample b's valid units (AVATAR's TAS, arXiv 2508.03100, as the authors' code: the module docstring).

    Shape:
        mask: [B, T] -> [B, T]
    """
    m = (mask > 0).float()  # [B, T]
    w = (1.0 + alpha * (2.0 * unit_positions(mask) - 1.0) ** 2) * m  # [B, T]
    if normalize:
        mean = w.sum(dim=1, keepdim=True) / m.sum(dim=1, keepdim=True).clamp_min(1.0)  # [B, 1]
        w = w / mean.clamp_min(1e-12)
    return w


@dataclass(frozen=True)
class TASOptions:
    """``algorithm.shaping_args`` of ``tas`` (:func:`tas`)."""

    alpha: Annotated[float, Range(ge=0)] = 0.3
    """λ_TAS (the authors' ``tas_lambda``, default 0.3): the extra weight of the first and last token over the middle
    one (w = 1 + λ at the ends); 0 = GRPO."""
    normalize: bool = False
    """Ours (not in the authors' code): divide the weights by their mean over each sample's tokens, so the sample's
    total advantage stays GRPO's."""


@SHAPERS.register("tas", options=TASOptions)
def tas(advantages: Tensor, inputs: ShapingInputs, alpha: float = 0.3, normalize: bool = False) -> Tensor:
    """A_{b,t} = A_b · w_{b,t}: GRPO's broadcast advantage times TAS's position weights (:func:`tas_weights`).

    Shape:
        advantages: [P, G] (or [B, 1] for ragged groups) -> [B, T], zero where the mask is 0
    """
    a = advantages.reshape(-1, 1).float()  # [B, 1]
    return a * tas_weights(inputs.mask, float(alpha), bool(normalize))  # [B, T]


def check_config(algorithm: Any) -> None:
    """Refuse, in one line at load, ``shaping: tas`` with a surrogate that takes one advantage per sequence."""
    if algorithm.shaping == "tas" and algorithm.surrogate in SEQUENCE_ADVANTAGE_SURROGATES:
        raise ConfigError(
            f"algorithm.shaping: tas weights each token's advantage, but surrogate {algorithm.surrogate} uses one "
            "advantage per sequence (their mean), which averages the weights away; use surrogate: ppo_clip, sapo, "
            "cispo or reinforce"
        )
