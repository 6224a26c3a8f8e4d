"""Prompt samplers that choose each step's prompts from the reward variance they showed before.

Selected by ``algorithm.sampler`` (``SAMPLERS``; the default ``sequential`` is :class:`PromptSampler`, a
seeded permutation per epoch). A sampler is built as ``cls(n_rows, prompts_per_step, world, rank, seed, **options)``
and has the ``PromptSampler`` interface — ``positions(step)`` (the global positions that key the rollout noise) and
``indices(step)`` (this process's P rows) — plus ``observe(indices, rewards, diversity)``, which the trainer calls
after every step with the rows, combined rewards and trajectory diversity of **all** processes (gathered), so that
every process holds the same statistics and draws the same global batch (docs/architecture.md, "World-size
invariance": the W·P rows of a step depend on (seed, step, history), never on W; process r takes slice r).

``variance`` implements two published selection rules on one set of statistics:

* MMR1 (Leng et al. 2025, "MMR1: Enhancing Multimodal Reasoning with Variance-Aware Sampling", arXiv 2509.21268;
  code LengSicong/MMR1, ``verl/curriculum/metrics.py``, ``samplers.py`` and ``RayPPOTrainer._compute_curriculum_
  weights`` in ``verl/trainer/ray_trainer.py``): the Variance Promotion Score VPS = α·OVS + β·TDS, a weighted sum
  of the outcome variance of a prompt's rollouts (the code's ``learnability`` p(1 − p), p the pass rate over the
  rollouts) and their trajectory diversity (the code offers ``distinct_3``, ``self_bleu_123`` and
  ``edit_distance``); the scores are min-max normalised over the dataset, optionally smoothed with a momentum, and a
  ``mixture_ratio`` share of every batch is drawn with probability ∝ the normalised score, the rest uniformly
  (``MixedCurriculumSampler``; ``examples/mmr1.yaml``: ``learnability`` alone with weight 1, mixture 0.5,
  momentum 0). ``mode: weight``.
* Temporal-RLT (2025, "Reinforcement Learning Tuning for VideoLLMs: Reward Design and Data Efficiency",
  arXiv 2506.01908; appletea233/Temporal-R1): keep the samples whose repeated rollouts have non-zero reward
  variance (``mode: filter``: prompts whose last variance is ≤ ``min_variance`` are not drawn).

As in the MMR1 code: OVS is the population variance of the group's combined rewards (= p(1 − p) for 0/1 rewards,
and defined for any reward); TDS is distinct-3, the share of distinct word 3-grams among all 3-grams of the group's
completions (``calculate_distinct_n`` with n = 3); weights = (s − min s)/(max s − min s + 1e-8); each step's
W·P rows interleave the weighted and the uniform draws. Departures: MMR1 scores the whole dataset with a separate
batch of rollouts every ``curriculum_update_freq`` steps; here a row's score is its last observed group under the
running policy, updated online after each step, and a row not yet seen scores ``unseen_score`` (so every prompt is
tried first). Distinct-3 counts whitespace-separated words, not the model's tokens (the sampler never sees token
ids); flow/image outputs count as one "word" each. ``floor`` (default 0, MMR1 has none) is added to every weight.
Draws are without replacement within a step (MMR1's ``WeightedRandomSampler`` draws with replacement).

The statistics are part of the checkpoint (:meth:`VarianceSampler.state_dict`), so a resumed run draws the rows an
uninterrupted one would.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from mmgrpo.options import resolve
from mmgrpo.registry import Registry
from mmgrpo.shaping import NoOptions

SAMPLERS: Registry[type] = Registry("prompt sampler")
"""``cls(n_rows, prompts_per_step, world, rank, seed, **options)`` with ``positions``/``indices`` (+ ``observe``).
The default, ``sequential`` (no options), is :class:`PromptSampler`, the base class of the others."""

SEQUENTIAL = "sequential"


class PromptSampler:
    """Deterministic prompt order: epoch e is a permutation seeded by (seed, e); the position is step-derived.

    Process r takes prompts [r·P, (r+1)·P) of each global batch of W·P, so resuming at a step reproduces the
    exact prompts an uninterrupted run would have seen.

    The base of every sampler (``algorithm.sampler``): a subclass that learns from the rewards sets ``observes``
    and overrides :meth:`observe`, :meth:`state_dict` and :meth:`load_state_dict` (saved in the checkpoint).
    """

    observes: bool = False  # True: the trainer calls observe() after every step and checkpoints state_dict()

    def __init__(
        self, n_rows: int, prompts_per_step: int, world: int, rank: int, seed: int, options: NoOptions | None = None
    ):
        self.n, self.P, self.world, self.rank, self.seed = n_rows, prompts_per_step, world, rank, seed

    def positions(self, step: int) -> list[int]:
        """[P] global positions of this process's prompts at ``step``: the keys of their rollout noise.

        Position ``step·W·P + r·P + i``: the global batch of a step is the same W·P positions at any world size
        (with ``prompts_per_step`` scaled to keep W·P fixed), and process r holds a contiguous slice of it."""
        start = (step * self.world + self.rank) * self.P
        return list(range(start, start + self.P))

    def indices(self, step: int) -> list[int]:
        """[P] dataset rows at this process's :meth:`positions`."""
        out = []
        for pos in self.positions(step):
            epoch, offset = divmod(pos, self.n)
            perm = torch.randperm(self.n, generator=torch.Generator().manual_seed(self.seed * 100003 + epoch))
            out.append(int(perm[offset]))
        return out

    def observe(self, indices: Tensor, rewards: Tensor, diversity: Tensor) -> None:
        """[R] rows, [R, G] combined rewards and [R] trajectory diversity of every process's groups (gathered)."""

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict` (nothing to restore for the sequential order)."""


SAMPLERS.add(SEQUENTIAL, PromptSampler, NoOptions)


@dataclass(frozen=True)
class VarianceOptions:
    """``algorithm.sampler_args`` of ``variance`` (:class:`VarianceSampler`; MMR1, Temporal-RLT)."""

    mode: str = "weight"
    """weight: MMR1's VPS-weighted draws | filter: Temporal-RLT's non-zero-variance rows."""
    alpha: float = 1.0
    """α, the weight of the outcome variance OVS."""
    beta: float = 0.0
    """β, the weight of the trajectory diversity TDS (distinct-3)."""
    mixture_ratio: float = 0.5
    """The share of each step's rows drawn by score (the rest uniformly)."""
    momentum: float = 0.0
    """m: a row's statistics are m·old + (1 − m)·new."""
    floor: float = 0.0
    """Added to every weight."""
    unseen_score: float = 1.0
    """The score of a row not yet observed."""
    min_variance: float = 0.0
    """mode filter: rows whose last variance is at most this are not drawn."""


@SAMPLERS.register("variance", options=VarianceOptions)
class VarianceSampler(PromptSampler):
    """Variance-aware prompt sampling (MMR1 VPS weighting, Temporal-RLT variance filter); see the module docstring.

    Score of row i: s_i = α·OVS_i + β·TDS_i for rows seen before, ``unseen_score`` otherwise; with ``momentum`` m
    a row's OVS/TDS are m·old + (1 − m)·new. ``mode: weight`` draws round(``mixture_ratio``·W·P) rows of a step
    without replacement with probability ∝ ``floor`` + minmax(s)_i, and the others uniformly among the remaining
    rows, interleaved; ``mode: filter`` draws uniformly among the rows whose OVS > ``min_variance`` (and the unseen
    ones). When fewer rows than needed are eligible, the rest are drawn uniformly from the others.
    """

    observes = True

    def __init__(
        self,
        n_rows: int,
        prompts_per_step: int,
        world: int,
        rank: int,
        seed: int,
        options: VarianceOptions = VarianceOptions(),
    ):
        o = options
        if o.mode not in ("weight", "filter"):
            raise ValueError(f"algorithm.sampler_args.mode: {o.mode!r} is not allowed; choose one of: weight, filter")
        if min(o.alpha, o.beta, o.floor, o.unseen_score, o.min_variance) < 0:
            raise ValueError("algorithm.sampler_args: alpha, beta, floor, unseen_score and min_variance must be >= 0")
        if not (0 <= o.mixture_ratio <= 1 and 0 <= o.momentum < 1):
            raise ValueError(
                f"algorithm.sampler_args: mixture_ratio must be in [0, 1] and momentum in [0, 1), got "
                f"{o.mixture_ratio} and {o.momentum}"
            )
        super().__init__(n_rows, prompts_per_step, world, rank, seed)
        self.mode, self.alpha, self.beta, self.floor = o.mode, o.alpha, o.beta, o.floor
        self.mixture_ratio, self.momentum = o.mixture_ratio, o.momentum
        self.unseen_score, self.min_variance = o.unseen_score, o.min_variance
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
            s = self.scores()  # [N]
            return self.floor + (s - s.min()) / (s.max() - s.min() + 1e-8)  # [N] MMR1's min-max normalisation
        seen = ~torch.isnan(self.variance)  # [N]
        keep = ~seen | (self.variance > self.min_variance)  # [N]
        return keep.float()  # [N]

    @staticmethod
    def _draw(w: Tensor, k: int, g: torch.Generator) -> list[int]:
        """k rows without replacement ∝ ``w`` (rows with w = 0 only once the others are used up; repeats if k > N)."""
        out: list[int] = []
        if k <= 0:
            return out
        if int((w > 0).sum()) < min(k, w.numel()):  # too few eligible rows: the others are drawn uniformly after them
            w = torch.where(w > 0, w * 1e6, torch.ones_like(w))  # [N]
        while len(out) < k:
            out += torch.multinomial(w, min(k - len(out), w.numel()), replacement=False, generator=g).tolist()
        return out

    def global_indices(self, step: int) -> list[int]:
        """[W·P] the rows of the whole step (the same on every process), drawn from (seed, step) and the scores."""
        if self._cache is not None and self._cache[0] == step:
            return self._cache[1]
        k = self.world * self.P
        g = torch.Generator().manual_seed(self.seed * 100003 + 7919 * step + 17)
        w = self.weights()  # [N]
        if self.mode == "filter":
            out = self._draw(w, k, g)
        else:
            k_w = round(self.mixture_ratio * k)
            weighted = self._draw(w, k_w, g)
            rest = torch.ones(self.n)  # [N] uniform over the rows the weighted draw left
            if len(set(weighted)) < self.n:
                rest[weighted] = 0.0
            uniform = self._draw(rest, k - k_w, g)
            out = [r for pair in zip(weighted, uniform) for r in pair]  # interleaved, as MixedCurriculumSampler
            out += weighted[len(uniform) :] + uniform[len(weighted) :]
        self._cache = (step, out)
        return out

    def indices(self, step: int) -> list[int]:
        """[P] this process's rows: slice [r·P, (r+1)·P) of :meth:`global_indices`."""
        return self.global_indices(step)[self.rank * self.P : (self.rank + 1) * self.P]

    def observe(self, indices: Tensor, rewards: Tensor, diversity: Tensor) -> None:
        """Record the step's groups: OVS = population variance of each group's valid rewards, TDS = ``diversity``.

        A row seen before is smoothed with ``momentum`` (MMR1 ``curriculum_momentum``); a row that appears twice in
        the step keeps its last group.

        Shape:
            indices: [W·P] rows, rewards: [W·P, G] combined rewards (NaN = not applicable), diversity: [W·P]
        """
        r = rewards.float()  # [W·P, G]
        valid = ~torch.isnan(r)  # [W·P, G]
        count = valid.float().sum(1)  # [W·P]
        rz = torch.where(valid, r, torch.zeros_like(r))  # [W·P, G]
        mean = rz.sum(1) / count.clamp_min(1.0)  # [W·P]
        var = (((rz - mean[:, None]) * valid).square().sum(1)) / count.clamp_min(1.0)  # [W·P]
        idx = indices.long()  # [W·P]
        old_var, old_div = self.variance[idx], self.diversity[idx]  # [W·P]
        seen = ~torch.isnan(old_var)  # [W·P]
        m = self.momentum
        self.variance[idx] = torch.where(seen, m * old_var + (1 - m) * var, var)
        self.diversity[idx] = torch.where(seen, m * old_div + (1 - m) * diversity.float(), diversity.float())
        self._cache = None

    def state_dict(self) -> dict:
        """The statistics as JSON-ready lists (``None`` = not seen), saved in the trainer's checkpoint state."""
        variance = [None if v != v else v for v in self.variance.tolist()]  # NaN → None (strict JSON)
        return {"sampler": "variance", "n_rows": self.n, "variance": variance, "diversity": self.diversity.tolist()}

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict`; refuses statistics of a dataset with another number of rows."""
        if int(state.get("n_rows", -1)) != self.n:
            raise ValueError(
                f"checkpoint sampler state has {state.get('n_rows')} rows, the training data has {self.n}; resume "
                "with the same task data, or start a new run"
            )
        self.variance = torch.tensor([float("nan") if v is None else float(v) for v in state["variance"]])
        self.diversity = torch.tensor([float(v) for v in state["diversity"]])
        self._cache = None


def build_sampler(a, n_rows: int, world: int, rank: int, seed: int) -> PromptSampler:
    """The sampler ``algorithm.sampler`` names (``a``: the algorithm config): the sequential
    :class:`PromptSampler` or a :data:`SAMPLERS` class built with ``algorithm.sampler_args``."""
    options = resolve(SAMPLERS, a.sampler, a.sampler_args, "algorithm.sampler_args")
    return SAMPLERS.get(a.sampler)(n_rows, a.prompts_per_step, world, rank, seed, options)


def distinct_n(outputs: list, group_size: int, n: int = 3) -> Tensor:
    """[P] distinct-n of each group of ``group_size`` consecutive outputs: distinct word n-grams / all word n-grams.

    MMR1's ``calculate_distinct_n`` (``verl/curriculum/metrics.py``) on whitespace-separated words of ``str(output)``
    instead of token ids; a group without any n-gram scores 0, as there.
    """
    out = []
    for start in range(0, len(outputs), group_size):
        grams = []
        for o in outputs[start : start + group_size]:
            words = str(o).split()
            grams += [tuple(words[i : i + n]) for i in range(len(words) - n + 1)]
        out.append(len(set(grams)) / len(grams) if grams else 0.0)
    return torch.tensor(out)
