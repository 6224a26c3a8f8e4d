"""Schedules of the KL coefficient β over training steps: ``BETA_SCHEDULES[name](step, total, beta, **options)``.

One signature, pure Python (no torch state), so the trainer calls it once per step and logs the value (``kl/beta``).
``beta`` is the configured ``algorithm.beta``: the peak (or final) value of every schedule, so ``beta = 0`` loads no
reference model whatever the schedule.

* ``constant`` — β_t = β (GRPO, DeepSeekMath eq. 3).
* ``othink``   — GRPO-D, the dynamic KL of OThink-MR1 (Liu et al. 2025, arXiv 2503.16081, "GRPO-D"): the KL weight
  starts small so that early training explores and grows so that late training exploits ("inspired by the
  ε-greedy strategy"). Implemented as a linear rise from ``beta_min`` to β over the first ``warmup_ratio`` of the
  steps, then constant β. Departure: the paper's exact piecewise equation could not be retrieved here; this is our
  reading of its description, and ``beta_min``/``warmup_ratio`` are options, not the paper's values.
* ``linear``   — β_t = β_start + (β − β_start)·t/(S−1) over the S steps (β_start = ``beta_start``, default 0).
* ``cosine``   — β_t = β_start + (β − β_start)·(1 − cos(π·t/(S−1)))/2: the same end points, a cosine ramp.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from mmgrpo.registry import Registry

BETA_SCHEDULES: Registry[Callable[..., float]] = Registry("beta schedule")
"""``fn(step, total_steps, beta, **options) -> float``: β at ``step`` (0-based) of ``total_steps``."""


def _progress(step: int, total_steps: int) -> float:
    """t / (S − 1) clamped to [0, 1]: 0 at the first step, 1 at the last (1 for a one-step run)."""
    if total_steps <= 1:
        return 1.0
    return min(1.0, max(0.0, step / (total_steps - 1)))


def _check(beta: float, **bounds: float) -> None:
    for name, value in {"beta": beta, **bounds}.items():
        if value < 0:
            raise ValueError(f"beta schedule: {name} must be >= 0, got {value}")


@BETA_SCHEDULES.register("constant")
def constant(step: int, total_steps: int, beta: float) -> float:
    """β_t = β."""
    _check(beta)
    return float(beta)


@BETA_SCHEDULES.register("othink")
def othink(step: int, total_steps: int, beta: float, *, beta_min: float = 0.0, warmup_ratio: float = 0.5) -> float:
    """GRPO-D (OThink-MR1): β_t = β_min + (β − β_min)·min(1, t / (w·S)), w = ``warmup_ratio`` ∈ (0, 1]."""
    _check(beta, beta_min=beta_min)
    if not 0 < warmup_ratio <= 1:
        raise ValueError(f"beta schedule othink: warmup_ratio must be in (0, 1], got {warmup_ratio}")
    frac = min(1.0, step / max(1e-12, warmup_ratio * total_steps))
    return float(beta_min + (beta - beta_min) * frac)


@BETA_SCHEDULES.register("linear")
def linear(step: int, total_steps: int, beta: float, *, beta_start: float = 0.0) -> float:
    """β_t = β_start + (β − β_start)·t/(S−1)."""
    _check(beta, beta_start=beta_start)
    return float(beta_start + (beta - beta_start) * _progress(step, total_steps))


@BETA_SCHEDULES.register("cosine")
def cosine(step: int, total_steps: int, beta: float, *, beta_start: float = 0.0) -> float:
    """β_t = β_start + (β − β_start)·(1 − cos(π·t/(S−1)))/2."""
    _check(beta, beta_start=beta_start)
    p = _progress(step, total_steps)
    return float(beta_start + (beta - beta_start) * 0.5 * (1.0 - math.cos(math.pi * p)))


def beta_at(name: str, step: int, total_steps: int, beta: float, options: dict | None = None) -> float:
    """β of schedule ``name`` at ``step``; ``options`` are the schedule's keyword options (config-checked)."""
    return BETA_SCHEDULES.get(name)(step, total_steps, beta, **(options or {}))


def lr_lambda(step: int, warmup: int, total: int, schedule: str) -> float:
    """Learning-rate multiplier: linear warm-up over ``warmup`` steps, then constant / cosine / linear decay."""
    if warmup > 0 and step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    if schedule == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * progress))
    if schedule == "linear":
        return 1.0 - progress
    return 1.0
