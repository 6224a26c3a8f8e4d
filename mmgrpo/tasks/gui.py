"""``gui``: episodes of the synthetic phone app (``mmgrpo.tools.GuiApp``, environment ``gui``) for multi-turn GRPO /
GiGPO of a vision-language GUI agent, Mobile-R1's setting (arXiv 2506.20332, seed ``002:313``) in miniature.

Each row is an episode seed: the app draws from it one of ten tasks ("turn on wifi", "turn off airplane", "send
hi", …), the start screen (home, settings or messages), the settings list's scroll position and the switches. The
policy reads the task from the observation's text and the screen from the rendered image, and writes one
action per assistant turn (``<action>tap wifi</action>``, ``<action>type hi</action>``, ``<action>scroll
down</action>``, ``<action>back</action>``). A task takes 1–4 actions (2.3 on average over seeds 0–1999); a
uniformly random choice among the actions that matter (:func:`~mmgrpo.tools.gui.candidate_actions`) completes
about 5 % of them in 5 steps.

What the tiny model needs (docs/agents.md, "The GUI task"): the task in every observation (the app's
``task_every_turn``, as Mobile-R1's prompt repeats the instruction each step) and a long enough warm-up. With the task
in the first observation only and 100 warm-up steps, greedy play repeated one action whatever the task (held-out
success 0.117, 3 seeds) and 12–24 RL steps did not move it. Every task can also be done without reading the screen
(``back``, then a fixed plan of at most 3 actions per task, completes all of them), so held-out success measures the
task, not screen reading; the shortest path, which the warm-up's expert shows, needs the screen.

Rows: ``{"prompt", "seed", "task", "min_moves"}``; play with ``rollout.environment: gui``, whose ``environment_args``
must give ``max_steps`` as this task does (``tests/test_gui_task.py`` checks the shipped configs).

Splits: an episode (task, start screen, scroll position, switches: :meth:`GuiApp.episode_text`; 334 distinct ones)
is held out by a hash of its text (Sokoban's :func:`~mmgrpo.tasks.sokoban.held_out`), so no held-out episode is a
train episode; the same task from another start state can be in both.

Warm-up (``warmup_rows``): Mobile-R1's Stage 1 (format fine-tuning on annotated trajectories) as an ε-noisy expert,
teacher-forced through the real app: each target turn is, with probability 1 − ε, the first action of a shortest
solution from the current state (:meth:`GuiApp.shortest_solution`), else a uniformly random candidate action, until
the task is done or ``warmup_turns`` run out. The noisy turns leave the expert's trajectories with wrong steps to
recover from, as Mobile-R1's self-correction trajectories do.

Held-out metrics (``score``; each held-out episode played once, greedily): ``success_rate`` (task completed within
``max_steps``), ``mean_steps``, ``invalid_rate`` (turns without a valid action, per turn taken), ``first_move_share``
(the share of episodes opened with the most common first action: 1.0 when the policy ignores the task and screen)
and ``random_success`` (a uniformly random mover over the candidate actions, 32 plays per episode).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Annotated

from mmgrpo.config import Range
from mmgrpo.plugins import TASKS, TaskSpec
from mmgrpo.tasks.sokoban import LevelTaskArgs, SokobanTask
from mmgrpo.tools.gui import GuiApp, candidate_actions, parse_gui_action
from mmgrpo.types import Transcript

PROMPT = "Phone."


@dataclass
class GuiArgs(LevelTaskArgs):
    """Options under ``task.args`` for ``task.name: gui`` (``max_steps`` as ``rollout.environment_args``; the splits
    and warm-up as Sokoban's, :class:`~mmgrpo.tasks.sokoban.LevelTaskArgs`, over episodes instead of levels)."""

    max_steps: Annotated[int, Range(ge=1)] = 5
    """Actions per episode (``rollout.environment_args.max_steps``; ``rollout.max_turns`` should equal it)."""
    prompt: str = PROMPT
    """The text each row carries (the first observation's text, with the task, follows it)."""
    seed: int = 4321
    """Base of the episode seeds: seed·10⁶ + i."""


class GuiTask(SokobanTask):
    """Sokoban's task on the phone app (module docstring): its episodes, expert and random mover."""

    @staticmethod
    def make_game(args: GuiArgs) -> GuiApp:
        return GuiApp(max_steps=args.max_steps)

    def level_id(self) -> str:
        """The episode's identity: task, start screen, scroll position, switches (:meth:`GuiApp.episode_text`)."""
        return self.game.episode_text()

    def row_extra(self) -> dict:
        return {"task": self.game.task}

    def expert(self) -> str:
        """The first action of a shortest solution from the current state (:meth:`GuiApp.shortest_solution`)."""
        return self.game.shortest_solution()[0]

    def random_action(self, rng: random.Random) -> str:
        """A uniformly random action among those that matter to the episode's goal (:func:`candidate_actions`)."""
        return rng.choice(candidate_actions(self.game.goal))

    def won(self) -> bool:
        return self.game.completed

    @staticmethod
    def first_of(output) -> tuple[str, str] | None:
        return first_action(output)


def first_action(output) -> tuple[str, str] | None:
    """The (verb, argument) of an output's first turn (``None``: no valid action)."""
    turns = output.turns if isinstance(output, Transcript) else tuple(str(output).split("\n"))
    return parse_gui_action(turns[0])[0] if turns else None


build_gui_task = TASKS.register("gui")(TaskSpec(args=GuiArgs, cls=GuiTask, load=lambda a, seed: GuiTask(a)))
