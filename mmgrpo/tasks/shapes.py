"""A procedurally generated visual question task: colour / shape / count questions on rendered images.

Each row holds a freshly rendered PIL image (one or more filled shapes at random positions and sizes on a
noisy background), a question, and the ``answer`` the ``accuracy`` reward compares against. Train and eval
splits are drawn from different seeds, so the held-out images are never seen in training.

Answers are one word inside ``<answer></answer>`` tags. ``warmup_rows`` gives format-only targets: the
answer word is drawn uniformly from the question's answer set, *independent of the image*, so a supervised
warm-up teaches the output format and vocabulary but not the visual skill — accuracy after warm-up stays at
chance, and any gain beyond that comes from GRPO.

The ``colours`` question is multi-answer multiple choice (for TW-GRPO's ``multiple_choice_partial`` reward): 2 or
3 shapes of distinct colours, options A, B, … naming ``task.args.colours`` in order, the answer the sorted letters
of the colours present joined by ``", "`` (``"A, C"``). Its answer set is every such letter set (35 for six
colours), its warm-up targets one of them at random, and ``score`` adds ``set_accuracy`` (the exact set, the
partial reward equal to 1) and ``partial`` (the reward's mean) over the ``colours`` rows.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass, field
from typing import Annotated, Literal

from PIL import Image, ImageDraw

from mmgrpo.config import ConfigError, Range
from mmgrpo.media import MAX_IMAGE_SIDE
from mmgrpo.plugins import TASKS, TaskSpec
from mmgrpo.tasks.eval_rewards import EvalRewards

COLOURS = {
    "red": (220, 40, 40),
    "green": (40, 180, 60),
    "blue": (50, 80, 230),
    "yellow": (235, 215, 40),
    "purple": (150, 60, 190),
    "orange": (245, 140, 30),
}
SHAPES = ["circle", "square", "triangle"]
COUNT_WORDS = ["one", "two", "three", "four"]

QUESTIONS = {
    "colour": "What colour is the shape? Answer with <answer>colour</answer>.",
    "shape": "What shape is it? Answer with <answer>shape</answer>.",
    "count": "How many shapes are there? Answer with <answer>number</answer>.",
    "colours": "Which colours are in the image? {options}. Answer with the letters of all that apply, "
    "e.g. <answer>A, C</answer>.",
}
ANSWERS = {"colour": list(COLOURS), "shape": SHAPES, "count": COUNT_WORDS}


@dataclass
class ShapesArgs:
    """Options under ``task.args`` for ``task.name: shapes``."""

    questions: Annotated[list[Literal[tuple(QUESTIONS)]], Range(ge=1)] = field(default_factory=lambda: ["colour"])
    """Question types to mix: colour | shape | count | colours (which colours are present, several letters)."""
    colours: list[str] = field(default_factory=lambda: list(COLOURS))
    """Colours drawn (and the answer set of colour questions), a subset of: red, green, blue, yellow, purple, orange."""
    image_size: Annotated[int, Range(ge=28, le=MAX_IMAGE_SIDE)] = 56
    """Square image side in pixels (multiples of 28 map to whole merged patches for Qwen2-VL)."""
    train_size: Annotated[int, Range(ge=1)] = 2000
    """Rows in the train split."""
    eval_size: Annotated[int, Range(ge=1)] = 200
    """Rows in the held-out split."""
    seed: int = 1234
    """Base seed of the generator (train and eval use different derived seeds)."""


def _draw_shape(draw: ImageDraw.ImageDraw, kind: str, box: tuple[int, int, int, int], colour: tuple) -> None:
    x0, y0, x1, y1 = box
    if kind == "circle":
        draw.ellipse(box, fill=colour)
    elif kind == "square":
        draw.rectangle(box, fill=colour)
    else:
        draw.polygon([((x0 + x1) // 2, y0), (x1, y1), (x0, y1)], fill=colour)


def render(rng: random.Random, size: int, n_shapes: int, kind: str, colour: str) -> Image.Image:
    """One image with ``n_shapes`` shapes of one kind and colour on a dark noisy background."""
    return render_shapes(rng, size, [(kind, colour)] * n_shapes)


def render_shapes(rng: random.Random, size: int, shapes: list[tuple[str, str]]) -> Image.Image:
    """One image with one shape per ``(kind, colour)`` (at most 4, one per quadrant) on a dark noisy background;
    the same random draws as :func:`render` for the same number of shapes."""
    n_shapes = len(shapes)
    base = rng.randint(15, 60)
    img = Image.new("RGB", (size, size), (base, base, base))
    draw = ImageDraw.Draw(img)
    for _ in range(size * size // 16):  # speckle noise so the background is not a constant
        x, y, v = rng.randrange(size), rng.randrange(size), rng.randint(0, 70)
        draw.point((x, y), fill=(v, v, v))
    cells = size // 2 if n_shapes > 1 else size
    slots = [(0, 0), (1, 0), (0, 1), (1, 1)] if n_shapes > 1 else [(0, 0)]
    for (cx, cy), (kind, colour) in zip(rng.sample(slots, n_shapes), shapes):
        side = rng.randint(int(cells * 0.5), int(cells * 0.85))
        x0 = cx * cells + rng.randint(0, cells - side)
        y0 = cy * cells + rng.randint(0, cells - side)
        jitter = tuple(max(0, min(255, c + rng.randint(-20, 20))) for c in COLOURS[colour])
        _draw_shape(draw, kind, (x0, y0, x0 + side, y0 + side), jitter)
    return img


class ShapesTask:
    """See the module docstring."""

    def __init__(self, args: ShapesArgs):
        self._metrics = EvalRewards([{"name": "accuracy"}, {"name": "format", "kwargs": {"think": False}}], "shapes")
        unknown = [c for c in args.colours if c not in COLOURS]
        if unknown or len(args.colours) < 2:
            raise ConfigError(f"task.args.colours: need >= 2 of {', '.join(COLOURS)}; got {args.colours}")
        self.args = args
        letters = "ABCDEFGH"[: len(args.colours)]
        self._options = ", ".join(f"{letter} {c}" for letter, c in zip(letters, args.colours))
        sets = [s for k in (2, 3) for s in itertools.combinations(letters, k)]
        self._colour_sets = [", ".join(s) for s in sorted(sets)]  # the colours question's answer set
        self._sets = EvalRewards([{"name": "multiple_choice_partial"}], "shapes")
        self._train = self._make(args.train_size, args.seed * 2 + 1)
        self._eval = self._make(args.eval_size, args.seed * 2 + 2)

    def _make(self, n: int, seed: int) -> list[dict]:
        rng = random.Random(seed)
        rows = []
        for i in range(n):
            q = self.args.questions[i % len(self.args.questions)]
            if q == "colours":
                rows.append(self._colours_row(rng))
                continue
            count = rng.randint(1, 4) if q == "count" else 1
            kind, colour = rng.choice(SHAPES), rng.choice(self.args.colours)
            image = render(rng, self.args.image_size, count, kind, colour)
            answer = {"colour": colour, "shape": kind, "count": COUNT_WORDS[count - 1]}[q]
            rows.append({"prompt": QUESTIONS[q], "image": image, "answer": answer, "question_type": q})
        return rows

    def _colours_row(self, rng: random.Random) -> dict:
        """2 or 3 shapes (random kinds) of distinct colours; the answer is their sorted option letters."""
        colours = rng.sample(self.args.colours, rng.randint(2, min(3, len(self.args.colours))))
        image = render_shapes(rng, self.args.image_size, [(rng.choice(SHAPES), c) for c in colours])
        answer = ", ".join(sorted("ABCDEFGH"[self.args.colours.index(c)] for c in colours))
        prompt = QUESTIONS["colours"].format(options=self._options)
        return {"prompt": prompt, "image": image, "answer": answer, "question_type": "colours"}

    def train_rows(self) -> list[dict]:
        return self._train

    def eval_rows(self) -> list[dict]:
        return self._eval

    def answers(self, question_type: str) -> list[str]:
        """The answer set of a question type."""
        if question_type == "colours":
            return self._colour_sets
        return self.args.colours if question_type == "colour" else ANSWERS[question_type]

    def warmup_rows(self, seed: int) -> list[dict]:
        """Format-only supervised targets: a random answer word of the right type (image-independent)."""
        rng = random.Random(seed)
        return [
            dict(row, target=f"<answer>{rng.choice(self.answers(row['question_type']))}</answer>")
            for row in self._train
        ]

    def score(self, outputs: list[str], rows: list[dict]) -> dict[str, float]:
        """accuracy (the ``accuracy`` reward, last <answer>), format rate, and the chance level of the mix; with
        ``colours`` rows also ``set_accuracy`` (the exact letter set, in any order) and ``partial`` (the mean
        ``multiple_choice_partial`` reward) over those rows."""
        chance = sum(1 / len(self.answers(r["question_type"])) for r in rows) / len(rows)
        metrics = {**self._metrics.score(outputs, rows), "chance": chance}
        picked = [i for i, r in enumerate(rows) if r["question_type"] == "colours"]
        if picked:
            partial = self._sets.scores([outputs[i] for i in picked], [rows[i] for i in picked])[:, 0]  # [n]
            metrics.update(set_accuracy=float((partial == 1.0).float().mean()), partial=float(partial.mean()))
        return metrics


build_shapes_task = TASKS.register("shapes")(
    TaskSpec(args=ShapesArgs, cls=ShapesTask, load=lambda a, seed: ShapesTask(a))
)
