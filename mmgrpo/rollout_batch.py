"""What a rollout step reads and returns: the step's scored groups (:class:`RolloutBatch`) and the run's services
(:class:`RolloutContext`).

Their own module, below :mod:`mmgrpo.rollout_steps`, so a step's module (:mod:`mmgrpo.scaffold`, :mod:`mmgrpo.gcpo`,
:mod:`mmgrpo.replay`) can type its arguments without importing the registry that registers it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from torch import Tensor

from mmgrpo import noise
from mmgrpo.groups import Groups
from mmgrpo.types import Rollout


@dataclass
class RolloutBatch:
    """The step's scored groups, what the batch steps read and replace.

    Shape:
        scores: [B, K] each reward function's score of each sample (NaN = not applicable), B = P·G
    """

    rows: list[dict]
    """The P rows the groups were sampled from (as rolled out: an augmented row carries its hint)."""
    rollout: Rollout
    scores: Tensor  # [B, K]
    indices: list[int]
    """[P] the dataset rows of the groups (the variance sampler's keys)."""
    metrics: dict[str, float] = field(default_factory=dict)
    """The reward metrics of the scoring, then each step's own."""
    groups: Groups | None = None
    """How the B samples form the P groups (:mod:`mmgrpo.groups`); None: G each (set in ``__post_init__``), ragged
    under a step with a ``plan`` (Knapsack RL's budgets)."""

    def __post_init__(self) -> None:
        if self.groups is None:
            self.groups = Groups.uniform(len(self.rows), self.rollout.group_size)


@dataclass(frozen=True)
class RolloutContext:
    """What a step may use of the run during one training step; the trainer builds it."""

    step: int
    """The training step (0-based)."""
    group_size: int
    """G."""
    weights: Tensor  # [K]
    """The reward functions' weights (combined rewards: :func:`mmgrpo.advantages.combine_rewards`)."""
    reward_names: list[str]
    """[K] the reward functions' names (``reward/<name>`` metrics)."""
    adapter: Any
    """The policy adapter (a step calls only the capability its registration names in ``needs``)."""
    positions: list[int]
    """[P] the step's global prompt positions (keys of per-prompt randomness, world-size invariant)."""
    seed: int
    """The run's seed."""
    keys: Callable[..., noise.NoiseKeys | None]
    """``keys(seed, positions=the step's, n=G)``: rollout noise keys of ``positions`` (``n`` samples each) at this
    step under ``seed`` (None under ``rollout_noise: per_process``); a rollout of fewer rows passes their positions."""
    rollout: Callable[..., RolloutBatch]
    """``rollout(rows, indices, keys, n=G)``: sample ``n`` per row, apply the sample steps, score; a new
    :class:`RolloutBatch` (groups of ``n``: :mod:`mmgrpo.scaffold` samples one per hinted prompt)."""
    read_rows: Callable[[list[int]], list[dict]]
    """``read_rows(indices)``: dataset rows (a row that cannot be read is skipped for the next, and counted)."""
    n_rows: int
    """Training rows in the dataset."""
    acc: Any
    """The accelerator: collectives (``reduce``, ``gather``), ``num_processes``, ``process_index``, ``device``."""
    sampler: Any
    """The prompt sampler (:mod:`mmgrpo.sampling`)."""
    score: Callable[..., tuple[Tensor, dict[str, float]]] | None = None
    """``score(rows, outputs, extras, n=G)``: the rewards [len(rows)·n, K] (and their metrics) of ``outputs``, ``n``
    per row (group-major), e.g. after a step replaced some of them (:mod:`mmgrpo.gcpo`)."""


__all__ = ["RolloutBatch", "RolloutContext"]
