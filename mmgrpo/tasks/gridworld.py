"""``gridworld``: levels of the visual grid world (``mmgrpo.tools.GridWorld``: walk the blue dot onto the red square)
for multi-turn GRPO / GiGPO with the built-in tiny model on a CPU.

The "grid world" form of the issue's visual multi-step game, beside :mod:`mmgrpo.tasks.sokoban`, whose splits,
noisy-expert warm-up and held-out metrics it shares (:class:`~mmgrpo.tasks.sokoban.SokobanTask`; only the game differs).
At the defaults (6×6 room with the wall border, so 4×4 floor; goal at least 2 moves away; 6 moves) a level takes 2–6
moves (3.1 on average), the default splits hold 128 distinct train levels and 53 held-out ones, and a uniformly random
mover wins 12 % of the held-out rows, so a random-initialised policy's groups are mostly all-lost and the warm-up is
what makes wins to compare. The winning move from any room is a move toward the goal: the policy must read where two
things stand in the image, not three things and a push. With the built-in tiny model that did not make reading easier:
after a 1500-step warm-up one seed of three opens levels according to the room (docs/agents.md, "The grid world").

Rows: ``{"prompt", "seed", "min_moves"}`` as Sokoban's; play with ``rollout.environment: gridworld``, whose
``environment_args`` must give this task's level options (``size``, ``min_distance``, ``max_steps``;
``tests/test_gridworld_task.py`` checks the shipped configs). Metrics: Sokoban's (``success_rate``: the player on the
goal within ``max_steps``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from mmgrpo.config import Range
from mmgrpo.plugins import TASKS, TaskSpec
from mmgrpo.tasks.sokoban import LevelTaskArgs, SokobanTask
from mmgrpo.tools.gridworld import GridWorld

PROMPT = (
    "Grid world. Walk onto the red square; you are the blue dot. Each turn, reply with one move: "
    "<action>up</action>, <action>down</action>, <action>left</action> or <action>right</action>."
)


@dataclass
class GridWorldArgs(LevelTaskArgs):
    """Options under ``task.args`` for ``task.name: gridworld`` (level options as ``rollout.environment_args``; the
    splits and warm-up as Sokoban's, :class:`~mmgrpo.tasks.sokoban.LevelTaskArgs`)."""

    size: Annotated[int, Range(ge=4)] = 6
    """Room side in cells, the wall border included (``rollout.environment_args.size``)."""
    min_distance: Annotated[int, Range(ge=1)] = 2
    """Fewest moves from the player to the goal (Manhattan distance; ``rollout.environment_args.min_distance``)."""
    max_steps: Annotated[int, Range(ge=1)] = 6
    """Moves per episode (``rollout.environment_args.max_steps``; ``rollout.max_turns`` should equal it)."""
    warmup_turns: Annotated[int, Range(ge=1)] = 6
    """Moves per warm-up target at most, each a turn (fewer when a move wins); as many as ``max_steps``."""
    prompt: str = PROMPT
    """The instruction each row carries (the first observation's text follows it)."""


class GridWorldTask(SokobanTask):
    """Sokoban's task on the grid world (module docstring)."""

    @staticmethod
    def make_game(args: GridWorldArgs) -> GridWorld:
        return GridWorld(size=args.size, min_distance=args.min_distance, max_steps=args.max_steps)


build_gridworld_task = TASKS.register("gridworld")(
    TaskSpec(args=GridWorldArgs, cls=GridWorldTask, load=lambda a, seed: GridWorldTask(a))
)
