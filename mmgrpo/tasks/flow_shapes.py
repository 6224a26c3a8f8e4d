"""A procedurally generated text-to-image task for flow policies, its reward, a quality proxy, and the base model.

**Images.** 32×32 RGB: one filled shape (``circle`` | ``square``) of one of four colours in one quadrant
(``top left`` … ``bottom right``) on a dark background, anti-aliased, with random size (radius 5–7 px) and
position jitter (±2 px) — :func:`render`. Prompts read ``"a red circle top left"``: 4 × 2 × 4 = 32 prompts.

**Splits.** The base model is pre-trained on renderings of all 32 prompts (:func:`pretrain`). GRPO trains on 24
of them; evaluation uses the 8 *held-out* prompts (each colour, shape and position appears among them) with
``eval_seeds`` initial noises each, so "after" measures improvement on prompts RL never saw.

**Reward** ``flow_shape_match`` (on the decoded PIL image): soft IoU between the target-colour map
M(x) = exp(−‖I(x) − c‖² / (2·0.25²)) and the canonical target shape S (radius 6 at the quadrant centre),
Σ min(M, S) / Σ max(M, S) ∈ [0, 1]. Wrong colour, wrong place, wrong shape, blur and smears all lower it.

**Quality proxy** (must not collapse): ``template_rmse``, the RMSE from each image to its nearest *clean*
rendering of any prompt (a bank over colours, shapes, quadrants, radii 5–7 and jitter −2…2 px; pixels in [0, 1]),
and ``realism`` = exp(−template_rmse / 0.1) ∈ (0, 1]. It does not know the prompt: it only asks whether the
image still looks like a sample of the data distribution (clean colours, one crisp shape, flat background).
A policy that hacks the IoU with off-distribution images (colour fields, multiple blobs, noise) loses realism.

The base pipeline is a tiny ``StableDiffusion3Pipeline`` (real classes, :mod:`.flow_tiny`) trained by
:func:`pretrain` (``examples/pretrain_tiny_flow.py``): first the ``AutoencoderKL`` (32×32×3 → 8×8×4), then the
``SD3Transformer2DModel`` with the rectified-flow loss, text encoders frozen at their random initialisation,
10% prompt dropout for CFG. It is deliberately short, so the base is sensible but imperfect.
"""

from __future__ import annotations

import itertools
import math
import random
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from PIL import Image, ImageDraw

from mmgrpo.config import ConfigError
from mmgrpo.plugins import TASKS, TaskSpec
from mmgrpo.tasks.eval_rewards import EvalRewards

RESOLUTION = 32
BACKGROUND = (40, 40, 40)
COLOURS = {"red": (220, 40, 40), "green": (40, 190, 70), "blue": (60, 90, 235), "yellow": (235, 215, 40)}
SHAPES = ("circle", "square")
POSITIONS = {
    "top left": (0.25, 0.25),
    "top right": (0.75, 0.25),
    "bottom left": (0.25, 0.75),
    "bottom right": (0.75, 0.75),
}
HELD_OUT = (
    ("red", "circle", "top right"),
    ("red", "square", "bottom left"),
    ("green", "circle", "bottom right"),
    ("green", "square", "top left"),
    ("blue", "circle", "bottom left"),
    ("blue", "square", "top right"),
    ("yellow", "circle", "top left"),
    ("yellow", "square", "bottom right"),
)
"""The 8 evaluation prompts: every colour with both shapes, every shape in every quadrant."""

TAU = 0.25  # colour-similarity width, RGB in [0, 1]
NOMINAL_RADIUS = 6.0


def prompt_of(colour: str, shape: str, position: str) -> str:
    return f"a {colour} {shape} {position}"


def parse_prompt(prompt: str) -> tuple[str, str, str]:
    """(colour, shape, position) of a task prompt; ValueError naming the prompt otherwise."""
    words = prompt.lower().replace("a ", "", 1).split()
    if len(words) != 4 or words[0] not in COLOURS or words[1] not in SHAPES or " ".join(words[2:]) not in POSITIONS:
        raise ValueError(f"not a flow_shapes prompt: {prompt!r} (expected e.g. 'a red circle top left')")
    return words[0], words[1], " ".join(words[2:])


def all_combos() -> list[tuple[str, str, str]]:
    return list(itertools.product(COLOURS, SHAPES, POSITIONS))


def render(
    colour: str,
    shape: str,
    position: str,
    radius: float = NOMINAL_RADIUS,
    dx: float = 0.0,
    dy: float = 0.0,
    size: int = RESOLUTION,
    supersample: int = 4,
) -> Image.Image:
    """Draw one anti-aliased shape (drawn at ``supersample``× and box-downsampled)."""
    big = size * supersample
    img = Image.new("RGB", (big, big), BACKGROUND)
    draw = ImageDraw.Draw(img)
    fx, fy = POSITIONS[position]
    cx, cy, r = (fx * size + dx) * supersample, (fy * size + dy) * supersample, radius * supersample
    box = (cx - r, cy - r, cx + r, cy + r)
    if shape == "circle":
        draw.ellipse(box, fill=COLOURS[colour])
    else:
        s = r * math.sqrt(math.pi) / 2  # same area as the circle
        draw.rectangle((cx - s, cy - s, cx + s, cy + s), fill=COLOURS[colour])
    return img.resize((size, size), Image.BOX)


def random_render(rng: random.Random, combo: tuple[str, str, str] | None = None) -> tuple[Image.Image, str]:
    """A training image with random radius in [5, 7] and jitter in [−2, 2] px, and its prompt."""
    colour, shape, position = combo or rng.choice(all_combos())
    img = render(colour, shape, position, radius=rng.uniform(5, 7), dx=rng.uniform(-2, 2), dy=rng.uniform(-2, 2))
    return img, prompt_of(colour, shape, position)


def to_array(img: Any) -> np.ndarray:
    """PIL image (or HWC uint8 array) → float32 [H, W, 3] in [0, 1], resized to the task resolution."""
    if isinstance(img, Image.Image):
        img = img.convert("RGB")
        if img.size != (RESOLUTION, RESOLUTION):
            img = img.resize((RESOLUTION, RESOLUTION), Image.BILINEAR)
        img = np.asarray(img)
    return np.asarray(img, dtype=np.float32) / 255.0


_TARGETS: dict[tuple[str, str], np.ndarray] = {}


def _target_mask(shape: str, position: str) -> np.ndarray:
    key = (shape, position)
    if key not in _TARGETS:
        white = {"circle": "circle", "square": "square"}[shape]
        img = render("red", white, position)  # any colour: the mask is where it differs from the background
        arr = to_array(img)
        bg = np.asarray(BACKGROUND, dtype=np.float32) / 255.0
        red = np.asarray(COLOURS["red"], dtype=np.float32) / 255.0
        _TARGETS[key] = np.clip(((arr - bg) @ (red - bg)) / float((red - bg) @ (red - bg)), 0, 1)
    return _TARGETS[key]


def shape_match(image: Any, prompt: str) -> float:
    """Soft IoU of the target-colour map with the canonical target shape (see the module docstring)."""
    colour, shape, position = parse_prompt(prompt)
    arr = to_array(image)  # [H, W, 3]
    c = np.asarray(COLOURS[colour], dtype=np.float32) / 255.0
    m = np.exp(-((arr - c) ** 2).sum(-1) / (2 * TAU**2))  # [H, W]
    s = _target_mask(shape, position)
    return float(np.minimum(m, s).sum() / max(np.maximum(m, s).sum(), 1e-6))


def flow_shape_match(completions: list, *, prompts: list, **_: Any) -> list[float]:
    """Soft IoU between the prompt's colour and its canonical shape in the decoded image (flow_shapes task).

    r = Σ min(m, s) / Σ max(m, s), with m the soft mask of pixels close to the prompt's colour and s the
    shape's target mask at its canonical position (see ``shape_match``).

    Source: ours, the reward of mmgrpo's synthetic flow_shapes task (no paper).
    """
    return [shape_match(img, p) for img, p in zip(completions, prompts)]


_BANK: torch.Tensor | None = None


def template_bank() -> torch.Tensor:
    """Clean renderings of every prompt at radii 5, 6, 7 and jitters −2…2 px (step 1). Shape: [N, H·W·3]."""
    global _BANK
    if _BANK is None:
        rows = [
            to_array(render(c, s, p, radius=r, dx=dx, dy=dy)).reshape(-1)
            for c, s, p in all_combos()
            for r in (5.0, 6.0, 7.0)
            for dx in range(-2, 3)
            for dy in range(-2, 3)
        ]
        _BANK = torch.from_numpy(np.stack(rows))
    return _BANK


def template_rmse(images: list) -> list[float]:
    """Per image, the RMSE (pixels in [0, 1]) to the nearest clean rendering of any prompt.

    Distances are computed directly (``cdist`` without the ‖x‖² − 2x·b + ‖b‖² expansion, whose float32
    cancellation left ~1e-3 for an exact match, depending on the thread count).
    """
    x = torch.from_numpy(np.stack([to_array(im).reshape(-1) for im in images]))  # [N, D]
    bank = template_bank()  # [M, D]
    d = torch.cdist(x, bank, compute_mode="donot_use_mm_for_euclid_dist")  # [N, M]
    return (d.min(1).values / x.shape[1] ** 0.5).tolist()


# ----------------------------------------------------------------------------------------------- task


@dataclass
class FlowShapesArgs:
    """Options under ``task.args`` for ``task.name: flow_shapes``."""

    train_repeats: int = 4
    """Each of the 24 training prompts appears this many times in the train split."""
    eval_seeds: int = 4
    """Initial noises per held-out prompt (rows get a ``seed`` column that the flow adapter's evaluate uses)."""
    include_train_prompts_in_eval: bool = False
    """Also evaluate the 24 training prompts (reported as eval/.../reward_train_prompts)."""


class FlowShapesTask:
    """``Task`` over the prompts of this module; ``score`` reports reward, realism and template RMSE."""

    def __init__(self, args: FlowShapesArgs, seed: int = 0):
        self.args = args
        self._metrics = EvalRewards([{"name": "flow_shape_match"}], "flow_shapes")
        held = set(HELD_OUT)
        self._train = [{"prompt": prompt_of(*c)} for c in all_combos() if c not in held] * args.train_repeats
        eval_combos = list(HELD_OUT)
        if args.include_train_prompts_in_eval:
            eval_combos += [c for c in all_combos() if c not in held]
        self._eval = [
            {"prompt": prompt_of(*c), "seed": 10_000 + 97 * i + k, "held_out": c in held}
            for i, c in enumerate(eval_combos)
            for k in range(args.eval_seeds)
        ]

    def train_rows(self) -> list[dict]:
        return self._train

    def eval_rows(self) -> list[dict]:
        return self._eval

    def score(self, outputs: list, rows: list[dict]) -> dict[str, float]:
        rewards = self._metrics.scores(outputs, rows)[:, 0].double().numpy()  # flow_shape_match, as training scores
        rmse = np.asarray(template_rmse(outputs))
        held = np.asarray([r.get("held_out", True) for r in rows])
        out = {
            "reward": float(rewards[held].mean()),
            "realism": float(np.exp(-rmse[held] / 0.1).mean()),
            "template_rmse": float(rmse[held].mean()),
        }
        if (~held).any():
            out["reward_train_prompts"] = float(rewards[~held].mean())
        return out


def _load(a: FlowShapesArgs, seed: int) -> FlowShapesTask:
    """The task from its checked ``task.args``."""
    if a.train_repeats < 1 or a.eval_seeds < 1:
        raise ConfigError("task.args.train_repeats and eval_seeds must be >= 1")
    return FlowShapesTask(a, seed)


build_flow_shapes = TASKS.register("flow_shapes")(TaskSpec(args=FlowShapesArgs, cls=FlowShapesTask, load=_load))


def _register_reward() -> None:
    try:
        from mmgrpo.rewards.registry import register_reward
    except ImportError:  # the rewards package is optional for the task itself
        return
    register_reward("flow_shape_match")(flow_shape_match)


_register_reward()


__all__ = [
    "FlowShapesArgs",
    "FlowShapesTask",
    "flow_shape_match",
    "render",
    "shape_match",
    "template_rmse",
]
