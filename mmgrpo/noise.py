"""Rollout noise keyed by (seed, step, global prompt position, sample index): the same draws at any world size.

With per-process RNG streams (``set_seed(seed, device_specific=True)``), sample b of a step depends on which
process drew it and how many rows that process drew before it, so 1 process × P prompts and 2 processes × P/2
prompts sample different rollouts from the same weights. Here every sample owns its noise: a ``torch.Generator``
seeded by a hash of (seed, step, global prompt position, sample index), from which an adapter draws everything
the sample needs (a uniform per token, an initial latent and the SDE noise of every step). The position is the
prompt's index in the step's global batch of W·P prompts (``trainer.PromptSampler``), so a sample's draws are
those it gets at any world size, with any split of the global batch over processes.

Token sampling with one uniform per row and step is inverse-CDF sampling (:func:`inverse_cdf`): token
``searchsorted(cumsum(p), u · Σp)``, an exact draw from the categorical ``p`` (Devroye 1986, *Non-Uniform Random
Variate Generation*, §III.2.1, the inversion method). It does not reproduce ``torch.multinomial``'s draws, so the
trainer's ``rollout_noise: per_process`` keeps the HF-``generate``-equivalent stream.

The keys travel from the trainer to the adapter through :func:`keyed` (a context variable) so that
``PolicyAdapter.rollout(prompts, G)`` keeps its signature; an adapter reads :func:`current` and falls back to
its own RNG when it is ``None`` (direct calls, evaluation, adapters that do not key their noise).

Shape glossary: ``P`` prompts, ``G`` group size, ``B = P·G`` (group-major), ``T`` units, ``V`` vocabulary.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager
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
                "were made for (mmgrpo.noise.keyed), or set rollout_noise: per_process"
            )


_CURRENT: contextvars.ContextVar[NoiseKeys | None] = contextvars.ContextVar("mmgrpo_noise_keys", default=None)


@contextmanager
def keyed(keys: NoiseKeys | None) -> Iterator[None]:
    """Within the block, :func:`current` returns ``keys`` (``None``: adapters use their own RNG)."""
    token = _CURRENT.set(keys)
    try:
        yield
    finally:
        _CURRENT.reset(token)


def current() -> NoiseKeys | None:
    """The keys of the rollout being sampled, or ``None`` outside :func:`keyed`."""
    return _CURRENT.get()


def uniforms(generators: list[torch.Generator], n: int, device: torch.device | str | None = None) -> Tensor:
    """n uniforms in [0, 1) per generator, float64, moved to ``device`` once (kept on the CPU for MPS, which has
    no float64). Shape: [B] generators → [B, n]."""
    u = torch.stack([torch.rand(n, generator=g, dtype=torch.float64) for g in generators])  # [B, n]
    return u if device is None or torch.device(device).type == "mps" else u.to(device)


def normals(generators: list[torch.Generator], shape: tuple[int, ...]) -> Tensor:
    """Standard normal draws of ``shape`` per generator, float32. Shape: [B] generators → [B, *shape]."""
    return torch.stack([torch.randn(shape, generator=g) for g in generators])


def inverse_cdf(probs: Tensor, u: Tensor) -> Tensor:
    """Exact categorical draws by inversion: the first token whose cumulative probability exceeds u·Σp.

    Token i is chosen iff cdf[i-1] ≤ u·Σp < cdf[i], an interval of length p[i]·(1 + O(ε)) for u ~ U[0, 1);
    the cumulative sum is in float64, and a token of probability 0 is never chosen (its interval is empty;
    a product that rounds up to Σp is sent to the last token of positive probability).

    Shape:
        probs: [n, V] non-negative (need not sum to 1), u: [n] in [0, 1) → [n] long
    """
    device = probs.device
    if device.type == "mps":  # no float64 there: the (small) cumulative sums run on the CPU
        probs = probs.cpu()
    cdf = probs.double().cumsum(dim=-1)  # [n, V]
    target = (u.double().to(cdf.device) * cdf[:, -1]).unsqueeze(1)  # [n, 1]
    token = torch.searchsorted(cdf, target, right=True).squeeze(1)  # [n]
    V = probs.shape[-1]
    last = V - 1 - (probs > 0).flip(-1).int().argmax(dim=-1)  # [n] last token of positive probability
    return torch.minimum(token, last).to(device)
