"""OTC: reward a right answer more the fewer tool calls it took (OTC-PO's tool-integrated reward).

OTC (Wang et al. 2025, "OTC: Optimal Tool Calls via Reinforcement Learning", arXiv 2504.14870, §3, the
tool-integrated reward). With m the tool calls of a trajectory, n the optimal (fewest) calls for the question and
r_φ the correctness reward, the trained reward is::

    r^tool_φ(q, y) = α · r_tool · r_φ(q, y)

    OTC-PPO (no group):    r_tool = cos(m·π / (2m + c))
    OTC-GRPO (n from the group):
        f(m, n) = 0 if m = n = 0;  m if n = 0;  2nm / (m + n) otherwise
        r_tool  = 1 if f(m, n) = n = 0;  cos(m·π / (2m + c)) if n = 0;  sin(f(m, n)·π / (2n)) otherwise

so a right answer with the fewest calls of its group scores α·r_φ, one with more calls less, and a wrong one 0
(r_φ = 0); c smooths the decay (c = 1: m = 1 → cos(π/3) = 0.5 when the group solved it without a call). n is the
fewest calls among the group's correct samples (r_φ > ``acc_threshold``), as OTC-GRPO approximates the optimal
number from the rollouts of the question. The equations as a public re-implementation writes them (a verl reward
module, "OTC (Optimal Tool Call) Reward Implementation", ``compute_mapping_function`` / ``compute_tool_reward``),
which matches the summaries of the paper; the paper's own PDF was not retrieved here.

Departures (*our reading*): a group without a correct sample has no n; its samples use the OTC-PPO form
(n = 0), which only matters for a partial-credit r_φ (a 0/1 accuracy makes them 0 anyway). r_φ is one of our
accuracy rewards (``accuracy_reward``, default the exact-match ``accuracy``), m the ``tool_calls`` column the
multi-turn rollout fills (an int per sample), the group the ``group_index`` column the trainer adds.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any, Literal

from ._common import column, group_ids
from .agents import TOOL_CALLS
from .registry import load_reward, register_reward


def mapping(m: int, n: int) -> float:
    """OTC-GRPO's f(m, n): 0 if m = n = 0; m if n = 0; 2nm / (m + n) otherwise (module docstring)."""
    if n == 0:
        return float(m)
    return 2.0 * n * m / (m + n)


def tool_score(m: int, n: int | None, c: float = 1.0) -> float:
    """r_tool of a trajectory with ``m`` calls when the optimum is ``n`` (None: OTC-PPO, no optimum known)::

    n = None or n = 0:  1 if m = 0, else cos(m·π / (2m + c))
    n > 0:              sin(f(m, n)·π / (2n))
    """
    if not n:  # OTC-PPO, or OTC-GRPO with n = 0 (f(0, 0) = 0 = n gives 1; cos(0) = 1 agrees)
        return math.cos(m * math.pi / (2 * m + c))
    return math.sin(mapping(m, n) * math.pi / (2 * n))


def optimal_calls(calls: list[int], correct: list[bool], groups: list[Any]) -> list[int | None]:
    """n of each sample: the fewest calls among the correct samples of its group; None where the group has none."""
    best: dict[Any, int] = defaultdict(lambda: -1)
    for m, ok, g in zip(calls, correct, groups):
        if ok and (best[g] < 0 or m < best[g]):
            best[g] = m
    return [best[g] if best[g] >= 0 else None for g in groups]


@register_reward(
    "otc",
    "OTC-PO tool productivity: α · r_tool(m, n) · accuracy, r_tool = 1 at the group's fewest calls n of a right "
    "answer, sin/cos-decaying with more calls (arXiv 2504.14870)",
)
def otc(
    completions: list,
    *,
    prompts: list | None = None,
    accuracy_reward: str = "accuracy",
    accuracy_kwargs: dict | None = None,
    mode: Literal["grpo", "ppo"] = "grpo",
    alpha: float = 1.0,
    c: float = 1.0,
    acc_threshold: float = 0.5,
    tool_calls_key: str = "tool_calls",
    group_key: str = "group_index",
    **columns: Any,
) -> list[float | None]:
    """OTC's r^tool_φ = α · r_tool(m, n) · r_φ (module docstring).

    ``accuracy_reward`` (a reward name or spec, built with ``accuracy_kwargs``) gives r_φ on the same batch; a
    sample it scores ``None`` is ``None`` here. ``mode``: ``grpo`` (n = the fewest calls among the group's samples
    with r_φ > ``acc_threshold``) or ``ppo`` (no n: cos(m·π/(2m + c))). ``tool_calls_key`` names the column of
    each sample's number of tool calls (the multi-turn rollout's), ``group_key`` the group column (else equal
    prompts are a group).

    Source: OTC (arXiv 2504.14870), §3, OTC-PPO's and OTC-GRPO's r_tool and r^tool_φ = α·r_tool·r_φ.
    """
    if mode not in ("grpo", "ppo"):
        raise ValueError(f"reward 'otc': mode must be 'grpo' or 'ppo', got {mode!r}")
    if c <= 0:
        raise ValueError(f"reward 'otc': c must be > 0 (the cosine's smoothing constant), got {c}")
    calls = [int(m or 0) for m in column(columns, tool_calls_key, "otc", len(completions), TOOL_CALLS)]
    accs = load_reward(accuracy_reward, **(accuracy_kwargs or {}))(completions, prompts=prompts, **columns)
    known = [a is not None and not (isinstance(a, float) and math.isnan(a)) for a in accs]
    correct = [ok and float(a) > acc_threshold for ok, a in zip(known, accs)]
    groups = group_ids(prompts if prompts is not None else [None] * len(completions), columns, group_key)
    best = optimal_calls(calls, correct, groups) if mode == "grpo" else [None] * len(calls)
    return [alpha * tool_score(m, n, c) * float(a) if ok else None for m, n, a, ok in zip(calls, best, accs, known)]


__all__ = ["mapping", "optimal_calls", "otc", "tool_score"]
