"""``zoom``: a small coloured square in a large image, too small to read at the policy's input resolution.

"Thinking with images" in miniature (DeepEyes, arXiv 2505.14362; Mini-o3, arXiv 2509.07969): the answer is only
legible in a crop. Each row holds an ``image_size`` × ``image_size`` image (448 by default) covered with a fine
checkerboard of random palette colours (``cell`` = 4 px), and one ``target`` × ``target`` square (24 px) of the
answer colour inside one of ``grid`` × ``grid`` boxes (2 × 2 boxes of ``box`` = 56 px, one centred in each quarter).
The prompt names that box in original-image pixels.

Why a crop is needed. The configs cap the image at ``model.args.max_pixels: 3136``, so the policy sees the image at
56 × 56 (an 8-times reduction per side, 4 vision tokens): the box is 7 pixels there and the square 3 × 3, where the
checkerboard averages to the palette's mean colour; the ``crop`` tool (``mmgrpo.tools``) called with the prompt's box
returns its 56 × 56 pixels, shown 1 : 1, the square 24 px wide. Measured with an oracle matched filter on 14-pixel
patch means that knows the box and the palette (200 rows): 0.43 at the policy's resolution (chance 0.25), 0.975 on
the crop (``tests/test_zoom_task.py`` checks the gap). The premise is about what a patch encoder averages, not about
information: a reader of single pixels of the 56 × 56 view can find the square's 3-pixel blob; the no-tool baseline
(``tools: false``) measures what the tiny policy reads.

Two variants (``tools``): with tools the prompt asks for a ``crop`` call first and the warm-up targets are two turns
— the call with the prompt's box, then ``<answer>colour</answer>`` with a **random** colour (the format, not the
skill: accuracy after the warm-up stays at chance); without tools (the baseline, the same images) the prompt asks for
the answer and the warm-up target is the random answer alone. Held-out metrics: ``accuracy`` (last ``<answer>``),
``tool_call_rate`` (outputs with a ``<tool_call>``), ``crop_hits_box`` (the first call crops exactly the row's box)
and ``chance``.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from typing import Annotated

from PIL import Image

from mmgrpo.config import ConfigError, Range
from mmgrpo.plugins import TASKS, TaskSpec
from mmgrpo.tasks.eval_rewards import EvalRewards, first_call_arguments, tool_answer_scores
from mmgrpo.tasks.shapes import COLOURS

TOOL_PROMPT = (
    "What colour is the small square in the box {box}? It is too small to see here: first crop the box with the "
    "crop tool, then answer with <answer>colour</answer>."
)
PLAIN_PROMPT = "What colour is the small square in the box {box}? Answer with <answer>colour</answer>."


@dataclass
class ZoomArgs:
    """Options under ``task.args`` for ``task.name: zoom``."""

    tools: bool = True
    """Prompts and warm-up targets for a policy with the crop tool (a crop call, then the answer); false: the
    no-tool baseline on the same images (the answer only)."""
    colours: list[str] = field(default_factory=lambda: ["red", "green", "blue", "yellow"])
    """Answer colours (a subset of the shapes task's), also the checkerboard's palette; chance = 1 / their number."""
    image_size: Annotated[int, Range(ge=56)] = 448
    """Side of the square image, original pixels (the configs' ``model.args.max_pixels`` 56² shows it at 56 × 56)."""
    grid: Annotated[int, Range(ge=1)] = 2
    """Boxes per side: the square lies in one of grid × grid boxes, one centred in each image_size / grid cell."""
    box: Annotated[int, Range(ge=28)] | None = 56
    """Side of a box, original pixels (the crop of a box is shown 1 : 1 when it fits max_pixels); None = the whole
    cell (image_size / grid)."""
    target: Annotated[int, Range(ge=2)] = 24
    """Side of the coloured square, original pixels."""
    cell: Annotated[int, Range(ge=1)] = 4
    """Side of a checkerboard cell, original pixels (below the processor's resolution: it averages out)."""
    train_size: Annotated[int, Range(ge=1)] = 2000
    """Rows in the train split."""
    eval_size: Annotated[int, Range(ge=1)] = 200
    """Rows in the held-out split."""
    seed: int = 4321
    """Base seed (train and eval use different derived seeds)."""


def render(rng: random.Random, a: ZoomArgs, colour: str, box: tuple[int, int, int, int]) -> Image.Image:
    """The checkerboard of random palette colours and the answer's square at a random place inside ``box``."""
    n = a.image_size // a.cell
    palette = [COLOURS[c] for c in a.colours]
    small = Image.new("RGB", (n, n))
    small.putdata([palette[rng.randrange(len(palette))] for _ in range(n * n)])
    image = small.resize((n * a.cell, n * a.cell), Image.Resampling.NEAREST)
    if image.size != (a.image_size, a.image_size):
        image = image.crop((0, 0, a.image_size, a.image_size))
    x1, y1, x2, y2 = box
    margin = max(0, (x2 - x1 - a.target) // 4)
    x = rng.randint(x1 + margin, x2 - a.target - margin)
    y = rng.randint(y1 + margin, y2 - a.target - margin)
    image.paste(Image.new("RGB", (a.target, a.target), COLOURS[colour]), (x, y))
    return image


def crop_call(box: list[int]) -> str:
    """The tool call that crops ``box`` (the warm-up's first turn)."""
    return "<tool_call>" + json.dumps({"name": "crop", "arguments": {"bbox_2d": box}}) + "</tool_call>"


class ZoomTask:
    """See the module docstring."""

    def __init__(self, args: ZoomArgs):
        unknown = [c for c in args.colours if c not in COLOURS]
        if unknown or len(args.colours) < 2:
            raise ConfigError(f"task.args.colours: need >= 2 of {', '.join(COLOURS)}; got {args.colours}")
        cell = args.image_size // args.grid
        side = cell if args.box is None else args.box
        if args.image_size % args.grid or not args.target + 2 <= side <= cell:
            raise ConfigError(
                f"task.args.grid/box: image_size {args.image_size} must split into {args.grid} cells per side, each "
                f"holding a box of {side} px larger than the target ({args.target} px); change grid, box, image_size "
                "or target"
            )
        self.args = args
        self._metrics = EvalRewards([{"name": "accuracy"}], "zoom")
        self._train = self._make(args.train_size, args.seed * 2 + 1)
        self._eval = self._make(args.eval_size, args.seed * 2 + 2)

    def _make(self, n: int, seed: int) -> list[dict]:
        a, rng = self.args, random.Random(seed)
        rows = []
        for _ in range(n):
            gx, gy, colour = rng.randrange(a.grid), rng.randrange(a.grid), rng.choice(a.colours)
            box = self.boxes()[gy * a.grid + gx]
            prompt = (TOOL_PROMPT if a.tools else PLAIN_PROMPT).format(box=box)
            rows.append({"prompt": prompt, "image": render(rng, a, colour, tuple(box)), "answer": colour, "box": box})
        return rows

    def boxes(self) -> list[list[int]]:
        """The grid × grid boxes [x1, y1, x2, y2], row by row: one of side ``box`` centred in each cell."""
        a = self.args
        cell = a.image_size // a.grid
        side = cell if a.box is None else a.box
        off = (cell - side) // 2
        return [
            [gx * cell + off, gy * cell + off, gx * cell + off + side, gy * cell + off + side]
            for gy in range(a.grid)
            for gx in range(a.grid)
        ]

    def train_rows(self) -> list[dict]:
        return self._train

    def eval_rows(self) -> list[dict]:
        return self._eval

    def warmup_rows(self, seed: int) -> list[dict]:
        """Format-only targets (the module docstring): the crop call of the row's box (with tools), then an answer
        drawn at random, independent of the image."""
        rng = random.Random(seed)
        out = []
        for row in self._train:
            answer = f"<answer>{rng.choice(self.args.colours)}</answer>"
            out.append(dict(row, target=[crop_call(row["box"]), answer] if self.args.tools else answer))
        return out

    def score(self, outputs: list[str], rows: list[dict]) -> dict[str, float]:
        """accuracy (the ``accuracy`` reward: the last <answer>), tool_call_rate, crop_hits_box (outputs whose first
        tool call is a crop of exactly the row's box), chance."""
        accuracy = self._metrics.scores(outputs, rows)[:, 0]
        boxes = [first_call_arguments(o, "crop") or {} for o in outputs]
        hits = [b.get("bbox_2d") == row["box"] for b, row in zip(boxes, rows)]
        return tool_answer_scores(accuracy, outputs, "crop_hits_box", hits, 1 / len(self.args.colours))


build_zoom_task = TASKS.register("zoom")(TaskSpec(args=ZoomArgs, cls=ZoomTask, load=lambda a, seed: ZoomTask(a)))
