"""Rewards: plain functions ``f(completions, *, prompts, **columns) -> list[float | None]``, found by name.

Public API:

- :data:`REWARDS`, :func:`register_reward`, :func:`load_reward`, :func:`list_rewards` — the plug-in registry
  (registry name, ``package.module:attr``, or the ``mmgrpo.rewards`` entry-point group);
- :func:`check_reward_spec` — the load-time check of a reward's name, kwargs and weight;
- :class:`RewardRunner`, :class:`RewardError` — weighted, routed, parallel evaluation with a timeout (threads, or
  worker processes that are killed at the deadline); :func:`score_rows` (outputs against their dataset rows);
  :func:`weighted_scorer` / :class:`WeightedScore` — Σ_k w_k·reward_k as one callable, what the trainer hands an
  adapter builder that scores its own intermediate outputs (the flow adapter's value rewards);
- :mod:`~mmgrpo.rewards.parsing` — one parser for tags, boxes, points, numbers, choices and time spans;
- the built-in rewards of :mod:`.text`, :mod:`.speech`, :mod:`.visual` and :mod:`.model_based`
  (``mmgrpo rewards list`` prints them; ``docs/rewards.md`` has formulas and sources).
"""

from . import parsing
from .agents import deepeyes  # noqa: F401  (docs/agents.md)
from .model_based import CLIPScore, PickScore
from .registry import (
    ENTRY_POINT_GROUP,
    REWARDS,
    UnknownRewardError,
    check_reward_spec,
    list_rewards,
    load_reward,
    register_reward,
)
from .runner import RewardError, RewardRunner, WeightedScore, score_rows, weighted_scorer
from .speech import cer, corpus_wer, hallucination, wer
from .text import (
    accuracy,
    bleu,
    exact_match,
    format_reward,
    last_number,
    length_band,
    length_cosine,
    length_kimi,
    math_accuracy,
    multiple_choice,
    multiple_choice_partial,
    numeric,
    regression,
    repetition_penalty,
    rouge,
)
from .tool_efficiency import otc  # noqa: F401  (OTC-PO, docs/variants.md)
from .variants import self_consistency, step_rar, step_rvr, tempsamp_soft  # noqa: F401  (docs/variants.md)
from .video import temporal_contrast, temporal_iou_frames  # noqa: F401  (T-GRPO contrast; frame-number IoU)
from .visual import (
    BoxSpace,
    ImageGeometry,
    box_giou,
    box_iou,
    convert_coords,
    count_exact,
    count_fuzzy,
    detection_visual_rft,
    detection_weighted,
    giou,
    gui_point_distance,
    gui_point_in_box,
    iou,
    multi_span_iou,
    span_iou,
    temporal_iou,
    to_normalized,
    tracking_iou,
)

__all__ = [
    "ENTRY_POINT_GROUP",
    "REWARDS",
    "BoxSpace",
    "CLIPScore",
    "ImageGeometry",
    "PickScore",
    "RewardError",
    "RewardRunner",
    "UnknownRewardError",
    "WeightedScore",
    "accuracy",
    "bleu",
    "box_giou",
    "box_iou",
    "cer",
    "check_reward_spec",
    "convert_coords",
    "corpus_wer",
    "count_exact",
    "count_fuzzy",
    "detection_visual_rft",
    "detection_weighted",
    "exact_match",
    "format_reward",
    "giou",
    "gui_point_distance",
    "gui_point_in_box",
    "hallucination",
    "iou",
    "last_number",
    "length_band",
    "length_cosine",
    "length_kimi",
    "list_rewards",
    "load_reward",
    "math_accuracy",
    "multi_span_iou",
    "multiple_choice",
    "multiple_choice_partial",
    "numeric",
    "parsing",
    "register_reward",
    "regression",
    "repetition_penalty",
    "rouge",
    "score_rows",
    "span_iou",
    "temporal_iou",
    "to_normalized",
    "tracking_iou",
    "weighted_scorer",
    "wer",
]
