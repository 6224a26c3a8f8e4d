"""``gui``: episodes of the synthetic phone app (``mmgrpo.tools.GuiApp``, environment ``gui``) for multi-turn GRPO /
GiGPO of a vision-language GUI agent, Mobile-R1's setting (arXiv 2506.20332, seed ``002:313``) in miniature.

Each row is an episode seed: the app draws from it one of ten tasks ("turn on wifi", "turn off airplane", "send
hi", …), the start screen (home, settings or messages), the settings list's scroll position and the switches. The
policy reads the task from the first observation's text and the screen from the rendered image, and writes one
action per assistant turn (``<action>tap wifi</action>``, ``<action>type hi</action>``, ``<action>scroll
down</action>``, ``<action>back</action>``). A task takes 1–4 actions (2.3 on average over seeds 0–1999); a
uniformly random choice among the actions that matter (:func:`~mmgrpo.tools.gui.candidate_actions`) completes
about 5 % of them in 5 steps.

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

from mmgrpo.config import ConfigError, Range
from mmgrpo.plugins import TASKS, TaskSpec
from mmgrpo.tasks.sokoban import RANDOM_PLAYS, SCAN_LIMIT, held_out
from mmgrpo.tools.gui import GuiApp, candidate_actions, parse_gui_action
from mmgrpo.types import Transcript

PROMPT = "Phone."


@dataclass
class GuiArgs:
    """Options under ``task.args`` for ``task.name: gui`` (``max_steps`` as ``rollout.environment_args``)."""

    max_steps: Annotated[int, Range(ge=1)] = 5
    """Actions per episode (``rollout.environment_args.max_steps``; ``rollout.max_turns`` should equal it)."""
    train_size: Annotated[int, Range(ge=1)] = 2000
    """Rows in the train split (episodes repeat, as the seeds give them)."""
    eval_size: Annotated[int, Range(ge=1)] = 100
    """Rows in the held-out split (episodes repeat; none is a train episode)."""
    eval_fraction: Annotated[float, Range(gt=0.0, lt=1.0)] = 0.3
    """Share of the distinct episodes held out (by a hash of the episode)."""
    warmup_turns: Annotated[int, Range(ge=1)] = 5
    """Actions per warm-up target at most, each a turn (fewer when the task is done)."""
    warmup_expert_eps: Annotated[float, Range(ge=0.0, le=1.0)] = 0.25
    """ε of the warm-up's noisy expert: the share of target actions drawn uniformly from the candidate actions."""
    prompt: str = PROMPT
    """The text each row carries (the first observation's text, with the task, follows it)."""
    seed: int = 4321
    """Base of the episode seeds: seed·10⁶ + i."""


class GuiTask:
    """See the module docstring."""

    def __init__(self, args: GuiArgs):
        try:
            self.app = GuiApp(max_steps=args.max_steps)
        except ValueError as e:
            raise ConfigError(f"task.args: {e}") from None
        self.args = args
        self._train, self._eval = self._split()

    def _row(self, seed: int) -> dict:
        self.app.reset({"seed": seed})
        solution = self.app.shortest_solution()
        return {"prompt": self.args.prompt, "seed": seed, "task": self.app.task, "min_moves": len(solution or [])}

    def _split(self) -> tuple[list[dict], list[dict]]:
        a = self.args
        train, held = [], []
        for i in range(SCAN_LIMIT):
            if len(train) >= a.train_size and len(held) >= a.eval_size:
                return train, held
            seed = a.seed * 10**6 + i
            self.app.reset({"seed": seed})
            split = held if held_out(self.app.episode_text(), a.eval_fraction) else train
            if len(split) < (a.eval_size if split is held else a.train_size):
                split.append(self._row(seed))
        raise ConfigError(
            f"task.args: {SCAN_LIMIT} seeds give {len(held)} held-out rows and {len(train)} train rows; set "
            "eval_fraction inside (0, 1) so both splits get episodes"
        )

    def train_rows(self) -> list[dict]:
        return self._train

    def eval_rows(self) -> list[dict]:
        return self._eval

    def warmup_rows(self, seed: int) -> list[dict]:
        """ε-noisy expert targets (module docstring), one per train row, played through the app; the same for the
        same ``seed``."""
        rng = random.Random(seed)
        rows = []
        for row in self._train:
            self.app.reset(row)
            target = []
            while len(target) < self.args.warmup_turns and not self.app.done:
                noisy = rng.random() < self.args.warmup_expert_eps
                action = rng.choice(candidate_actions(self.app.goal)) if noisy else self.app.shortest_solution()[0]
                target.append(f"<action>{action}</action>")
                self.app.step(target[-1])
            rows.append(dict(row, target=target))
        return rows

    def play(self, output, row: dict) -> tuple[bool, int, int]:
        """Replay one output's turns in the row's episode: (completed, actions taken, invalid actions). A plain
        string (not :class:`~mmgrpo.types.Transcript`) is split into turns at newlines."""
        turns = output.turns if isinstance(output, Transcript) else tuple(str(output).split("\n"))
        if isinstance(output, Transcript) and output.cut_last:
            turns = turns[:-1]
        self.app.reset(row)
        steps = invalid = 0
        for turn in turns:
            if self.app.done:
                break
            obs, _, _ = self.app.step(turn)
            steps += 1
            invalid += int(obs.invalid)
        return self.app.completed, steps, invalid

    def random_success(self, rows: list[dict]) -> float:
        """A uniformly random mover's success on ``rows`` (``RANDOM_PLAYS`` plays each over the candidate actions of
        the row's goal, seeded by the row)."""
        wins = 0
        for row in rows:
            rng = random.Random(row["seed"])
            for _ in range(RANDOM_PLAYS):
                self.app.reset(row)
                while not self.app.done:
                    self.app.step(f"<action>{rng.choice(candidate_actions(self.app.goal))}</action>")
                wins += self.app.completed
        return wins / (RANDOM_PLAYS * max(1, len(rows)))

    def score(self, outputs: list, rows: list[dict]) -> dict[str, float]:
        """success_rate, mean_steps, invalid_rate, first_move_share, random_success (module docstring)."""
        played = [self.play(o, r) for o, r in zip(outputs, rows)]
        n, steps = max(1, len(played)), sum(p[1] for p in played)
        first = [first_action(o) for o in outputs]
        return {
            "success_rate": sum(p[0] for p in played) / n,
            "mean_steps": steps / n,
            "invalid_rate": sum(p[2] for p in played) / max(1, steps),
            "first_move_share": max(map(first.count, set(first)), default=0) / n,
            "random_success": self.random_success(rows),
        }


def first_action(output) -> tuple[str, str] | None:
    """The (verb, argument) of an output's first turn (``None``: no valid action)."""
    turns = output.turns if isinstance(output, Transcript) else tuple(str(output).split("\n"))
    return parse_gui_action(turns[0])[0] if turns else None


build_gui_task = TASKS.register("gui")(TaskSpec(args=GuiArgs, cls=GuiTask, load=lambda a, seed: GuiTask(a)))
