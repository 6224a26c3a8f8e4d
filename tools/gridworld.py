"""``sokoban``: a small visual Sokoban, rendered as PIL images, deterministic from the row's seed.

The game of verl-agent's visual GiGPO benchmark (``agent_system/environments/env_package/sokoban``, built on
``gym_sokoban``; ``examples/gigpo_trainer/run_sokoban.sh``: 6×6 room, 1 box, at most 15 steps). Written here from
the rules, not ported, to stay small and dependency-free:

- **Level** (``reset(row)``, ``row["seed"]`` an int): a ``size × size`` room with a wall border; ``boxes`` targets
  at distinct random floor cells with the boxes on them and the player on another floor cell; then
  ``pulls`` random *reverse* moves (the player steps in a direction; a box right behind the player is pulled
  along), gym_sokoban's reverse-play generation, so every level is solvable. A level whose boxes end on their
  targets is drawn again. ``random.Random(seed)`` makes it the same on every machine and Python version.
- **Actions**: ``<action>up|down|left|right</action>`` (the last tag counts). Walking into a wall, or pushing a
  box into a wall or another box, leaves the state as it is (a legal step). Text that holds no such action is
  an **invalid action**: the state is unchanged, the observation says so and has ``error`` set
  (verl-agent's ``is_action_valid = 0``), and it costs a step.
- **Rewards** (gym_sokoban's defaults): −0.1 per step, +1 for a box pushed onto a target, −1 for a box pushed off
  one, +10 when every box is on a target (the episode ends); the episode also ends after ``max_steps`` steps.
- **Observation**: the rendered room (``cell`` pixels per cell: dark grey walls, light floor, red targets, brown
  boxes, green boxes on targets, a blue player; ``floor="coordinates"`` colours each floor cell by its row and column,
  :meth:`Sokoban.render`) and a fixed instruction text (``instruction``, default
  :data:`INSTRUCTION`; no step counter, so equal states give equal observations). The image is the GiGPO anchor
  state: :func:`~mmgrpo.tools.state_anchor`. ``visual=False`` gives the room as text instead (gym_sokoban's
  symbols, verl-agent's text mode), for text-only policies; the text is then the anchor.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

from PIL import Image, ImageDraw

from .base import Observation
from .env import ENVIRONMENTS, parse_action, row_seed

ACTIONS = ("up", "down", "left", "right")
MOVES = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}  # (row, column)
COLORS = dict(
    wall=(64, 64, 64), floor=(232, 232, 232), target=(220, 40, 40), box=(150, 95, 40), box_on_target=(40, 160, 70),
    player=(40, 80, 210),
)  # fmt: skip
FLOORS = ("plain", "coordinates")
"""Floor renderings: one light grey, or each floor cell's colour giving its row and column (:meth:`Sokoban.render`)."""
TEXT_LEGEND = "(# wall, _ floor, O target, X box, √ box on target, P you, S you on a target)"
INSTRUCTION = (
    "Push every brown box onto a red target. You are the blue square; green boxes are on targets. Reply with "
    "your move as <action>up</action>, <action>down</action>, <action>left</action> or <action>right</action>."
)

GRID_INSTRUCTION = (
    "Walk onto the red square. You are the blue dot. Reply with your move as <action>up</action>, "
    "<action>down</action>, <action>left</action> or <action>right</action>."
)


class Sokoban:
    """One Sokoban episode (module docstring); satisfies :class:`~mmgrpo.tools.Environment`."""

    filled_targets = False
    """Targets drawn as an outline (a box or the player shows inside it); :class:`GridWorld` fills its goal."""

    def __init__(
        self,
        *,
        size: int = 6,
        boxes: int = 1,
        pulls: int | None = None,
        max_steps: int = 15,
        cell: int = 16,
        floor: str = "plain",
        border: bool = True,
        visual: bool = True,
        step_reward: float = -0.1,
        box_on_target_reward: float = 1.0,
        box_off_target_reward: float = -1.0,
        solved_reward: float = 10.0,
        instruction: str = INSTRUCTION,
    ):
        if size < 4:
            raise ValueError(f"size must be >= 4 (a wall border around at least 2x2 floor), got {size}")
        if not 1 <= boxes <= (size - 2) ** 2 // 3:
            raise ValueError(f"boxes must be from 1 to {(size - 2) ** 2 // 3} for size {size}, got {boxes}")
        if floor not in FLOORS:
            raise ValueError(f"floor must be one of {', '.join(FLOORS)}, got {floor!r}")
        self.size, self.n_boxes, self.max_steps, self.cell, self.visual = size, boxes, max_steps, cell, visual
        self.floor, self.border = floor, border
        self.pulls = pulls if pulls is not None else 3 * size
        self.rewards = dict(step=step_reward, on=box_on_target_reward, off=box_off_target_reward, solved=solved_reward)
        self.instruction = instruction
        self.player: tuple[int, int] = (0, 0)
        self.boxes: set[tuple[int, int]] = set()
        self.targets: frozenset[tuple[int, int]] = frozenset()
        self.steps = 0
        self.done = True

    # ------------------------------------------------------------------------------------------------ protocol

    def reset(self, row: Mapping[str, Any]) -> Observation:
        """A new level from ``row["seed"]`` (an int)."""
        self._generate(random.Random(row_seed(row, "sokoban", "level")))
        self.steps, self.done = 0, False
        return self.observe()

    def step(self, action_text: str) -> tuple[Observation, float, bool]:
        """Apply the last ``<action>`` in ``action_text`` (module docstring for the rules and rewards)."""
        if self.done:
            raise RuntimeError("sokoban: step() after the episode ended; call reset(row) first")
        self.steps += 1
        action, reason = parse_action(action_text, ACTIONS)
        reward = self.rewards["step"]
        if action is None:
            obs = self.observe(error=f"invalid action: {reason}")
        else:
            reward += self._move(MOVES[action])
            obs = self.observe()
        solved = self.solved
        if solved:
            reward += self.rewards["solved"]
        self.done = solved or self.steps >= self.max_steps
        obs.reward = reward
        return obs, reward, self.done

    @property
    def solved(self) -> bool:
        """Whether the current state wins the level (every box on a target)."""
        return self._goal(self.player, frozenset(self.boxes))

    def shortest_solution(self, limit: int = 50) -> list[str] | None:
        """The fewest moves that win the level from the current state (breadth-first search over (player, boxes),
        ties in the order of :data:`ACTIONS`), or ``None`` when none of at most ``limit`` moves does. For level
        statistics, the tasks' expert and tests; the environment never calls it."""
        start = (self.player, frozenset(self.boxes))
        seen, frontier = {start}, [(start, [])]
        for _ in range(limit):
            nxt = []
            for (player, boxes), path in frontier:
                if self._goal(player, boxes):
                    return path
                for name, (dr, dq) in MOVES.items():
                    cell = (player[0] + dr, player[1] + dq)
                    if self._wall(cell):
                        continue
                    moved = boxes
                    if cell in boxes:
                        beyond = (cell[0] + dr, cell[1] + dq)
                        if self._wall(beyond) or beyond in boxes:
                            continue
                        moved = (boxes - {cell}) | {beyond}
                    state = (cell, moved)
                    if state not in seen:
                        seen.add(state)
                        nxt.append((state, [*path, name]))
            frontier = nxt
        return next((path for (player, boxes), path in frontier if self._goal(player, boxes)), None)

    # ----------------------------------------------------------------------------------------------- internals

    def observe(self, error: str | None = None) -> Observation:
        """The current state as an observation: the rendered room and the instruction (``visual=False``: the
        room as text, :meth:`render_text`, and the instruction)."""
        text = self.instruction
        if error is not None:
            text = f"Invalid action ({error}); the board is unchanged. {text}".rstrip()
        if not self.visual:
            return Observation(text=f"{self.render_text()}\n{TEXT_LEGEND} {text}", error=error)
        return Observation(text=text, images=[self.render()], error=error)

    def render_text(self) -> str:
        """The room as rows of gym_sokoban's symbols: ``#`` wall, ``_`` floor, ``O`` target, ``X`` box, ``√`` box on
        a target, ``P`` player, ``S`` player on a target."""
        rows = []
        for r in range(self.size):
            line = ""
            for q in range(self.size):
                cell, target = (r, q), (r, q) in self.targets
                if self._wall(cell):
                    line += "#"
                elif cell == self.player:
                    line += "S" if target else "P"
                elif cell in self.boxes:
                    line += "√" if target else "X"
                else:
                    line += "O" if target else "_"
            rows.append(line)
        return "\n".join(rows)

    def render(self) -> Image.Image:
        """The room as an RGB image of ``size·cell`` pixels a side (deterministic).

        ``floor="coordinates"`` paints each floor cell in a colour of its own position, (255 − k·row,
        255 − k·column, 200) with k = min(40, 240 // (size − 1)), and draws targets, boxes and the player over the
        middle half of the cell, so that the floor's colour shows around them: where a thing stands is then in its
        vision patch's pixels, not only in the patch's position. Supervised on the solver's move, the randomly
        initialised tiny model learns it on this floor and not on the plain one within 1500 steps (docs/agents.md,
        "The Sokoban task"); a pretrained VLM, as in verl-agent, needs neither.

        ``border=False`` leaves out the wall ring (every level has it and no other wall), so the image is the floor
        alone, ``(size − 2)·cell`` pixels a side. With 4×4 floor cells of 28 pixels that is 112×112, which the tiny
        Qwen2.5-VL processor (at most 112×112 pixels, 14-pixel patches merged 2×2) takes unresized: each image token
        is one cell. The whole 6×6 room at 28 pixels (168×168) is resized to 112×112 there, and a cell straddles
        patches."""
        c, n = self.cell, self.size
        coordinates, k = self.floor == "coordinates", min(40, 240 // (n - 1))
        inset, ring = (c // 4, c // 4) if coordinates else (3, 2)  # object margin, target outline margin
        skip = 0 if self.border else 1  # border=False: the floor alone, the wall ring left out
        image = Image.new("RGB", ((n - 2 * skip) * c, (n - 2 * skip) * c), COLORS["floor"])
        draw = ImageDraw.Draw(image)
        for r in range(skip, n - skip):
            for q in range(skip, n - skip):
                x, y = (q - skip) * c, (r - skip) * c
                if self._wall((r, q)):
                    draw.rectangle([x, y, x + c - 1, y + c - 1], fill=COLORS["wall"])
                    continue
                if coordinates:
                    fill = (255 - k * r, 255 - k * q, 200)
                    draw.rectangle([x, y, x + c - 1, y + c - 1], fill=fill)
                if (r, q) in self.targets and self.filled_targets:
                    draw.rectangle([x + inset, y + inset, x + c - 1 - inset, y + c - 1 - inset], fill=COLORS["target"])
                elif (r, q) in self.targets:
                    draw.rectangle(
                        [x + ring, y + ring, x + c - 1 - ring, y + c - 1 - ring], outline=COLORS["target"], width=2
                    )
                if (r, q) in self.boxes:
                    color = COLORS["box_on_target"] if (r, q) in self.targets else COLORS["box"]
                    draw.rectangle([x + inset, y + inset, x + c - 1 - inset, y + c - 1 - inset], fill=color)
                if (r, q) == self.player:
                    draw.ellipse([x + inset, y + inset, x + c - 1 - inset, y + c - 1 - inset], fill=COLORS["player"])
        return image

    def _goal(self, player: tuple[int, int], boxes: frozenset) -> bool:
        """Whether (player, boxes) wins: every box on a target."""
        return boxes == self.targets

    def _wall(self, cell: tuple[int, int]) -> bool:
        r, q = cell
        return r <= 0 or q <= 0 or r >= self.size - 1 or q >= self.size - 1

    def _free(self, cell: tuple[int, int]) -> bool:
        return not self._wall(cell) and cell not in self.boxes

    def _move(self, d: tuple[int, int]) -> float:
        """Move the player by ``d`` (pushing a box); the box reward of the move."""
        nxt = (self.player[0] + d[0], self.player[1] + d[1])
        if self._wall(nxt):
            return 0.0
        if nxt not in self.boxes:
            self.player = nxt
            return 0.0
        beyond = (nxt[0] + d[0], nxt[1] + d[1])
        if not self._free(beyond):
            return 0.0
        self.boxes.remove(nxt)
        self.boxes.add(beyond)
        self.player = nxt
        on = self.rewards["on"] if beyond in self.targets else 0.0
        off = self.rewards["off"] if nxt in self.targets else 0.0
        return on + off

    def _generate(self, rng: random.Random) -> None:
        floor = [(r, q) for r in range(1, self.size - 1) for q in range(1, self.size - 1)]
        for _ in range(1000):
            cells = rng.sample(floor, self.n_boxes + 1)
            self.targets = frozenset(cells[: self.n_boxes])
            self.boxes, self.player = set(self.targets), cells[-1]
            for _ in range(self.pulls):
                d = MOVES[rng.choice(ACTIONS)]
                nxt = (self.player[0] + d[0], self.player[1] + d[1])
                if not self._free(nxt):
                    continue
                behind = (self.player[0] - d[0], self.player[1] - d[1])
                if behind in self.boxes:  # reverse of a push: the box follows the player
                    self.boxes.remove(behind)
                    self.boxes.add(self.player)
                self.player = nxt
            if self.boxes != set(self.targets):
                return
        raise RuntimeError("sokoban: no level after 1000 draws; raise pulls")


class GridWorld(Sokoban):
    """``gridworld``: walk onto the goal. Sokoban's room, rules and rendering without boxes: one red goal square
    (filled) and the blue player at distinct floor cells at least ``min_distance`` apart (Manhattan); the level is
    won, +``solved_reward``, when the player stands on the goal. Every move is legal (walking into the wall leaves the
    player where it is); text without an action is an invalid action, as in Sokoban.

    The "grid world" form of the visual multi-step game, next to Sokoban: a winning move is one of the (at most
    two) moves toward the goal, so what a policy must read from the image is where two things stand, not three
    things and a push. The shortest path (:meth:`Sokoban.shortest_solution`) breaks ties in the order of
    :data:`ACTIONS`, so vertical moves come first.

    ``distance_reward`` w > 0 adds potential-based shaping (Ng, Harada & Russell 1999, "Policy invariance under
    reward transformations", ICML, Theorem 1, with γ = 1 and potential Φ(s) = −w·distance(s)): each move earns
    w·(distance before − distance after). The shaped rewards of an episode telescope to w·(first distance − last
    distance), so the optimal policies are the unshaped game's, and each turn's reward says whether that move
    helped: the per-turn signal that step-level credit (GiGPO's γ-discounted step returns, MT-GRPO's turn rewards)
    can use and a trajectory-level advantage sums away. 0 (the default) is the sparse game."""

    filled_targets = True

    def __init__(
        self,
        *,
        size: int = 6,
        min_distance: int = 2,
        max_steps: int = 8,
        cell: int = 16,
        floor: str = "plain",
        border: bool = True,
        visual: bool = True,
        step_reward: float = 0.0,
        solved_reward: float = 10.0,
        distance_reward: float = 0.0,
        instruction: str = GRID_INSTRUCTION,
    ):
        super().__init__(
            size=size, max_steps=max_steps, cell=cell, floor=floor, border=border, visual=visual,
            step_reward=step_reward, solved_reward=solved_reward, instruction=instruction,
        )  # fmt: skip
        if not 1 <= min_distance <= 2 * (size - 3):
            raise ValueError(
                f"min_distance must be from 1 to {2 * (size - 3)} (the room's diagonal) for size {size}, got "
                f"{min_distance}"
            )
        self.n_boxes, self.min_distance, self.distance_reward = 0, min_distance, distance_reward

    def distance(self) -> int:
        """Moves from the player to the goal (Manhattan distance: the floor has no inner walls)."""
        (goal,) = self.targets
        return abs(goal[0] - self.player[0]) + abs(goal[1] - self.player[1])

    def _goal(self, player: tuple[int, int], boxes: frozenset) -> bool:
        return player in self.targets

    def _move(self, d: tuple[int, int]) -> float:
        """Move the player by ``d``; the shaping reward ``distance_reward · (distance before − distance after)``
        (+1·w a move toward the goal, −1·w away, 0 into the wall)."""
        before = self.distance()
        super()._move(d)
        return self.distance_reward * (before - self.distance())

    def _generate(self, rng: random.Random) -> None:
        floor = [(r, q) for r in range(1, self.size - 1) for q in range(1, self.size - 1)]
        self.boxes = set()
        while True:  # min_distance is at most the diagonal, so a draw succeeds
            goal, self.player = rng.sample(floor, 2)
            self.targets = frozenset([goal])
            if self.distance() >= self.min_distance:
                return


ENVIRONMENTS.add("sokoban", Sokoban)
ENVIRONMENTS.add("gridworld", GridWorld)
