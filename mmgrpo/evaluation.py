"""Held-out evaluation: the rows, their outputs generated across processes, and the records written.

The trainer evaluates before training, after the warm-up, every ``eval.every`` steps and after training
(``eval/<stage>/*``); it scores the outputs with the task's metric or, where the task has none, the rewards, through
the training reward path: :func:`reward_scores` calls :func:`mmgrpo.rewards.score_rows` as a training step does, with
the reward columns the outputs carry (:func:`output_columns`: a multi-turn answer's ``tool_calls`` and
``turn_rewards``, the token ids, the image sizes...), so a reward that trains also evaluates.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

from accelerate import Accelerator
from accelerate.utils import DistributedType, gather_object

from mmgrpo import tracking
from mmgrpo.advantages import combine_rewards
from mmgrpo.rewards import score_rows
from mmgrpo.types import Answer, DataError, TextTokenizer

logger = logging.getLogger(__name__)


def held_out_rows(data, max_rows: int | None) -> list[dict]:
    """The first ``eval.max_rows`` held-out rows (all without a limit); unreadable rows are skipped, warned."""
    n = len(data) if max_rows is None else min(len(data), max_rows)
    rows = []
    for i in range(n):
        try:
            rows.append(data[i])
        except DataError as e:
            logger.warning("mmgrpo: skipped held-out row: %s", e)
    return rows


def generate(acc: Accelerator, adapter, rows: list[dict], batch_size: int) -> list[tuple[int, Any]]:
    """``(row index, output)`` of every row, sorted by index, the same on every process (each generates a share)."""
    outputs = []
    sharded = acc.distributed_type == DistributedType.FSDP  # every process must run as many forwards
    with acc.split_between_processes(list(range(len(rows))), apply_padding=sharded) as mine:
        for start in range(0, len(mine), batch_size):
            batch = [rows[i] for i in mine[start : start + batch_size]]
            outputs += list(zip(mine[start : start + len(batch)], adapter.evaluate(batch)))
    return sorted(dict(gather_object(outputs)).items())  # padding repeats the last row: kept once


def output_columns(outputs: list, adapter: object = None) -> dict[str, list]:
    """The reward columns of held-out ``outputs``, one value per output, as a training rollout's ``Rollout.extras``.

    :class:`~mmgrpo.types.Answer` outputs (the token families' ``evaluate``) carry theirs: the union of their
    columns, ``None`` where one lacks a key. Plain text outputs of an adapter with a tokenizer get ``completion_ids``,
    the text re-tokenised (no EOS: the text does not hold it); other outputs (images) get none."""
    if outputs and all(isinstance(o, Answer) for o in outputs):
        keys = dict.fromkeys(k for o in outputs for k in o.columns)
        return {k: [o.columns.get(k) for o in outputs] for k in keys}
    text = bool(outputs) and all(isinstance(o, str) for o in outputs)
    if text and isinstance(adapter, TextTokenizer) and callable(adapter.tokenizer):
        return {"completion_ids": list(adapter.tokenizer(list(outputs), add_special_tokens=False)["input_ids"])}
    return {}


def reward_scores(runner, adapter: object, outputs: list, rows: list[dict], trainer_state=None) -> dict[str, float]:
    """Mean of each configured reward over the held-out ``outputs`` (one per row) as ``reward/<name>`` (NaN = not
    applicable is left out; ``reward/wer`` is the reward 1 − WER, not the WER), and ``reward``, the weighted
    combination. Scored as a training step scores (``mmgrpo.trainer``'s ``RolloutContext.score``): one call of
    :func:`~mmgrpo.rewards.score_rows` with the outputs' reward columns (:func:`output_columns`), ``group_index``
    and ``trainer_state``, each row a group of one."""
    extras = output_columns(outputs, adapter)
    scores, _ = score_rows(runner, outputs, rows, 1, extras, group_index=True, trainer_state=trainer_state)  # [n, K]
    combined = combine_rewards(scores[:, None, :], runner.weights)  # [n, 1]
    result = {f"reward/{name}": float(scores[:, k].nanmean()) for k, name in enumerate(runner.names)}
    result["reward"] = float(combined.nanmean())
    return result


def announce(stage: str, result: dict, step: int) -> None:
    """``mmgrpo: eval after (step 40): accuracy=0.9 format=1`` — printed when the evaluation finishes (above the
    progress bar), not only in the run's final message."""
    from tqdm.auto import tqdm

    prefix = f"eval/{stage}/"
    values = " ".join(f"{k.removeprefix(prefix)}={v:.4g}" for k, v in sorted(result.items()))
    tqdm.write(f"mmgrpo: eval {stage} (step {step}): {values}", file=sys.stdout)
    sys.stdout.flush()  # seen when it happens in a piped log too


def record(
    acc: Accelerator, out: Path, stage: str, result: dict, rows: list[dict], outputs: list, step: int, at: int
) -> None:
    """``metrics.jsonl`` (at ``step``), the first 8 samples as files and tracker media (at ``at``), and one line on
    stdout as soon as the evaluation finishes (:func:`announce`; main process)."""
    announce(stage, result, step)
    tracking.append_jsonl(out / "metrics.jsonl", {"step": step, **result})
    from mmgrpo import samples as sample_files  # text inline, images/video/audio as files

    records = [(rows[i], o) for i, o in outputs[:8]]
    written = sample_files.write_samples(out, stage, records, step=at)
    tracking.log_samples(acc, stage, written, out, at)  # the trackers' media types
