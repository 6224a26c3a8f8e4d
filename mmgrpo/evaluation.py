"""Held-out evaluation: the rows, their outputs generated across processes, and the records written.

The trainer evaluates before training, after the warm-up, every ``eval.every`` steps and after training
(``eval/<stage>/*``); it scores the outputs with the task's metric or, where the task has none, the rewards.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from accelerate import Accelerator
from accelerate.utils import DistributedType, gather_object

from mmgrpo import tracking
from mmgrpo.types import DataError

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


def record(
    acc: Accelerator, out: Path, stage: str, result: dict, rows: list[dict], outputs: list, step: int, at: int
) -> None:
    """``metrics.jsonl`` (at ``step``) and the first 8 samples as files and tracker media (at ``at``; main process)."""
    tracking.append_jsonl(out / "metrics.jsonl", {"step": step, **result})
    from mmgrpo import samples as sample_files  # text inline, images/video/audio as files

    records = [(rows[i], o) for i, o in outputs[:8]]
    written = sample_files.write_samples(out, stage, records, step=at)
    tracking.log_samples(acc, stage, written, out, at)  # the trackers' media types
