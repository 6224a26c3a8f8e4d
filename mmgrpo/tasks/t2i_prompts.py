"""A text-to-image prompt dataset task: prompts from files, held-out evaluation with reward functions.

``task.name: t2i_prompts`` reads prompts as Flow-GRPO's datasets ship them (``dataset/pickscore/train.txt``: one
prompt per line) or as JSON lines (``{"prompt": ..., other columns...}``; the extra columns reach the rewards, e.g.
GenEval metadata). Evaluation scores the deterministic images of the held-out prompts with ``eval_rewards``
(registry names, ``package.module:function`` or entry points, as in ``rewards:``), reported as
``eval/<stage>/<name>``. The paper-scale recipes (``configs/flow_sd35m_recipe.yaml``, ``flow_flux_dev_recipe.yaml``)
use it.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mmgrpo.config import ConfigError
from mmgrpo.plugins import TASKS, TaskSpec
from mmgrpo.tasks.eval_rewards import EvalRewards
from mmgrpo.types import DataError


@dataclass
class T2IPromptsArgs:
    """Options under ``task.args`` for ``task.name: t2i_prompts``."""

    train_path: str = ""
    """Training prompts: a .txt file (one prompt per line) or .jsonl (objects with a ``prompt`` key)."""
    eval_path: str | None = None
    """Held-out prompts (same formats); None holds out ``eval_size`` prompts of train_path instead."""
    eval_size: int = 64
    """Held-out prompts to evaluate (the first ones of eval_path, or a seeded sample of train_path)."""
    eval_rewards: list[dict[str, Any]] = field(default_factory=list)
    """Evaluation metrics: [{name, kwargs}], each reported as eval/<stage>/<name> (mean over held-out rows)."""


def read_prompts(path: str, option: str = "task.args.train_path") -> list[dict]:
    """Rows from a .txt (one prompt per line, blank lines skipped) or .jsonl file; ``option`` names the config
    field in messages."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(
            f"{option}: prompt file {path!r} does not exist (relative paths resolve against the working directory "
            f"{str(Path.cwd())!r}); get the prompt set the config's comments name, or give your own .txt / .jsonl"
        )
    if p.suffix == ".jsonl":
        rows = []
        for i, line in enumerate(p.read_text().splitlines()):
            if line.strip():
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as e:
                    raise DataError(
                        f"{path} line {i + 1}: not valid JSON ({e.msg} at column {e.colno}); write one JSON object "
                        'per line, e.g. {"prompt": "a red cube"}'
                    ) from None
                if not isinstance(row, dict) or "prompt" not in row:
                    raise ConfigError(f"{option}: {path} line {i + 1} has no 'prompt' key")
                rows.append(row)
        return rows
    return [{"prompt": line.strip()} for line in p.read_text().splitlines() if line.strip()]


class T2IPromptsTask:
    """``Task`` over prompt files; ``score`` averages ``eval_rewards`` over the held-out images."""

    def __init__(self, args: T2IPromptsArgs, seed: int = 0):
        rows = read_prompts(args.train_path)
        if args.eval_path:
            self._train, self._eval = rows, read_prompts(args.eval_path, "task.args.eval_path")[: args.eval_size]
        else:
            order = list(range(len(rows)))
            random.Random(seed).shuffle(order)
            held = set(order[: args.eval_size])
            self._train = [r for i, r in enumerate(rows) if i not in held]
            self._eval = [rows[i] for i in sorted(held)]
        if not self._train:
            raise ConfigError(f"task.args.train_path: no training prompts left in {args.train_path}")
        self._metrics = EvalRewards(args.eval_rewards, "task.args.eval_rewards")  # loaded at the first score

    def train_rows(self) -> list[dict]:
        return self._train

    def eval_rows(self) -> list[dict]:
        return self._eval

    def score(self, outputs: list, rows: list[dict]) -> dict[str, float]:
        return self._metrics.score(outputs, rows)


def _load(a: T2IPromptsArgs, seed: int) -> T2IPromptsTask:
    """The task from its checked ``task.args``."""
    if not a.train_path:
        raise ConfigError("task.args.train_path: give a .txt (one prompt per line) or .jsonl prompt file")
    return T2IPromptsTask(a, seed)


build_t2i_prompts = TASKS.register("t2i_prompts")(TaskSpec(args=T2IPromptsArgs, cls=T2IPromptsTask, load=_load))

__all__ = ["T2IPromptsArgs", "T2IPromptsTask", "build_t2i_prompts", "read_prompts"]
