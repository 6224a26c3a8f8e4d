"""``zoom``: a small coloured square in each of four named boxes, too small to read at the policy's input resolution.

"Thinking with images" in miniature (DeepEyes, arXiv 2505.14362; Mini-o3, arXiv 2509.07969): the answer is only
legible in a crop, and what RL teaches is *where* to look. Each row holds an ``image_size`` × ``image_size`` image
(448 by default) covered with a fine checkerboard of random palette colours (``cell`` = 4 px) and ``grid`` × ``grid``
boxes (2 × 2 boxes of ``box`` = 56 px, one centred in each quarter), each holding one ``target`` × ``target`` square
(24 px); the squares' colours are a random permutation of the colours (one per box, all different when there are as
many colours as boxes). The prompt names one box in original-image pixels; the answer is that box's colour.

Why a crop is needed. The configs cap the image at ``model.args.max_pixels: 3136``, so the policy sees the image at
56 × 56 (an 8-times reduction per side, 4 vision tokens): a box is 7 pixels there and its square 3 × 3, where the
checkerboard averages to the palette's mean colour; the ``crop`` tool (``mmgrpo.tools``) called with a box returns
its 56 × 56 pixels, shown 1 : 1, the square 24 px wide. An oracle matched filter on 14-pixel patch means that knows
the box and the palette reads the prompt's box's colour on 0.515 of 200 rows at the policy's resolution and on 0.975
in the crop (chance 0.25; ``tests/test_zoom_task.py`` checks the gap). The premise is about what a patch
encoder averages, not about information: a reader of single pixels of the 56 × 56 view can find a 3-pixel blob; the
no-tool baseline (``tools: false``) measures what the tiny policy reads.

The warm-up stands in for what DeepEyes' pretrained Qwen2.5-VL brings to RL: perception and the tool format, not the
choice of region. With ``tools`` its targets are two turns — the crop call of a box drawn at random (the prompt's
box with probability ``warmup_call_hit_rate``, else one of the others uniformly; the default 1 / boxes makes the draw
uniform over all boxes, independent of the prompt; ``configs/zoom_tools.yaml`` uses 0.5, as GRPO did not learn from
the uniform draw in its budget: docs/agents.md), then ``<answer>colour</answer>`` with the colour of the box that was
cropped (what the crop shows). After it the policy calls the tool and reads crops, but its sampled calls crop the
prompt's box only at about that rate (greedy ones always, once a rate above 1 / boxes is learnt), and a wrong box's
colour is never the answer; GRPO must learn to crop the box the prompt names.
Without tools (the baseline, the same images) the warm-up target is ``<answer>`` with the true colour of the
prompt's box, to be read from the 56 × 56 view. Held-out metrics: ``accuracy`` (last ``<answer>``),
``tool_call_rate`` (outputs with a ``<tool_call>``), ``crop_hits_box`` (the first call crops exactly the prompt's
box) and ``chance``.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from typing import Annotated

import numpy as np
from PIL import Image

from mmgrpo.config import ConfigError, Range
from mmgrpo.media import MAX_IMAGE_SIDE
from mmgrpo.plugins import TASKS, TaskSpec
from mmgrpo.tasks.eval_rewards import EvalRewards, first_call_arguments, tool_answer_scores, warmup_call_pick
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
    """Answer colours (a subset of the shapes task's), also the checkerboard's palette; chance = 1 / their number.
    At least grid² of them: every box's square has its own colour."""
    image_size: Annotated[int, Range(ge=56, le=MAX_IMAGE_SIDE)] = 448
    """Side of the square image, original pixels (the configs' ``model.args.max_pixels`` 56² shows it at 56 × 56)."""
    grid: Annotated[int, Range(ge=1)] = 2
    """Boxes per side: grid × grid boxes, one centred in each image_size / grid cell, each with a square."""
    box: Annotated[int, Range(ge=28)] | None = 56
    """Side of a box, original pixels (the crop of a box is shown 1 : 1 when it fits max_pixels); None = the whole
    cell (image_size / grid)."""
    target: Annotated[int, Range(ge=2)] = 24
    """Side of the coloured square, original pixels."""
    cell: Annotated[int, Range(ge=1)] = 4
    """Side of a checkerboard cell, original pixels (below the processor's resolution: it averages out)."""
    warmup_call_hit_rate: Annotated[float, Range(ge=0.0, le=1.0)] | None = None
    """Share of the warm-up's crop calls that crop the prompt's box (the others crop one of the other boxes, drawn
    uniformly); None = 1 / grid², a uniform draw over all boxes, independent of the prompt. Tools only."""
    train_size: Annotated[int, Range(ge=1)] = 2000
    """Rows in the train split."""
    eval_size: Annotated[int, Range(ge=1)] = 200
    """Rows in the held-out split."""
    seed: int = 4321
    """Base seed (train and eval use different derived seeds)."""


def render(rng: random.Random, a: ZoomArgs, squares: list[tuple[str, list[int]]]) -> Image.Image:
    """The checkerboard of random palette colours and, for each ``(colour, box)``, a square of that colour at a
    random place inside the box."""
    n = a.image_size // a.cell
    palette = np.array([COLOURS[c] for c in a.colours], dtype=np.uint8)  # [C, 3]
    cells = randbelow_many(rng, len(palette), n * n)  # [n²], rng.randrange(C) n² times
    small = Image.fromarray(palette[cells].reshape(n, n, 3), "RGB")
    image = small.resize((n * a.cell, n * a.cell), Image.Resampling.NEAREST)
    if image.size != (a.image_size, a.image_size):
        image = image.crop((0, 0, a.image_size, a.image_size))
    for colour, (x1, y1, x2, y2) in squares:
        margin = max(0, (x2 - x1 - a.target) // 4)
        x = rng.randint(x1 + margin, x2 - a.target - margin)
        y = rng.randint(y1 + margin, y2 - a.target - margin)
        image.paste(Image.new("RGB", (a.target, a.target), COLOURS[colour]), (x, y))
    return image


def randbelow_many(rng: random.Random, n: int, count: int) -> np.ndarray:
    """``[rng.randrange(n) for _ in range(count)]`` as an int64 array [count], the same numbers and ``rng`` left in
    the same state, drawn in bulk: ``randrange(n)`` takes the top ``k = n.bit_length()`` bits of one 32-bit Mersenne
    Twister output and redraws while the value is ``>= n`` (CPython's ``_randbelow_with_getrandbits``); numpy's
    MT19937 started from ``rng``'s state gives the same outputs, so the accepted values are those of the loop, and
    ``rng`` is moved past exactly the outputs the loop would have used (tests/test_zoom_task.py checks both)."""
    k = n.bit_length()
    if count <= 0 or k > 32:  # nothing to draw / more bits than one output: the loop itself
        return np.array([rng.randrange(n) for _ in range(count)], dtype=np.int64)
    version, internal, gauss = rng.getstate()
    key = np.array(internal[:-1], dtype=np.uint32)  # [624]
    start = {"bit_generator": "MT19937", "state": {"key": key, "pos": internal[-1]}}
    bits = np.random.MT19937()
    bits.state = start
    raw = np.zeros(0, dtype=np.uint64)
    accepted = np.zeros(0, dtype=np.int64)
    while len(accepted) < count:  # about count · 2^k / n outputs, and a margin
        more = bits.random_raw(int((count - len(accepted)) * (1 << k) / n) + 64)  # [m] 32-bit outputs
        raw = np.concatenate([raw, more])
        accepted = np.flatnonzero((raw >> np.uint64(32 - k)) < n)
    used = int(accepted[count - 1]) + 1  # outputs the loop consumes
    values = (raw[accepted[:count]] >> np.uint64(32 - k)).astype(np.int64)  # [count]
    bits.state = start
    bits.random_raw(used)
    after = bits.state["state"]
    rng.setstate((version, (*(int(w) for w in after["key"]), int(after["pos"])), gauss))
    return values


def crop_call(box: list[int]) -> str:
    """The tool call that crops ``box`` (the warm-up's first turn)."""
    return "<tool_call>" + json.dumps({"name": "crop", "arguments": {"bbox_2d": box}}) + "</tool_call>"


class ZoomTask:
    """See the module docstring."""

    def __init__(self, args: ZoomArgs):
        unknown = [c for c in args.colours if c not in COLOURS]
        if unknown or len(args.colours) < max(2, args.grid**2):
            raise ConfigError(
                f"task.args.colours: need >= max(2, grid² = {args.grid**2}) of {', '.join(COLOURS)} (one colour per "
                f"box); got {args.colours}"
            )
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
        a, rng, boxes = self.args, random.Random(seed), self.boxes()
        rows = []
        for _ in range(n):
            k = rng.randrange(len(boxes))
            colours = rng.sample(a.colours, len(boxes))  # box i's square is colours[i]
            image = render(rng, a, list(zip(colours, boxes)))
            prompt = (TOOL_PROMPT if a.tools else PLAIN_PROMPT).format(box=boxes[k])
            rows.append({"prompt": prompt, "image": image, "answer": colours[k], "box": boxes[k], "colours": colours})
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
        """Perception and format targets (the module docstring). With tools: the crop call of a box drawn at random
        (the prompt's with probability ``warmup_call_hit_rate``), then the colour of the box cropped; without: the
        prompt's box's colour."""
        a, rng, boxes = self.args, random.Random(seed), self.boxes()
        out = []
        for row in self._train:
            if not a.tools:
                out.append(dict(row, target=f"<answer>{row['answer']}</answer>"))
                continue
            k = warmup_call_pick(rng, boxes.index(row["box"]), len(boxes), a.warmup_call_hit_rate)
            out.append(dict(row, target=[crop_call(boxes[k]), f"<answer>{row['colours'][k]}</answer>"]))
        return out

    def score(self, outputs: list[str], rows: list[dict]) -> dict[str, float]:
        """accuracy (the ``accuracy`` reward: the last <answer>), tool_call_rate, crop_hits_box (outputs whose first
        tool call is a crop of exactly the row's box), chance."""
        accuracy = self._metrics.scores(outputs, rows)[:, 0]
        boxes = [first_call_arguments(o, "crop") or {} for o in outputs]
        hits = [b.get("bbox_2d") == row["box"] for b, row in zip(boxes, rows)]
        return tool_answer_scores(accuracy, outputs, "crop_hits_box", hits, 1 / len(self.args.colours))


build_zoom_task = TASKS.register("zoom")(TaskSpec(args=ZoomArgs, cls=ZoomTask, load=lambda a, seed: ZoomTask(a)))
