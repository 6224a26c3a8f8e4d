"""Importance-sampling correction of the engine/trainer mismatch (rollouts sampled by an inference engine).

When the G samples come from an inference engine (vLLM) rather than from the trained model itself, the engine's
sampling distribution π_engine differs from the trainer's π_old by kernels, precision and batching, even with the
same weights. The surrogate's ratio is taken against π_old (recomputed by the trainer's own model, as TRL does), so
each unit's loss is re-weighted by the importance ratio π_old / π_engine of the sample it came from, bounded:

* ``token_truncate``    — w_t = min(exp(log π_old − log π_engine), C_max) per unit: truncated importance sampling
  (TIS; Yao et al. 2025, "Your Efficient RL Framework Secretly Brings You Off-Policy RL Training", fengyao.notion.site;
  TRL ``vllm_importance_sampling_correction`` with ``vllm_importance_sampling_mode="token_truncate"``);
* ``token_mask``        — w_t = ratio if C_min ≤ ratio ≤ C_max else 0 (masked IS, TRL ``token_mask``);
* ``sequence_truncate`` / ``sequence_mask`` — the same with one ratio per sample, exp(Σ_t (log π_old − log π_engine))
  over its valid units (TRL ``sequence_*``; TRL's default mode is ``sequence_mask``).

C_min (``clip_min``) also lower-bounds the truncating modes when it is set, as in TRL
(``trl/trainer/grpo_trainer.py``, ``_generate_and_score_completions``). The weights carry no gradient.

Departures from TRL: none in the formulas; an engine log-prob that is not finite gives weight 1 at that unit (TRL:
a NaN difference is zeroed, so the ratio is 1).

Shape glossary: ``B`` samples, ``T`` units.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")


def engine_is_weights(
    old_logprobs: Tensor,
    engine_logprobs: Tensor,
    mask: Tensor,
    *,
    mode: str = "token_truncate",
    clip_max: float | None = 3.0,
    clip_min: float | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Per-unit importance weights π_old / π_engine, bounded by ``mode`` (see the module docstring).

    Metrics (detached, over valid units): ``engine/logprob_abs_diff`` = mean |log π_old − log π_engine|,
    ``engine/logprob_abs_mean`` = mean |log π_old| (the scale the gap's rounding is relative to),
    ``engine/is_ratio_mean``, ``engine/capped_fraction`` (units, or samples for ``sequence_*``, whose ratio was
    truncated or masked).

    Shape:
        old_logprobs, engine_logprobs, mask: [B, T]
        returns weights [B, T] (0 where mask is 0), metrics {name: []}
    """
    if mode not in MODES:
        raise ValueError(f"importance-sampling mode {mode!r} not allowed; choose one of: {', '.join(MODES)}")
    m = mask.float()  # [B, T]
    diff = torch.nan_to_num((old_logprobs.float() - engine_logprobs.float()) * m, nan=0.0, posinf=0.0, neginf=0.0)
    sequence = mode.startswith("sequence")
    log_ratio = diff.sum(dim=1, keepdim=True) if sequence else diff  # [B, 1] or [B, T]
    ratio = log_ratio.exp()
    lo = -math.inf if clip_min is None else clip_min
    hi = math.inf if clip_max is None else clip_max
    out = (ratio < lo) | (ratio > hi)  # [B, 1] or [B, T]
    if mode.endswith("truncate"):
        weights = ratio.clamp(min=clip_min, max=clip_max)
    else:
        weights = ratio.masked_fill(out, 0.0)
    weights = (weights.expand_as(m) * m).detach()  # [B, T]
    units = m.sum().clamp(min=1.0)
    if sequence:
        has_units = (m.sum(dim=1, keepdim=True) > 0).float()  # [B, 1]
        capped = (out.float() * has_units).sum() / has_units.sum().clamp(min=1.0)
        ratio_mean = (ratio * has_units).sum() / has_units.sum().clamp(min=1.0)
    else:
        capped = (out.float() * m).sum() / units
        ratio_mean = (ratio * m).sum() / units
    old_abs = torch.nan_to_num(old_logprobs.float() * m, nan=0.0, posinf=0.0, neginf=0.0).abs()  # [B, T]
    metrics = {
        "engine/logprob_abs_diff": (diff.abs().sum() / units).detach(),
        "engine/logprob_abs_mean": (old_abs.sum() / units).detach(),
        "engine/is_ratio_mean": ratio_mean.detach(),
        "engine/capped_fraction": capped.detach(),
    }
    return weights, metrics


def rollout_is_weights(rollout, settings) -> tuple[Tensor | None, dict[str, Tensor]]:
    """The bounded weights π_old / π_engine [B, T] of an engine-sampled ``rollout`` and their metrics, as the
    ``rollout`` config section ``settings`` sets them (``is_mode``, ``is_clip_max``, ``is_clip_min``); ``(None, {})``
    for a rollout the trainer sampled itself, or with ``is_mode: none``."""
    if rollout.engine_logprobs is None or settings.is_mode == "none":
        return None, {}
    logprobs = (rollout.old_logprobs, rollout.engine_logprobs, rollout.mask)  # [B, T] each
    return engine_is_weights(
        *logprobs, mode=settings.is_mode, clip_max=settings.is_clip_max, clip_min=settings.is_clip_min
    )  # [B, T]
