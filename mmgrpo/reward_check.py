"""The reward load check: each configured reward runs once, before the model loads, on a synthetic rollout of the
kind the run makes, through the path training scores with (:func:`mmgrpo.rewards.score_rows` and the run's
:class:`~mmgrpo.rewards.RewardRunner`, :meth:`~mmgrpo.rewards.RewardRunner.check`).

:mod:`mmgrpo.preflight` checks the built-in rewards' columns without calling them (``--dry-run`` imports no reward
module). Here the rewards are already imported, under the code policy (``rewards/code_policy.py``), by the trainer's
runner, so every one of them (``module:function`` included) is called once on the first :data:`CHECK_ROWS` training
rows, :data:`CHECK_GROUP` synthetic samples each, with the columns a rollout of the run's kind gives
(:func:`synthetic_rollout`): a text (or image, ``Inputs.outputs``) completion per sample, ``completion_ids`` for
text, the trajectory columns of a multi-turn rollout (``tool_calls``, ``turn_rewards``... with ``rollout.tools`` or
``rollout.environment``), the media columns of the row's image, video or audio. A reward that returns something
other than a list of floats or None (``None`` itself, the string ``"1"``, one value too many), or needs a column
the batch does not have, stops the run here in one line naming the reward, what it returned and the fix; one whose
own code raises on the synthetic samples stops it too under ``reward_runtime.on_error: raise`` (a warning under
``nan``, which scores such samples NaN in training).
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
from PIL import Image

from mmgrpo.config import ConfigError, TrainConfig
from mmgrpo.media import as_list
from mmgrpo.rewards import RewardRunner, score_rows

logger = logging.getLogger(__name__)

CHECK_ROWS = 2
"""Training rows the synthetic rollout answers (fewer when the task has fewer)."""

CHECK_GROUP = 2
"""Synthetic samples per row: B = rows · 2, so a reward that returns one value per row, not per sample, is seen."""

SYNTHETIC_RATE = 16_000
"""Sampling rate of the synthetic ``audio_array`` (one second of silence), Whisper's and Qwen2-Audio's."""


def load_rewards(cfg: TrainConfig, train_rows: Any) -> RewardRunner:
    """The run's :class:`~mmgrpo.rewards.RewardRunner` (``rewards``, ``reward_runtime``), its rewards imported
    under the code policy, checked on a synthetic rollout answering the first :data:`CHECK_ROWS` of
    ``train_rows`` (:func:`check_rewards`; not with ``reward_runtime.load_check: false``); the trainer calls it
    before the model loads."""
    from mmgrpo.row_check import adapter_inputs

    rt = cfg.reward_runtime
    runner = RewardRunner(
        [(r.name, r.weight, r.kwargs) for r in cfg.rewards],
        timeout_s=rt.timeout_s,
        on_error=rt.on_error,
        max_workers=rt.workers,
        reward_types=[r.reward_types for r in cfg.rewards],
        isolation=rt.isolation,
    )
    if not rt.load_check:  # reward_runtime.load_check: false
        return runner
    inputs = adapter_inputs(cfg.model.adapter)
    rows = [train_rows[i] for i in range(min(CHECK_ROWS, len(train_rows)))]
    check_rewards(runner, cfg, rows, image_outputs=inputs is not None and inputs.outputs == "image")
    return runner


def check_rewards(runner: RewardRunner, cfg: TrainConfig, rows: list[dict], image_outputs: bool = False) -> None:
    """Run every reward of ``runner`` once on a synthetic rollout answering ``rows`` (module docstring); raise a
    one-line :class:`ConfigError` for the first that cannot be scored. ``image_outputs``: the adapter's samples are
    images (``Inputs.outputs``)."""
    if not rows:
        return
    completions, extras = synthetic_rollout(cfg, rows, image_outputs)
    prompts_rows = [{**row, "prompt": row.get("prompt", "")} for row in rows]
    failures = _check(runner, completions, prompts_rows, extras, cfg.steps)
    kind = rollout_kind(cfg, image_outputs)
    for k, message, broken in failures:
        where = f"rewards[{k}] ({cfg.rewards[k].name})"
        line = (
            f"{where} cannot be scored: {message} (load check: {len(completions)} synthetic {kind} samples of the "
            f"first {len(rows)} training row(s), before the model loads)"
        )
        if broken or cfg.reward_runtime.on_error == "raise":
            raise ConfigError(line.replace("\n", " "))
        logger.warning("%s; reward_runtime.on_error: nan scores such samples NaN", line)


def _check(runner: RewardRunner, completions: list, rows: list[dict], extras: dict[str, list], steps: int) -> list:
    """``runner.check`` of the samples as :func:`score_rows` lays them out (each row repeated G times, its columns
    and ``group_index``), with the ``extras`` of a rollout and the ``trainer_state`` of step 0 of ``steps``."""
    from transformers import TrainerState

    failures: list = []

    def collect(outputs: list, prompts: list, columns: dict, **kwargs: Any) -> tuple:  # in the runner's place
        failures.extend(runner.check(outputs, prompts, columns, **kwargs))
        return None, {}

    state = TrainerState(global_step=0, max_steps=steps, epoch=0.0)  # as the first training step passes it
    score_rows(collect, completions, rows, CHECK_GROUP, extras, group_index=True, trainer_state=state)
    return failures


def rollout_kind(cfg: TrainConfig, image_outputs: bool) -> str:
    """``single-turn text``, ``multi-turn text (tools)``, ``multi-turn text (environment)`` or ``image``."""
    r = cfg.rollout
    if image_outputs:
        return "image"
    if r.environment is not None:
        return "multi-turn text (environment)"
    return "multi-turn text (tools)" if r.multi_turn else "single-turn text"


def synthetic_rollout(cfg: TrainConfig, rows: list[dict], image_outputs: bool = False) -> tuple[list, dict[str, list]]:
    """``(completions, extras)`` of B = len(rows) · :data:`CHECK_GROUP` synthetic samples, group-major: what a
    rollout of ``cfg``'s kind gives the rewards (module docstring). Text completions end with the row's ``answer``
    (or ``solution``) in ``<answer>`` tags, so ground-truth rewards have something to parse."""
    G = CHECK_GROUP
    samples = [(row, g) for row in rows for g in range(G)]
    extras: dict[str, list] = {}
    if image_outputs:
        completions: list = [Image.new("RGB", (64, 64), (127, 127, 127)) for _ in samples]
    else:
        completions = [_text(row, g) for row, g in samples]
        extras["completion_ids"] = [[1, 2, 3, 4][: 2 + g] for _, g in samples]
    media = [_media_columns(row, i) for i, row in enumerate(rows) for _ in range(G)]
    for key in dict.fromkeys(k for m in media for k in m):
        extras[key] = [m.get(key) for m in media]
    if cfg.rollout.multi_turn:
        for key, value in _trajectory_columns(cfg).items():
            extras[key] = [value(g) for _, g in samples]
    return completions, extras


def _text(row: dict, g: int) -> str:
    answer = row.get("answer", row.get("solution"))
    answer = answer if isinstance(answer, (str, int, float)) else "0"
    return f"<think>synthetic sample {g}</think> <answer>{answer}</answer>"


def _trajectory_columns(cfg: TrainConfig) -> dict[str, Any]:
    """Per-sample makers of the columns a multi-turn rollout records (``modalities/tokens/turns.py``
    ``trajectory_extras``): two turns, sample g calls a tool g times and earns g at its last turn."""
    columns = {
        "tool_calls": lambda g: g,
        "tool_errors": lambda g: 0,
        "num_turns": lambda g: 2,
        "turn_rewards": lambda g: [0.0, float(g)],
        "turn_invalid": lambda g: [False, False],
        "anchors": lambda g: [("synthetic", 0), ("synthetic", g + 1)],
        "messages": lambda g: [
            {"role": "assistant", "text": "<action>1</action>", "images": []},
            {"role": "user", "text": "observation", "images": []},
        ],
    }
    if cfg.rollout.ground_truth_probe is not None:
        columns["gt_logprobs"] = lambda g: [-1.0, -0.5]
    return columns


def _media_columns(row: dict, index: int) -> dict[str, Any]:
    """The columns a token adapter adds for the media of row ``index`` (``Rollout.extras``): image sizes and patch
    grids, a video's group and timing, an audio's waveform and rate."""
    out: dict[str, Any] = {}
    images = as_list(row.get("images") if row.get("images") is not None else row.get("image"))
    sizes = [i.size for i in images if isinstance(i, Image.Image)]
    if sizes:
        one = (lambda v: v[0]) if len(sizes) == 1 else list
        out["image_size"] = row.get("image_size") or one(sizes)
        out["resized_image_size"] = one([(28 * max(1, w // 28), 28 * max(1, h // 28)) for w, h in sizes])
        out["image_grid_thw"] = one([[1, 2 * max(1, h // 28), 2 * max(1, w // 28)] for w, h in sizes])
    if row.get("video") is not None:
        out.update(group_id=index, sample_fps=2.0, frame_timestamps=[0.0, 0.5, 1.0], duration=row.get("duration", 1.5))
        out["shuffled_completions"] = ["<answer>0</answer>"]  # T-GRPO's samples on shuffled frames
    if row.get("audio") is not None:
        out.update(audio_array=np.zeros(SYNTHETIC_RATE, dtype=np.float32), sampling_rate=SYNTHETIC_RATE)
    return out


__all__ = ["CHECK_GROUP", "CHECK_ROWS", "check_rewards", "load_rewards", "rollout_kind", "synthetic_rollout"]
