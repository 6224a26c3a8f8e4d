"""``gui``: a small synthetic phone app, rendered as PIL images, for multi-turn vision-language GUI agents.

Mobile-R1 (Gu et al. 2025, "Mobile-R1: Towards Interactive Reinforcement Learning for VLM-Based Mobile Agent via
Task-Level Rewards", arXiv 2506.20332; seed ``002:313``) trains a VLM to operate real Android apps from
screenshots: each turn the policy sees the instruction, the current screenshot and its earlier actions and writes
one action (click, type, swipe, system button); Stage 2 rewards single steps (``R_action = R_Act + R_Fmt``: the
action right or not, the output well formed or not, each binary), Stage 3 rewards whole multi-turn episodes by
whether the task was completed. Its apps and judge (a 28-app Chinese dataset, GPT-4o) are not reproducible here;
this is the same loop on a deterministic app written from the rules, small enough for the built-in tiny Qwen2.5-VL
on a CPU. No public code of Mobile-R1 was found to compare with (its project page, ``mobile-r1.github.io``, links
none at the time of writing).

- **Screens** (``screen``): ``home`` (two app tiles, ``settings`` and ``messages``), ``settings`` (a list of three
  switches, ``wifi``, ``bluetooth``, ``airplane``, of which two fit on the screen: ``scroll down`` shows
  ``airplane``, ``scroll up`` shows ``wifi`` again) and ``messages`` (a text field and a ``send`` button).
- **Actions** (the last ``<action>…</action>`` of the turn, case and surrounding space ignored):
  ``tap NAME`` (an element's name: ``settings``, ``messages``, ``wifi``, ``bluetooth``, ``airplane``, ``send``),
  ``type TEXT`` (1–12 characters of ``a-z 0-9`` and spaces; sets the text field), ``scroll up`` / ``scroll down``
  and ``back`` (the system back button: to ``home``). Tapping an element that is not on the current screen, typing
  where there is no field, scrolling a screen that does not scroll or going back from home are **legal no-ops**, as
  on a phone. Text that is not one of these actions is an **invalid action**: the screen is unchanged, the
  observation says so and has ``error`` set (verl-agent's ``is_action_valid = 0``), and it costs a step.
- **Episode** (``reset(row)``, ``row["seed"]`` an int): ``random.Random(seed)`` draws the goal (one of
  :data:`GOALS`: turn a switch on or off, or send a word), the start screen, the list's scroll position and the
  switches (the goal's switch starts opposite to its target); the episode ends when the goal holds (the switch is
  as asked, or the last message sent is the word) or after ``max_steps`` actions.
- **Rewards** (our reading of Mobile-R1, §3 "Action-level" and "Task-level" online training: the exact Stage-3
  equation was not retrievable here), the step's reward ``r_t`` is the sum of
  - the step-level **format** reward, ``format_reward · (f_t − 1)``: Mobile-R1's binary ``R_Fmt`` (``f_t`` = 1 when
    the action parses and is allowed, else 0) shifted by −1, so that a well-formed step earns 0 and a malformed
    one ``−format_reward``, and a longer episode does not earn more;
  - the **action** reward ``action_reward · (d_{t−1} − d_t)``, ``d`` the fewest actions left to the goal
    (:meth:`GuiApp.distance`): Mobile-R1's Stage-2 ``R_Act`` (1 for the ground-truth action) as potential-based
    shaping (Ng et al. 1999), +w for an action of a shortest path, so the optimal policies are unchanged; 0 (the
    default) leaves it out, as Mobile-R1's Stage 3 does;
  - the **task-level** reward ``task_reward`` on the step that completes the task (Mobile-R1's trajectory-level
    reward, there judged by GPT-4o from the trajectory, here by the app's state).

  The episode's return (``env_return``) is then ``task_reward · completed − format_reward · #invalid
  + action_reward · (d_0 − d_end)``. A turn cut by the token limit before its end token is never played (the
  rollout ends the trajectory), so the app cannot penalise it: train with ``model.args.mask_truncated: true``, or
  a policy can dodge the format penalty by never ending a turn (the shipped configs do; docs/agents.md).
- **Observation**: the rendered screen (:meth:`GuiApp.render`: ``4·cell`` pixels a side, a title bar whose colour
  names the screen, each element a coloured tile with its name; switches show a green or red knob; the text field
  shows the typed text) and the text ``instruction`` (the first observation starts with ``Task: <goal>.``; with
  ``task_every_turn`` every observation does, as Mobile-R1's prompt repeats the instruction at each step: a small
  model then finds the task next to the screen it acts on instead of turns back). No step
  counter, so equal screens give equal observations: the image is the GiGPO anchor state
  (:func:`~mmgrpo.tools.state_anchor`). The labels are drawn with Pillow's built-in bitmap font (no font file,
  the same pixels on every machine).
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from PIL import Image, ImageDraw, ImageFont

from .base import Observation
from .env import ENVIRONMENTS, action_tag, row_seed

SCREENS = ("home", "settings", "messages")
SWITCHES = ("wifi", "bluetooth", "airplane")
"""The settings list, top to bottom; :data:`VISIBLE` of them fit on the screen."""
VISIBLE = 2
WORDS = ("hi", "ok", "yes", "no")
"""The words of the ``send`` goals."""
ELEMENTS = {"home": ("settings", "messages"), "messages": ("send",)}
"""Tappable elements per screen (``settings``: the switches in view, :meth:`GuiApp.visible`)."""
TAPPABLE = ("settings", "messages", *SWITCHES, "send")
VERBS = ("tap", "type", "scroll", "back")
MAX_TYPED = 12
ALLOWED_TEXT = frozenset("abcdefghijklmnopqrstuvwxyz0123456789 ")
GOALS = (
    *((f"turn {state} {name}", ("switch", name, state == "on")) for name in SWITCHES for state in ("on", "off")),
    *((f"send {word}", ("send", word, True)) for word in WORDS),
)
"""(instruction, (kind, target, value)) of every task: six switch goals and four words to send."""
COLORS = dict(
    home=(40, 80, 200), settings=(90, 90, 90), messages=(30, 150, 70), background=(245, 245, 245),
    wifi=(60, 140, 230), bluetooth=(130, 70, 200), airplane=(240, 140, 30), send=(40, 80, 200),
    on=(40, 180, 70), off=(210, 50, 50), field=(255, 255, 255), text=(0, 0, 0), label=(255, 255, 255),
)  # fmt: skip
INSTRUCTION = "Your move?"
HELP = "tap NAME, type TEXT, scroll up, scroll down or back"


@dataclass(frozen=True)
class Screen:
    """The app's state: what the screen shows and what has been done (hashable: the shortest-path search's node)."""

    screen: str
    """The current screen, one of :data:`SCREENS`."""
    offset: int
    """Scroll position of the settings list: the index of its first switch in view (0 or 1)."""
    switches: tuple[bool, ...]
    """Each of :data:`SWITCHES` on (True) or off."""
    draft: str = ""
    """The text field's content on the messages screen."""
    sent: str | None = None
    """The last message sent (None: none yet)."""


def parse_gui_action(text: str) -> tuple[tuple[str, str] | None, str]:
    """``(verb, argument)`` of the last ``<action>…</action>`` in ``text`` (lower-cased, spaces collapsed), or
    ``None`` and a one-line reason naming the fix. Linear in the text (``str.rfind``)."""
    fix = f"end the turn with <action>{HELP}</action>"
    inside, why = action_tag(text, fix)
    if inside is None:
        return None, why
    words = inside.split()
    verb, arg = (words[0], " ".join(words[1:])) if words else ("", "")
    shown = repr(" ".join(words)[:40])
    if verb not in VERBS:
        return None, f"{shown} is not an action; {fix}"
    if verb == "tap" and arg not in TAPPABLE:
        return None, f"{shown}: tap one of {', '.join(TAPPABLE)}"
    if verb == "type" and not (0 < len(arg) <= MAX_TYPED and set(arg) <= ALLOWED_TEXT):
        return None, f"{shown}: type 1 to {MAX_TYPED} characters of a-z, 0-9 and spaces"
    if verb == "scroll" and arg not in ("up", "down"):
        return None, f"{shown}: scroll up or scroll down"
    if verb == "back" and arg:
        return None, f"{shown}: back takes no argument"
    return (verb, arg), ""


def apply_action(state: Screen, verb: str, arg: str) -> Screen:
    """The state after a parsed action (module docstring: a tap on an element not in view, typing without a field,
    scrolling what does not scroll and back from home change nothing)."""
    if verb == "back":
        return replace(state, screen="home")
    if verb == "scroll":
        if state.screen != "settings":
            return state
        top = len(SWITCHES) - VISIBLE
        return replace(state, offset=min(top, state.offset + 1) if arg == "down" else max(0, state.offset - 1))
    if verb == "type":
        return replace(state, draft=arg) if state.screen == "messages" else state
    if arg not in visible_elements(state):
        return state
    if arg in ("settings", "messages"):
        return replace(state, screen=arg)
    if arg == "send":
        return replace(state, sent=state.draft, draft="") if state.draft else state
    flipped = list(state.switches)
    flipped[SWITCHES.index(arg)] = not flipped[SWITCHES.index(arg)]
    return replace(state, switches=tuple(flipped))


def visible_elements(state: Screen) -> tuple[str, ...]:
    """The elements a tap reaches on the current screen."""
    if state.screen == "settings":
        return SWITCHES[state.offset : state.offset + VISIBLE]
    return ELEMENTS[state.screen]


def goal_holds(state: Screen, goal: tuple[str, str, bool]) -> bool:
    """Whether ``state`` completes ``goal`` = (kind, target, value) of :data:`GOALS`."""
    kind, target, value = goal
    if kind == "switch":
        return state.switches[SWITCHES.index(target)] == value
    return state.sent == target


def candidate_actions(goal: tuple[str, str, bool]) -> tuple[str, ...]:
    """The actions worth trying for ``goal``, in tie-break order (the search's moves; typing only the goal's word
    or, for a switch goal, nothing)."""
    typed = (f"type {goal[1]}",) if goal[0] == "send" else ()
    return ("back", *(f"tap {n}" for n in TAPPABLE), "scroll down", "scroll up", *typed)


class GuiApp:
    """One episode of the app (module docstring); satisfies :class:`~mmgrpo.tools.Environment`.

    Options: ``max_steps`` (actions per episode), ``cell`` (pixels per screen row), ``task_reward``,
    ``format_reward`` and ``action_reward`` (the reward terms' weights), ``instruction`` (each observation's text)
    and ``task_every_turn`` (``Task: <goal>.`` before every observation's text, not only the first; off by default,
    on in the shipped configs)."""

    def __init__(
        self,
        *,
        max_steps: int = 5,
        cell: int = 28,
        task_reward: float = 1.0,
        format_reward: float = 0.5,
        action_reward: float = 0.0,
        instruction: str = INSTRUCTION,
        task_every_turn: bool = False,
    ):
        if max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, got {max_steps}")
        if cell < 8:
            raise ValueError(f"cell must be >= 8 pixels (a label needs room), got {cell}")
        self.max_steps, self.cell, self.instruction = max_steps, cell, instruction
        self.task_every_turn = task_every_turn
        self.rewards = dict(task=task_reward, format=format_reward, action=action_reward)
        self.state = Screen("home", 0, (False,) * len(SWITCHES))
        self.goal: tuple[str, str, bool] = GOALS[0][1]
        self.task = GOALS[0][0]
        self.steps = 0
        self.done = True

    # ------------------------------------------------------------------------------------------------ protocol

    def reset(self, row: Mapping[str, Any]) -> Observation:
        """A new episode from ``row["seed"]`` (an int): goal, start screen, scroll position and switches."""
        rng = random.Random(row_seed(row, "gui", "episode"))
        self.task, self.goal = rng.choice(GOALS)
        switches = [rng.random() < 0.5 for _ in SWITCHES]
        if self.goal[0] == "switch":
            switches[SWITCHES.index(self.goal[1])] = not self.goal[2]
        self.state = Screen(rng.choice(SCREENS), rng.randrange(len(SWITCHES) - VISIBLE + 1), tuple(switches))
        self.steps, self.done = 0, False
        obs = self.observe()
        if not self.task_every_turn:
            obs.text = f"Task: {self.task}. {obs.text}".rstrip()
        return obs

    def step(self, action_text: str) -> tuple[Observation, float, bool]:
        """Apply the last ``<action>`` of ``action_text``; the step's reward is the format, action and task terms
        of the module docstring."""
        if self.done:
            raise RuntimeError("gui: step() after the episode ended; call reset(row) first")
        self.steps += 1
        parsed, reason = parse_gui_action(action_text)
        shaped = self.rewards["action"] != 0.0
        before = self.distance() if shaped else 0
        if parsed is None:
            reward = -self.rewards["format"]
            obs = self.observe(error=f"invalid action: {reason}")
        else:
            self.state = apply_action(self.state, *parsed)
            reward = self.rewards["action"] * (before - self.distance()) if shaped else 0.0
            obs = self.observe()
        if self.completed:
            reward += self.rewards["task"]
        self.done = self.completed or self.steps >= self.max_steps
        obs.reward = reward
        return obs, reward, self.done

    @property
    def completed(self) -> bool:
        """Whether the current state completes the episode's goal."""
        return goal_holds(self.state, self.goal)

    def shortest_solution(self, limit: int = 12) -> list[str] | None:
        """The fewest actions (each ``verb [argument]``) that complete the goal from the current state: breadth-first
        over :class:`Screen` states with :func:`candidate_actions` (ties in their order); ``None`` beyond ``limit``."""
        moves = [(action, parse_gui_action(f"<action>{action}</action>")[0]) for action in candidate_actions(self.goal)]
        seen, frontier = {self.state}, [(self.state, [])]
        for _ in range(limit + 1):
            nxt = []
            for state, path in frontier:
                if goal_holds(state, self.goal):
                    return path
                for action, parsed in moves:
                    after = apply_action(state, *parsed)
                    if after not in seen:
                        seen.add(after)
                        nxt.append((after, [*path, action]))
            frontier = nxt
        return None

    def distance(self) -> int:
        """Actions left to the goal along a shortest path (the action reward's potential)."""
        path = self.shortest_solution()
        return len(path) if path is not None else 12

    def episode_text(self) -> str:
        """The episode's identity (goal and start state) as text: the task's split key."""
        s = self.state
        switches = ",".join(f"{n}={'on' if v else 'off'}" for n, v in zip(SWITCHES, s.switches))
        return f"{self.task}|{s.screen}|{s.offset}|{switches}"

    # ----------------------------------------------------------------------------------------------- internals

    def observe(self, error: str | None = None) -> Observation:
        """The current screen as an observation: its rendering and the instruction text."""
        text = f"Task: {self.task}. {self.instruction}".rstrip() if self.task_every_turn else self.instruction
        if error is not None:
            text = f"Invalid action ({error}); the screen is unchanged. {text}".rstrip()
        return Observation(text=text, images=[self.render()], error=error)

    def render(self) -> Image.Image:
        """The screen as an RGB image of ``4·cell`` pixels a side, four rows of ``cell`` pixels (deterministic).

        Row 0 is the title bar in the screen's colour (:data:`COLORS`: home blue, settings grey, messages green).
        Home: the ``settings`` and ``messages`` tiles in rows 1 and 2. Settings: the switches in view in rows 1 and 2
        (an icon square in the switch's colour, its name, a knob green when on and red when off) and a scroll mark in
        row 3 (top or bottom of the list). Messages: the text field (white, the typed text) in row 1, the blue
        ``send`` button in row 2 and the last message sent in row 3."""
        c, s = self.cell, self.state
        image = Image.new("RGB", (4 * c, 4 * c), COLORS["background"])
        draw, font = ImageDraw.Draw(image), ImageFont.load_default_imagefont()
        draw.rectangle([0, 0, 4 * c - 1, c - 1], fill=COLORS[s.screen])
        draw.text((3, 3), s.screen, fill=COLORS["label"], font=font)
        pad = max(2, c // 8)
        if s.screen == "home":
            for row, name in enumerate(ELEMENTS["home"], start=1):
                draw.rectangle([pad, row * c + pad, 4 * c - pad, (row + 1) * c - pad], fill=COLORS[name])
                draw.text((2 * pad, row * c + pad + 1), name, fill=COLORS["label"], font=font)
        elif s.screen == "settings":
            for row, name in enumerate(visible_elements(s), start=1):
                on = s.switches[SWITCHES.index(name)]
                draw.rectangle([pad, row * c + pad, c - pad, (row + 1) * c - pad], fill=COLORS[name])
                draw.text((c + 1, row * c + pad + 1), name, fill=COLORS["text"], font=font)
                knob = [3 * c + pad, row * c + pad, 4 * c - pad, (row + 1) * c - pad]
                draw.ellipse(knob, fill=COLORS["on" if on else "off"])
            mark = 3 * c + (pad if s.offset == 0 else c - 2 * pad)
            draw.rectangle([4 * c - 2 * pad, mark, 4 * c - 1, mark + pad], fill=COLORS["settings"])
        else:
            draw.rectangle([pad, c + pad, 4 * c - pad, 2 * c - pad], fill=COLORS["field"], outline=COLORS["text"])
            draw.text((2 * pad, c + pad + 1), s.draft, fill=COLORS["text"], font=font)
            draw.rectangle([pad, 2 * c + pad, 2 * c, 3 * c - pad], fill=COLORS["send"])
            draw.text((2 * pad, 2 * c + pad + 1), "send", fill=COLORS["label"], font=font)
            draw.text((2 * pad, 3 * c + pad), f"sent: {s.sent or ''}", fill=COLORS["text"], font=font)
        return image


ENVIRONMENTS.add("gui", GuiApp)
