"""A task's held-out metrics scored by registered rewards through the trainer's path (``score_rows``): the dataset
and t2i_prompts tasks' ``task.args.eval_rewards`` and the built-in tasks' fixed metrics."""

from __future__ import annotations

import random

import torch

from mmgrpo.config import ConfigError


class EvalRewards:
    """A task's own evaluation metrics ``[{name, kwargs}]``: checked when the task is built (registered names and
    their kwargs; no module imported, no model loaded), loaded at the first :meth:`score` (a model-based reward
    such as PickScore loads its weights then, not at ``--dry-run``, but its ``load_check`` finds them at build:
    :func:`mmgrpo.rewards.registry.reward_load_check`)."""

    def __init__(self, specs: list[dict], where: str):
        from mmgrpo.rewards.registry import REWARDS, check_reward_spec, reward_load_check

        self.specs, self._runner = [], None
        for i, spec in enumerate(specs):
            if not isinstance(spec, dict) or "name" not in spec:
                raise ConfigError(f"{where}[{i}]: expected {{name: ..., kwargs: {{}}}}, got {spec!r}")
            if spec["name"] in REWARDS:
                try:
                    check_reward_spec(spec["name"], spec.get("kwargs", {}))
                except ValueError as e:
                    raise ConfigError(f"{where}[{i}] ({spec['name']}): {e}") from None
                problem = reward_load_check(spec["name"], spec.get("kwargs") or {})
                if problem is not None:
                    raise ConfigError(f"{where}[{i}] ({spec['name']}): cannot load its weights: {problem}")
            self.specs.append((spec["name"], dict(spec.get("kwargs") or {})))

    def __bool__(self) -> bool:
        return bool(self.specs)

    def scores(self, outputs: list, rows: list[dict]) -> torch.Tensor:
        """Every metric of every output, scored by :func:`mmgrpo.rewards.score_rows` as training scores (the same
        columns and calling convention, with the reward columns the outputs carry:
        :func:`mmgrpo.evaluation.output_columns`). Shape: ``[n, K]`` float32, NaN where a metric does not apply."""
        from mmgrpo.evaluation import output_columns
        from mmgrpo.rewards import RewardRunner, score_rows

        if self._runner is None:  # threads, no deadline: a held-out metric runs as long as it needs
            self._runner = RewardRunner([(n, 1.0, kw) for n, kw in self.specs], isolation="thread", timeout_s=None)
        return score_rows(self._runner, outputs, rows, 1, output_columns(outputs), group_index=True)[0]

    def score(self, outputs: list, rows: list[dict]) -> dict[str, float]:
        """Mean of each metric over ``rows`` (``None`` values left out; NaN when none is left)."""
        scores = self.scores(outputs, rows)  # [n, K]
        return {name: float(scores[:, k].nanmean()) for k, (name, _) in enumerate(self.specs)}


__all__ = ["EvalRewards"]


def first_call_arguments(output: str, tool: str) -> dict | None:
    """The arguments of the first well-formed tool call in ``output`` when it calls ``tool`` (None otherwise)."""
    from mmgrpo.tools import parse_tool_calls

    calls, _ = parse_tool_calls(output)
    return calls[0].arguments if calls and calls[0].name == tool else None


def tool_answer_scores(
    accuracy: torch.Tensor, outputs: list[str], hits_name: str, hits: list[bool], chance: float
) -> dict[str, float]:
    """The held-out metrics of a tool task (zoom, video_find): ``accuracy`` (per-row scores [n], NaN as 0),
    ``tool_call_rate``, ``hits_name`` (the share of ``hits``: the first call aimed where the row needs it) and
    ``chance``."""
    n = max(1, len(outputs))
    return {
        "accuracy": float(accuracy.nan_to_num(0.0).mean()),
        "tool_call_rate": sum("<tool_call>" in o for o in outputs) / n,
        hits_name: sum(hits) / n,
        "chance": chance,
    }


def warmup_call_pick(rng: random.Random, own: int, n: int, hit_rate: float | None) -> int:
    """Which of ``n`` targets a tool task's warm-up call aims at (zoom's box, video_find's span): the row's own
    (index ``own``) with probability ``hit_rate``, else one of the other n − 1 uniformly; ``hit_rate`` None is 1 / n,
    a draw that ignores the row. With one target it is the row's own."""
    rate = 1 / n if hit_rate is None else hit_rate
    if n > 1 and rng.random() >= rate:
        return rng.choice([i for i in range(n) if i != own])
    return own
