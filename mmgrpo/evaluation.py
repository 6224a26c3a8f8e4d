"""Held-out evaluation: the rows, their outputs generated across processes, and the records written.

The trainer evaluates before training, after the warm-up, every ``eval.every`` steps and after training
(``eval/<stage>/*``); it scores the outputs with the task's metric or, where the task has none, the rewards.
"""

from __future__ import annotations

import logging
import sys
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
