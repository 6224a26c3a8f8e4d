"""Step selectors: which denoising transitions of a rollout are stochastic (SDE) and which are trained.

Every GRPO variant for flow/diffusion models differs in this rule only (Flow-GRPO's timestep fraction, DanceGRPO's
random subset, MixGRPO's window, TempFlow-GRPO's branching, GCPO's chunks), so it is one
registry with one signature::

    selector(num_steps: int, batch_size: int, group_size: int, *, generator, iteration, **params) -> StepPlan

Each rule below is written over a :class:`StepGrid` (those five arguments) and registered under that signature
by ``_selector``.

- ``fraction``       Flow-GRPO (Liu et al. 2025, arXiv 2505.05470, §5.1; yifan123/flow_grpo ``scripts/train_sd3.py``,
                     ``timestep_fraction``): every step is SDE; the first ⌊f·T⌋ steps are trained (f = 0.99 trains
                     9 of 10: the last, near-clean step is skipped).
- ``random_subset``  DanceGRPO (Xue et al. 2025, arXiv 2505.07818; XueZeyue/DanceGRPO ``fastvideo/train_grpo_flux.py``)
                     and DDPO: every step is SDE; each sample trains its own random ⌊f·T'⌋ steps (T' = T − 1 with
                     ``exclude_last``).
- ``sde_window``     Flow-GRPO-Fast (yifan123/flow_grpo ``scripts/train_sd3_fast.py``): one window [s, s+w) per
                     rollout, s ~ U{lo, …, hi − w}; SDE and trained inside, ODE outside. ``window=0`` is plain
                     Flow-GRPO on [0, T−1).
- ``sliding_window`` MixGRPO (Li et al. 2025, arXiv 2507.21802, §3.2; Tencent-Hunyuan/MixGRPO
                     ``fastvideo/utils/grpo_states.py``): the window start moves by ``stride`` every ``every``
                     iterations (``progressive``, optionally rolling back to 0) or is drawn uniformly each iteration
                     (``random``).
- ``branching``      TempFlow-GRPO trajectory branching (He et al. 2025, arXiv 2508.04324, §3.1; the authors' reply in
                     Shredded-Pork/TempFlow-GRPO issue #3): all G samples of a group share the initial noise and the
                     ODE prefix up to a branch step k; only the transition at k is stochastic and trained, so the
                     group advantage is exactly the advantage of the children that share (seed, k). **Departure:**
                     TempFlow branches every k for N seeds per prompt; we draw one k per group per rollout (uniform
                     over [lo, hi)), so a prompt's steps are covered across iterations instead of within one.
- ``chunks``         Chunk-GRPO (Luo et al. 2025, arXiv 2510.21583, §3.3; xingzhejun/GCPO
                     ``fastvideo/utils/chunk.py``): every step is SDE; after the rollout, each sample trains ⌊f·M⌋ of
                     its M chunks, drawn without replacement uniformly or with probability ∝ the chunk's mean
                     relative latent change ‖x_{t+1} − x_t‖₁/‖x_t‖₁.

The adapter additionally masks out transitions whose kernel is deterministic (std 0: CPS and DDIM last steps).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from mmgrpo.registry import Registry

STEP_SELECTORS: Registry = Registry("step selector")


@dataclass
class StepPlan:
    """Which transitions of a rollout are stochastic and trained.

    Shape:
        sde: [B, T] bool, transition uses the stochastic kernel (else the ODE step)
        train: [B, T] bool, transition is trained (a subset of ``sde``)
    ``shared_noise``: the G samples of a group start from the same initial noise.
    ``post``: optional rule that replaces ``train`` once the latents are known,
    ``post(latents [B, T+1, *D], generator) -> train [B, T]`` (chunk sampling).
    """

    sde: Tensor
    train: Tensor
    shared_noise: bool = False
    post: Callable[[Tensor, torch.Generator | None], Tensor] | None = None


@dataclass(frozen=True)
class StepGrid:
    """What every selector is given: ``num_steps`` transitions (T) of ``batch_size`` samples (B = P·G, group-major,
    ``group_size`` G), the generator of the rollout's draws and the training iteration."""

    num_steps: int
    batch_size: int
    group_size: int
    generator: torch.Generator | None = None
    iteration: int = 0

    def full(self, value: bool = True) -> Tensor:
        """Every transition of every sample set to ``value``. Shape: [B, T] bool."""
        return torch.full((self.batch_size, self.num_steps), value, dtype=torch.bool)

    def window(self, start: int, window: int) -> StepPlan:
        """The transitions [start, start + window) of every sample SDE and trained, the others ODE."""
        sde = self.full(False)  # [B, T]
        sde[:, start : start + window] = True
        return StepPlan(sde=sde, train=sde.clone())

    def randint(self, low: int, high: int) -> int:
        """Uniform integer in [low, high] (inclusive), drawn from the generator."""
        return int(torch.randint(low, high + 1, (1,), generator=self.generator).item())


def _selector(name: str) -> Callable[[Callable[..., StepPlan]], Callable[..., StepPlan]]:
    """Register ``rule(grid: StepGrid, **params) -> StepPlan`` as step selector ``name``, called with the registry's
    one signature ``selector(num_steps, batch_size, group_size, *, generator=None, iteration=0, **params)``."""

    def register(rule: Callable[..., StepPlan]) -> Callable[..., StepPlan]:
        @functools.wraps(rule)
        def selector(
            num_steps: int, batch_size: int, group_size: int, *, generator=None, iteration: int = 0, **params
        ) -> StepPlan:
            return rule(StepGrid(num_steps, batch_size, group_size, generator, iteration), **params)

        STEP_SELECTORS.add(name, selector)
        return selector

    return register


@_selector("fraction")
def fraction(grid: StepGrid, fraction: float = 0.99) -> StepPlan:
    """All steps SDE; the first ⌊fraction·T⌋ trained (Flow-GRPO ``timestep_fraction``, default 0.99)."""
    if not 0 < fraction <= 1:
        raise ValueError(f"steps.fraction must be in (0, 1], got {fraction}")
    train = grid.full(False)  # [B, T]
    train[:, : max(1, int(grid.num_steps * fraction))] = True
    return StepPlan(sde=grid.full(), train=train)


@_selector("random_subset")
def random_subset(grid: StepGrid, fraction: float = 0.6, exclude_last: bool = True) -> StepPlan:
    """All steps SDE; each sample trains a random ⌊fraction·T'⌋ of its steps (DanceGRPO 0.6, last excluded)."""
    usable = grid.num_steps - 1 if exclude_last else grid.num_steps
    k = max(1, int(usable * fraction))
    order = torch.rand(grid.batch_size, usable, generator=grid.generator).argsort(dim=1)[:, :k]  # [B, k]
    train = grid.full(False)  # [B, T]
    train.scatter_(1, order, True)
    return StepPlan(sde=grid.full(), train=train)


@_selector("sde_window")
def sde_window(grid: StepGrid, window: int = 3, low: int = 0, high: int | None = None) -> StepPlan:
    """Flow-GRPO-Fast: one SDE+trained window [s, s+window), s ~ U{low, …, high − window}; high = T//2 by default."""
    T = grid.num_steps
    if window == 0:
        return grid.window(0, T - 1)
    high = T // 2 if high is None else high
    if not 0 <= low <= high - window or high > T:
        raise ValueError(
            f"steps: sde_window needs 0 <= low <= high - window and high <= T={T}; "
            f"got low={low}, high={high}, window={window}"
        )
    return grid.window(grid.randint(low, high - window), window)


@_selector("sliding_window")
def sliding_window(
    grid: StepGrid,
    window: int = 4,
    stride: int = 1,
    every: int = 25,
    strategy: str = "progressive",
    roll_back: bool = True,
    max_steps: int | None = None,
) -> StepPlan:
    """MixGRPO window [c, c+window) with c = (iteration // every)·stride (``progressive``) or c ~ U (``random``).

    The window lives inside the first ``max_steps`` = T − 1 steps by default (MixGRPO clips at S − 2, i.e. the
    last transition is never stochastic); past the end it rolls back to 0 (``roll_back``) or stays at the end.
    """
    max_steps = grid.num_steps - 1 if max_steps is None else max_steps
    window = min(window, max_steps)
    last_start = max_steps - window
    if strategy == "random":
        start = grid.randint(0, last_start)
    elif strategy == "progressive":
        start = (grid.iteration // max(every, 1)) * stride
        if start > last_start:
            start = start % (last_start + 1) if roll_back else last_start
    else:
        raise ValueError(f"steps.strategy must be progressive | random, got {strategy!r}")
    return grid.window(start, window)


@_selector("branching")
def branching(grid: StepGrid, low: int = 0, high: int | None = None) -> StepPlan:
    """TempFlow-GRPO branching: per group one branch step k ~ U{low, …, high − 1}; only k is SDE and trained.

    ``high`` defaults to T − 1 (the last, near-clean step is not a branch point). Shared initial noise.
    """
    T, G = grid.num_steps, grid.group_size
    high = T - 1 if high is None else high
    if not 0 <= low < high <= T:
        raise ValueError(f"steps: branching needs 0 <= low < high <= T={T}, got low={low}, high={high}")
    k = torch.randint(low, high, (grid.batch_size // G,), generator=grid.generator).repeat_interleave(G)  # [B]
    sde = torch.nn.functional.one_hot(k, T).bool()  # [B, T]
    return StepPlan(sde=sde, train=sde.clone(), shared_noise=True)


def chunk_ids(chunk_sizes: list[int], num_steps: int) -> Tensor:
    """Chunk index of every step, e.g. [2, 3] -> [0, 0, 1, 1, 1]. Shape: [T]."""
    if sum(chunk_sizes) != num_steps or min(chunk_sizes) < 1:
        raise ValueError(f"chunk_sizes {chunk_sizes} must be positive and sum to the number of steps T={num_steps}")
    return torch.repeat_interleave(torch.arange(len(chunk_sizes)), torch.tensor(chunk_sizes))


def relative_latent_change(latents: Tensor) -> Tensor:
    """GCPO's temporal-dynamics profile ‖x_{t+1} − x_t‖₁ / ‖x_t‖₁ per sample and step.

    Shape:
        latents: [B, T+1, *D] -> [B, T]
    """
    x = latents.float().flatten(2)  # [B, T+1, D]
    return (x[:, 1:] - x[:, :-1]).abs().sum(-1) / x[:, :-1].abs().sum(-1).clamp_min(1e-12)


def sample_chunks(
    latents: Tensor,
    chunk_sizes: list[int],
    fraction: float,
    weighting: str = "uniform",
    probs: str = "normalized",
    exclude_last: bool = True,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Chunk-GRPO chunk subsampling: per sample, ⌊fraction·M⌋ of the M chunks, drawn without replacement.

    ``weighting="latent_change"`` draws chunk c with p_c ∝ w_c (``probs="normalized"``) or softmax(w)
    (``"softmax"``), w_c = mean over the chunk's steps of :func:`relative_latent_change` (GCPO
    ``--sample_weight``); ``"uniform"`` is a random permutation. ``exclude_last`` drops the last step from training.

    Shape:
        latents: [B, T+1, *D] -> train mask [B, T] bool
    """
    B, T = latents.shape[0], latents.shape[1] - 1
    ids = chunk_ids(chunk_sizes, T)  # [T]
    M = len(chunk_sizes)
    k = max(1, math.floor(fraction * M))
    if weighting == "uniform":
        w = torch.ones(B, M)
    elif weighting == "latent_change":
        change = relative_latent_change(latents).cpu()  # [B, T]
        w = torch.zeros(B, M).index_add_(1, ids, change) / torch.bincount(ids, minlength=M).float()  # [B, M]
    else:
        raise ValueError(f"steps.weighting must be uniform | latent_change, got {weighting!r}")
    p = torch.softmax(w, dim=1) if probs == "softmax" else w / w.sum(1, keepdim=True).clamp_min(1e-12)  # [B, M]
    chosen = torch.multinomial(p, k, replacement=False, generator=generator)  # [B, k]
    chunk_on = torch.zeros(B, M, dtype=torch.bool).scatter_(1, chosen, True)  # [B, M]
    train = chunk_on[:, ids]  # [B, T]
    if exclude_last:
        train[:, -1] = False
    return train


@_selector("chunks")
def chunks(
    grid: StepGrid,
    chunk_sizes: list[int] | None = None,
    fraction: float = 1.0,
    weighting: str = "uniform",
    probs: str = "normalized",
    exclude_last: bool = True,
) -> StepPlan:
    """All steps SDE; after the rollout each sample trains ⌊fraction·M⌋ chunks (see :func:`sample_chunks`).

    ``chunk_sizes`` must equal ``algorithm.chunk_sizes`` (the chunk ratio); GCPO trains 50% of the chunks.
    """
    sizes = chunk_sizes or [grid.num_steps]
    chunk_ids(sizes, grid.num_steps)  # validate early
    train = grid.full()  # [B, T]
    if exclude_last:
        train[:, -1] = False

    def post(latents: Tensor, gen: torch.Generator | None) -> Tensor:
        return sample_chunks(latents, sizes, fraction, weighting, probs, exclude_last, gen)

    return StepPlan(sde=grid.full(), train=train, post=None if fraction >= 1 else post)


__all__ = [
    "STEP_SELECTORS",
    "StepGrid",
    "StepPlan",
    "branching",
    "chunk_ids",
    "chunks",
    "fraction",
    "random_subset",
    "relative_latent_change",
    "sample_chunks",
    "sde_window",
    "sliding_window",
]
