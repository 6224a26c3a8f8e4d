"""``sokoban``: levels of the visual Sokoban (``mmgrpo.tools.Sokoban``) for multi-turn GRPO / GiGPO, small enough for
a tiny model on a CPU.

The game of verl-agent's visual GiGPO benchmark (``examples/gigpo_trainer/run_sokoban.sh``: 6×6 room, 1 box, 15 steps,
Qwen2.5-VL-3B; GiGPO ahead of GRPO there), made smaller: few reverse moves (``pulls``, default 4) make levels that
1–4 pushes solve (at 6×6: 57 % one move, 32 % two, 10 % three, 2 % four, over seeds 0–299), and ``max_steps`` is 5.
A uniformly random mover solves about 30 % of them in 5 steps, so a group of 8 trajectories mostly holds wins and
losses (GRPO's signal); reading the rendered image solves all of them.

Rows: ``{"prompt": the instruction, "seed": the level seed, "min_moves": its shortest solution}``. The policy
plays with ``rollout.environment: sokoban``, whose ``environment_args`` must give the level options of this task
(``size``, ``boxes``, ``pulls``, ``max_steps``; ``tests/test_sokoban_task.py`` checks the shipped configs).

Splits. A level (the room as text) is held out when the first 8 hex digits of its SHA-256 fall below
``eval_fraction`` of the range, so train and held-out rows share no level, not only no seed (at 6×6 with 4 pulls
about 400 distinct levels come out of 20 000 seeds, the short ones far more often). Seeds ``seed·10⁶ + i`` are
scanned in order and each becomes a row of its level's split until both are full, so levels repeat within a split
as the seeds give them and both splits follow the generator's mix of short and long levels.

Warm-up (``warmup_rows``): an ε-noisy expert, teacher-forced through the real game. Each train row's target is up
to ``warmup_turns`` assistant turns ``<action>d</action>``: with probability 1 − ε (``warmup_expert_eps``) ``d`` is
the first move of a shortest solution from the current room (:func:`expert_move`, a breadth-first search over
(player, boxes) states; gym_sokoban, on which verl-agent's Sokoban is built, searches the same state space backwards
to generate its levels), otherwise a uniformly random
move (every one is legal: walking into a wall leaves the room as it is); the move is played and the next turn is
chosen from the room it leaves, until the level is solved or the turns run out. It stands in for the prior a
pretrained VLM brings to verl-agent's Sokoban (Qwen2.5-VL reads the room and plays far better than random before RL):
meant to leave a policy above a random mover and below the solver, so that what GRPO adds is measured. With the
built-in tiny model it does not: greedy play after it is one sequence of moves on every level (docs/agents.md, "The
Sokoban task", and ``examples/sokoban_read_probe.py``). ε = 1 is the earlier format-only warm-up (uniformly random
moves whatever the room).

Held-out metrics (``score``; the trainer's evaluation plays each held-out level once, greedily, through the same
multi-turn rollout): ``success_rate`` (every box on a target within ``max_steps``), ``mean_steps`` (moves taken),
``invalid_rate`` (turns without a parsable action, per move taken), ``first_move_share`` (the share of levels
whose first move is the policy's most common first move: 1.0 when the greedy policy opens every level alike, i.e.
does not read the room) and ``random_success`` (a uniformly random
mover's success on the same levels, 32 plays each with a fixed seed: the reference a state-blind policy sits near).
The score replays the greedy turns (:class:`~mmgrpo.types.Transcript`) through the game, a turn cut before its end
token not taken, exactly as the rollout stepped them.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass
from typing import Annotated

from mmgrpo.config import ConfigError, Range
from mmgrpo.plugins import TASKS, TaskSpec
from mmgrpo.tools.env import parse_action
from mmgrpo.tools.gridworld import ACTIONS, Sokoban
from mmgrpo.types import Transcript

PROMPT = (
    "Sokoban. Push the brown box onto the red target; you are the blue dot. Each turn, reply with one move: "
    "<action>up</action>, <action>down</action>, <action>left</action> or <action>right</action>."
)
RANDOM_PLAYS = 32
"""Plays per held-out level of the uniformly random mover (``random_success``)."""
SCAN_LIMIT = 1_000_000
"""Seeds scanned at most before the task says a split cannot be filled."""


@dataclass
class LevelTaskArgs:
    """The options a level task shares (splits, warm-up, instruction); a game's task adds its level options."""

    train_size: Annotated[int, Range(ge=1)] = 2000
    """Rows in the train split (levels repeat, as the seeds give them)."""
    eval_size: Annotated[int, Range(ge=1)] = 100
    """Rows in the held-out split (levels repeat, as the seeds give them; none is a train level)."""
    eval_fraction: Annotated[float, Range(gt=0.0, lt=1.0)] = 0.3
    """Share of the distinct levels held out (by a hash of the level)."""
    warmup_turns: Annotated[int, Range(ge=1)] = 5
    """Moves per warm-up target at most, each a turn (fewer when a move solves the level); as many as ``max_steps``
    so that every turn position of an episode can see the format (with 2, turns 3–5 came out as ``</action>`` alone)."""
    warmup_expert_eps: Annotated[float, Range(ge=0.0, le=1.0)] = 0.25
    """ε of the warm-up's noisy expert: the share of target moves drawn uniformly at random instead of the solver's
    move (0: the solver alone; 1: random moves only, the format without the solution)."""
    prompt: str = PROMPT
    """The instruction each row carries (the first observation's text follows it)."""
    seed: int = 1234
    """Base of the level seeds: seed·10⁶ + i."""


@dataclass
class SokobanArgs(LevelTaskArgs):
    """Options under ``task.args`` for ``task.name: sokoban`` (level options as ``rollout.environment_args``)."""

    size: Annotated[int, Range(ge=4)] = 6
    """Room side in cells, the wall border included (``rollout.environment_args.size``)."""
    boxes: Annotated[int, Range(ge=1)] = 1
    """Boxes (and targets) per level (``rollout.environment_args.boxes``)."""
    pulls: Annotated[int, Range(ge=1)] = 4
    """Random reverse moves that generate a level: few make short levels (``rollout.environment_args.pulls``)."""
    max_steps: Annotated[int, Range(ge=1)] = 5
    """Moves per episode (``rollout.environment_args.max_steps``; ``rollout.max_turns`` should equal it)."""


def level_text(env: Sokoban, seed: int) -> str:
    """The room of level ``seed`` as text (the level's identity)."""
    env.reset({"seed": seed})
    return env.render_text()


def held_out(level: str, fraction: float) -> bool:
    """Whether ``level`` belongs to the held-out split (a hash of its text, the same on every machine)."""
    return int(hashlib.sha256(level.encode()).hexdigest()[:8], 16) < fraction * 16**8


class SokobanTask:
    """See the module docstring. A task of another game (the grid world, the GUI app) subclasses it and overrides the
    game's hooks: :meth:`make_game`, :meth:`level_id`, :meth:`row_extra`, :meth:`expert`, :meth:`random_action`,
    :meth:`won` and :meth:`first_of`; the splits, warm-up, replay and score are shared."""

    def __init__(self, args: SokobanArgs):
        try:
            self.game = self.make_game(args)
        except ValueError as e:
            raise ConfigError(f"task.args: {e}") from None
        self.args = args
        self._train, self._eval = self._split()

    @staticmethod
    def make_game(args: LevelTaskArgs) -> Sokoban:
        """The game of the task's levels (the level options of ``args``); a task of another game overrides it."""
        return Sokoban(size=args.size, boxes=args.boxes, pulls=args.pulls, max_steps=args.max_steps)

    def level_id(self) -> str:
        """The current level's identity (the split hashes it): the room as text."""
        return self.game.render_text()

    def row_extra(self) -> dict:
        """Columns a game adds to the row of the level just reset (none here)."""
        return {}

    def expert(self) -> str:
        """The expert's next action in the current state (:func:`expert_move`)."""
        return expert_move(self.game)

    def random_action(self, rng: random.Random) -> str:
        """One uniformly random action (the warm-up's noise and the random mover)."""
        return rng.choice(ACTIONS)

    def won(self) -> bool:
        """Whether the episode played so far reached the goal (every box on a target)."""
        return self.game.solved

    @staticmethod
    def first_of(output) -> object:
        """The action of an output's first turn (:func:`first_move`), for ``first_move_share``."""
        return first_move(output)

    def _row(self, seed: int) -> dict:
        self.game.reset({"seed": seed})
        solution = self.game.shortest_solution()
        row = {"prompt": self.args.prompt, "seed": seed, **self.row_extra()}
        return row | {"min_moves": -1 if solution is None else len(solution)}

    def _split(self) -> tuple[list[dict], list[dict]]:
        a = self.args
        train, held = [], []
        for i in range(SCAN_LIMIT):
            if len(train) >= a.train_size and len(held) >= a.eval_size:
                return train, held
            seed = a.seed * 10**6 + i
            self.game.reset({"seed": seed})
            if not held_out(self.level_id(), a.eval_fraction):
                if len(train) < a.train_size:
                    train.append(self._row(seed))
            elif len(held) < a.eval_size:
                held.append(self._row(seed))
        raise ConfigError(
            f"task.args: {SCAN_LIMIT} seeds give {len(held)} held-out rows and {len(train)} train rows, fewer than "
            f"eval_size {a.eval_size} / train_size {a.train_size}; set eval_fraction inside (0, 1) so both splits get "
            "levels"
        )

    def train_rows(self) -> list[dict]:
        return self._train

    def eval_rows(self) -> list[dict]:
        return self._eval

    def warmup_rows(self, seed: int) -> list[dict]:
        """ε-noisy expert targets (module docstring), one per train row, each played through the game as it is
        built; the same for the same ``seed``."""
        rng = random.Random(seed)
        rows = []
        for row in self._train:
            self.game.reset(row)
            target = []
            while len(target) < self.args.warmup_turns and not self.game.done:
                noisy = rng.random() < self.args.warmup_expert_eps
                move = self.random_action(rng) if noisy else self.expert()
                target.append(f"<action>{move}</action>")
                self.game.step(target[-1])
            rows.append(dict(row, target=target))
        return rows

    def play(self, output: str, row: dict) -> tuple[bool, int, int]:
        """Replay one output's turns on the row's level: (solved, moves taken, invalid moves). A plain string (not
        :class:`~mmgrpo.types.Transcript`) is split into turns at newlines."""
        turns = output.turns if isinstance(output, Transcript) else tuple(str(output).split("\n"))
        if isinstance(output, Transcript) and output.cut_last:
            turns = turns[:-1]
        self.game.reset(row)
        steps = invalid = 0
        for turn in turns:
            if self.game.done:
                break
            obs, _, _ = self.game.step(turn)
            steps += 1
            invalid += int(obs.invalid)
        return self.won(), steps, invalid

    def random_success(self, rows: list[dict]) -> float:
        """A uniformly random mover's success rate on ``rows`` (``RANDOM_PLAYS`` plays each, seeded by the level)."""
        wins = 0
        for row in rows:
            rng = random.Random(row["seed"])
            for _ in range(RANDOM_PLAYS):
                self.game.reset(row)
                while not self.game.done:
                    self.game.step(f"<action>{self.random_action(rng)}</action>")
                wins += self.won()
        return wins / (RANDOM_PLAYS * max(1, len(rows)))

    def score(self, outputs: list[str], rows: list[dict]) -> dict[str, float]:
        """success_rate, mean_steps, invalid_rate, first_move_share, random_success (module docstring)."""
        played = [self.play(o, r) for o, r in zip(outputs, rows)]
        n, steps = max(1, len(played)), sum(p[1] for p in played)
        first = [self.first_of(o) for o in outputs]
        return {
            "success_rate": sum(p[0] for p in played) / n,
            "mean_steps": steps / n,
            "invalid_rate": sum(p[2] for p in played) / max(1, steps),
            "first_move_share": max(map(first.count, set(first)), default=0) / n,
            "random_success": self.random_success(rows),
        }


def expert_move(game: Sokoban) -> str:
    """The first move of a shortest solution from ``game``'s current room (:meth:`Sokoban.shortest_solution`,
    breadth-first over (player, boxes) states, ties in the order up, down, left, right); a level it cannot solve
    within the search's limit (none that reverse play generates) gets ``up``."""
    solution = game.shortest_solution()
    return solution[0] if solution else ACTIONS[0]


def first_move(output: str) -> str | None:
    """The move of an output's first turn (``None``: no parsable action)."""
    turns = output.turns if isinstance(output, Transcript) else tuple(output.split("\n"))
    return parse_action(turns[0], ACTIONS)[0] if turns else None


build_sokoban_task = TASKS.register("sokoban")(
    TaskSpec(args=SokobanArgs, cls=SokobanTask, load=lambda a, seed: SokobanTask(a))
)
