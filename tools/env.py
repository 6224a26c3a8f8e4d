"""Environments: multi-step games the policy plays by writing actions, one instance per trajectory.

Protocol (verl-agent's env managers, TRL's ``environment_factory`` one level lower): ``reset(row) -> Observation``
starts an episode from a dataset row (deterministic given the row: a seed column fixes the level);
``step(action_text) -> (Observation, reward, done)`` reads the action out of the assistant turn's text, applies it
and answers. An action that cannot be parsed or is not allowed is not an exception: the observation says so and
has ``error`` set (verl-agent's ``is_action_valid = 0``, which GiGPO's invalid-action penalty keys on), the state
does not change, and the episode goes on. The observation a step returns is the state the *next* action is taken
from: its :func:`~mmgrpo.tools.anchor_key` is that step's GiGPO anchor.

``ENVIRONMENTS`` maps names to factories (a class or a function taking keyword options) so a config can name one;
a config may name its own by reference instead (``module:Class``, ``module:factory()``: :data:`REFERENCES`); the
rollout builds one instance per sample with :func:`make_environment`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol, runtime_checkable

from mmgrpo.registry import Registry
from mmgrpo.suggest import did_you_mean

from .base import Observation


@runtime_checkable
class Environment(Protocol):
    """A multi-step game: ``reset(row)`` then ``step(action_text)`` until ``done``."""

    def reset(self, row: Mapping[str, Any]) -> Observation:
        """Start an episode for ``row``; the observation the first action is taken from."""
        ...

    def step(self, action_text: str) -> tuple[Observation, float, bool]:
        """Apply the action written in ``action_text`` (the assistant turn); ``(observation, reward, done)``."""
        ...


ENVIRONMENTS: Registry[Callable[..., Environment]] = Registry("environment")
"""Environment factories by name: ``ENVIRONMENTS.get(name)(**options)`` builds one instance."""


REFERENCES: dict[str, Callable[..., Environment]] = {}
"""Environments a config names by reference (``module:Class``, ``module:factory()``), by that text: the factory the
trainer's load check imported under the code policy (``mmgrpo/env_check.py``), which :func:`make_environment` calls."""


def is_reference(name: str) -> bool:
    """``name`` names code (``module:Class`` or ``module:factory()``) rather than a registered environment."""
    return ":" in name


def environment_factory(name: str) -> Callable[..., Environment]:
    """The factory of ``name``: a registered environment, or a reference loaded into :data:`REFERENCES`; a
    ``KeyError`` in one line otherwise (the closest registered name and the valid ones)."""
    if name in ENVIRONMENTS:
        return ENVIRONMENTS.get(name)
    if is_reference(name):
        if name in REFERENCES:
            return REFERENCES[name]
        raise KeyError(f"environment {name!r} is code named by the config and was not loaded (the trainer loads it)")
    valid = ENVIRONMENTS.names()
    close = did_you_mean(name, valid)
    hint = f"did you mean {close!r}? " if close else ""
    raise KeyError(f"unknown environment {name!r}; {hint}valid: {', '.join(valid)}")


def make_environment(name: str, **options: Any) -> Environment:
    """A fresh instance of the environment ``name`` (:func:`environment_factory`) built with ``options``; an unknown
    name raises ``KeyError`` with the closest name and the valid ones, a bad option ``TypeError`` naming it."""
    factory = environment_factory(name)
    try:
        return factory(**options)
    except TypeError as e:
        raise TypeError(f"environment {name!r}: cannot build it with options {sorted(options)}: {e}") from None


def action_tag(text: str, fix: str) -> tuple[str | None, str]:
    """The lower-cased content of the last ``<action>…</action>`` of ``text`` (verl-agent's format; the tags
    case-sensitive), or ``None`` and a one-line reason ending with ``fix``. Linear in the text (``str.rfind``; no
    backtracking regex on model output)."""
    close = text.rfind("</action>")
    start = text.rfind("<action>", 0, close) if close != -1 else -1
    if start == -1:
        return None, f"no <action>...</action> in the reply; {fix}"
    return text[start + len("<action>") : close].lower(), ""


def row_seed(row: Mapping[str, Any], env: str, what: str) -> int:
    """``row["seed"]``, the integer an environment draws its ``what`` (level, episode) from; a ValueError naming the
    column otherwise."""
    seed = row.get("seed")
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise ValueError(f"{env}: the row needs an integer 'seed' column (the {what}), got {seed!r}")
    return seed


def parse_action(text: str, allowed: tuple[str, ...]) -> tuple[str | None, str]:
    """The action in the last ``<action>…</action>`` of ``text`` (:func:`action_tag`; surrounding space and the case
    of the action ignored) if it is one of ``allowed``; else ``None`` and a one-line reason naming the fix."""
    fix = f"end the turn with <action>one of {', '.join(allowed)}</action>"
    action, why = action_tag(text, fix)
    if action is None:
        return None, why
    action = action.strip()
    if action not in allowed:
        shown = action if len(action) <= 40 else action[:39] + "…"
        return None, f"{shown!r} is not an action; {fix}"
    return action, ""
