"""Rewards of tool-using agents: DeepEyes' accuracy + format + conditional tool bonus; an environment's return.

DeepEyes (Zheng et al. 2025, "DeepEyes: Incentivizing 'Thinking with Images' via Reinforcement Learning",
arXiv 2505.14362; ``Visual-Agent/DeepEyes`` ``verl/utils/reward_score/vl_agent.py`` ``compute_score``)::

    R = 0.8·acc + 0.2·fmt + 1.2·tool
    fmt  = −1 if the tags are unbalanced (``<think>``/``</think>``; ``<answer>``/``</answer>`` after the last
           ``</think>``; DeepEyes' vision-token pairs, here ``<tool_call>``/``</tool_call>``) or the answer is
           1000 characters or longer (then acc = 0 too), else 0
    tool = 1 if the trajectory made at least one tool call AND acc > 0.5, else 0

The conditional bonus is the point (paper §3.3 as summarised in the anchors): without it zooming dies out; an
unconditional bonus makes the policy zoom always, right or wrong.

Departures. ``acc`` comes from one of our accuracy rewards (``accuracy_reward``, default the exact-match
``accuracy``; ``math_accuracy``, ``multiple_choice``, ``box_iou``... work too), not from DeepEyes' LLM judge
(Qwen2.5-72B-Instruct). The tool count is read from the ``tool_calls`` column (an int per sample) that the
multi-turn rollout fills, instead of counting vision tokens in the response. The three weights are options.
"""

from __future__ import annotations

import math
from typing import Any

from ._common import column
from .parsing import completion_text
from .registry import load_reward, register_reward

ROLLOUT_NEEDS = {"deepeyes": "rollout.tools", "otc": "rollout.tools", "env_return": "rollout.environment"}
"""The rewards here that read what a multi-turn rollout records (``tool_calls``, ``turn_rewards``), and the setting
that makes one: checked at load (``mmgrpo.loader``), before any model is built."""

TOOL_CALLS = "the number of tool calls of each sample, filled by the multi-turn rollout: set rollout.tools"
"""What the ``tool_calls`` column of :func:`deepeyes` and :func:`~.tool_efficiency.otc` holds (their error)."""

MAX_ANSWER_CHARS = 1000
"""DeepEyes scores an answer this long or longer as wrong and badly formatted."""


@register_reward(
    "deepeyes",
    "DeepEyes: 0.8·acc + 0.2·fmt + 1.2·tool, the tool bonus only when a tool was called and the answer is right",
)
def deepeyes(
    completions: list,
    *,
    prompts: list | None = None,
    accuracy_reward: str = "accuracy",
    accuracy_kwargs: dict | None = None,
    acc_weight: float = 0.8,
    format_weight: float = 0.2,
    tool_weight: float = 1.2,
    acc_threshold: float = 0.5,
    tool_calls_key: str = "tool_calls",
    **columns: Any,
) -> list[float | None]:
    """DeepEyes' reward shape (module docstring).

    ``accuracy_reward`` (a reward name or spec, built with ``accuracy_kwargs``) scores acc on the same batch and
    columns; a sample it scores ``None`` (no ground truth) is ``None`` here. ``tool_calls_key`` names the column
    with each sample's number of tool calls (filled by the multi-turn rollout).

    Source: DeepEyes (arXiv 2505.14362), ``Visual-Agent/DeepEyes`` ``verl/utils/reward_score/vl_agent.py``
    ``compute_score``; acc from our accuracy rewards instead of its LLM judge.
    """
    calls = column(columns, tool_calls_key, "deepeyes", len(completions), TOOL_CALLS)
    acc_fn = load_reward(accuracy_reward, **(accuracy_kwargs or {}))
    accs = acc_fn(completions, prompts=prompts, **columns)
    out: list[float | None] = []
    for completion, acc, n_calls in zip(completions, accs, calls):
        if acc is None or (isinstance(acc, float) and math.isnan(acc)):
            out.append(None)
            continue
        fmt, too_long = deepeyes_format(completion_text(completion))
        acc = 0.0 if too_long else float(acc)
        tool = 1.0 if int(n_calls or 0) >= 1 and acc > acc_threshold else 0.0
        out.append(acc_weight * acc + format_weight * fmt + tool_weight * tool)
    return out


def deepeyes_format(text: str) -> tuple[float, bool]:
    """``(fmt, answer_too_long)``: fmt = −1 for unbalanced tags or an answer of ``MAX_ANSWER_CHARS`` or more, else
    0 (module docstring)."""
    bad = text.count("<think>") != text.count("</think>")
    bad |= text.count("<tool_call>") != text.count("</tool_call>")
    after_think = text.split("</think>")[-1]
    bad |= after_think.count("<answer>") != after_think.count("</answer>")
    answer = text.split("<answer>")[-1].split("</answer>")[0].strip()
    too_long = len(answer) >= MAX_ANSWER_CHARS
    return (-1.0 if bad or too_long else 0.0), too_long


@register_reward(
    "env_return",
    "the environment's return: the sum of the turn rewards of a rollout.environment trajectory (verl-agent's "
    "episode reward)",
)
def env_return(
    completions: list, *, prompts: list | None = None, turn_rewards_key: str = "turn_rewards", **columns: Any
) -> list[float | None]:
    """R_b = Σ_s r_{b,s}, the summed rewards of the environment's steps (``turn_rewards``, filled by the multi-turn
    rollout): what verl-agent's GRPO trains on in its environments (``episode_rewards``), so ``algorithm.credit:
    trajectory`` sees the game's return. Under ``algorithm.credit: gigpo`` the turn rewards already make the episode
    return; set ``algorithm.credit_args.outcome_on_last_turn: false`` there, or it is counted twice (the config check
    says so).

    Source: verl-agent (``langfengQ/verl-agent``), ``gigpo/core_gigpo.py``: ``episode_rewards`` is the sum of the
    environment's step rewards, the score GRPO and GiGPO's episode groups normalise.
    """
    what = "each trajectory's per-turn environment rewards, filled by a multi-turn rollout with rollout.environment"
    per_turn = column(columns, turn_rewards_key, "env_return", len(completions), what)
    return [float(sum(float(r) for r in rewards)) for rewards in per_turn]
