"""``video_find``: the colour of a brief flash in a video, too brief for the frames the policy's prompt samples.

The video counterpart of ``zoom`` ("thinking with videos": Pixel-Reasoner's ``select_frames``, arXiv 2505.15966;
VITAL's dense re-sampling of a time span on demand, arXiv 2508.04416). Each row is an mp4 file of ``num_frames``
frames at ``fps`` (32 at 8 fps: 4 s) over a static noisy background; for ``flash_frames`` consecutive frames (2:
0.25 s) a large square of the answer colour is shown. The prompt names a time span, one of ``spans`` (4 by default,
0.5 s each: ``[0.5, 1.0]``, ``[1.5, 2.0]``, ...), that holds the flash.

Why the tool is needed. The configs sample ``prompt_frames`` frames (``model.args.video.nframes: 4``, qwen-vl-utils'
``linspace(0, num_frames - 1, 4).round()``: frames 0, 10, 21, 31) into the prompt, and the flash never falls on one
of them: the answer is not in the policy's input at all (chance 1 / colours; ``tests/test_video_find_task.py`` decodes
the prompt's clip and finds no flash pixel). ``select_frames(start, end)`` over the prompt's span returns the span's
frames at the file's native rate (the video adapter's ``span_frames``), the flash among them.

Two variants (``tools``), as in ``zoom``: with tools the prompt asks for a ``select_frames`` call of the span first
and the warm-up targets are two turns — the call of the prompt's span, then ``<answer>colour</answer>`` with a
**random** colour (the format, not the skill); without tools the same videos, the answer alone. Held-out metrics:
``accuracy``, ``tool_call_rate``, ``call_hits_span`` (the first call is ``select_frames`` of exactly the prompt's
span) and ``chance``. Files are written once with PyAV under ``$MMGRPO_CACHE/video_find/<hash of the options>``.
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Annotated

import numpy as np

from mmgrpo.cache import cache_dir, publish_dir
from mmgrpo.config import ConfigError, Range
from mmgrpo.plugins import TASKS, TaskSpec
from mmgrpo.tasks.eval_rewards import EvalRewards, first_call_arguments, tool_answer_scores
from mmgrpo.tasks.shapes import COLOURS
from mmgrpo.tasks.video_motion import _background, write_mp4

TOOL_PROMPT = (
    "Something flashes between {start}s and {end}s. What colour is it? It is too brief to see here: first look "
    "at that span with the select_frames tool, then answer with <answer>colour</answer>."
)
PLAIN_PROMPT = "Something flashes between {start}s and {end}s. What colour is it? Answer with <answer>colour</answer>."
RENDER_VERSION = 1  # part of the cache key: bump when the drawing changes


@dataclass
class VideoFindArgs:
    """Options under ``task.args`` for ``task.name: video_find``."""

    tools: bool = True
    """Prompts and warm-up targets for a policy with select_frames (a call, then the answer); false: the no-tool
    baseline on the same videos (the answer only)."""
    colours: list[str] = field(default_factory=lambda: ["red", "green", "blue", "yellow"])
    """Flash colours (a subset of the shapes task's); chance = 1 / their number."""
    spans: list[list[float]] = field(default_factory=lambda: [[0.5, 1.0], [1.5, 2.0], [2.5, 3.0], [3.5, 4.0]])
    """The time spans [start, end] (seconds) a prompt may name; the flash lies inside the named one."""
    frame_size: int = 56
    """Square frame side in pixels."""
    num_frames: Annotated[int, Range(ge=4)] = 32
    """Frames in each file."""
    fps: Annotated[int, Range(ge=1)] = 8
    """Frame rate of the files."""
    flash_frames: Annotated[int, Range(ge=1)] = 2
    """Consecutive frames that show the flash."""
    prompt_frames: Annotated[int, Range(ge=2)] = 4
    """Frames the policy's prompt samples (must equal the config's model.args.video.nframes): the flash avoids them."""
    train_size: Annotated[int, Range(ge=1)] = 1000
    """Rows in the train split."""
    eval_size: Annotated[int, Range(ge=1)] = 200
    """Rows in the held-out split."""
    seed: int = 2468
    """Base seed (train and eval use different derived seeds)."""
    video_dir: str | None = None
    """Where the mp4 files go; None = $MMGRPO_CACHE/video_find/<hash of these options>."""


def prompt_indices(num_frames: int, prompt_frames: int) -> list[int]:
    """The frames qwen-vl-utils samples with ``nframes``: ``linspace(0, num_frames - 1, n).round()`` (torch's round,
    halves to even, as qwen-vl-utils uses)."""
    import torch

    return torch.linspace(0, num_frames - 1, prompt_frames).round().long().tolist()


def select_call(span: list[float]) -> str:
    """The tool call that selects ``span`` (the warm-up's first turn)."""
    args = {"start": span[0], "end": span[1]}
    return "<tool_call>" + json.dumps({"name": "select_frames", "arguments": args}) + "</tool_call>"


class VideoFindTask:
    """See the module docstring."""

    def __init__(self, args: VideoFindArgs):
        unknown = [c for c in args.colours if c not in COLOURS]
        if unknown or len(args.colours) < 2:
            raise ConfigError(f"task.args.colours: need >= 2 of {', '.join(COLOURS)}; got {args.colours}")
        if args.frame_size < 28 or args.frame_size % 2:
            raise ConfigError(f"task.args.frame_size: must be an even number >= 28, got {args.frame_size}")
        self.args = args
        self._sampled = set(prompt_indices(args.num_frames, args.prompt_frames))
        self._starts = [self._flash_starts(span) for span in args.spans]
        for span, starts in zip(args.spans, self._starts):
            if not starts:
                raise ConfigError(
                    f"task.args.spans: {span} holds no {args.flash_frames} consecutive frames of the "
                    f"{args.num_frames}-frame, {args.fps}-fps video that the prompt's {args.prompt_frames} frames "
                    "skip; widen the span or change prompt_frames"
                )
        self._metrics = EvalRewards([{"name": "accuracy"}], "video_find")
        self.video_dir = Path(args.video_dir) if args.video_dir else self._default_dir()
        self._train, self._eval = self._build()

    def _flash_starts(self, span: list[float]) -> list[int]:
        """First frames f of a flash inside ``span`` whose frames f..f+flash_frames-1 the prompt does not sample."""
        a = self.args
        frames = [i for i in range(a.num_frames) if span[0] <= i / a.fps <= span[1]]
        return [
            f
            for f in frames
            if f + a.flash_frames - 1 in frames and not self._sampled & set(range(f, f + a.flash_frames))
        ]

    def _default_dir(self) -> Path:
        content = {k: v for k, v in asdict(self.args).items() if k not in ("video_dir", "tools")}
        content["render_version"] = RENDER_VERSION
        digest = hashlib.sha1(json.dumps(content, sort_keys=True).encode()).hexdigest()[:12]
        return cache_dir() / "video_find" / digest

    def _rows(self, n: int, seed: int, split: str) -> list[tuple[dict, list[np.ndarray]]]:
        a, rng = self.args, random.Random(seed)
        out = []
        for k in range(n):
            row_rng = random.Random(rng.getrandbits(64))
            s, colour = row_rng.randrange(len(a.spans)), row_rng.choice(a.colours)
            first = row_rng.choice(self._starts[s])
            bg = _background(row_rng, a.frame_size)
            side = row_rng.randint(a.frame_size // 2, a.frame_size * 3 // 4)
            x, y = row_rng.randint(0, a.frame_size - side), row_rng.randint(0, a.frame_size - side)
            frames = []
            for t in range(a.num_frames):
                frame = bg.copy()
                if first <= t < first + a.flash_frames:
                    frame[y : y + side, x : x + side] = COLOURS[colour]
                frames.append(frame)
            span = list(a.spans[s])
            prompt = (TOOL_PROMPT if a.tools else PLAIN_PROMPT).format(start=span[0], end=span[1])
            row = {
                "prompt": prompt,
                "answer": colour,
                "span": span,
                "flash": [first / a.fps, (first + a.flash_frames) / a.fps],
                "video": str(self.video_dir / f"{split}_{k:05d}.mp4"),
            }
            out.append((row, frames))
        return out

    def _build(self) -> tuple[list[dict], list[dict]]:
        a = self.args
        train = self._rows(a.train_size, a.seed * 2 + 1, "train")
        evals = self._rows(a.eval_size, a.seed * 2 + 2, "eval")

        def write(tmp: Path) -> None:
            for row, frames in train + evals:
                write_mp4(tmp / Path(row["video"]).name, frames, a.fps)

        publish_dir(self.video_dir, write, {k: v for k, v in asdict(a).items() if k != "tools"})
        return [r for r, _ in train], [r for r, _ in evals]

    def train_rows(self) -> list[dict]:
        return self._train

    def eval_rows(self) -> list[dict]:
        return self._eval

    def warmup_rows(self, seed: int) -> list[dict]:
        """Format-only targets: the select_frames call of the row's span (with tools), then an answer drawn at
        random, independent of the video."""
        rng = random.Random(seed)
        out = []
        for row in self._train:
            answer = f"<answer>{rng.choice(self.args.colours)}</answer>"
            out.append(dict(row, target=[select_call(row["span"]), answer] if self.args.tools else answer))
        return out

    def score(self, outputs: list[str], rows: list[dict]) -> dict[str, float]:
        """accuracy (the last <answer>), tool_call_rate, call_hits_span (the first call selects exactly the row's
        span), chance."""
        accuracy = self._metrics.scores(outputs, rows)[:, 0]
        calls = [first_call_arguments(o, "select_frames") for o in outputs]
        hits = [c is not None and [c.get("start"), c.get("end")] == row["span"] for c, row in zip(calls, rows)]
        return tool_answer_scores(accuracy, outputs, "call_hits_span", hits, 1 / len(self.args.colours))


build_video_find_task = TASKS.register("video_find")(
    TaskSpec(args=VideoFindArgs, cls=VideoFindTask, load=lambda a, seed: VideoFindTask(a))
)
