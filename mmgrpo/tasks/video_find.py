"""``video_find``: the colour of the brief flash in the time span the prompt names, too brief for the frames the
policy's prompt samples.

The video counterpart of ``zoom`` ("thinking with videos": Pixel-Reasoner's ``select_frames``, arXiv 2505.15966;
VITAL's dense re-sampling of a time span on demand, arXiv 2508.04416). Each row is an mp4 file of ``num_frames``
frames at ``fps`` (32 at 8 fps: 4 s) over a static noisy background. Every one of the ``spans`` (4 by default, 0.5 s
each: ``[0.5, 1.0]``, ``[1.5, 2.0]``, ...) holds one flash of ``flash_frames`` consecutive frames (2: 0.25 s), a large
square, each span's flash a different colour (a random permutation of ``colours``; needs as many colours as spans).
The prompt names one span; the answer is that span's colour. Fetching frames is not enough: the policy has to fetch
the *named* span's frames (a wrong span shows a wrong colour).

Why the tool is needed. The configs sample ``prompt_frames`` frames (``model.args.video.nframes: 4``, qwen-vl-utils'
``linspace(0, num_frames - 1, 4).round()``: frames 0, 10, 21, 31) into the prompt, and the flash never falls on one
of them: the answer is not in the policy's input at all (chance 1 / colours; ``tests/test_video_find_task.py`` decodes
the prompt's clip and finds no flash pixel). ``select_frames(start, end)`` over the prompt's span returns the span's
frames at the file's native rate (the video adapter's ``span_frames``), the flash among them.

The warm-up stands in for what a pretrained video LLM brings to RL (VITAL and Pixel-Reasoner start from
Qwen2.5-VL, which already perceives colour and knows the tool format; RL teaches *which* frames to fetch). With tools
its targets are two turns: a ``select_frames`` call of a span drawn at random — the prompt's span with probability
``warmup_call_hit_rate`` (default 1 / spans: uniform, not conditioned on the prompt), another span otherwise — then
``<answer>`` with the colour of the flash in the span actually selected (perception of the returned frames and the
format, not the choice of span). After it the policy calls, reads what it fetched, and picks the prompt's span about
a quarter of the time; GRPO has to teach the choice. Without tools (the baseline on the same videos) the targets are
``<answer>`` with the true colour, which the prompt's frames do not show. Held-out metrics: ``accuracy``,
``tool_call_rate``, ``call_hits_span`` (the first call is ``select_frames`` of exactly the prompt's span),
``reads_selected`` (the answer is the colour of the span the first call selected, whichever it is: perception) and
``chance``. Files are written once with PyAV under ``$MMGRPO_CACHE/video_find/<hash of the options>``.
"""

from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Annotated

import numpy as np

from mmgrpo.config import ConfigError, Range
from mmgrpo.media import MAX_FRAME_SIDE, MAX_FRAMES
from mmgrpo.plugins import TASKS, TaskSpec
from mmgrpo.tasks.eval_rewards import EvalRewards, first_call_arguments, tool_answer_scores, warmup_call_pick
from mmgrpo.tasks.shapes import COLOURS
from mmgrpo.tasks.video_motion import _background, publish_splits, video_cache_dir

TOOL_PROMPT = (
    "Something flashes between {start}s and {end}s. What colour is it? It is too brief to see here: first look "
    "at that span with the select_frames tool, then answer with <answer>colour</answer>."
)
PLAIN_PROMPT = "Something flashes between {start}s and {end}s. What colour is it? Answer with <answer>colour</answer>."
RENDER_VERSION = 2  # part of the cache key: bump when the drawing changes
_NOT_DRAWN = ("video_dir", "tools", "warmup_call_hit_rate")  # options that do not change the files


@dataclass
class VideoFindArgs:
    """Options under ``task.args`` for ``task.name: video_find``."""

    tools: bool = True
    """Prompts and warm-up targets for a policy with select_frames (a call, then the answer); false: the no-tool
    baseline on the same videos (the answer only)."""
    colours: list[str] = field(default_factory=lambda: ["red", "green", "blue", "yellow"])
    """Flash colours (a subset of the shapes task's, at least one per span); chance = 1 / their number."""
    spans: list[list[float]] = field(default_factory=lambda: [[0.5, 1.0], [1.5, 2.0], [2.5, 3.0], [3.5, 4.0]])
    """The time spans [start, end] (seconds) a prompt may name; each holds one flash, each flash a different colour."""
    frame_size: Annotated[int, Range(ge=1, le=MAX_FRAME_SIDE)] = 56
    """Square frame side in pixels."""
    num_frames: Annotated[int, Range(ge=4, le=MAX_FRAMES)] = 32
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
    warmup_call_hit_rate: Annotated[float, Range(ge=0.0, le=1.0)] | None = None
    """With tools: the share of warm-up targets whose call selects the prompt's span (the others select one of the
    other spans, uniformly); None = 1 / len(spans), a call that ignores the prompt."""
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
        if unknown or len(args.colours) < max(2, len(args.spans)):
            raise ConfigError(
                f"task.args.colours: need >= max(2, {len(args.spans)}) of {', '.join(COLOURS)}; got {args.colours}"
            )
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

    def _drawn(self) -> dict:
        """The options that draw the videos (the cache key)."""
        return {k: v for k, v in asdict(self.args).items() if k not in _NOT_DRAWN}

    def _default_dir(self) -> Path:
        return video_cache_dir("video_find", self._drawn(), RENDER_VERSION)

    def _rows(self, n: int, seed: int, split: str) -> list[tuple[dict, list[np.ndarray]]]:
        a, rng = self.args, random.Random(seed)
        out = []
        for k in range(n):
            row_rng = random.Random(rng.getrandbits(64))
            s, colours = row_rng.randrange(len(a.spans)), row_rng.sample(a.colours, len(a.spans))
            bg = _background(row_rng, a.frame_size)
            frames = [bg.copy() for _ in range(a.num_frames)]
            flashes = []
            for starts, colour in zip(self._starts, colours):
                first = row_rng.choice(starts)
                side = row_rng.randint(a.frame_size // 2, a.frame_size * 3 // 4)
                x, y = row_rng.randint(0, a.frame_size - side), row_rng.randint(0, a.frame_size - side)
                for t in range(first, first + a.flash_frames):
                    frames[t][y : y + side, x : x + side] = COLOURS[colour]
                flashes.append([first / a.fps, (first + a.flash_frames) / a.fps])
            span = list(a.spans[s])
            prompt = (TOOL_PROMPT if a.tools else PLAIN_PROMPT).format(start=span[0], end=span[1])
            row = {
                "prompt": prompt,
                "answer": colours[s],
                "span": span,
                "flash": flashes[s],
                "span_colours": colours,  # the flash colour of each of args.spans, in order
                "flashes": flashes,
                "video": str(self.video_dir / f"{split}_{k:05d}.mp4"),
            }
            out.append((row, frames))
        return out

    def _build(self) -> tuple[list[dict], list[dict]]:
        a = self.args
        train = self._rows(a.train_size, a.seed * 2 + 1, "train")
        evals = self._rows(a.eval_size, a.seed * 2 + 2, "eval")
        return publish_splits(self.video_dir, train, evals, fps=a.fps, key=self._drawn())

    def train_rows(self) -> list[dict]:
        return self._train

    def eval_rows(self) -> list[dict]:
        return self._eval

    def warmup_rows(self, seed: int) -> list[dict]:
        """With tools: the select_frames call of a span drawn at random (the row's own with probability
        ``warmup_call_hit_rate``, else another, uniformly), then the colour of the flash in the span selected.
        Without tools: the true colour (which the prompt's frames do not show)."""
        a, rng = self.args, random.Random(seed)
        out = []
        for row in self._train:
            if not a.tools:
                out.append(dict(row, target=f"<answer>{row['answer']}</answer>"))
                continue
            pick = warmup_call_pick(rng, a.spans.index(row["span"]), len(a.spans), a.warmup_call_hit_rate)
            answer = f"<answer>{row['span_colours'][pick]}</answer>"
            out.append(dict(row, target=[select_call(a.spans[pick]), answer]))
        return out

    def score(self, outputs: list[str], rows: list[dict]) -> dict[str, float]:
        """accuracy (the last <answer>), tool_call_rate, call_hits_span (the first call selects exactly the row's
        span), reads_selected (the answer is the colour of the span the first call selected exactly; 0 without such
        a call), chance."""
        from mmgrpo.rewards.parsing import extract_answer

        accuracy = self._metrics.scores(outputs, rows)[:, 0]
        calls = [first_call_arguments(o, "select_frames") for o in outputs]
        picked = [c and [c.get("start"), c.get("end")] for c in calls]
        hits = [p == row["span"] for p, row in zip(picked, rows)]
        out = tool_answer_scores(accuracy, outputs, "call_hits_span", hits, 1 / len(self.args.colours))
        reads = [
            p in self.args.spans and extract_answer(o) == row["span_colours"][self.args.spans.index(p)]
            for o, p, row in zip(outputs, picked, rows)
        ]
        out["reads_selected"] = sum(reads) / max(1, len(outputs))
        return out


build_video_find_task = TASKS.register("video_find")(
    TaskSpec(args=VideoFindArgs, cls=VideoFindTask, load=lambda a, seed: VideoFindTask(a))
)
