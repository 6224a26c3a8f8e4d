"""The optional supervised warm-up before GRPO (``warmup.*``): a few supervised steps on the warm-up rows.

The rows are the task's warm-up rows, or training rows with a target built from ``warmup.target_column`` and
``warmup.target_template``; with ``warmup.thought_dropout`` a share of the targets lose their thought
(:mod:`mmgrpo.thoughts`, TON). The trainer evaluates the warmed-up policy as its own stage (``eval/warmup/*``).
"""

from __future__ import annotations

import logging
import random
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from accelerate import Accelerator

from mmgrpo import thoughts, tracking
from mmgrpo.config import TrainConfig
from mmgrpo.optim import names_error
from mmgrpo.preflight import row_name, warmup_target
from mmgrpo.types import DataError, SupervisedLoss

logger = logging.getLogger(__name__)
MAX_CONSECUTIVE_BAD_ROWS = 100  # unreadable rows in a row before the run stops with a DataError


def supervised_warmup(cfg: TrainConfig, acc: Accelerator, adapter: SupervisedLoss, rows) -> int:
    """``warmup.steps`` supervised steps with a fresh AdamW over the trainable parameters (those ``warmup.trainable``
    names, when given); returns the number of unreadable rows skipped."""
    if not cfg.warmup.trainable:
        return _supervised_steps(cfg, acc, adapter, rows, list(adapter.trainable_parameters()))
    with only_trainable(adapter.model, cfg.warmup.trainable, freeze=acc.num_processes == 1) as params:
        return _supervised_steps(cfg, acc, adapter, rows, params)


@contextmanager
def only_trainable(model: torch.nn.Module, patterns: list[str], freeze: bool = True) -> Iterator[list]:
    """The trainable parameters of ``model`` whose name contains one of ``patterns``; inside, the other trainable
    parameters are ``requires_grad=False`` (restored after), so the backward computes no gradient for them.
    ``freeze=False`` (several processes: DDP expects every gradient it was built with) leaves them as they are; they
    are still not in the list, so the warm-up does not move them either."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    unmatched = [k for k in patterns if not any(k in n for n, _ in named)]
    if unmatched:
        raise names_error("warmup.trainable", unmatched, [n for n, _ in named])
    chosen = [p for n, p in named if any(k in n for k in patterns)]
    others = [p for n, p in named if not any(k in n for k in patterns)]
    for p in others if freeze else []:
        p.requires_grad_(False)
    try:
        yield chosen
    finally:
        for p in others:
            p.requires_grad_(True)
            p.grad = None  # without freeze they accumulated the warm-up's gradients: GRPO must not see them


def _supervised_steps(cfg: TrainConfig, acc: Accelerator, adapter: SupervisedLoss, rows, params: list) -> int:
    w = cfg.warmup
    rng = random.Random(cfg.seed * 7 + acc.process_index)
    opt = torch.optim.AdamW(params, lr=w.lr)
    bar = tracking.progress_bar(cfg, acc, total=w.steps, desc="warm-up")
    skipped = 0
    for i in range(w.steps):
        batch, bad = warmup_batch(cfg, rows, rng)
        skipped += bad
        batch = thoughts.drop_thoughts(batch, w.thought_dropout, cfg.seed * 100_003 + i)  # TON (0: as is)
        loss = adapter.supervised_loss(batch)
        acc.backward(loss)
        acc.clip_grad_norm_(params, 1.0)
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
