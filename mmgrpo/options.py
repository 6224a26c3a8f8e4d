"""One options convention for every registered component: a frozen dataclass per component, checked at config load.

A surrogate, aggregation, KL estimator (:mod:`mmgrpo.losses`), shaper (:mod:`mmgrpo.shaping`), token weighting,
β schedule (:mod:`mmgrpo.schedules`), advantage transform (:mod:`mmgrpo.advantages`), prompt sampler
(:mod:`mmgrpo.sampling`), credit mode (:mod:`mmgrpo.credit`) or rollout step (:mod:`mmgrpo.rollout_steps`) declares
the dataclass of its options (:meth:`mmgrpo.registry.Registry.options_class`).
:func:`resolve` builds it from the config's ``algorithm.<x>_args`` mapping: an unknown key is one line naming the
allowed keys and the closest one (:func:`mmgrpo.suggest.unknown_field`), a value of the wrong type or outside its
``Range`` one line naming the key (:func:`mmgrpo.config.from_dict`).

The math functions keep plain keyword parameters (STYLE.md 1: tensors and plain scalars in, no config objects); the
dataclass is the config-facing declaration of the same parameters, and ``tests/test_options.py`` checks that each
dataclass and its function's keyword parameters agree in names, order and defaults. The losses, written earlier,
take the dataclass itself as their ``options`` parameter (their message for an unknown key is their own,
:func:`mmgrpo.losses.resolve_options`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from mmgrpo.config import from_dict
from mmgrpo.registry import Registry


def resolve(registry: Registry, name: str, args: dict[str, Any] | None, where: str) -> Any:
    """The options of component ``name`` of ``registry``, built from ``args`` (the config's mapping at ``where``,
    e.g. ``algorithm.shaping_args``); raises :class:`~mmgrpo.config.ConfigError` for an unknown key (with "did you
    mean") or a bad value."""
    return from_dict(registry.options_class(name), args or {}, where)


def as_kwargs(options: Any) -> dict[str, Any]:
    """The options as the keyword arguments of the component's function (one per dataclass field)."""
    return dataclasses.asdict(options)
