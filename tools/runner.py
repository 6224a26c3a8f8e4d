"""Run one parsed tool call, bounded: whatever the model wrote, the answer is an :class:`Observation`.

:func:`run_tool_call` never raises. An unknown tool, arguments that are too long or do not fit the tool's schema,
a tool that raises, returns something that is not an observation, returns an image over ``max_source_pixels``, or
runs past ``timeout_s`` — each becomes an error observation whose text names the fix (``reward = error_reward``); an
observation that is too large is cut to the limits (text to ``max_observation_chars`` from the middle, as verl's
``tool_response_truncate_side: middle``; images and frames to their counts; each image to ``max_pixels``).

The deadline covers the tool **and** that post-processing (an image's downscale): both run in the worker
(:mod:`.worker`): a forked process whose process group is killed at the deadline and at exit (``isolation: process``,
the default for tools that are not mmgrpo's own), or one of a bounded set of threads (``isolation: thread``, the
default for the built-in tools, which bound their own work: box sizes, frame counts).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

from PIL import Image

from .base import FunctionTool, Observation, Tool, ToolCall, ToolContext, _unknown
from .parsing import parse_tool_calls
from .worker import ISOLATIONS, Busy, RemoteError, in_process, in_thread


def run_tool_call(
    call: ToolCall,
    tools: Mapping[str, Tool] | Sequence[Tool],
    context: ToolContext,
    *,
    timeout_s: float = 10.0,
    max_argument_chars: int = 10_000,
    max_observation_chars: int = 4_000,
    max_images: int = 4,
    max_frames: int = 16,
    max_pixels: int = 2_000_000,
    max_source_pixels: int = 50_000_000,
    error_reward: float = 0.0,
    isolation: str = "auto",
) -> Observation:
    """Run ``call`` with the tool of that name among ``tools``; never raises.

    Args:
        call: a parsed call (:func:`~mmgrpo.tools.parse_tool_calls`).
        tools: the tools this rollout may run (by name, or a list); nothing else runs.
        context: what the tool may read (:class:`~mmgrpo.tools.ToolContext`).
        timeout_s: seconds before the call is abandoned, its worker killed (``None`` or ``inf``: no limit); the
            observation's post-processing (an image's downscale) is inside it.
        max_argument_chars: longest accepted argument text (the raw JSON between the tags).
        max_observation_chars: longest text returned; longer text keeps its head and tail around a marker.
        max_images: most images returned (later ones dropped, the text says so).
        max_frames: most video frames returned (uniformly thinned, times kept aligned).
        max_pixels: largest image area returned; larger images are downscaled, aspect kept.
        max_source_pixels: largest image area a tool may return at all; a larger one is an error (a 12000x12000
            image is not downscaled: its decode and resize alone cost seconds and gigabytes).
        error_reward: ``Observation.reward`` of an error observation, the runner's or a tool's own error that
            carries no reward of its own (verl's ``ImageZoomInTool``: −0.05).
        isolation: where the call runs (:mod:`.worker`): ``process`` (a forked worker, killed with its process
            group at the deadline), ``thread`` (a bounded set of threads), ``auto`` (threads for mmgrpo's own
            tools, a process for the others).

    Returns:
        The tool's observation, bounded; or an error observation (``error`` set) saying what was wrong.
    """
    limits = dict(
        max_observation_chars=max_observation_chars, max_images=max_images, max_frames=max_frames,
        max_pixels=max_pixels,
    )  # fmt: skip

    def fail(message: str) -> Observation:
        return bound(Observation(text=f"Error: {message}", error=message, reward=error_reward), **limits)

    try:
        by_name = dict(tools) if isinstance(tools, Mapping) else {t.name: t for t in tools}
        if call.name not in by_name:
            return fail(_unknown(call.name, sorted(by_name)) + "; call one of the tools listed in the system prompt")
        size = len(call.raw) if call.raw else len(json.dumps(call.arguments, default=str))
        if size > max_argument_chars:
            return fail(
                f"the arguments of {call.name!r} are {size} characters, more than the limit of {max_argument_chars}; "
                "send short arguments"
            )
        tool = by_name[call.name]
        problem = check_arguments(tool.schema, call.arguments)
        if problem is not None:
            return fail(f"{call.name}: {problem}")
        work = functools.partial(_answer, tool, call, context, limits, max_source_pixels, error_reward)
        run = in_process if _isolated(tool, isolation) else in_thread
        try:
            done, value = run(work, timeout_s, tool.name)
        except Busy as e:
            return fail(f"{call.name} was not run: {e}; try again later")
        if not done:
            return fail(f"{call.name} did not finish within {timeout_s:g} s; try a smaller request")
        if isinstance(value, BaseException):
            kind = value.type_name if isinstance(value, RemoteError) else type(value).__name__
            reason = str(value).splitlines()[0][:200] if str(value) else ""
            return fail(f"{call.name} failed ({kind}: {reason})")
        return fail(value) if isinstance(value, str) else value
    except Exception as e:  # a bug here must not end the rollout either
        return Observation(text=f"Error: internal tool runner error ({type(e).__name__})", error=str(e)[:200])


def _answer(
    tool: Tool, call: ToolCall, context: ToolContext, limits: dict, max_source_pixels: int, error_reward: float
) -> Observation | str:
    """In the worker: the tool's observation, checked and bounded (the post-processing inside the deadline), or the
    one-line reason it is unusable."""
    value = tool(dict(call.arguments), context)
    if not isinstance(value, Observation):
        return f"{call.name} returned a {type(value).__name__}, not an Observation (a bug in the tool)"
    problem = _malformed(value) or _oversized(value, max_source_pixels)
    if problem is not None:
        return f"{call.name} returned {problem} (a bug in the tool)"
    if not math.isfinite(float(value.reward)):
        return f"{call.name} returned a non-finite reward {value.reward!r} (a bug in the tool)"
    if value.invalid and value.reward == 0.0:  # the tool's own error (a bad box): the same penalty
        value = dataclasses.replace(value, reward=error_reward)
    return bound(value, **limits)


def _oversized(obs: Observation, max_source_pixels: int) -> str | None:
    """An image or frame larger than ``max_source_pixels`` (refused rather than downscaled), or ``None``."""
    big = next((im for im in [*obs.images, *obs.frames] if im.width * im.height > max_source_pixels), None)
    if big is None:
        return None
    return f"a {big.width}x{big.height} image, more than rollout.tool_limits.max_source_pixels={max_source_pixels}"


def _isolated(tool: Tool, isolation: str) -> bool:
    """Whether ``tool`` runs in a worker process (:mod:`.worker`): ``auto`` for every tool whose code is not
    mmgrpo's own."""
    if isolation not in ISOLATIONS:
        raise ValueError(f"rollout.tool_limits.isolation must be one of {ISOLATIONS}, got {isolation!r}")
    if isolation != "auto":
        return isolation == "process"
    code = tool.fn if isinstance(tool, FunctionTool) else type(tool)
    return not str(code.__module__).startswith("mmgrpo.")


LIMITS: dict[str, Any] = {
    name: p.default for name, p in inspect.signature(run_tool_call).parameters.items() if p.kind is p.KEYWORD_ONLY
}
"""The limits :func:`run_tool_call` takes and their defaults (``max_pixels``: Mini-o3's crop ceiling)."""


def run_tool_calls(
    text: str,
    tools: Mapping[str, Tool] | Sequence[Tool],
    context: ToolContext,
    *,
    max_calls: int = 1,
    **limits: Any,
) -> list[Observation]:
    """Parse ``text`` and answer it: one observation per call (the first ``max_calls`` are run; verl's
    ``max_parallel_calls`` default is 1), then one error observation per malformed call and one saying how many
    calls were skipped. An empty list means the turn holds no tool call at all (the trajectory ends there).
    ``limits`` are :func:`run_tool_call`'s keywords."""
    unknown = set(limits) - set(LIMITS)
    if unknown:
        raise TypeError(f"run_tool_calls: unknown limits {sorted(unknown)}; valid: {sorted(LIMITS)}")
    calls, errors = parse_tool_calls(text)
    error_reward = limits.get("error_reward", LIMITS["error_reward"])
    out = [run_tool_call(call, tools, context, **limits) for call in calls[:max_calls]]
    out += [Observation(text=f"Error: {e}", error=e, reward=error_reward) for e in errors]
    if len(calls) > max_calls:
        skipped = len(calls) - max_calls
        msg = f"only {max_calls} tool call(s) per turn run; the other {skipped} were skipped"
        out.append(Observation(text=f"Error: {msg}", error=msg, reward=error_reward))
    return out


def _malformed(obs: Observation) -> str | None:
    """What makes a tool's observation unusable (a field of the wrong type), or ``None``."""
    if not isinstance(obs.text, str):
        return f"text of type {type(obs.text).__name__}, not str"
    for field, items in (("images", obs.images), ("frames", obs.frames)):
        if not isinstance(items, list) or not all(isinstance(im, Image.Image) for im in items):
            return f"{field} that are not a list of PIL images"
    if not isinstance(obs.frame_times, list) or len(obs.frame_times) != len(obs.frames):
        return f"{len(obs.frame_times)} frame_times for {len(obs.frames)} frames"
    if not isinstance(obs.reward, (int, float)) or isinstance(obs.reward, bool):
        return f"a reward of type {type(obs.reward).__name__}"
    return None


def check_arguments(schema: dict[str, Any], arguments: Any) -> str | None:
    """What is wrong with ``arguments`` for a tool with this OpenAI ``schema`` (required names present, no
    unknown names, JSON types of the top-level values), or ``None``."""
    if not isinstance(arguments, dict):
        return f"arguments must be a JSON object, got {type(arguments).__name__}"
    params = schema.get("function", {}).get("parameters", {}) or {}
    props = params.get("properties", {}) or {}
    missing = [n for n in params.get("required", []) if n not in arguments]
    usage = f"arguments: {', '.join(props) or '(none)'}"
    if missing:
        return f"missing required argument(s) {missing}; {usage}"
    extra = [n for n in arguments if n not in props]
    if extra and props:
        shown = [n if len(n) <= 40 else n[:39] + "…" for n in extra[:5]]
        return f"unknown argument(s) {shown}; {usage}"
    for name, value in arguments.items():
        want = props.get(name, {}).get("type")
        if isinstance(want, str) and want in _JSON_TYPES and not _JSON_TYPES[want](value):
            return f"argument {name!r} must be a JSON {want}, got {type(value).__name__}; {usage}"
    return None


_JSON_TYPES = {
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "array": lambda v: isinstance(v, list),
    "object": lambda v: isinstance(v, dict),
    "null": lambda v: v is None,
}


def bound(
    obs: Observation, *, max_observation_chars: int, max_images: int, max_frames: int, max_pixels: int
) -> Observation:
    """A copy of ``obs`` within the limits (module docstring); notes of what was cut go at the end of the text."""
    notes = []
    images = list(obs.images)
    if len(images) > max_images:
        notes.append(f"[{len(images) - max_images} more image(s) dropped: at most {max_images} per call]")
        images = images[:max_images]
    frames, times = list(obs.frames), list(obs.frame_times)
    if len(frames) > max_frames:
        keep = [round(i * (len(frames) - 1) / max(1, max_frames - 1)) for i in range(max_frames)]
        notes.append(f"[{len(frames)} frames thinned to {max_frames}]")
        frames = [frames[i] for i in keep]
        times = [times[i] for i in keep] if len(times) == len(obs.frames) else times
    images = [_shrink(im, max_pixels) for im in images]
    frames = [_shrink(im, max_pixels) for im in frames]
    text = obs.text if isinstance(obs.text, str) else str(obs.text)
    tail = (" " + " ".join(notes)) if notes else ""
    budget = max(0, max_observation_chars - len(tail))
    if len(text) > budget:
        marker = f" …[{len(text) - budget} characters cut]… "
        keep = max(0, budget - len(marker))
        text = text[: (keep + 1) // 2] + marker + (text[len(text) - keep // 2 :] if keep // 2 else "")
    error = obs.error if obs.error is None else str(obs.error)[:500]
    return Observation(
        text=text + tail, images=images, frames=frames, frame_times=times, reward=float(obs.reward), error=error
    )


def _shrink(image: Image.Image, max_pixels: int) -> Image.Image:
    w, h = image.size
    if w * h <= max_pixels:
        return image
    scale = math.sqrt(max_pixels / (w * h))
    return image.resize((max(1, int(w * scale)), max(1, int(h * scale))), Image.Resampling.BICUBIC)
