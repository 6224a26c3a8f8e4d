"""A step's metrics: the completion statistics of one process and their reduction over processes.

Every process computes its metrics on its own P groups; :func:`reduce_metrics` turns them into one set for the
whole step, the same on every process (means, except the counts in :data:`SUMMED_METRICS`, the maxima and wall
times, and the reward statistics, recomputed from every process's rewards).
"""

from __future__ import annotations

import logging
import math

import torch
from accelerate import Accelerator
from accelerate.utils import gather_object
from torch import Tensor

from mmgrpo import advantages as adv_lib
from mmgrpo.multiturn import turn_metrics

logger = logging.getLogger(__name__)

SUMMED_METRICS = {"reward/errors", "data/skipped_rows"}
"""Metrics that are counts: summed over processes (every other one is a mean, see :func:`reduce_metrics`).

``optim/skipped_steps`` is not one: every process takes the same skip decision (the norm is taken after the
gradient all-reduce), so its count is the same everywhere and is added after the reduction."""


def completion_summary(rollout, mask: Tensor) -> dict[str, float]:
    """completion/* statistics (reward/* come from ``compute_advantages``)."""
    lengths = rollout.mask.sum(dim=1)  # [B]
    return {
        "completion/units_mean": float(lengths.mean()),
        "completion/truncated_fraction": float(rollout.truncated.float().mean()),
        "completion/trained_fraction": float((mask.sum(1) > 0).float().mean()),
        **turn_metrics(rollout),  # turns/*, tools/* of multi-turn rollouts
    }


def reduce_metrics(
    acc: Accelerator, metrics: dict[str, float], rewards: Tensor, weights: Tensor, names: list[str], std_unbiased: bool
) -> dict[str, float]:
    """Every process's metrics → one set for the whole step (identical on all processes).

    Each process holds the same number of samples (P·G) and, after ``_update``'s weighting, loss terms
    that sum to the whole-update value over processes, so a plain mean over processes is the mean over
    all samples. Exceptions: counts (``reward/errors``) are summed, wall times (``perf/*``) and maxima
    (``*_max``) take the largest process value, and the reward statistics whose weights differ per
    process (``reward/mean``, ``reward/std``, ``reward/<name>`` over applicable samples) are recomputed
    from all processes' rewards.
    """
    per_process = gather_object([metrics])  # W dicts
    out: dict[str, float] = {}
    for key in metrics:
        values = [m[key] for m in per_process if key in m]
        if key in SUMMED_METRICS:
            out[key] = float(sum(values))
        elif key.startswith("perf/") or key.endswith("_max"):
            out[key] = float(max(values))
        else:
            finite = [v for v in values if not math.isnan(v)]  # a reward not applicable on one process
            out[key] = float(sum(finite) / len(finite)) if finite else math.nan
    everything = acc.gather(rewards.to(acc.device)[None]).cpu()  # [W, P, G, K]
    everything = everything.flatten(0, 1)  # [W·P, G, K]
    combined = adv_lib.combine_rewards(everything, weights).flatten()  # [W·P·G]
    valid = combined[~torch.isnan(combined)]  # [n]
    if valid.numel() > 0:
        out["reward/mean"] = float(valid.mean())
        out["reward/std"] = float(valid.std(unbiased=std_unbiased)) if valid.numel() > 1 else 0.0
    for k, name in enumerate(names):
        col = everything[..., k].flatten()  # [W·P·G]
        ok = ~torch.isnan(col)
        if f"reward/{name}" in out:
            out[f"reward/{name}"] = float(col[ok].mean()) if bool(ok.any()) else math.nan
    return out


def no_signal_causes(metrics: dict[str, float]) -> list[str]:
    """Why a step cannot learn, read from its (reduced) metrics; empty when it can."""
    causes = []
    if metrics.get("advantage/zero_std_fraction", 0.0) >= 1.0:
        causes.append("every group has zero reward variance (all advantages 0)")
    if metrics.get("completion/trained_fraction", 1.0) == 0.0:
        causes.append("every sample is masked out")
    if metrics.get("completion/truncated_fraction", 0.0) >= 1.0:
        causes.append("every completion was truncated (raise the adapter's length limit)")
    return causes


def warn_if_no_signal(metrics: dict[str, float], step: int, summary: dict, warned: set[str], main: bool) -> None:
    """Warn (first time per cause, on the main process; all counted in summary ``train/no_signal_steps``) when a
    step cannot learn; ``warned`` holds the causes already warned about."""
    causes = no_signal_causes(metrics)
    if not causes:
        return
    summary["train/no_signal_steps"] = summary.get("train/no_signal_steps", 0) + 1
    new = [c for c in causes if c not in warned]
    if new and main:
        logger.warning(
            "step %d has no learning signal: %s (later steps like this are only counted in "
            "summary.json train/no_signal_steps)",
            step,
            "; ".join(new),
        )
    warned.update(new)
