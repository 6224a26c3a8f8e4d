"""Difficulty-aware data augmentation of DeepVideo-R1 (Park, Na, Kim, Kim 2025, "DeepVideo-R1: Video Reinforcement
Fine-Tuning via Difficulty-aware Regressive GRPO", arXiv 2506.07464, NeurIPS 2025; the paper's second part, after
Reg-GRPO): move each prompt towards a solvable difficulty, so that its group's rewards differ and GRPO's advantage
does not vanish.

What is implemented (``algorithm.difficulty_augmentation``; the rollout step ``difficulty_augmentation`` of
:mod:`mmgrpo.rollout_steps` runs it after scoring the step's rollouts, with the helpers here):

* difficulty of a group: ΔR = (mean reward of the reference window: the batch mean rewards of the last W = ``window``
  steps, the paper's W = 100) − (the group's mean reward). The window holds the steps *before* this one; the batch
  mean of this step's (unaugmented) rollouts enters it afterwards. The first step has an empty window: nothing is
  augmented.
* hard groups (ΔR > 0) get a partial reasoning hint appended to the prompt: the first round(|ΔR|) + 1 units of the
  row's ``hint_column`` (words by default), through ``hint_template``;
* easy groups (ΔR < 0) get Gaussian noise on every frame of their video, σ = ``noise_std``·(|ΔR| + 1), through the
  adapter's :class:`VideoAugment` capability (the video adapter owns its frames; rows without video stay as they are);
* the step's P prompts (augmented or not) are then rolled out again and scored, and the step trains on that second
  rollout. Logged: ``augment/hinted_fraction``, ``augment/noised_fraction``, ``augment/window_mean``,
  ``augment/delta_mean`` (docs/metrics.md).

Where the paper is silent or this departs from it:

* the scaling: the camera-ready gives no formula for how the hint length and the noise grow with |ΔR|; the earlier
  arXiv version's guide length round(|ΔR|) + 1 and noise scale |ΔR| + 1 are used (a weaker source). Python's
  ``round`` (half to even). The noise scale multiplies ``noise_std``, in pixel values 0–255 (our unit; the paper
  names none), and the noisy frames are clamped to [0, 255] and rounded back to the frames' dtype.
* the hint: the paper takes the partial trace from the best rollout generated with the ground truth in the prompt;
  here it is a prefix of a ground-truth reasoning column of the data (no extra generation). A unit is a word
  (``hint_separator`` null) or what ``hint_separator`` splits on (lines, sentences).
* the cost: a second rollout of the step's P prompts (the first one only measures the difficulty); the window is per
  process and restarts empty on resume (not checkpointed). Not combined with ``dynamic_sampling`` or
  ``gt_injection`` (refused at load).
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import torch
from torch import Tensor

RESAMPLE_NOISE = 0xA06
"""Tag mixed into the seed of the augmented rollout's keyed noise (apart from the step's first rollout)."""
FRAME_NOISE = 0xF4A
"""Tag mixed into the seed of each row's frame noise."""


@runtime_checkable
class VideoAugment(Protocol):
    """Adapter capability: a row whose video gets frame-level Gaussian noise when the adapter reads it."""

    def augment_video(self, row: dict, std: float, seed: int) -> dict:
        """A copy of ``row`` whose video frames get N(0, std²) noise in pixel values, drawn from a generator seeded
        by ``seed``; ``row`` itself unchanged (and returned as is when it has no video)."""
        ...


def difficulty(window_mean: float, group_means: Tensor) -> Tensor:
    """ΔR = window mean − group mean: > 0 hard, < 0 easy. Shape: [P] → [P]."""
    return window_mean - group_means.float()  # [P]


def hint_units(delta: float) -> int:
    """Units of reasoning given to a hard group: round(|ΔR|) + 1 (the earlier arXiv version's guide length)."""
    return round(abs(delta)) + 1


def noise_scale(delta: float) -> float:
    """Multiplier of the frame noise of an easy group: |ΔR| + 1 (the earlier arXiv version's noise scale)."""
    return abs(delta) + 1.0


def hint_prefix(text: str, units: int, separator: str | None) -> str:
    """The first ``units`` units of ``text``: words (``separator`` None) or pieces split on ``separator``."""
    if separator is None:
        return " ".join(text.split()[:units])
    return separator.join(text.split(separator)[:units])


def with_hint(row: dict, text: str, setting: str, i: int) -> dict:
    """A copy of ``row`` whose string prompt ends with ``text`` (a formatted hint); ``setting`` and the row's index
    ``i`` name the cause when the prompt is not a string (chat messages, media parts). Also Scaf-GRPO's tiered hints
    (:mod:`mmgrpo.scaffold`)."""
    if not isinstance(row.get("prompt"), str):
        raise ValueError(
            f"{setting}: row {i}'s prompt is not a string, so no hint can be appended; use string prompts or turn "
            f"{setting} off"
        )
    return {**row, "prompt": row["prompt"] + text}


def augment_rows(
    adapter: VideoAugment, rows: list[dict], delta: list[float], seeds: list[int], options: Any
) -> tuple[list[dict], Tensor, Tensor]:
    """Rows with hints (ΔR > 0 and a ``hint_column``) or frame noise (ΔR < 0); [P] bool masks of each.

    ``options`` is the ``algorithm.difficulty_augmentation`` section; ``seeds`` [P] the frame-noise seed of each row.
    The rows themselves are not changed (hinted or noised rows are copies).
    """
    o = options
    out, hinted, noised = [], torch.zeros(len(rows), dtype=torch.bool), torch.zeros(len(rows), dtype=torch.bool)
    for i, (row, d, seed) in enumerate(zip(rows, delta, seeds, strict=True)):
        if d > 0 and row.get(o.hint_column) is not None:
            hint = hint_prefix(str(row[o.hint_column]), hint_units(d), o.hint_separator)
            row = with_hint(row, o.hint_template.format(hint=hint), "algorithm.difficulty_augmentation", i)
            hinted[i] = True
        elif d < 0:
            new = adapter.augment_video(row, o.noise_std * noise_scale(d), seed)
            noised[i] = new is not row
            row = new
        out.append(row)
    return out, hinted, noised
