"""What a reward named by code (``module:function``, a factory ``module:make()``, an entry point) must be; the same
functions judge ``rollout.tools`` (``mmgrpo/tool_check.py``) and ``rollout.environment`` (``mmgrpo/env_check.py``)
by reference: one code policy for every callable a config names (``kind``: whose allow-list, :data:`LIBRARIES`).

Functions here only judge; :mod:`mmgrpo.rewards.registry` calls them on the live object (a module already
imported) or on the ``def`` read from source (a module not imported yet) and raises its own errors with their
messages.

**Where the code comes from** (:func:`library_refusal`). A reward reference must name code from one of:

1. **your own modules**: a module whose file is outside the Python installation's library folders
   (``site-packages`` / ``dist-packages``, the standard library): the current directory, the config's folder,
   a source tree on ``PYTHONPATH`` or installed editable (``pip install -e``);
2. a **registered entry point** of the group ``mmgrpo.rewards`` (an installed package that declares the
   function a reward);
3. an **allow-listed reward library**, :data:`REWARD_LIBRARIES` (``trl.rewards``, and mmgrpo's own ``mmgrpo.rewards``).

Anything else in an installed library is refused at load, ``--dry-run`` included, in one line: its functions
load files or objects (``torch:load()`` with ``weights_only: false`` runs a pickle, as do
``pandas:read_pickle()`` and ``joblib:load()``), and a config (or a run directory from elsewhere) is code. The
standard library, classes and built-ins stay refused whatever the origin (``subprocess:Popen``, ``os:system``,
``builtins:eval``). To use a library function anyway, the person running the command opts in by module, in
the environment rather than the config (a config cannot vouch for itself): ``MMGRPO_TRUSTED_REWARD_MODULES=
pkg.module,other`` (:data:`TRUST_ENV`; a name also covers its submodules).

**Reward shape.** A reward receives the completions as its first argument. A function that, once the spec's
``kwargs`` are bound, has no positional parameter left for them, or whose return annotation is a ``Callable``,
builds a reward instead: it is a factory, written with ``()`` (``trl.rewards:get_soft_overlong_punishment()``), so
it is called once with the ``kwargs`` and what it returns is the reward (:func:`factory_hint`).
"""

from __future__ import annotations

import ast
import contextlib
import inspect
import os
import site
import sys
import sysconfig
from collections.abc import Callable
from pathlib import Path
from typing import Any

REWARD_LIBRARIES = ("trl.rewards", "mmgrpo.rewards")
"""Installed modules whose functions are rewards (or reward factories) by design; submodules included."""

TOOL_LIBRARIES = ("mmgrpo.tools",)
"""Installed modules whose functions are tools by design (the built-in tools); submodules included."""

LIBRARIES = {"reward": REWARD_LIBRARIES, "tool": TOOL_LIBRARIES, "environment": ()}
"""The allow-listed installed modules of each kind of user code named ``module:attr`` (rewards, ``rollout.tools``,
``rollout.environment``)."""

TRUST_ENV = "MMGRPO_TRUSTED_REWARD_MODULES"
"""Comma-separated modules the user allows code from (rewards, tools, environments), on top of :data:`LIBRARIES`."""


def trusted_modules(kind: str = "reward") -> tuple[str, ...]:
    """The allow-listed modules of ``kind`` (:data:`LIBRARIES`) and the modules named in :data:`TRUST_ENV` (read
    now)."""
    extra = [m.strip() for m in os.environ.get(TRUST_ENV, "").split(",") if m.strip()]
    return (*LIBRARIES[kind], *extra)


def is_stdlib(module: str) -> bool:
    """``module`` (a dotted name) belongs to the Python standard library or is built into the interpreter: refused
    as user code whatever the allow-list says (``os:system``, ``subprocess:run``, ``builtins:eval``)."""
    top = module.partition(".")[0]
    return top in sys.stdlib_module_names or top in sys.builtin_module_names


def _library_dirs() -> list[Path]:
    """The installation's library folders: site-packages (user's too) and the standard library."""
    paths = {sysconfig.get_paths().get(k) for k in ("purelib", "platlib", "stdlib", "platstdlib")}
    with contextlib.suppress(AttributeError):  # some embedded interpreters' site module lacks them
        paths |= {*site.getsitepackages(), site.getusersitepackages()}
    return [Path(p).resolve() for p in paths if p]


def is_installed_library(origin: str) -> bool:
    """``origin`` (a module's file) is inside ``site-packages`` / ``dist-packages`` or the standard library."""
    path = Path(origin).resolve()
    if {"site-packages", "dist-packages"} & set(path.parts):
        return True
    return any(path.is_relative_to(d) for d in _library_dirs())


def library_refusal(spec: str, module_name: str, origin: str | None, kind: str = "reward") -> str | None:
    """Why the code policy refuses ``spec`` (code of ``kind``: a key of :data:`LIBRARIES`), which names code of
    ``module_name`` (file ``origin``): it is in an installed library that is neither allow-listed for ``kind`` nor
    trusted by :data:`TRUST_ENV` (by ``module_name`` or by the module ``spec`` names). ``None``: allowed."""
    named = spec.partition(":")[0]
    if any(n == m or n.startswith(m + ".") for m in trusted_modules(kind) for n in (named, module_name)):
        return None
    if not origin or not os.path.isabs(origin) or not is_installed_library(origin):
        return None  # one's own code (or a module without a file: builtins are refused elsewhere)
    where = named if module_name in (named, "") else f"{named} ({module_name})"
    if kind != "reward":
        allowed = "".join(f", or {m}" for m in LIBRARIES[kind])
        return (
            f"{kind} {spec!r} is code of the installed library {where}, not of your own modules (its functions may "
            f"download, load or run anything); a {kind} must come from your own modules{allowed}; to allow it "
            f"anyway, run with {TRUST_ENV}={named} (docs/reliability.md#tools-and-environments-code-and-bounds)"
        )
    return (
        f"reward {spec!r} is code of the installed library {where}, which is not a reward library (its functions "
        "may load files or objects); a reward must come from your own modules, an entry point of the group "
        f"'mmgrpo.rewards', or {' / '.join(REWARD_LIBRARIES)}; to allow it anyway, run with {TRUST_ENV}={named} "
        "(docs/rewards.md#code-policy)"
    )


def live_library_refusal(spec: str, obj: Any, kind: str = "reward") -> str | None:
    """:func:`library_refusal` for a live function or class: the module that defines it (``obj.__module__``)."""
    module_name = getattr(obj, "__module__", None) or ""
    module = sys.modules.get(module_name)
    origin = getattr(module, "__file__", None) if module is not None else None
    return library_refusal(spec, module_name, origin, kind) if module_name else None


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


__all__ = [
    "LIBRARIES",
    "REWARD_LIBRARIES",
    "TOOL_LIBRARIES",
    "TRUST_ENV",
    "factory_hint",
    "is_installed_library",
    "is_stdlib",
    "library_refusal",
    "live_factory_hint",
    "live_library_refusal",
    "static_factory_hint",
    "trusted_modules",
]
