"""Line world: a small environment of one's own, named by reference from a config (docs/agents.md, "Your own
environment").

The policy stands on a line of ``length`` cells and must reach the goal cell. Each turn it answers with
``<action>left</action>`` or ``<action>right</action>``; the environment moves it one cell and says where it stands.
A row's integer ``seed`` column fixes the start and the goal, so the G trajectories of a row play the same level.

Rewards: ``goal_reward`` on the step that reaches the goal (the episode ends), ``step_reward`` on every other step;
the episode also ends after ``max_steps`` actions. A reply without a valid action is not an exception: the
observation says so and has ``error`` set, the position does not change (the protocol's invalid action).

Use it as ``rollout.environment: line_world:LineWorld`` (the class, built once per trajectory with
``rollout.environment_args``) or ``rollout.environment: line_world:make_line_world()`` (a function that builds it);
``line_world.yaml`` next to this file trains on it.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

from mmgrpo.tools import Observation, parse_action

ACTIONS = ("left", "right")


class LineWorld:
    """Reach the goal on a line of ``length`` cells, one ``left`` / ``right`` a turn (module docstring)."""

    def __init__(self, length: int = 7, max_steps: int = 6, goal_reward: float = 1.0, step_reward: float = -0.1):
        if length < 2:
            raise ValueError(f"length must be >= 2 (a start and a goal), got {length}")
        self.length, self.max_steps = length, max_steps
        self.goal_reward, self.step_reward = goal_reward, step_reward
        self.position = self.goal = self.steps = 0

    def reset(self, row: Mapping[str, Any]) -> Observation:
        """Start the level of ``row["seed"]``: the start and the goal, two distinct cells."""
        rng = random.Random(int(row["seed"]))
        self.position, self.goal = rng.sample(range(self.length), 2)
        self.steps = 0
        return self.observe()

    def step(self, action_text: str) -> tuple[Observation, float, bool]:
        """Move one cell by the action in ``action_text``; ``(observation, reward, done)``."""
        action, why = parse_action(action_text, ACTIONS)
        self.steps += 1
        if action is None:
            return self.observe(error=why), self.step_reward, self.steps >= self.max_steps
        self.position = max(0, min(self.length - 1, self.position + (1 if action == "right" else -1)))
        if self.position == self.goal:
            return self.observe(), self.goal_reward, True
        return self.observe(), self.step_reward, self.steps >= self.max_steps

    def observe(self, error: str | None = None) -> Observation:
        """Where the player and the goal stand, as text (and the error of an invalid action)."""
        text = f"You are at cell {self.position}, the goal is at cell {self.goal}. Move left or right."
        if error is not None:
            text = f"Invalid action ({error}). {text}"
        return Observation(text=text, error=error)


def make_line_world(length: int = 7, max_steps: int = 6) -> LineWorld:
    """A factory: ``rollout.environment: line_world:make_line_world()`` calls it once per trajectory."""
    return LineWorld(length=length, max_steps=max_steps)
