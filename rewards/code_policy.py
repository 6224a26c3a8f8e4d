"""What a reward named by code (``module:function``, a factory ``module:make()``, an entry point) must look like.

Functions here only judge; :mod:`mmgrpo.rewards.registry` calls them on the live object (a module already
imported) or on the ``def`` read from source (a module not imported yet) and raises its own errors with their
messages.

**Reward shape.** A reward receives the completions as its first argument. A function that, once the spec's
``kwargs`` are bound, has no positional parameter left for them, or whose return annotation is a ``Callable``,
builds a reward instead: it is a factory, written with ``()`` (``trl.rewards:get_soft_overlong_punishment()``), so
it is called once with the ``kwargs`` and what it returns is the reward (:func:`factory_hint`).
"""

from __future__ import annotations

import ast
import inspect
from collections.abc import Callable
from typing import Any


def factory_hint(label: str, positional: list[str], varargs: bool, returns: str, kwargs: dict) -> str | None:
    """Why ``label`` (written without ``()``) is a factory rather than a reward, with the spelling to use; or
    ``None`` when it can take the completions. ``positional``: its positional parameter names; ``varargs``: it
    has ``*args``; ``returns``: its return annotation as text (``""`` for none)."""
    left = [p for p in positional if p not in kwargs]
    if "Callable" in returns:
        why = f"returns a Callable (-> {returns})"
    elif not left and not varargs:
        bound = f"once kwargs {sorted(kwargs)} are bound" if kwargs else "(it takes no positional parameter)"
        why = f"has no parameter left for the completions {bound}"
    else:
        return None
    return (
        f"reward {label!r} {why}, so it builds a reward rather than being one (a factory): write "
        f"name: '{label}()' to call it once with the kwargs and use what it returns"
    )


def live_factory_hint(label: str, fn: Callable, kwargs: dict) -> str | None:
    """:func:`factory_hint` for a live function."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    params = sig.parameters.values()
    positional = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    varargs = any(p.kind is p.VAR_POSITIONAL for p in params)
    ann = sig.return_annotation
    returns = "" if ann is sig.empty else ann if isinstance(ann, str) else _annotation_text(ann)
    return factory_hint(label, positional, varargs, returns, kwargs)


def static_factory_hint(label: str, node: ast.FunctionDef | ast.AsyncFunctionDef, kwargs: dict) -> str | None:
    """:func:`factory_hint` for a ``def`` read from source."""
    a = node.args
    returns = ast.unparse(node.returns) if node.returns is not None else ""
    return factory_hint(label, [p.arg for p in a.posonlyargs + a.args], a.vararg is not None, returns, kwargs)


def _annotation_text(ann: Any) -> str:
    text = getattr(ann, "__qualname__", None) if isinstance(ann, type) else None
    return text or str(ann).replace("typing.", "").replace("collections.abc.", "")


__all__ = ["factory_hint", "live_factory_hint", "static_factory_hint"]
