"""Per-unit advantage shaping: from one advantage per sample [P, G] to one per action unit [B, T].

Pure math (torch only). Every shaper has one signature::

    shaper(advantages: Tensor[P, G], inputs: ShapingInputs, **params) -> Tensor[B, T]

``none`` broadcasts the sample's advantage to all of its units (outcome-level GRPO). Other shapers
(chunk-level, temporal, value-anchored) are registered below them; see their docstrings for sources.
"""

from __future__ import annotations

from dataclasses import dataclass

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


@SHAPERS.register("none")
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


__all__ = ["SHAPERS", "ShapingInputs", "broadcast", "shape_advantages"]
