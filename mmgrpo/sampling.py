"""Prompt samplers that choose each step's prompts from the reward variance they showed before.

Selected by ``algorithm.sampler`` (``SAMPLERS``; the default ``sequential`` is the trainer's ``PromptSampler``, a
seeded permutation per epoch). A sampler is built as ``cls(n_rows, prompts_per_step, world, rank, seed, **options)``
and has the ``PromptSampler`` interface — ``positions(step)`` (the global positions that key the rollout noise) and
``indices(step)`` (this process's P rows) — plus ``observe(indices, rewards, diversity)``, which the trainer calls
after every step with the rows, combined rewards and trajectory diversity of **all** processes (gathered), so that
every process holds the same statistics and draws the same global batch (docs/architecture.md, "World-size
invariance": the W·P rows of a step depend on (seed, step, history), never on W; process r takes slice r).

``variance`` implements two published selection rules on one set of statistics:

* MMR1 (Leng et al. 2025, "MMR1: Enhancing Multimodal Reasoning with Variance-Aware Sampling", arXiv 2509.21268;
  LengSicong/MMR1): the Variance Promotion Score VPS = α·OVS + β·TDS, the outcome variance of a prompt's rewards
  plus the diversity of its trajectories; prompts are drawn with probability ∝ VPS (``mode: weight``).
* Temporal-RLT (2025, "Reinforcement Learning Tuning for VideoLLMs: Reward Design and Data Efficiency",
  arXiv 2506.01908; appletea233/Temporal-R1): keep the samples whose repeated rollouts have non-zero reward
  variance (``mode: filter``: prompts whose last variance is ≤ ``min_variance`` are not drawn).

Departures: both papers score the data offline with repeated rollouts of the base model (MMR1 refreshes the scores
periodically); here the scores are the last observed group of the running policy, updated online after each step,
and a prompt not yet seen scores ``unseen_score`` (so every prompt is tried first). OVS is the population variance
of the group's combined rewards; TDS is the fraction of distinct completions in the group (MMR1 measures trajectory
diversity differently; distinct-fraction is our cheap stand-in). The statistics are not checkpointed: a resumed run
starts them afresh (its prompt order then differs from an uninterrupted run's).
"""

from __future__ import annotations

import torch
from torch import Tensor

from mmgrpo.registry import Registry

SAMPLERS: Registry[type] = Registry("prompt sampler")
"""``cls(n_rows, prompts_per_step, world, rank, seed, **options)`` with ``positions``/``indices`` (+ ``observe``).
The default, ``sequential`` (no options), is the trainer's own ``PromptSampler`` and is not in this registry."""

SEQUENTIAL = "sequential"


@SAMPLERS.register("variance")
class VarianceSampler:
    """Variance-aware prompt sampling (MMR1 VPS weighting, Temporal-RLT variance filter); see the module docstring.

    Score of row i: s_i = α·OVS_i + β·TDS_i for rows seen before, ``unseen_score`` otherwise. ``mode: weight``
    draws the W·P rows of a step without replacement with probability ∝ ``floor`` + s_i; ``mode: filter`` draws
    uniformly among the rows whose OVS > ``min_variance`` (and the unseen ones). When fewer than W·P rows are
    eligible, the rest are drawn uniformly from the others.
    """

    def __init__(
        self,
        n_rows: int,
        prompts_per_step: int,
        world: int,
        rank: int,
        seed: int,
        *,
        mode: str = "weight",
        alpha: float = 1.0,
        beta: float = 0.0,
        floor: float = 0.05,
        unseen_score: float = 1.0,
        min_variance: float = 0.0,
    ):
        if mode not in ("weight", "filter"):
            raise ValueError(f"algorithm.sampler_args.mode: {mode!r} is not allowed; choose one of: weight, filter")
        if min(alpha, beta, floor, unseen_score, min_variance) < 0:
            raise ValueError("algorithm.sampler_args: alpha, beta, floor, unseen_score and min_variance must be >= 0")
        self.n, self.P, self.world, self.rank, self.seed = n_rows, prompts_per_step, world, rank, seed
        self.mode, self.alpha, self.beta, self.floor = mode, alpha, beta, floor
        self.unseen_score, self.min_variance = unseen_score, min_variance
        self.variance = torch.full((n_rows,), float("nan"))  # [N] last observed OVS; NaN = not seen
        self.diversity = torch.zeros(n_rows)  # [N] last observed TDS
        self._cache: tuple[int, list[int]] | None = None

    def positions(self, step: int) -> list[int]:
        """[P] global positions ``step·W·P + r·P + i`` (the rollout-noise keys, as ``PromptSampler``)."""
        start = (step * self.world + self.rank) * self.P
        return list(range(start, start + self.P))

    def scores(self) -> Tensor:
        """[N] the score s_i of every row (``unseen_score`` for rows not yet observed)."""
        seen = ~torch.isnan(self.variance)  # [N]
        s = self.alpha * torch.nan_to_num(self.variance) + self.beta * self.diversity  # [N]
        return torch.where(seen, s, torch.full_like(s, self.unseen_score))  # [N]

    def weights(self) -> Tensor:
        """[N] unnormalised draw probabilities of the rows (0 = not eligible this step)."""
        if self.mode == "weight":
            return self.floor + self.scores()  # [N]
        seen = ~torch.isnan(self.variance)  # [N]
        keep = ~seen | (self.variance > self.min_variance)  # [N]
        return keep.float()  # [N]

    def global_indices(self, step: int) -> list[int]:
        """[W·P] the rows of the whole step (the same on every process), drawn from (seed, step) and the scores."""
        if self._cache is not None and self._cache[0] == step:
            return self._cache[1]
        k = self.world * self.P
        g = torch.Generator().manual_seed(self.seed * 100003 + 7919 * step + 17)
        w = self.weights()  # [N]
        eligible = int((w > 0).sum())
        if eligible < min(k, self.n):  # too few eligible rows: the others are drawn uniformly after them
            w = torch.where(w > 0, w * 1e6, torch.ones_like(w))  # [N]
        out = torch.multinomial(w, min(k, self.n), replacement=False, generator=g).tolist()
        while len(out) < k:  # more prompts per step than rows: repeat a fresh draw
            out += torch.multinomial(w, min(k - len(out), self.n), replacement=False, generator=g).tolist()
        self._cache = (step, out)
        return out

    def indices(self, step: int) -> list[int]:
        """[P] this process's rows: slice [r·P, (r+1)·P) of :meth:`global_indices`."""
        return self.global_indices(step)[self.rank * self.P : (self.rank + 1) * self.P]

    def observe(self, indices: Tensor, rewards: Tensor, diversity: Tensor) -> None:
        """Record the step's groups: OVS = population variance of each group's valid rewards, TDS = ``diversity``.

        Shape:
            indices: [W·P] rows, rewards: [W·P, G] combined rewards (NaN = not applicable), diversity: [W·P]
        """
        r = rewards.float()  # [W·P, G]
        valid = ~torch.isnan(r)  # [W·P, G]
        count = valid.float().sum(1)  # [W·P]
        rz = torch.where(valid, r, torch.zeros_like(r))  # [W·P, G]
        mean = rz.sum(1) / count.clamp_min(1.0)  # [W·P]
        var = (((rz - mean[:, None]) * valid).square().sum(1)) / count.clamp_min(1.0)  # [W·P]
        idx = indices.long()
        self.variance[idx] = var
        self.diversity[idx] = diversity.float()


def distinct_fraction(outputs: list, group_size: int) -> Tensor:
    """[P] fraction of distinct outputs (by ``str``) in each group of ``group_size`` consecutive outputs."""
    groups = [outputs[i : i + group_size] for i in range(0, len(outputs), group_size)]
    return torch.tensor([len({str(o) for o in g}) / group_size for g in groups])
