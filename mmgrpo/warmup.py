"""The optional supervised warm-up before GRPO (``warmup.*``): a few supervised steps on the warm-up rows.

The rows are the task's warm-up rows, or training rows with a target built from ``warmup.target_column`` and
``warmup.target_template``; with ``warmup.thought_dropout`` a share of the targets lose their thought
(:mod:`mmgrpo.thoughts`, TON). The trainer evaluates the warmed-up policy as its own stage (``eval/warmup/*``).
"""

from __future__ import annotations

import logging
import random

import torch
from accelerate import Accelerator

from mmgrpo import thoughts, tracking
from mmgrpo.config import TrainConfig
from mmgrpo.preflight import row_name, warmup_target
from mmgrpo.types import DataError, SupervisedLoss

logger = logging.getLogger(__name__)
MAX_CONSECUTIVE_BAD_ROWS = 100  # unreadable rows in a row before the run stops with a DataError


def supervised_warmup(cfg: TrainConfig, acc: Accelerator, adapter: SupervisedLoss, rows) -> int:
    """``warmup.steps`` supervised steps with a fresh AdamW; returns the number of unreadable rows skipped."""
    w = cfg.warmup
    rng = random.Random(cfg.seed * 7 + acc.process_index)
    opt = torch.optim.AdamW(adapter.trainable_parameters(), lr=w.lr)
    bar = tracking.progress_bar(cfg, acc, total=w.steps, desc="warm-up")
    skipped = 0
    for i in range(w.steps):
        batch, bad = warmup_batch(cfg, rows, rng)
        skipped += bad
        batch = thoughts.drop_thoughts(batch, w.thought_dropout, cfg.seed * 100_003 + i)  # TON (0: as is)
        loss = adapter.supervised_loss(batch)
        acc.backward(loss)
        acc.clip_grad_norm_(adapter.trainable_parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        bar.update(1)
        bar.set_postfix(loss=f"{loss.item():.3f}")
    bar.close()
    return skipped


def warmup_batch(cfg: TrainConfig, rows, rng: random.Random) -> tuple[list[dict], int]:
    """``warmup.batch_size`` rows drawn without replacement, and the number of unreadable rows skipped; with
    ``warmup.target_column`` each is a training row with ``target`` from ``warmup.target_template``."""
    w = cfg.warmup
    batch = []
    skipped = 0
    n = len(rows)
    for i in rng.sample(range(n), min(n, w.batch_size + MAX_CONSECUTIVE_BAD_ROWS)):
        if len(batch) == min(w.batch_size, n):
            break
        try:
            row = rows[i]
            if w.target_column:
                where = row_name(cfg, rows, "train", i)
                row = dict(row, target=warmup_target(row, w.target_column, w.target_template, where))
        except DataError as e:
            skipped += 1
            logger.warning("mmgrpo: skipped warm-up row: %s", e)
            continue
        batch.append(row)
    if not batch:
        raise DataError("no warm-up row could be read; check the data (the first one's error is logged above)")
    return batch, skipped


def read_rows(data, indices: list[int], bad: set[int]) -> tuple[list[dict], int]:
    """Rows ``indices`` of ``data`` and the number skipped: a row that cannot be read is skipped (warned, added
    to ``bad``) for the next one in file order; :data:`MAX_CONSECUTIVE_BAD_ROWS` in a row stop the run."""
    n = len(data)
    rows = []
    skipped = 0
    for i in indices:
        for attempt in range(min(n, MAX_CONSECUTIVE_BAD_ROWS)):
            j = (i + attempt) % n
            if j in bad:
                skipped += 1
                continue
            try:
                rows.append(data[j])
                break
            except DataError as e:
                bad.add(j)
                skipped += 1
                logger.warning("mmgrpo: skipped row: %s", e)
        else:
            raise DataError(f"{min(n, MAX_CONSECUTIVE_BAD_ROWS)} rows in a row could not be read; check the data")
    return rows, skipped
