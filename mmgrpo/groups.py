"""Ragged groups: B samples in P groups of sizes n_p, and the rollout units that sample them.

The core's groups are a fixed [P, G] grid (sample b belongs to prompt b // G). A per-prompt rollout budget
(Knapsack RL, :mod:`mmgrpo.budgets`) gives prompt p its own n_p samples, Σ_p n_p = B, still group-major (the samples
of group p are consecutive). :class:`Groups` is that layout; every group statistic reads it through
:meth:`Groups.grid`, which lays the B samples out on a [P, W] grid (W ≥ max n_p) padded with NaN. NaN is the
core's "not applicable" (:mod:`mmgrpo.advantages`): every estimator, the zero-variance test and the transforms leave
NaN entries out of their means, stds and extremes and give them advantage 0, so a padded grid gives each group's
statistics over its own n_p samples — the same numbers as the group computed alone (tested). With every group of
size G the grid is ``x.view(P, G, …)`` and the flat form ``x.reshape(B, …)``: the fixed-G path is bit-identical.

:class:`Units` is how such a budget is sampled through the unchanged adapter protocol
(``adapter.rollout(rows, G, keys)`` samples G per row): prompt p's n_p = k_p·u samples are k_p rows of ``u`` samples
each (the rollout's own groups, its ``group_size`` = u), unit j of the prompt at global position q keyed at position
q for j = 0 and at ``mix(q, BUDGET_NOISE, j)`` for j ≥ 1, so every sample's noise is fixed by (seed, step, prompt
position, sample index) and the first u samples of a prompt are those the uniform rollout draws for it.

Shape glossary (DESIGN.md): ``P`` prompts, ``G`` group size, ``B`` samples, ``W`` the grid's width.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property

import torch
from torch import Tensor

from mmgrpo import noise

BUDGET_NOISE = 0xB0D6E7
"""Mixed into the position of a prompt's second and later rollout units (:func:`split`)."""


@dataclass(frozen=True)
class Groups:
    """B samples in P consecutive groups: group p holds ``sizes[p]`` samples (group-major)."""

    sizes: tuple[int, ...]
    """[P] samples of each group (each ≥ 1)."""
    width: int
    """W: the group dimension of :meth:`grid`, ≥ max(sizes); the same on every process, so every process's grid has
    one shape (the multi-process metrics gather it)."""

    def __post_init__(self) -> None:
        if any(n < 1 for n in self.sizes) or (self.sizes and max(self.sizes) > self.width):
            raise ValueError(f"Groups: sizes {list(self.sizes)[:16]} must lie in [1, width={self.width}]")

    @classmethod
    def uniform(cls, P: int, G: int) -> Groups:
        """P groups of G samples: the core's fixed grid."""
        return cls((G,) * P, G)

    @property
    def count(self) -> int:
        """P."""
        return len(self.sizes)

    @property
    def samples(self) -> int:
        """B = Σ_p n_p."""
        return sum(self.sizes)

    @property
    def equal(self) -> bool:
        """Every group has W samples (the fixed [P, G] grid: views, no copies)."""
        return all(n == self.width for n in self.sizes)

    @cached_property
    def slots(self) -> Tensor:
        """[B] each sample's place in the flattened [P·W] grid: p·W + j for sample j of group p."""
        return torch.cat([p * self.width + torch.arange(n) for p, n in enumerate(self.sizes)])  # [B]

    def ids(self) -> Tensor:
        """[B] long, the group of each sample (0..P−1)."""
        return torch.arange(self.count).repeat_interleave(torch.tensor(self.sizes))  # [B]

    def grid(self, x: Tensor, fill: float = float("nan")) -> Tensor:
        """[B, …] → [P, W, …]: group p's samples in row p, its empty places ``fill`` (NaN: not applicable)."""
        P, W, rest = self.count, self.width, tuple(x.shape[1:])
        if self.equal:
            return x.view(P, W, *rest)  # [P, G, …]
        out = x.new_full((P * W, *rest), fill)  # [P·W, …]
        out[self.slots.to(x.device)] = x
        return out.view(P, W, *rest)  # [P, W, …]

    def flat(self, x: Tensor) -> Tensor:
        """[P, W, …] → [B, …]: the samples' entries, group-major (the inverse of :meth:`grid`)."""
        rest = tuple(x.shape[2:])
        if self.equal:
            return x.reshape(self.samples, *rest)  # [B, …]
        return x.reshape(self.count * self.width, *rest)[self.slots.to(x.device)]  # [B, …]

    def repeat(self, x: Tensor) -> Tensor:
        """[P, …] → [B, …]: each group's entry for each of its samples."""
        if self.equal:
            return x.repeat_interleave(self.width, dim=0)  # [B, …]
        return x.repeat_interleave(torch.tensor(self.sizes, device=x.device), dim=0)  # [B, …]

    def per_sample(self, x: Tensor) -> Tensor:
        """A per-sample shaper's [P, G] input: ``x`` itself for equal groups, ``flat(x)`` as [B, 1] otherwise (B
        groups of one, which a shaper that only broadcasts A_b over sample b's units reads the same way)."""
        return x if self.equal else self.flat(x)[:, None]  # [P, G] or [B, 1]


@dataclass(frozen=True)
class Units:
    """The rows one rollout call samples and how its samples form the step's groups."""

    rows: list[dict]
    """[P'] the rows handed to ``adapter.rollout``, ``size`` samples each (a prompt's row repeated per unit)."""
    size: int
    """u: samples per row (the rollout's ``group_size``)."""
    keys: noise.NoiseKeys | None
    """The noise keys of the P' rows (None: the adapter's own RNG)."""
    groups: Groups
    """How the P'·u samples form the P prompts' groups."""


def uniform(rows: list[dict], keys: noise.NoiseKeys | None, G: int) -> Units:
    """G samples per row, one unit per prompt: the core's usual rollout."""
    return Units(rows, G, keys, Groups.uniform(len(rows), G))


def split(rows: list[dict], keys: noise.NoiseKeys | None, sizes: list[int], unit: int, width: int) -> Units:
    """Prompt p's ``sizes[p]`` samples as ``sizes[p] // unit`` rows of ``unit`` samples (see the module docstring
    for the keys); a row gets ``group_index`` p (the column group-aware rewards read), unless it has one."""
    if any(n % unit or n < unit for n in sizes):
        raise ValueError(f"budgets {sizes} must be positive multiples of the rollout unit {unit}")
    reps = [n // unit for n in sizes]  # [P] units per prompt
    out = [{"group_index": p, **row} for p, (row, k) in enumerate(zip(rows, reps, strict=True)) for _ in range(k)]
    unit_keys = None
    if keys is not None:
        at = [q if j == 0 else noise.mix(q, BUDGET_NOISE, j) for q, k in zip(keys.positions, reps) for j in range(k)]
        unit_keys = replace(keys, positions=tuple(at), group_size=unit)
    return Units(out, unit, unit_keys, Groups(tuple(sizes), width))


__all__ = ["BUDGET_NOISE", "Groups", "Units", "split", "uniform"]
