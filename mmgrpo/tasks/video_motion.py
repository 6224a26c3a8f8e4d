"""A procedurally generated video task that needs temporal order, written to real mp4 files.

``direction`` — "Which way does the object move?": a coloured bar spanning the frame sweeps from one edge to the
other (left, right, up or down) over a static noisy background. A frame on its own does not tell the answer
(a bar at the left edge is where a rightward sweep starts and a leftward one ends), and neither does the *set*
of frames: moving left is moving right played backwards, frame for frame (``tests/test_video_task.py``). Only
the order tells, so a policy that ignores order is at chance on the sign (≤ 50 % with the axis known), which
is what T-GRPO's shuffled-frame contrast tests for. (A small square moving half-way across from a random start
was not learnt by the tiny model within 300 steps; the edge-to-edge sweep is learnt in about 200.)

``when`` — "When is the square visible?": a large static square is visible during one or two 0.5-second segments
of the clip and absent otherwise; the answer is a time span in seconds (``<answer>0.5 to 1.5</answer>``), scored
with ``temporal_iou`` against the ground truth in seconds of the file's own time base (the adapter also passes
the real ``frame_timestamps`` of the frames the model saw). The tiny model does not learn this one on CPU: in
300–500 GRPO steps it settles on one constant span (docs/video.md), so the shipped configs ask ``direction``.

Files are written once with PyAV (H.264, lossless ``crf=0``, ``yuv420p``; decord, torchcodec and torchvision
read them) under ``video_dir`` (default ``$MMGRPO_CACHE/video_motion/<hash of the options>``), never into the
repository. Train and eval use different seeds. ``eval_shuffled`` adds, to the held-out split only, the eval
``direction`` clips again with their frames permuted in the file (question type ``direction_shuffled``): accuracy
there should stay near chance whatever the policy learns, because the order is gone.

``warmup_rows`` gives format-only targets (a random answer of the right type, independent of the video), as
``shapes`` does: the warm-up teaches the answer format, not the skill.
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Annotated, Literal

import numpy as np

from mmgrpo.cache import cache_dir, publish_dir
from mmgrpo.config import ConfigError, Range
from mmgrpo.media import MAX_FRAME_SIDE, MAX_FRAMES, write_mp4
from mmgrpo.plugins import TASKS, TaskSpec
from mmgrpo.tasks.eval_rewards import EvalRewards

COLOURS = [(220, 40, 40), (40, 180, 60), (50, 80, 230), (235, 215, 40), (150, 60, 190), (245, 140, 30)]
DIRECTIONS = {"left": (-1, 0), "right": (1, 0), "up": (0, -1), "down": (0, 1)}
QUESTIONS = {
    "direction": "Which way does the object move? Answer with <answer>direction</answer>.",
    "when": "When is the square visible? Answer with <answer>start to end</answer> in seconds.",
}
SEGMENT_S = 0.5  # the "when" events start and end on multiples of half a second
RENDER_VERSION = 4  # part of the cache key: bump when the drawing changes, so stale clips are not reused


@dataclass
class VideoMotionArgs:
    """Options under ``task.args`` for ``task.name: video_motion``."""

    questions: Annotated[list[Literal[tuple(QUESTIONS)]], Range(ge=1)] = field(default_factory=lambda: ["direction"])
    """Question types to mix: direction | when."""
    directions: Annotated[list[Literal[tuple(DIRECTIONS)]], Range(ge=1)] = field(
        default_factory=lambda: list(DIRECTIONS)
    )
    """Motion directions to draw from (left, right, up, down)."""
    frame_size: Annotated[int, Range(ge=1, le=MAX_FRAME_SIDE)] = 56
    """Square frame side in pixels (a multiple of 28 maps to whole merged patches for Qwen2/2.5-VL)."""
    num_frames: Annotated[int, Range(ge=1, le=MAX_FRAMES)] = 16
    """Frames written to each file."""
    fps: float = 8.0
    """Frame rate of the written files (the adapter samples from them at its own model.args.video.fps)."""
    train_size: Annotated[int, Range(ge=1)] = 1000
    """Rows in the train split."""
    eval_size: Annotated[int, Range(ge=1)] = 200
    """Rows in the held-out split."""
    eval_shuffled: bool = True
    """Also evaluate the held-out direction clips with their frames permuted (question direction_shuffled)."""
    seed: int = 1234
    """Base seed (train and eval use different derived seeds)."""
    video_dir: str | None = None
    """Where the mp4 files go; None = $MMGRPO_CACHE/video_motion/<hash of these options>."""


# ----------------------------------------------------------------------------------------------- drawing


def _background(rng: random.Random, size: int) -> np.ndarray:
    """A static dark background with speckle noise, [H, W, 3] uint8."""
    nrng = np.random.default_rng(rng.getrandbits(32))
    base = rng.randint(15, 60)
    img = np.full((size, size, 3), base, dtype=np.uint8)
    n = size * size // 16
    ys, xs = nrng.integers(0, size, n), nrng.integers(0, size, n)
    img[ys, xs] = nrng.integers(0, 70, (n, 1)).astype(np.uint8)
    return img


def _square(frame: np.ndarray, x: int, y: int, side: int, colour: tuple) -> None:
    frame[y : y + side, x : x + side] = colour


def direction_frames(rng: random.Random, size: int, n: int, direction: str) -> list[np.ndarray]:
    """``n`` frames of a bar spanning the frame that sweeps ``direction`` from one edge to the other,
    [H, W, 3] uint8 each. The bar's width and colour and the background are random."""
    bg = _background(rng, size)
    side = rng.randint(size // 6, size // 4)
    room = size - side
    dx, dy = DIRECTIONS[direction]
    colour = rng.choice(COLOURS)
    frames = []
    for t in range(n):
        travelled = round(room * t / (n - 1))
        pos = travelled if dx + dy > 0 else room - travelled
        frame = bg.copy()
        if dx:
            frame[:, pos : pos + side] = colour
        else:
            frame[pos : pos + side, :] = colour
        frames.append(frame)
    return frames


def when_frames(rng: random.Random, size: int, n: int, fps: float) -> tuple[list[np.ndarray], tuple[float, float]]:
    """Frames of a static square visible during one or two whole 0.5 s segments [i, j], and that span in seconds."""
    duration = n / fps
    segments = max(1, round(duration / SEGMENT_S))
    i = rng.randrange(segments)
    j = min(segments - 1, i + rng.randrange(2))
    start, end = i * SEGMENT_S, (j + 1) * SEGMENT_S
    bg = _background(rng, size)
    side = rng.randint(size * 2 // 3, size * 5 // 6)
    x, y = rng.randint(0, size - side), rng.randint(0, size - side)
    colour = rng.choice(COLOURS)
    frames = []
    for t in range(n):
        frame = bg.copy()
        if start <= t / fps < end:  # frame t shows [t/fps, (t+1)/fps)
            _square(frame, x, y, side, colour)
        frames.append(frame)
    return frames, (start, end)


Clips = list[tuple[dict, list[np.ndarray]]]
"""``(row, frames)`` pairs: a row and the frames of the video it names (kept only until written)."""


def publish_videos(video_dir: Path, clips: Clips, fps: float, key: dict) -> None:
    """Write each ``(row, frames)`` as the mp4 its row names (``row["video"]``'s file name) and publish the folder
    whole under ``video_dir`` (:func:`mmgrpo.cache.publish_dir`, ``key`` the options that drew the files)."""

    def write(tmp: Path) -> None:
        for row, frames in clips:
            write_mp4(tmp / Path(row["video"]).name, frames, fps, lossless=True)

    publish_dir(video_dir, write, key)


def publish_splits(video_dir: Path, train: Clips, evals: Clips, fps: float, key: dict) -> tuple[list[dict], list[dict]]:
    """The rows of the train and eval clips, once every clip's mp4 is published (:func:`publish_videos`)."""
    publish_videos(video_dir, train + evals, fps, key)
    return [r for r, _ in train], [r for r, _ in evals]


def video_cache_dir(task: str, drawn: dict, render_version: int) -> Path:
    """The default ``video_dir`` of a synthetic video task: ``task``'s folder of the cache, named by a digest of the
    options that draw the videos (``drawn``) and the drawing code's ``render_version``."""
    content = dict(drawn, render_version=render_version)
    digest = hashlib.sha1(json.dumps(content, sort_keys=True).encode()).hexdigest()[:12]
    return cache_dir() / task / digest


# ------------------------------------------------------------------------------------------------- task


class VideoMotionTask:
    """See the module docstring."""

    def __init__(self, args: VideoMotionArgs):
        self._format = EvalRewards([{"name": "format", "kwargs": {"think": False}}], "video_motion")
        self._direction = EvalRewards([{"name": "accuracy"}], "video_motion")
        self._when = EvalRewards([{"name": "temporal_iou"}], "video_motion")
        if args.frame_size < 28 or args.frame_size % 2:
            raise ConfigError(f"task.args.frame_size: must be an even number >= 28, got {args.frame_size}")
        if args.num_frames < 4:
            raise ConfigError(f"task.args.num_frames: must be >= 4, got {args.num_frames}")
        if args.fps <= 0 or abs(args.fps - round(args.fps)) > 1e-9:
            raise ConfigError(f"task.args.fps: must be a positive whole number (an mp4 time base), got {args.fps}")
        self.args = args
        self.video_dir = Path(args.video_dir) if args.video_dir else self._default_dir()
        self._train, self._eval = self._build()

    def _default_dir(self) -> Path:
        drawn = {k: v for k, v in asdict(self.args).items() if k != "video_dir"}
        return video_cache_dir("video_motion", drawn, RENDER_VERSION)

    def _rows(self, n: int, seed: int, split: str, shuffled: bool) -> list[tuple[dict, list[np.ndarray]]]:
        """Rows and their frames (frames only kept until written)."""
        a, rng = self.args, random.Random(seed)
        out = []
        for k in range(n):
            q = a.questions[k % len(a.questions)]
            row_rng = random.Random(rng.getrandbits(64))
            if q == "direction":
                d = row_rng.choice(a.directions)
                frames = direction_frames(row_rng, a.frame_size, a.num_frames, d)
                row = {"prompt": QUESTIONS[q], "answer": d, "question_type": q}
            else:
                frames, span = when_frames(row_rng, a.frame_size, a.num_frames, a.fps)
                row = {"prompt": QUESTIONS[q], "answer": list(span), "question_type": q}
            row.update(reward_type=q, video=str(self.video_dir / f"{split}_{k:05d}.mp4"))
            out.append((row, frames))
            if shuffled and q == "direction":
                perm = list(range(len(frames)))
                while perm == sorted(perm):
                    row_rng.shuffle(perm)
                path = str(self.video_dir / f"{split}_{k:05d}_shuffled.mp4")
                srow = dict(row, question_type="direction_shuffled", video=path)
                out.append((srow, [frames[i] for i in perm]))
        return out

    def _build(self) -> tuple[list[dict], list[dict]]:
        a = self.args
        train = self._rows(a.train_size, a.seed * 2 + 1, "train", shuffled=False)
        evals = self._rows(a.eval_size, a.seed * 2 + 2, "eval", shuffled=a.eval_shuffled)
        return publish_splits(self.video_dir, train, evals, fps=a.fps, key=asdict(a))

    def train_rows(self) -> list[dict]:
        return self._train

    def eval_rows(self) -> list[dict]:
        return self._eval

    def warmup_rows(self, seed: int) -> list[dict]:
        """Format-only supervised targets: a random answer of the row's type, independent of the video."""
        rng = random.Random(seed)
        segments = max(1, round(self.args.num_frames / self.args.fps / SEGMENT_S))
        rows = []
        for row in self._train:
            if row["question_type"] == "direction":
                target = rng.choice(self.args.directions)
            else:
                i = rng.randrange(segments)
                j = min(segments - 1, i + rng.randrange(2))
                target = f"{i * SEGMENT_S:g} to {(j + 1) * SEGMENT_S:g}"
            rows.append(dict(row, target=f"<answer>{target}</answer>"))
        return rows

    def score(self, outputs: list[str], rows: list[dict]) -> dict[str, float]:
        """accuracy (direction), accuracy_shuffled (direction on permuted frames), temporal_iou (when), format,
        and the chance levels: 1/|directions| for accuracy; shuffled clips cannot beat 1/2 once the axis is known."""
        out = self._format.score(outputs, rows)
        for qtype, name in [("direction", "accuracy"), ("direction_shuffled", "accuracy_shuffled"), ("when", "")]:
            idx = [i for i, r in enumerate(rows) if r["question_type"] == qtype]
            if idx:
                metrics = self._when if qtype == "when" else self._direction
                scores = metrics.score([outputs[i] for i in idx], [rows[i] for i in idx])
                out.update({name or k: v for k, v in scores.items()})
        if any(r["question_type"] == "direction" for r in rows):
            out["chance"] = 1 / len(self.args.directions)
        return out


build_video_motion_task = TASKS.register("video_motion")(
    TaskSpec(args=VideoMotionArgs, cls=VideoMotionTask, load=lambda a, seed: VideoMotionTask(a))
)
