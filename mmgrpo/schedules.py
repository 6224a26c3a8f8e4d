"""Schedules of the KL coefficient β over training steps: ``BETA_SCHEDULES[name](step, total, beta, **options)``.

One signature, pure Python (no torch state), so the trainer calls it once per step and logs the value (``kl/beta``).
``beta`` is the configured ``algorithm.beta``: the peak (or final) value of every schedule, so ``beta = 0`` loads no
reference model whatever the schedule.

* ``constant`` — β_t = β (GRPO, DeepSeekMath eq. 3).
* ``othink``   — GRPO-D, the dynamic KL of OThink-MR1 (Liu et al. 2025, arXiv 2503.16081 v2, eq. 3), with
  β_mid = (β_min + β_max)/2, w = ``exploration_ratio`` and progress p = t/(S−1) ∈ [0, 1]:
  p ≤ w: β_t = β_mid − (β_mid − β_min)·p/w (falls from β_mid to β_min over the exploration steps);
  p > w: β_t = β_min + (β_max − β_min)·(p − w)/(1 − w) (rises linearly to β_max at the last step).
  β_max is ``algorithm.beta`` (``beta_max`` may repeat it, under the paper's name). Paper defaults: w = 0.3;
  β_min/β_max = 0.04/0.1 (visual counting), 0.0/0.02 (geometry). Note: the paper's prose says β "starts small and
  increases" (ε-greedy: explore early, exploit late); its equation starts at β_mid and dips to β_min first. The
  equation is what is implemented.
* ``linear``   — β_t = β_start + (β − β_start)·t/(S−1) over the S steps (β_start = ``beta_start``, default 0).
* ``cosine``   — β_t = β_start + (β − β_start)·(1 − cos(π·t/(S−1)))/2: the same end points, a cosine ramp.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from mmgrpo.registry import Registry
from mmgrpo.shaping import NoOptions

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


@BETA_SCHEDULES.register("constant", options=NoOptions)
def constant(step: int, total_steps: int, beta: float) -> float:
    """β_t = β."""
    _check(beta)
    return float(beta)


@dataclass(frozen=True)
class OThinkOptions:
    """``algorithm.beta_schedule_args`` of ``othink`` (:func:`othink`; arXiv 2503.16081 eq. 3)."""

    beta_min: float = 0.0
    """β_min, the low point after the exploration steps."""
    beta_max: float | None = None
    """β_max; None = ``algorithm.beta``, which it must equal when given."""
    exploration_ratio: float = 0.3
    """w: the share of the steps over which β falls from β_mid to β_min."""


@BETA_SCHEDULES.register("othink", options=OThinkOptions)
def othink(
    step: int,
    total_steps: int,
    beta: float,
    *,
    beta_min: float = 0.0,
    beta_max: float | None = None,
    exploration_ratio: float = 0.3,
) -> float:
    """GRPO-D (OThink-MR1, arXiv 2503.16081 eq. 3): β_mid → β_min over the first ``exploration_ratio`` of the steps,
    then linearly β_min → β_max at the last step (module docstring). ``beta_max`` None = ``beta``
    (``algorithm.beta``); given, it must equal ``beta``, which is the peak that decides whether a reference model
    is loaded at all."""
    if beta_max is None:
        beta_max = beta
    elif beta_max != beta:
        raise ValueError(
            f"beta_max = {beta_max} differs from algorithm.beta = {beta}: algorithm.beta is the schedule's peak "
            "(β_max); set algorithm.beta to it and drop beta_max, or make them equal"
        )
    _check(beta, beta_min=beta_min)
    if beta_min > beta_max:
        raise ValueError(f"beta_min = {beta_min} must be <= beta_max = algorithm.beta = {beta_max}")
    if not 0 <= exploration_ratio < 1:
        raise ValueError(f"exploration_ratio must be in [0, 1), got {exploration_ratio}")
    p, w = _progress(step, total_steps), exploration_ratio
    beta_mid = 0.5 * (beta_min + beta_max)
    if p <= w and w > 0:
        return float(beta_mid - (beta_mid - beta_min) * p / w)
    return float(beta_min + (beta_max - beta_min) * (p - w) / (1 - w))


@dataclass(frozen=True)
class RampOptions:
    """``algorithm.beta_schedule_args`` of ``linear`` and ``cosine``."""

    beta_start: float = 0.0
    """β at the first step (the ramp ends at ``algorithm.beta``)."""


@BETA_SCHEDULES.register("linear", options=RampOptions)
def linear(step: int, total_steps: int, beta: float, *, beta_start: float = 0.0) -> float:
    """β_t = β_start + (β − β_start)·t/(S−1)."""
    _check(beta, beta_start=beta_start)
    return float(beta_start + (beta - beta_start) * _progress(step, total_steps))


@BETA_SCHEDULES.register("cosine", options=RampOptions)
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
