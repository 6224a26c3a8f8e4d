"""Thought dropout for the supervised warm-up (TON, 2025, "Think or Not? Selective Reasoning via
Reinforcement Learning for Vision-Language Models", arXiv 2505.16854; kokolerk/TON).

TON's SFT stage replaces the reasoning of a share of the training targets with an empty think block, so that the
model learns that skipping the thought is a valid output and GRPO can later choose when to think. Here each warm-up
target that holds a ``<think>…</think>`` block is, with probability ``rate``, rewritten with that block emptied to
``<think>\\n\\n</think>`` (TON's empty thought); targets without a think block are unchanged. The draw is seeded, so
the same rows are dropped on every process and on resume. Departure: TON rewrites its SFT data files offline; this
applies the same rewrite to the warm-up rows in memory.
TON's rate is 0.5 as a secondary summary of the paper reports it (the shipped
``configs/variant_thought_dropout.yaml``); the paper's own text was not read here.
"""

from __future__ import annotations

import random
import re

THINK = re.compile(r"<think>.*?</think>", re.DOTALL)
EMPTY_THOUGHT = "<think>\n\n</think>"


def drop_thoughts(rows: list[dict], rate: float, seed: int, column: str = "target") -> list[dict]:
    """Copies of ``rows`` whose ``column`` has its think blocks emptied with probability ``rate`` per row."""
    if not 0.0 <= rate <= 1.0:
        raise ValueError(f"warmup.thought_dropout: must be in [0, 1], got {rate}")
    if rate == 0.0:
        return rows
    rng = random.Random(seed * 7919 + 1)
    out = []
    for row in rows:
        text = row.get(column)
        if isinstance(text, str) and THINK.search(text) and rng.random() < rate:
            row = {**row, column: THINK.sub(EMPTY_THOUGHT, text)}
        out.append(row)
    return out
