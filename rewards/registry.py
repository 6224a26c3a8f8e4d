"""Finding rewards: by registry name, by ``package.module:attr``, or by the ``mmgrpo.rewards`` entry point.

A reward is a plain function ``f(completions: list, *, prompts: list, **columns) -> list[float | None]``
(a superset of TRL's reward signature, so a TRL reward works unchanged), or a class whose instances have that
``__call__`` (model-based rewards). ``None`` in the returned list means "not applicable to this sample".

Three ways to provide one, looked up in this order by :func:`load_reward`:

1. a **registry name** of :data:`REWARDS` (built-ins, and anything decorated with :func:`register_reward`);
2. an **import path** ``"package.module:function"`` or ``"package.module:Class"``;
3. an **entry point** in the group ``mmgrpo.rewards`` of any installed distribution, e.g. in the user's
   ``pyproject.toml``: ``[project.entry-points."mmgrpo.rewards"] my_reward = "my_pkg.rewards:my_reward"``.

**Factories**: a spec ending in ``()`` names a function that *returns* the reward (TRL's
``get_cosine_scaled_reward(min_value_wrong=..., ...)`` style); it is called once with the spec's ``kwargs``
and the function it returns is the reward, e.g. ``{name: "trl.rewards:get_soft_overlong_punishment()",
kwargs: {max_completion_len: 512, soft_punish_cache: 64}}``.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import inspect
import math
from collections.abc import Callable
from typing import Any

from mmgrpo.registry import Registry

REWARDS: Registry = Registry("reward")
"""Built-in and user-registered rewards, by name (functions, or classes for model-based rewards)."""

ENTRY_POINT_GROUP = "mmgrpo.rewards"
_DESCRIPTIONS: dict[str, str] = {}

_HOW_TO = (
    "Provide a reward in one of three ways: (1) a registry name (see `mmgrpo rewards list`, or decorate your "
    "function with @mmgrpo.rewards.register_reward('name') and import its module); (2) an import path "
    "'package.module:function' (or ':Class'); (3) an entry point in the group 'mmgrpo.rewards' of an installed "
    'package ([project.entry-points."mmgrpo.rewards"] name = "package.module:function" in its pyproject.toml).'
)


class UnknownRewardError(KeyError):
    """No reward has this name. The message lists the valid names and the three ways to provide one."""

    def __str__(self) -> str:  # KeyError would print the message with quotes around it
        return str(self.args[0]) if self.args else ""


def register_reward(name: str, description: str | None = None) -> Callable[[Any], Any]:
    """Decorator registering a reward function (or model-based reward class) under ``name``.

    ``description`` is the one line ``mmgrpo rewards list`` prints; by default the first line of the
    docstring. Registering a taken name with another object raises ``ValueError``.
    """

    def deco(obj: Any) -> Any:
        REWARDS.add(name, obj)
        if not inspect.isclass(obj):  # keyword-only parameters are its options: typos in kwargs are caught
            try:
                params = inspect.signature(obj).parameters.values()
                obj.reward_options = tuple(p.name for p in params if p.kind is p.KEYWORD_ONLY and p.name != "prompts")
            except (TypeError, ValueError, AttributeError):  # no signature, or no attributes (builtins)
                pass
        _DESCRIPTIONS[name] = description or _first_line(obj)
        return obj

    return deco


def _first_line(obj: Any) -> str:
    doc = inspect.getdoc(obj) or ""
    return doc.strip().splitlines()[0].strip() if doc.strip() else ""


def _entry_points() -> dict[str, importlib.metadata.EntryPoint]:
    """Entry points of the group ``mmgrpo.rewards`` in every installed distribution (read fresh each call)."""
    return {ep.name: ep for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}


def list_rewards() -> list[tuple[str, str]]:
    """``(name, one-line description)`` of every registered reward and every ``mmgrpo.rewards`` entry point.

    Entry points are loaded to read their docstrings; one that fails to import is listed with the error.
    A name that is both registered and an entry point is listed once: the registry wins (as in
    :func:`load_reward`).
    """
    rows = {name: _DESCRIPTIONS.get(name) or _first_line(REWARDS.get(name)) for name in REWARDS.names()}
    for name, ep in _entry_points().items():
        if name in rows:
            continue
        try:
            desc = _first_line(ep.load())
        except Exception as e:  # a broken plug-in must not break listing the others
            desc = f"(entry point {ep.value} failed to load: {type(e).__name__}: {e})"
        rows[name] = desc or f"(entry point {ep.value})"
    return sorted(rows.items())


def _import_path(spec: str) -> Any:
    module_name, _, attr = spec.partition(":")
    try:
        obj = importlib.import_module(module_name)
    except ImportError as e:
        raise UnknownRewardError(f"reward {spec!r}: cannot import module {module_name!r} ({e}). {_HOW_TO}") from e
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise UnknownRewardError(f"reward {spec!r}: module {module_name!r} has no attribute {attr!r}") from None
    return obj


def resolve_reward(spec: str) -> Any:
    """The object (function or class) behind ``spec``, not yet bound to kwargs. See :func:`load_reward`."""
    if not isinstance(spec, str) or not spec:
        raise TypeError(f"a reward spec is a non-empty string, got {spec!r}")
    if spec in REWARDS:
        return REWARDS.get(spec)
    if ":" in spec:
        return _import_path(spec)
    eps = _entry_points()
    if spec in eps:
        try:
            return eps[spec].load()
        except Exception as e:
            raise UnknownRewardError(
                f"reward {spec!r}: entry point {eps[spec].value!r} (group {ENTRY_POINT_GROUP!r}) failed to load: "
                f"{type(e).__name__}: {e}"
            ) from e
    valid = sorted(set(REWARDS.names()) | set(eps))
    raise UnknownRewardError(f"unknown reward {spec!r}; valid names: {', '.join(valid)}. {_HOW_TO}")


def load_reward(spec: str | Callable, **kwargs: Any) -> Callable[..., list]:
    """A ready-to-call reward from a registry name, ``package.module:attr`` or entry-point name.

    A function is returned as is, or with ``kwargs`` bound as keyword arguments (``functools.partial``); a
    class is instantiated with ``kwargs``. A callable ``spec`` is accepted too (bound the same way). Keyword
    arguments the function does not accept raise ``TypeError`` naming them and the accepted ones.
    """
    if isinstance(spec, str) and spec.endswith("()"):
        return _build_from_factory(spec, kwargs)
    obj = spec if callable(spec) and not isinstance(spec, str) else resolve_reward(spec)
    name = spec if isinstance(spec, str) else getattr(spec, "__name__", type(spec).__name__)
    if inspect.isclass(obj):
        try:
            return obj(**kwargs)
        except TypeError as e:
            raise TypeError(f"reward {name!r}: cannot build {obj.__name__}(**{kwargs!r}): {e}") from e
    if not callable(obj):
        raise TypeError(f"reward {name!r} resolves to {obj!r}, which is not callable")
    if not kwargs:
        return obj
    _check_kwargs(name, obj, kwargs)
    bound = functools.partial(obj, **kwargs)
    functools.update_wrapper(bound, obj)  # keeps __name__/__doc__ for messages and listings
    return bound


def _build_from_factory(spec: str, kwargs: dict) -> Callable[..., list]:
    factory = resolve_reward(spec[:-2])
    if not callable(factory):
        raise TypeError(f"reward {spec!r}: {spec[:-2]!r} is not callable, so it cannot be a factory")
    _check_kwargs(spec, factory, kwargs)
    try:
        fn = factory(**kwargs)
    except Exception as e:
        raise TypeError(f"reward {spec!r}: the factory raised {type(e).__name__}: {e}") from e
    if not callable(fn):
        raise TypeError(f"reward {spec!r}: the factory returned {type(fn).__name__}, not a reward function")
    return fn


def check_reward_spec(name: Any, kwargs: dict | None = None, weight: Any = 1.0) -> None:
    """Check a reward spec without calling the reward: the name resolves (the module imports, the attribute
    exists), ``kwargs`` are arguments it accepts, the weight is a finite number ``>= 0``. Raises ``ValueError``
    with one line naming what is wrong; the config loader calls this so ``--dry-run`` catches typos."""
    kwargs = kwargs or {}
    try:
        w = float(weight)
    except (TypeError, ValueError):
        raise ValueError(f"weight: must be a number, got {weight!r}") from None
    if not math.isfinite(w) or w < 0:
        raise ValueError(
            f"weight: must be a finite number >= 0, got {weight!r} (to penalise something, use a reward that "
            "returns negative values)"
        )
    if not isinstance(kwargs, dict):
        raise ValueError(f"kwargs: must be a mapping of argument names to values, got {kwargs!r}")
    factory = isinstance(name, str) and name.endswith("()")
    try:
        obj = resolve_reward(name[:-2] if factory else name)
    except (UnknownRewardError, TypeError) as e:
        raise ValueError(str(e).split(". Provide a reward")[0]) from None
    except Exception as e:  # the user's module raised while importing
        raise ValueError(f"reward {name!r}: importing it raised {type(e).__name__}: {e}") from None
    target = obj.__init__ if inspect.isclass(obj) else obj
    if inspect.isclass(obj) and not kwargs:
        return
    if kwargs or factory:
        try:
            _check_kwargs(name, target, kwargs)
        except TypeError as e:
            raise ValueError(f"kwargs: {e}") from None


def _check_kwargs(name: str, fn: Callable, kwargs: dict) -> None:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # builtins without a signature: let the call decide
        return
    accepted = getattr(fn, "reward_options", None)
    if accepted is None:
        if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
            return
        accepted = [n for n, p in params.items() if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)]
    unknown = sorted(set(kwargs) - set(accepted))
    if unknown:
        raise TypeError(f"reward {name!r} got unknown argument(s) {unknown}; it accepts {list(accepted)}")
