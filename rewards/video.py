"""Video rewards that need what the video adapter measured: the T-GRPO temporal contrast, and temporal IoU for
answers given in sampled-frame numbers.

Both read reward columns that :mod:`mmgrpo.modalities.video` adds to every rollout (``Rollout.extras``):
``group_id``, ``shuffled_completions`` (temporal contrast on), ``frame_timestamps`` and ``duration``.
"""

from __future__ import annotations

import inspect
import math
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from ._common import column, group_ids, per_answer
from .parsing import parse_time_span
from .registry import load_reward, register_reward
from .visual import _gt_span, span_iou


def _call(fn: Callable, completions: list, prompts: list, columns: dict[str, list]) -> list:
    """Call a reward the way the runner does for plain functions: columns it names (or all, with **kwargs)."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return list(fn(completions, prompts=prompts, **columns))
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return list(fn(completions, prompts=prompts, **columns))
    kw = {k: v for k, v in {"prompts": prompts, **columns}.items() if k in params}
    return list(fn(completions, **kw))


def contrast_bonus(
    ordered: list[float | None], shuffled: list[float | None], *, mu: float, alpha: float, threshold: float
) -> tuple[list[float | None], float | None, float | None]:
    """T-GRPO bonus for one group.

    ``p = mean(ordered)``, ``p̃ = mean(shuffled)`` (``None`` entries left out); if ``p ≥ μ·p̃`` every ordered
    sample with reward ``> threshold`` gets ``α``, the others 0; otherwise all get 0. ``None`` stays ``None``.
    With no shuffled score the rule is not defined: every sample gets ``None``. Returns ``(bonus, p, p̃)``.
    """
    o = [r for r in ordered if r is not None and not math.isnan(r)]
    s = [r for r in shuffled if r is not None and not math.isnan(r)]
    if not o or not s:
        return [None] * len(ordered), (sum(o) / len(o) if o else None), (sum(s) / len(s) if s else None)
    p, p_shuf = sum(o) / len(o), sum(s) / len(s)
    wins = p >= mu * p_shuf
    bonus = [None if r is None or math.isnan(r) else (alpha if wins and r > threshold else 0.0) for r in ordered]
    return bonus, p, p_shuf


@register_reward(
    "temporal_contrast",
    "T-GRPO (Video-R1) bonus: +alpha to correct samples of groups whose ordered accuracy >= mu x shuffled accuracy",
)
def temporal_contrast(
    completions: list,
    *,
    prompts: list | None = None,
    target: str = "accuracy",
    target_kwargs: dict | None = None,
    mu: float = 0.8,
    alpha: float = 0.3,
    threshold: float = 0.1,
    shuffled_key: str = "shuffled_completions",
    group_key: str = "group_id",
    log_metric: Callable | None = None,
    **columns: Any,
) -> list[float | None]:
    """T-GRPO temporal-contrast reward.

    For each group (``group_key`` column, else equal prompts), with ``r`` the ``target`` reward (any reward spec,
    with ``target_kwargs``) of its G ordered completions and ``r̃`` that of the completions the video adapter
    sampled on frame-shuffled video (``shuffled_key`` column, the same list on every sample of the group)::

        p = mean_i r_i,   p̃ = mean_j r̃_j,   bonus_i = α · 1[r_i > threshold] · 1[p ≥ μ · p̃]

    The shuffled completions are scored with the ordered row's columns (same ground truth). Rows without
    shuffled completions (no video) and rows whose target is ``None`` get ``None``. Returned as its own reward
    column: with weight w and ``combine: sum_then_normalize`` it adds ``w·bonus`` to the summed reward before
    group normalisation, which is Video-R1's rule when w equals the target's weight (Video-R1 adds α to
    reward column 0 itself). Metrics: ``p_ordered``, ``p_shuffled`` (means over groups) and
    ``bonus_group_fraction`` (Video-R1's ``temporal_rewards``).

    Source: Feng et al. 2025, "Video-R1: Reinforcing Video Reasoning in MLLMs" (arXiv 2503.21776 §3.2), code
    defaults μ = 0.8, α = 0.3, threshold 0.1 (tulerfeng/Video-R1 ``src/r1-v/src/open_r1/grpo.py``); here μ, α, the
    threshold and the target are options, not "column 0" (Video-R1 applies it to reward column 0 only, with hard-coded
    constants).
    """
    n = len(completions)
    prompts = list(prompts) if prompts is not None else [None] * n
    shuffled = column(columns, shuffled_key, "temporal_contrast", n)
    fn = load_reward(target, **(target_kwargs or {}))
    ordered_r = _call(fn, list(completions), prompts, columns)
    groups = group_ids(prompts, columns, group_key)
    members: dict[Any, list[int]] = defaultdict(list)
    for i, g in enumerate(groups):
        members[g].append(i)
    out: list[float | None] = [None] * n
    ps, p_shufs, wins = [], [], []
    for idx in members.values():
        texts = shuffled[idx[0]]
        if texts is None:
            continue
        if not isinstance(texts, (list, tuple)):
            raise ValueError(
                f"reward 'temporal_contrast': column {shuffled_key!r} must hold a list of completions per sample, "
                f"got {type(texts).__name__}"
            )
        i0 = idx[0]
        cols = {k: [v[i0]] * len(texts) for k, v in columns.items()}
        shuf_r = _call(fn, list(texts), [prompts[i0]] * len(texts), cols) if texts else []
        bonus, p, p_shuf = contrast_bonus([ordered_r[i] for i in idx], shuf_r, mu=mu, alpha=alpha, threshold=threshold)
        for i, b in zip(idx, bonus):
            out[i] = b
        if p is not None and p_shuf is not None:
            ps.append(p)
            p_shufs.append(p_shuf)
            wins.append(float(p >= mu * p_shuf))
    if log_metric is not None and ps:
        log_metric("p_ordered", sum(ps) / len(ps))
        log_metric("p_shuffled", sum(p_shufs) / len(p_shufs))
        log_metric("bonus_group_fraction", sum(wins) / len(wins))
    return out


@register_reward(
    "temporal_iou_frames",
    "temporal IoU of a span given in sampled-frame numbers, converted to seconds with the frames' real timestamps",
)
@per_answer("temporal_iou_frames")
def temporal_iou_frames(
    pred: str | None,
    gt: Any,
    *,
    columns: dict[str, Any],
    i: int,
    one_based: bool = False,
    timestamps_key: str = "frame_timestamps",
    duration_key: str = "duration",
) -> float | None:
    """Temporal IoU when the model answers with the numbers of the frames it saw ("2 to 5").

    With ``t_0 … t_{F-1}`` the timestamps of the sampled frames (``timestamps_key``, seconds in the file) and
    ``L`` the decoded length (``duration_key``), sampled frame k covers ``[t_k, t_{k+1})`` and the last one
    ``[t_{F-1}, t_0 + L)``. Predicted frames ``a ≤ b`` (0-based, or 1-based with ``one_based``) become the span
    ``[t_a, end of frame b)``, so the conversion follows the rate the video was really sampled at, not a
    nominal one. Ground truth in seconds; ``r`` = :func:`~mmgrpo.rewards.visual.span_iou`. A frame number
    outside ``[0, F)``, ``a > b``, a non-integer or no span → 0.

    Source: the temporal IoU of VideoChat-R1 / Temporal-R1 (OpenGVLab/VideoChat-R1 ``src/open_r1/grpo_tasks.py``;
    appletea233/Temporal-R1, arXiv 2506.01908; VideoChat-R1 ``grpo_tg.py``; Temporal-R1
    ``verl/utils/reward_score/tvg.py``) with frame-number answers
    mapped to time as qwen-vl-utils samples frames (QwenLM/Qwen2.5-VL
    ``qwen-vl-utils/src/qwen_vl_utils/vision_process.py``).
    """
    ts = column(columns, timestamps_key, "temporal_iou_frames")[i]
    length = column(columns, duration_key, "temporal_iou_frames")[i]
    if not ts or length is None:
        return None
    g = _gt_span(gt, "temporal_iou_frames")
    span = parse_time_span(pred, "last") if pred is not None else None
    if span is None or not all(float(v).is_integer() for v in span):
        return 0.0
    a, b = (int(v) - int(one_based) for v in span)
    if not (0 <= a <= b < len(ts)):
        return 0.0
    end = ts[b + 1] if b + 1 < len(ts) else ts[0] + float(length)
    return span_iou((ts[a], end), g)
