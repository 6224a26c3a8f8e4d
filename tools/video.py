"""``select_frames``: a time span of the row's video → up to N frames from it, uniformly spread, with their times.

The video is the one the rollout decoded for the prompt (``ToolContext.frames`` / ``frame_times``, sampled by the
video adapter's ``decode_clip``: qwen-vl-utils' ``fetch_video``, timestamps ``index / video_fps``), or, when the
rollout provides ``ToolContext.load_frames``, frames decoded fresh inside the span (denser than the prompt's
sampling: VITAL's "densely sample new frames on demand"). Semantics:

1. arguments ``start`` and ``end`` in seconds (``start <= end``, finite, ``start >= 0``; ``end`` past the video is
   clamped to its duration), optional ``num_frames`` (1..``max_frames``, default ``max_frames``);
2. with ``load_frames``: ``load_frames(start, end, n)`` and its frames/times as returned (none → an error); the
   token rollouts set it for a row whose video is a file (``VideoEncoder.span_frames``: the span's frames at the
   file's native rate, so the tool sees frames the prompt's sparser sampling skipped);
3. without: the frames whose time ``t`` has ``start <= t <= end``; if there are more than ``n``, the ones at
   positions ``round(linspace(0, m − 1, n))`` among those ``m`` (first and last kept, uniform in between); none in
   the span → an error naming the video's frame times so the model can pick a valid span.

The observation's text lists the times ("Frames at 1.0s, 1.5s, 2.0s of the video."). Pixel-Reasoner's
``select_frames`` takes frame indices (1..16, ≤ 8 frames); a span in seconds is kept here because timestamps are
what the model sees in Qwen2.5-VL's video prompts and what the temporal rewards read.
"""

from __future__ import annotations

import math
from typing import Any

from .base import TOOLS, Observation, ToolContext


def pick_uniform(m: int, n: int) -> list[int]:
    """``n`` positions out of ``m`` (``n <= m``), uniform and including both ends: ``round(linspace(0, m-1, n))``
    (Python's round: halves to even)."""
    if n >= m:
        return list(range(m))
    if n == 1:
        return [(m - 1) // 2]
    return [round(i * (m - 1) / (n - 1)) for i in range(n)]


class SelectFramesTool:
    """A :class:`~mmgrpo.tools.Tool` returning frames of the row's video inside a time span (module docstring)."""

    def __init__(self, name: str = "select_frames", *, max_frames: int = 8):
        if max_frames < 1:
            raise ValueError(f"max_frames must be >= 1, got {max_frames}")
        self.name = name
        self.max_frames = max_frames
        self.schema = {
            "type": "function",
            "function": {
                "name": name,
                "description": (
                    f"Look at the video between two times: returns up to {max_frames} frames spread evenly over "
                    "the span, with their times in seconds."
                ),
                "parameters": {
                    "type": "object",
                    "properties": {
                        "start": {"type": "number", "description": "Start of the span, seconds from the beginning."},
                        "end": {"type": "number", "description": "End of the span, seconds (>= start)."},
                        "num_frames": {
                            "type": "integer",
                            "description": f"How many frames, 1 to {max_frames} (optional, default {max_frames}).",
                        },
                    },
                    "required": ["start", "end"],
                },
            },
        }

    def __call__(self, arguments: dict[str, Any], context: ToolContext) -> Observation:
        start, end, n = arguments.get("start"), arguments.get("end"), arguments.get("num_frames", self.max_frames)
        if not context.frames and context.load_frames is None:
            return _error(f"{self.name} needs a video, and this prompt has none")
        if not all(_is_number(v) for v in (start, end)):
            return _error(f"start and end must be finite numbers of seconds, got start={start!r}, end={end!r}")
        if not (isinstance(n, int) and not isinstance(n, bool) and 1 <= n <= self.max_frames):
            return _error(f"num_frames must be an integer from 1 to {self.max_frames}, got {n!r}")
        duration = context.video_duration
        if duration is None and context.frame_times:
            duration = context.frame_times[-1]
        if start < 0 or start > end:
            return _error(f"need 0 <= start <= end, got start={start:g}, end={end:g}")
        if duration is not None:
            if start > duration:
                return _error(f"start={start:g}s is past the end of the video ({duration:g}s)")
            end = min(float(end), float(duration))
        if context.load_frames is not None:
            frames, times = context.load_frames(float(start), float(end), n)
            frames, times = list(frames), [float(t) for t in times]
            if not frames:
                return _error(f"no frame of the video between {start:g}s and {end:g}s; pick a wider span")
        else:
            inside = [i for i, t in enumerate(context.frame_times) if start <= t <= end]
            if not inside:
                have = ", ".join(f"{t:g}" for t in context.frame_times[:32])
                return _error(f"no frame between {start:g}s and {end:g}s; the video has frames at {have} (seconds)")
            chosen = [inside[j] for j in pick_uniform(len(inside), n)]
            frames = [context.frames[i] for i in chosen]
            times = [float(context.frame_times[i]) for i in chosen]
        text = "Frames at " + ", ".join(f"{t:g}s" for t in times) + " of the video."
        return Observation(text=text, frames=frames, frame_times=times)

    def __repr__(self) -> str:
        return f"SelectFramesTool({self.name!r}, max_frames={self.max_frames})"


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _error(message: str) -> Observation:
    return Observation(text=f"Error: {message}.", error=message)


TOOLS.add("select_frames", SelectFramesTool())
