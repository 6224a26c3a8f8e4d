"""An environment's ``reset`` / ``step`` called bounded: whatever the environment does, the caller gets the
protocol's values or one :class:`EnvironmentFault` line.

The protocol (:class:`~mmgrpo.tools.Environment`): ``reset(row)`` returns an :class:`~mmgrpo.tools.Observation`;
``step(action_text)`` returns ``(Observation, reward, done)`` with a finite real ``reward`` and a bool ``done``. A
method that raises, runs past ``timeout_s``, returns something else (2 values, another order, a ``str``), or returns
an observation larger than the limits (text over ``max_observation_chars``; more than ``max_images`` images or
``max_frames`` frames; an image over ``max_pixels``) is a fault. The limits are the tools' (``rollout.tool_limits``,
:data:`mmgrpo.tools.LIMITS`), but where a tool's oversized observation is cut, an environment's is refused: its
state is the environment's own, and a cut observation would show the policy a different one.

The same checks serve twice: at load the trainer builds the environment and calls both methods once on the first
row, a fault being one :class:`~mmgrpo.config.ConfigError` line (``mmgrpo/env_check.py``); mid-run a fault ends that
trajectory, counted in ``env/error_fraction`` (``modalities/tokens/turns.py``), never a traceback.

Deadlines use the tools' bounded thread slots (``tools/worker.py``, :func:`_call`): the method runs in a daemon
thread that is abandoned at the deadline but keeps its slot, so hung calls never add threads past the bound (Python
cannot kill a thread; a method holding the GIL delays the process until it lets go). Not a forked process as
untrusted tools get: an environment's state lives in its object from turn to turn.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from PIL import Image

from . import worker
from .base import Observation
from .env import Environment, make_environment

PROTOCOL_RESET = "an Observation (mmgrpo.tools.Observation(text=..., images=[...]))"
"""What ``reset`` must return, as the fault messages say it."""
PROTOCOL_STEP = "a tuple (Observation, reward: float, done: bool)"
"""What ``step`` must return, as the fault messages say it."""
PROTOCOL_STEP_RAISED = f"{PROTOCOL_STEP}, and an action it cannot use answered by an Observation with error set"
"""What ``step`` must do instead of raising, as the fault messages say it."""


class EnvironmentFault(Exception):
    """An environment broke the protocol, raised, or ran past the limits; the message is one line naming the method,
    what it did, and what the protocol expects."""


@dataclass(frozen=True)
class EnvLimits:
    """Bounds on one ``reset`` / ``step`` call (``rollout.tool_limits``' keys of the same names)."""

    timeout_s: float | None = 10.0
    """Seconds before the call is abandoned and the trajectory ends (``None`` or ``inf``: no limit)."""
    max_observation_chars: int = 4_000
    """Longest observation text accepted."""
    max_images: int = 4
    """Most images one observation may carry."""
    max_frames: int = 16
    """Most video frames one observation may carry."""
    max_pixels: int = 2_000_000
    """Largest image (or frame) area accepted, in pixels."""


def env_limits(limits: Mapping[str, Any]) -> EnvLimits:
    """The :class:`EnvLimits` among ``limits`` (the tools' limits: other keys, e.g. ``error_reward``, ignored)."""
    names = EnvLimits.__dataclass_fields__
    return EnvLimits(**{k: v for k, v in limits.items() if k in names})


def _shown(value: Any) -> str:
    """A short description of a returned value: its type and (cut) repr."""
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 60 else text[:59] + '…'}"


def _call(method: Callable[..., Any], argument: Any, what: str, expect: str, timeout_s: float | None) -> Any:
    """``method(argument)``; its exception or a time-out as an :class:`EnvironmentFault` naming ``what`` and what the
    protocol ``expect``s. With a deadline the call runs in one of the tools' bounded thread slots
    (:func:`mmgrpo.tools.worker.in_thread`): a call still running at the deadline is abandoned but keeps its slot, and
    with every slot held by hung calls the next one faults at once, so hung environments never add threads past
    :data:`~mmgrpo.tools.worker.MAX_THREADS`. (Not a forked process: an environment's state lives in its object
    across turns.)"""
    if timeout_s is None or math.isinf(timeout_s):
        try:
            return method(argument)
        except Exception as e:
            raise EnvironmentFault(_raised(what, e, expect)) from None
    try:
        finished, value = worker.in_thread(lambda: method(argument), timeout_s, "environment")
    except worker.Busy as e:
        raise EnvironmentFault(
            f"{what} was not called: {e}; fix the environment that hangs or raise rollout.tool_limits.timeout_s"
        ) from None
    if not finished:
        raise EnvironmentFault(
            f"{what} did not return within {timeout_s:g} s (rollout.tool_limits.timeout_s); make it faster or raise "
            "the limit"
        )
    if isinstance(value, BaseException):
        raise EnvironmentFault(_raised(what, value, expect))
    return value


def _raised(what: str, e: BaseException, expect: str = "") -> str:
    reason = (str(e).splitlines() or [""])[0][:200]
    return f"{what} raised {type(e).__name__}: {reason}" + (f"; the protocol expects {expect}" if expect else "")


def observation_problem(obs: Observation, limits: EnvLimits) -> str | None:
    """What makes ``obs`` unusable (a field of the wrong type, a size over ``limits``), or ``None``."""
    if not isinstance(obs.text, str):
        return f"an Observation whose text is a {type(obs.text).__name__}, not a str"
    for field, items, most in (("images", obs.images, limits.max_images), ("frames", obs.frames, limits.max_frames)):
        if not isinstance(items, list) or not all(isinstance(im, Image.Image) for im in items):
            return f"an Observation whose {field} are not a list of PIL images"
        if len(items) > most:
            return f"an Observation with {len(items)} {field}, more than rollout.tool_limits.max_{field}={most}"
        big = next((im for im in items if im.width * im.height > limits.max_pixels), None)
        if big is not None:
            return (
                f"an Observation with a {big.width}x{big.height} image, more than rollout.tool_limits.max_pixels="
                f"{limits.max_pixels}"
            )
    if len(obs.text) > limits.max_observation_chars:
        return (
            f"an Observation of {len(obs.text)} characters, more than rollout.tool_limits.max_observation_chars="
            f"{limits.max_observation_chars}"
        )
    if not isinstance(obs.frame_times, list) or len(obs.frame_times) != len(obs.frames):
        return f"an Observation with {len(obs.frame_times)} frame_times for {len(obs.frames)} frames"
    return None


def checked_reset(env: Environment, row: Mapping[str, Any], limits: EnvLimits) -> Observation:
    """``env.reset(row)``, checked (module docstring); an :class:`EnvironmentFault` otherwise."""
    value = _call(env.reset, row, "reset(row)", PROTOCOL_RESET, limits.timeout_s)
    if not isinstance(value, Observation):
        raise EnvironmentFault(f"reset(row) returned a {_shown(value)}; the protocol expects {PROTOCOL_RESET}")
    problem = observation_problem(value, limits)
    if problem is not None:
        raise EnvironmentFault(f"reset(row) returned {problem}; the protocol expects {PROTOCOL_RESET}")
    return value


def checked_step(env: Environment, action_text: str, limits: EnvLimits) -> tuple[Observation, float, bool]:
    """``env.step(action_text)``, checked (module docstring); ``(observation, reward, done)`` with ``reward`` a
    float and ``done`` a bool, or an :class:`EnvironmentFault`."""
    value = _call(env.step, action_text, "step(action_text)", PROTOCOL_STEP_RAISED, limits.timeout_s)
    expect = f"the protocol expects {PROTOCOL_STEP}"
    if not isinstance(value, (tuple, list)) or len(value) != 3:
        n = f" of {len(value)} values" if isinstance(value, (tuple, list)) else ""
        raise EnvironmentFault(f"step(action_text) returned a {type(value).__name__}{n} ({_shown(value)}); {expect}")
    obs, reward, done = value
    types = f"({', '.join(type(v).__name__ for v in value)})"
    if not isinstance(obs, Observation):
        raise EnvironmentFault(f"step(action_text) returned {types}; {expect}, the Observation first")
    if not isinstance(reward, numbers.Real) or isinstance(reward, bool) or not math.isfinite(float(reward)):
        raise EnvironmentFault(f"step(action_text) returned {types} with reward {reward!r}; {expect} (a finite reward)")
    if type(done).__name__ not in ("bool", "bool_"):  # numpy's bool_ too (gymnasium environments return it)
        raise EnvironmentFault(f"step(action_text) returned {types} with done {done!r}; {expect} (done a bool)")
    problem = observation_problem(obs, limits)
    if problem is not None:
        raise EnvironmentFault(f"step(action_text) returned {problem}; {expect}")
    return obs, float(reward), bool(done)


class FailedEnvironment:
    """Stands for an environment that could not start (its build or ``reset`` faulted): its ``step`` raises that
    fault, so the trajectory ends after its first turn, counted."""

    def __init__(self, reason: str):
        self.reason = reason

    def reset(self, row: Mapping[str, Any]) -> Observation:
        raise EnvironmentFault(self.reason)

    def step(self, action_text: str) -> tuple[Observation, float, bool]:
        raise EnvironmentFault(self.reason)


def start_episode(
    name: str, options: Mapping[str, Any], row: Mapping[str, Any], limits: EnvLimits
) -> tuple[Environment, Observation | None]:
    """A fresh environment ``name`` built with ``options`` and reset from ``row``, and its first observation; or a
    :class:`FailedEnvironment` and ``None`` when building or ``reset`` faults (never raises)."""
    try:
        env = make_environment(name, **options)
    except Exception as e:
        return FailedEnvironment(_raised(f"building {name}", e)), None
    try:
        return env, checked_reset(env, row, limits)
    except EnvironmentFault as e:
        return FailedEnvironment(str(e)), None
