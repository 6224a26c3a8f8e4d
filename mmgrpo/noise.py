"""Rollout noise keyed by (seed, step, global prompt position, sample index): the same draws at any world size.

With per-process RNG streams (``set_seed(seed, device_specific=True)``), sample b of a step depends on which
process drew it and how many rows that process drew before it, so 1 process × P prompts and 2 processes × P/2
prompts sample different rollouts from the same weights. Here every sample owns its noise: a ``torch.Generator``
seeded by a hash of (seed, step, global prompt position, sample index), from which an adapter draws everything
the sample needs (a uniform per token, an initial latent and the SDE noise of every step). The position is the
prompt's index in the step's global batch of W·P prompts (``sampling.PromptSampler``), so a sample's draws are
those it gets at any world size, with any split of the global batch over processes.

Token sampling with one uniform per row and step is inverse-CDF sampling (:func:`draw_by_inversion`): token
``searchsorted(cumsum(p), u · Σp)``, an exact draw from the categorical ``p`` (Devroye 1986, *Non-Uniform Random
Variate Generation*, §III.2.1, the inversion method). It does not reproduce ``torch.multinomial``'s draws, so the
trainer's ``rollout_noise: per_process`` keeps the HF-``generate``-equivalent stream.

The keys are an explicit argument: ``PolicyAdapter.rollout(prompts, G, keys)``; with ``keys=None`` (direct calls,
evaluation) an adapter uses its own RNG. The token families hand them to the one decode loop
(:func:`mmgrpo.modalities.tokens.decode.decode`), which checks them against the rows it samples.

Shape glossary: ``P`` prompts, ``G`` group size, ``B = P·G`` (group-major), ``T`` units, ``V`` vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

_MASK64 = (1 << 64) - 1
SHARED = -1  # sample index of a prompt's group-shared draws (e.g. one initial latent for the whole group)


def mix(*values: int) -> int:
    """A 63-bit hash of integers: splitmix64 (Steele, Lea & Flood 2014, "Fast splittable pseudorandom number
    generators", OOPSLA; the finaliser of ``java.util.SplittableRandom``) folded over ``values``."""
    h = 0x9E3779B97F4A7C15
    for v in values:
        h = (h ^ (int(v) & _MASK64)) & _MASK64
        h = (h + 0x9E3779B97F4A7C15) & _MASK64
        h = ((h ^ (h >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
        h = ((h ^ (h >> 27)) * 0x94D049BB133111EB) & _MASK64
        h ^= h >> 31
    return h >> 1  # torch.Generator.manual_seed takes up to 2^63 - 1 here without wrapping


@dataclass(frozen=True)
class NoiseKeys:
    """The keys of one rollout call: P prompts at global positions ``positions``, G samples each.

    Shape:
        positions: [P] global prompt positions of the step (``PromptSampler.positions``)
        rows (property): B = P·G, group-major (sample b is sample b % G of prompt b // G)
    """

    seed: int
    step: int
    positions: tuple[int, ...]  # [P]
    group_size: int

    @property
    def rows(self) -> int:
        return len(self.positions) * self.group_size

    def row_seeds(self) -> list[int]:
        """[B] generator seeds, group-major."""
        return [mix(self.seed, self.step, p, g) for p in self.positions for g in range(self.group_size)]

    def prompt_seeds(self) -> list[int]:
        """[P] seeds of the group-shared draws of each prompt (sample index :data:`SHARED`)."""
        return [mix(self.seed, self.step, p, SHARED) for p in self.positions]

    def generators(self, shared: bool = False) -> list[torch.Generator]:
        """One CPU generator per sample ([B]), or per prompt ([P]) with ``shared``."""
        seeds = self.prompt_seeds() if shared else self.row_seeds()
        return [torch.Generator().manual_seed(s) for s in seeds]

    def check(self, rows: int, what: str) -> None:
        """Raise when a rollout draws for a different number of rows than the keys describe."""
        if rows != self.rows:
            raise ValueError(
                f"{what}: keyed rollout noise covers {len(self.positions)} prompts × {self.group_size} samples = "
                f"{self.rows} rows, but {rows} rows are being sampled; call the adapter with the prompts the keys "
                "were made for, or set rollout_noise: per_process"
            )


def uniforms(generators: list[torch.Generator], n: int, device: torch.device | str | None = None) -> Tensor:
    """n uniforms in [0, 1) per generator, float64, moved to ``device`` once (kept on the CPU for MPS, which has
    no float64). Shape: [B] generators → [B, n]."""
    u = torch.stack([torch.rand(n, generator=g, dtype=torch.float64) for g in generators])  # [B, n]
    return u if device is None or torch.device(device).type == "mps" else u.to(device)


def normals(generators: list[torch.Generator], shape: tuple[int, ...]) -> Tensor:
    """Standard normal draws of ``shape`` per generator, float32. Shape: [B] generators → [B, *shape]."""
    return torch.stack([torch.randn(shape, generator=g) for g in generators])


def draw_by_inversion(weights: Tensor, u: Tensor, block: int = 1024) -> tuple[Tensor, Tensor]:
    """Index i of each row with probability ``weights[i] / weights.sum()``, chosen by the uniform ``u`` of the row.

    Index i is chosen iff cdf[i-1] ≤ u·Σw < cdf[i], an interval of length w[i]·(1 + O(ε)) for u ~ U[0, 1)
    (Devroye 1986, §III.2.1). In two levels, so no fp64 cumulative sum runs over all V columns (on one CPU thread
    that costs ~3 ms per 10⁶ values, more than the exp of the softmax): the row is cut into blocks of ``block``
    columns, a block is chosen from the fp64 cumulative sum of the block sums, then a column inside it from the fp64
    cumulative sum of that block alone. A column of weight 0 is never chosen (a product that rounds past the last
    positive column is sent back to it).

    A row holding NaN or inf (the logits of a policy whose weights diverged) gets an arbitrary index in [0, V) and a
    non-finite row sum instead of an out-of-range index: no host sync here; the non-finite log-probs that follow
    are caught by the trainer's gradient guard, which names the cause (``Trainer._optimizer_step``).

    Shape:
        weights: [B, V] non-negative, every row with a positive sum; u: [B] in [0, 1)
        returns index [B] long, row sum [B] fp64
    """
    device = weights.device
    if device.type == "mps":  # no float64 there: the draw runs on the CPU
        weights = weights.cpu()
    B, V = weights.shape
    full = V // block
    # block sums in the weights' dtype (an fp64 reduction would first copy all [B, V] weights to fp64)
    sums = weights[:, : full * block].reshape(B, full, block).sum(dim=-1)  # [B, full]
    if full * block < V:  # the ragged last block, summed apart (no padded copy of the [B, V] weights)
        sums = torch.cat([sums, weights[:, full * block :].sum(dim=-1, keepdim=True)], dim=1)
    sums = sums.double()  # [B, nb]
    cdf = sums.cumsum(dim=-1)  # [B, nb]
    total = cdf[:, -1]  # [B]
    x = u.double().to(cdf.device).reshape(B, 1) * total[:, None]  # [B, 1] in [0, total)
    nb = cdf.shape[1]
    last = torch.searchsorted(cdf, cdf[:, -1:].contiguous()).clamp_(max=nb - 1)  # [B, 1] last block of positive weight
    chosen = torch.minimum(torch.searchsorted(cdf, x, right=True), last)  # [B, 1]
    rest = (x - (cdf.gather(1, chosen) - sums.gather(1, chosen))).clamp_(min=0)  # [B, 1] mass left in the block
    columns = chosen * block + torch.arange(block, device=weights.device)  # [B, block]
    inside = weights.gather(1, columns.clamp(max=V - 1)).masked_fill_(columns >= V, 0.0)  # [B, block]
    inner = inside.cumsum(dim=-1, dtype=torch.float64)  # [B, block]
    last_column = torch.searchsorted(inner, inner[:, -1:].contiguous()).clamp_(max=block - 1)  # [B, 1] caps rounding
    column = torch.minimum(torch.searchsorted(inner, rest, right=True), last_column)  # [B, 1]
    index = (chosen * block + column).clamp_(max=V - 1)  # [B, 1] (a no-op unless the row is not finite)
    return index.squeeze(1).to(device), total.to(device)
