"""Finding rewards: by registry name, by ``package.module:function``, or by the ``mmgrpo.rewards`` entry point.

A reward is a plain function ``f(completions: list, *, prompts: list, **columns) -> list[float | None]``
(a superset of TRL's reward signature, so a TRL reward works unchanged), or a class whose instances have that
``__call__`` (model-based rewards, registered by name). ``None`` in the returned list means "not applicable to
this sample".

Three ways to provide one, looked up in this order by :func:`load_reward`:

1. a **registry name** of :data:`REWARDS` (built-ins, and anything decorated with :func:`register_reward`);
2. an **import path** ``"package.module:function"``;
3. an **entry point** in the group ``mmgrpo.rewards`` of any installed distribution, e.g. in the user's
   ``pyproject.toml``: ``[project.entry-points."mmgrpo.rewards"] my_reward = "my_pkg.rewards:my_reward"``.

**Factories**: a spec ending in ``()`` names a function that *returns* the reward (TRL's
``get_cosine_scaled_reward(min_value_wrong=..., ...)`` style); it is called once with the spec's ``kwargs``
and the callable it returns is the reward, e.g. ``{name: "trl.rewards:get_soft_overlong_punishment()",
kwargs: {max_completion_len: 512, soft_punish_cache: 64}}``.

**Code policy** (a config is code; a run directory from elsewhere is code). Registry names and entry points
name code that is already installed or imported. An import path names code to import, so it must resolve to
a **plain Python function** defined outside the standard library: a class (``subprocess:Popen``), a built-in
(``os:system``, ``builtins:eval``), a method, a callable instance or anything from the standard library
(``subprocess:run``, ``shutil:rmtree``) is refused with :class:`RewardCodeError`; and it must come from one's
own modules or an allow-listed reward library (``trl.rewards``): another installed library's function
(``torch:load()``) is refused unless ``MMGRPO_TRUSTED_REWARD_MODULES`` names it (:mod:`.code_policy`). A
function written without ``()`` that builds a reward (annotated ``-> Callable``, or with no parameter left for
the completions once its kwargs are bound) is refused with the factory spelling. A factory ``mod:make()`` must
be such a function too; what it returns must be callable and not a class (an instance with ``__call__``, e.g. a
model-based reward it builds, is fine). Checking a config (:func:`check_reward_spec`, run by ``load_config`` and
so by ``--dry-run``) never imports a module that is not imported yet: it finds the module's file
(``importlib.machinery.PathFinder``, which runs no package ``__init__``), reads its source with :mod:`ast` and
checks what it can see there (a ``def`` with the given options, not a ``class``); what it cannot see (a name
bound by assignment or a star import, a compiled module) is checked when the reward is loaded for training.
:func:`reward_code_policy` switches :func:`load_reward` to placeholders that never import (``"check"``, used by
``--dry-run``; ``"registered"``, used by ``mmgrpo demo`` without ``--trust-run-config``).
"""

from __future__ import annotations

import ast
import contextlib
import functools
import importlib
import importlib.machinery
import importlib.metadata
import inspect
import math
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from mmgrpo.errors import ConfigError
from mmgrpo.registry import Registry
from mmgrpo.suggest import did_you_mean

from .code_policy import is_stdlib, library_refusal, live_factory_hint, live_library_refusal, static_factory_hint

REWARDS: Registry = Registry("reward")
"""Built-in and user-registered rewards, by name (functions, or classes for model-based rewards)."""

ENTRY_POINT_GROUP = "mmgrpo.rewards"
_DESCRIPTIONS: dict[str, str] = {}
_LOAD_CHECKS: dict[str, Callable[[dict], str | None]] = {}

_HOW_TO = (
    "Provide a reward in one of three ways: (1) a registry name (see `mmgrpo rewards list`, or decorate your "
    "function with @mmgrpo.rewards.register_reward('name') and import its module); (2) an import path "
    "'package.module:function'; (3) an entry point in the group 'mmgrpo.rewards' of an installed "
    'package ([project.entry-points."mmgrpo.rewards"] name = "package.module:function" in its pyproject.toml).'
)

POLICIES = ("import", "check", "registered")
_policy = "import"


class UnknownRewardError(ConfigError, KeyError):
    """No reward has this name. The message lists the valid names and the three ways to provide one."""

    def __str__(self) -> str:  # KeyError would print the message with quotes around it
        return str(self.args[0]) if self.args else ""


class RewardCodeError(ConfigError, TypeError):
    """An import path names something the code policy refuses (a class, a built-in, the standard library)."""


@contextlib.contextmanager
def reward_code_policy(policy: str) -> Iterator[None]:
    """Within the block, how :func:`load_reward` treats specs that name code to import (``module:function``,
    factories, entry points):

    - ``"import"`` (the default outside any block): import and check it (see the module docstring);
    - ``"check"``: check it without importing (:func:`check_reward_spec`) and return a placeholder that raises
      :class:`RewardNotLoadedError` if called — ``--dry-run`` builds tasks under this policy;
    - ``"registered"``: registry names and installed entry points load as usual; an import path or factory is
      not imported and becomes such a placeholder — ``mmgrpo demo`` without ``--trust-run-config``.

    A process-wide setting (not per thread), restored on exit.
    """
    global _policy
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
    previous, _policy = _policy, policy
    try:
        yield
    finally:
        _policy = previous


def current_policy() -> str:
    """The code policy in force (one of :data:`POLICIES`; :func:`reward_code_policy`): the same for every callable a
    config names by import path — rewards, ``rollout.tools``, ``rollout.environment``."""
    return _policy


class RewardNotLoadedError(RuntimeError):
    """A placeholder reward was called: the policy in force did not import its code."""


class NotLoadedReward:
    """Stands for a reward whose code the policy did not import; calling it raises :class:`RewardNotLoadedError`."""

    def __init__(self, spec: str, reason: str):
        self.spec, self.reason = spec, reason
        self.__name__ = _attr_name(spec)

    def __call__(self, completions: list, **kwargs: Any) -> list:
        raise RewardNotLoadedError(f"reward {self.spec!r} was not loaded: {self.reason}")

    def __repr__(self) -> str:
        return f"NotLoadedReward({self.spec!r})"


def _attr_name(spec: str) -> str:
    return spec.removesuffix("()").rpartition(":")[2].rpartition(".")[2] or spec


def is_code_spec(spec: Any) -> bool:
    """True for a spec that names code to import: ``module:attr`` or a factory ``...()`` (not a registry name)."""
    return isinstance(spec, str) and spec not in REWARDS and (":" in spec or spec.endswith("()"))


def register_reward(
    name: str,
    description: str | None = None,
    *,
    unbounded: bool = False,
    preload: Callable[[], Any] | None = None,
    load_check: Callable[[dict], str | None] | None = None,
) -> Callable[[Any], Any]:
    """Decorator registering a reward function (or model-based reward class) under ``name``.

    ``description`` is the one line ``mmgrpo rewards list`` prints; by default the first line of the
    docstring. Registering a taken name with another object raises ``ValueError``. ``unbounded=True`` marks a
    reward whose work on some inputs is not bounded by its own code (a symbolic algebra system on model output):
    :class:`~mmgrpo.rewards.RewardRunner` with ``isolation="auto"`` runs it in a worker process, which
    ``timeout_s`` can kill (sets ``obj.reward_unbounded``). ``preload`` is a function the runner calls once in its
    own process when it is built (``obj.reward_preload``): imports and caches it warms are inherited by forked
    workers instead of being redone on every call (math-verify's first parse takes about 1.3 s with imports).
    ``load_check(kwargs)`` says, without building the reward, what would keep it from loading with those
    ``kwargs`` (a phrase with the fix, or ``None``): the load-time check runs it before any model loads
    (:func:`reward_load_check`; model-based rewards check that their weights can be found).
    """

    def deco(obj: Any) -> Any:
        REWARDS.add(name, obj)
        if unbounded:
            obj.reward_unbounded = True
        if preload is not None:
            obj.reward_preload = preload
        if load_check is not None:
            _LOAD_CHECKS[name] = load_check
        if not inspect.isclass(obj):  # keyword-only parameters are its options: typos in kwargs are caught
            try:
                params = inspect.signature(obj).parameters.values()
                obj.reward_options = tuple(p.name for p in params if p.kind is p.KEYWORD_ONLY and p.name != "prompts")
            except (TypeError, ValueError, AttributeError):  # no signature, or no attributes (builtins)
                pass
        _DESCRIPTIONS[name] = description or _first_line(obj)
        return obj

    return deco


def unknown_reward(name: str, valid: list[str]) -> str:
    """One line for an unknown reward name: the closest valid name (difflib) when one is close, else all names."""
    close = did_you_mean(name, valid)
    if close is not None:
        return f"unknown reward {name!r}; did you mean {close!r}? (`mmgrpo rewards list` describes all {len(valid)})"
    return f"unknown reward {name!r}; valid names: {', '.join(valid)}"


def reward_load_check(name: str, kwargs: dict) -> str | None:
    """What keeps the registered reward ``name`` from loading with ``kwargs`` (its ``load_check``), or ``None``."""
    check = _LOAD_CHECKS.get(name)
    return None if check is None else check(kwargs)


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
    if not module_name or not attr:
        raise UnknownRewardError(f"reward {spec!r}: an import path is 'package.module:function'. {_HOW_TO}")
    try:
        obj = importlib.import_module(module_name)
    except ImportError as e:
        raise UnknownRewardError(f"reward {spec!r}: cannot import module {module_name!r} ({e}). {_HOW_TO}") from e
    except Exception as e:  # the user's module raised while importing
        raise UnknownRewardError(
            f"reward {spec!r}: importing module {module_name!r} raised {type(e).__name__}: {e}"
        ) from e
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise UnknownRewardError(f"reward {spec!r}: module {module_name!r} has no attribute {attr!r}") from None
    return obj


def check_code_object(spec: str, obj: Any, *, library_ok: bool = False, kind: str = "reward") -> None:
    """Raise :class:`RewardCodeError` unless ``obj`` (what the import path ``spec`` names) is a plain Python
    function outside the standard library (a ``functools.partial`` of one is accepted), from one's own modules or
    an allowed reward library (:func:`~mmgrpo.rewards.code_policy.library_refusal`; ``library_ok``: an entry
    point's code, vouched for by its package; ``kind``: whose allow-list applies, ``reward``, ``tool``,
    ``environment``)."""
    target = obj
    while isinstance(target, functools.partial):
        target = target.func
    fix = (
        "an import path must name a plain Python function of your own code; for a model-based reward class, "
        "register it (@register_reward), declare an entry point, or name a function that builds it "
        "('package.module:make_reward()')"
    )
    if inspect.isclass(target):
        raise RewardCodeError(f"reward {spec!r} is the class {_qualname(target)}, not a function; {fix}")
    if not inspect.isfunction(target):
        kind = (
            "a built-in function"
            if inspect.isbuiltin(target)
            else "a method"
            if inspect.ismethod(target)
            else "a module"
            if inspect.ismodule(target)
            else f"a {type(target).__name__} object"
        )
        raise RewardCodeError(f"reward {spec!r} is {kind} ({_qualname(target)}), not a Python function; {fix}")
    module = getattr(target, "__module__", None) or ""
    if is_stdlib(module):
        raise RewardCodeError(
            f"reward {spec!r} is {_qualname(target)} from the Python standard library, not a reward; {fix}"
        )
    refusal = None if library_ok else live_library_refusal(spec, target, kind)
    if refusal is not None:
        raise RewardCodeError(refusal)


def _qualname(obj: Any) -> str:
    module = getattr(obj, "__module__", None)
    name = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None) or type(obj).__name__
    return f"{module}.{name}" if module else str(name)


def resolve_reward(spec: str) -> Any:
    """The object (function or class) behind ``spec``, not yet bound to kwargs. See :func:`load_reward`.

    An import path is checked by :func:`check_code_object` (the code policy)."""
    if not isinstance(spec, str) or not spec:
        raise TypeError(f"a reward spec is a non-empty string, got {spec!r}")
    if spec in REWARDS:
        return REWARDS.get(spec)
    if ":" in spec:
        module = spec.partition(":")[0]
        if is_stdlib(module):  # refused before importing anything
            raise RewardCodeError(
                f"reward {spec!r} names the Python standard library module {module!r}, not a reward; an import "
                "path must name a plain Python function of your own code"
            )
        obj = _import_path(spec)
        check_code_object(spec, obj)
        return obj
    eps = _entry_points()
    if spec in eps:
        try:
            return eps[spec].load()
        except Exception as e:
            raise UnknownRewardError(
                f"reward {spec!r}: entry point {eps[spec].value!r} (group {ENTRY_POINT_GROUP!r}) failed to load: "
                f"{type(e).__name__}: {e}"
            ) from e
    raise UnknownRewardError(f"{unknown_reward(spec, sorted(set(REWARDS.names()) | set(eps)))}. {_HOW_TO}")


def load_reward(spec: str | Callable, **kwargs: Any) -> Callable[..., list]:
    """A ready-to-call reward from a registry name, ``package.module:function`` or entry-point name.

    A function is returned as is, or with ``kwargs`` bound as keyword arguments (``functools.partial``); a
    registered (or entry-point) class is instantiated with ``kwargs``. A callable ``spec`` is accepted too
    (bound the same way). Keyword arguments the function does not accept raise ``TypeError`` naming them and
    the accepted ones. An import path the code policy refuses raises :class:`RewardCodeError`; under
    :func:`reward_code_policy` ``"check"`` / ``"registered"`` an import path is not imported and a
    :class:`NotLoadedReward` placeholder is returned.
    """
    if isinstance(spec, str) and _policy != "import" and _names_code_to_import(spec):
        if _policy == "check":
            try:
                check_reward_spec(spec, kwargs)
            except ValueError as e:
                raise RewardCodeError(f"reward {spec!r}: {e}") from None
            return NotLoadedReward(spec, "--dry-run checks a reward's code without importing it")
        return NotLoadedReward(
            spec, "it is code named by the run's config (an import path); the demo runs it only with --trust-run-config"
        )
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


def _names_code_to_import(spec: str) -> bool:
    """An import path or factory (always), or an entry point under the ``"check"`` policy (not imported there)."""
    if spec in REWARDS or spec.removesuffix("()") in REWARDS:
        return False
    if ":" in spec:
        return True
    return _policy == "check" and spec.removesuffix("()") in _entry_points()


def _build_from_factory(spec: str, kwargs: dict) -> Callable[..., list]:
    factory = resolve_reward(spec[:-2])  # an import path is checked to be a plain function there
    if inspect.isclass(factory):
        raise RewardCodeError(
            f"reward {spec!r}: {spec[:-2]!r} is a class; a factory is a function that returns the reward (drop the "
            "'()' to build a registered class with kwargs)"
        )
    if not callable(factory):
        raise TypeError(f"reward {spec!r}: {spec[:-2]!r} is not callable, so it cannot be a factory")
    _check_kwargs(spec, factory, kwargs)
    try:
        fn = factory(**kwargs)
    except Exception as e:
        raise TypeError(f"reward {spec!r}: the factory raised {type(e).__name__}: {e}") from e
    if inspect.isclass(fn) or not callable(fn):
        raise RewardCodeError(
            f"reward {spec!r}: the factory returned {type(fn).__name__ if not inspect.isclass(fn) else 'a class'}, "
            "not a reward function (return a function or an object with __call__)"
        )
    return fn


def check_reward_spec(name: Any, kwargs: dict | None = None, weight: Any = 1.0) -> str | None:
    """Check a reward spec without calling the reward and without importing code: the name resolves, ``kwargs``
    are arguments it accepts, the weight is a finite number ``>= 0``, an import path names a plain function.

    Registry names and modules already imported are checked on the live object. An import path to a module not
    imported yet is checked in its source (:func:`static_reward_check`): nothing of the user's code runs.
    Returns ``None`` when everything was checked, or a one-line note saying what is left for load time (an
    import path's module is imported, and its function checked again, when training starts). Raises
    ``ValueError`` with one line naming what is wrong; the config loader calls this so ``--dry-run`` catches
    typos.
    """
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
    if not isinstance(name, str) or not name or name == "()":
        raise ValueError(f"a reward name is a non-empty string, got {name!r}")
    if _policy == "registered" and is_code_spec(name):  # the demo of an untrusted run: not looked for, not loaded
        return f"reward {name!r} is code to import; not loaded under the registered-only policy"
    factory = name.endswith("()")
    base = name[:-2] if factory else name
    if base not in REWARDS and ":" not in base:  # an entry point (or unknown): checked on its value
        eps = _entry_points()
        if base not in eps:
            raise ValueError(unknown_reward(base, sorted(set(REWARDS.names()) | set(eps))))
        if eps[base].module not in sys.modules:
            return static_reward_check(eps[base].value, kwargs, factory=factory, label=name, entry_point=True)
    elif base not in REWARDS and base.partition(":")[0] not in sys.modules:
        return static_reward_check(base, kwargs, factory=factory, label=name)
    try:
        obj = resolve_reward(base)
    except (UnknownRewardError, TypeError) as e:
        raise ValueError(str(e).split(". Provide a reward")[0]) from None
    except Exception as e:  # an entry point's package raised while importing
        raise ValueError(f"reward {name!r}: importing it raised {type(e).__name__}: {e}") from None
    target = obj.__init__ if inspect.isclass(obj) else obj
    if inspect.isclass(obj) and factory:
        raise ValueError(f"reward {name!r}: {base!r} is a class; a factory is a function that returns the reward")
    if inspect.isclass(obj) and not kwargs:
        return None
    if kwargs or factory:
        try:
            _check_kwargs(name, target, kwargs)
        except TypeError as e:
            raise ValueError(f"kwargs: {e}") from None
    hint = None if factory or base in REWARDS or inspect.isclass(obj) else live_factory_hint(name, obj, kwargs)
    if hint is not None:
        raise ValueError(hint)
    return None


# ------------------------------------------------------------------------------- checking code without importing


def find_module_file(module_name: str) -> importlib.machinery.ModuleSpec | None:
    """The spec of ``module_name`` found on ``sys.path`` without importing it or its parent packages.

    ``importlib.util.find_spec("a.b")`` imports ``a`` (runs ``a/__init__.py``); this walks the path with
    :class:`importlib.machinery.PathFinder` one level at a time instead, using a parent's ``__path__`` only when
    the parent is already imported. ``None`` when it is not there.
    """
    parts = module_name.split(".")
    spec = None
    search: list[str] | None = None
    for i in range(len(parts)):
        qual = ".".join(parts[: i + 1])
        if qual in sys.modules and getattr(sys.modules[qual], "__spec__", None) is not None:
            spec = sys.modules[qual].__spec__
        else:
            spec = importlib.machinery.PathFinder.find_spec(qual, search)
            if spec is None:
                return None
        search = list(spec.submodule_search_locations or [])
        if i < len(parts) - 1 and not search:
            return None  # a module, not a package: it has no submodules
    return spec


def static_reward_check(
    spec: str, kwargs: dict, *, factory: bool = False, label: str | None = None, entry_point: bool = False
) -> str:
    """Check the import path ``spec`` (``module:attr``) in the module's source, importing nothing.

    Refuses (``ValueError``) a module that cannot be found, a standard-library module, a module without the
    attribute, a ``class`` (or an imported module) bound to it, and ``kwargs`` a ``def`` does not accept; follows
    ``from x import attr`` re-exports. Returns a note for the dry-run output: where the code is, and that it is
    imported and checked again when training starts.
    """
    label = label or spec
    where = f" (entry point {spec!r})" if entry_point else ""
    found = static_lookup(spec, depth=0, trusted=entry_point)
    kind, detail = found
    if kind == "class":
        raise ValueError(
            f"reward {label!r}{where} is the class {detail}, not a function; an import path must name a plain "
            "Python function (for a model-based reward class: register it, declare an entry point, or name a "
            "function that builds it, 'package.module:make_reward()')"
        )
    if kind == "module":
        raise ValueError(f"reward {label!r}{where} is the module {detail}, not a function")
    if kind == "function":
        node, path = detail
        if kwargs or factory:
            _check_kwargs_static(label, node, kwargs)
        hint = None if factory else static_factory_hint(label, node, kwargs)
        if hint is not None:
            raise ValueError(hint)
        return (
            f"reward {label!r} is code: {node.name}() in {path} (line {node.lineno}), found without importing it; "
            "it is imported, and checked to be a plain function, when training starts"
        )
    return (
        f"reward {label!r} is code in {detail}: its module is imported, and {spec.partition(':')[2]!r} checked to "
        "be a plain function, when training starts (not visible in the source without running it)"
    )


def static_lookup(spec: str, depth: int = 0, trusted: bool = False, kind: str = "reward") -> tuple[str, Any]:
    """What ``module:attr`` names, read in the module's source without importing it: ``("function", (node, path))``,
    ``("class", qualname)``, ``("module", name)`` or ``("unknown", path)``; raises ``ValueError`` for a module that is
    not there, the standard library, a missing attribute, or (unless ``trusted``: an entry point's code) an installed
    library the code policy does not allow for ``kind`` (``reward``, ``tool``, ``environment``:
    :func:`~mmgrpo.rewards.code_policy.library_refusal`), re-exports followed. The messages begin ``reward 'spec'``."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ValueError(f"reward {spec!r}: an import path is 'package.module:function'")
    if is_stdlib(module_name):
        raise ValueError(
            f"reward {spec!r} names the Python standard library module {module_name!r}, not a reward; an import "
            "path must name a plain Python function of your own code"
        )
    if module_name in sys.modules:  # already imported: no code runs by looking at it
        try:
            obj = _import_path(spec)
            check_code_object(spec, obj, library_ok=trusted, kind=kind)
        except (UnknownRewardError, RewardCodeError) as e:
            raise ValueError(str(e).split(". Provide a reward")[0]) from None
        try:
            src = inspect.getsourcefile(obj)
            node = _def_node(obj, src)
        except (TypeError, OSError):
            node, src = None, None
        return ("function", (node, src)) if node is not None else ("unknown", module_name)
    mspec = find_module_file(module_name)
    if mspec is None:
        raise ValueError(
            f"reward {spec!r}: cannot import module {module_name!r} (no such module on sys.path; a module of "
            "your own must be in the current directory, next to the config file, or an installed package)"
        )
    origin = mspec.origin
    refusal = None if trusted else library_refusal(spec, module_name, origin, kind)
    if refusal is not None:
        raise ValueError(refusal)
    if mspec.submodule_search_locations and origin in (None, "namespace"):
        raise ValueError(f"reward {spec!r}: {module_name!r} is a namespace package, which defines no functions")
    if not origin or not origin.endswith(".py") or not Path(origin).is_file():
        return "unknown", origin or module_name
    try:
        tree = ast.parse(Path(origin).read_bytes(), filename=origin)
    except SyntaxError as e:
        raise ValueError(f"reward {spec!r}: {origin} line {e.lineno} is not valid Python ({e.msg})") from None
    except (OSError, ValueError) as e:
        raise ValueError(f"reward {spec!r}: cannot read {origin} ({e})") from None
    first, _, rest = attr.partition(".")
    bindings = _module_bindings(tree, first)
    if not bindings:
        if _has_dynamic_names(tree):
            return "unknown", origin
        raise ValueError(f"reward {spec!r}: module {module_name!r} has no attribute {attr!r} ({origin})")
    kinds = {type(b) for b in bindings}
    last = bindings[-1]
    if rest:  # e.g. "Class.method": look no deeper
        return "unknown", origin
    if kinds <= {ast.FunctionDef, ast.AsyncFunctionDef}:
        if last.decorator_list:  # a decorator may return anything: checked on the real object
            return "unknown", origin
        return "function", (last, origin)
    if kinds == {ast.ClassDef}:
        return "class", f"{module_name}.{first}"
    if isinstance(last, ast.ImportFrom) and len(bindings) == 1 and depth < 5:
        target = _absolute_module(last, module_name, bool(mspec.submodule_search_locations))
        alias = next(a for a in last.names if (a.asname or a.name) == first)
        if target is not None:
            sub = f"{target}.{alias.name}"
            if find_module_file(sub) is not None and not is_stdlib(sub):
                return "module", sub
            try:
                return static_lookup(f"{target}:{alias.name}", depth + 1, trusted, kind)
            except ValueError as e:
                raise ValueError(f"reward {spec!r} is imported from {target}: {e}") from None
    if isinstance(last, ast.Import) and len(bindings) == 1:
        return "module", next(a.name for a in last.names if (a.asname or a.name.partition(".")[0]) == first)
    return "unknown", origin


def _module_bindings(tree: ast.Module, name: str) -> list[ast.AST]:
    """Statements at module level (also inside ``if``/``try``/``with`` blocks) that bind ``name``, in order."""
    out: list[ast.AST] = []

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
                out.append(node)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                for a in node.names:
                    bound = a.asname or (a.name.partition(".")[0] if isinstance(node, ast.Import) else a.name)
                    if bound == name:
                        out.append(node)
            elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if any(isinstance(n, ast.Name) and n.id == name for t in targets for n in ast.walk(t)):
                    out.append(node)
            elif isinstance(node, (ast.For, ast.AsyncFor, ast.While, ast.With, ast.AsyncWith)):
                if isinstance(node, (ast.For, ast.AsyncFor, ast.With, ast.AsyncWith)):
                    heads = (
                        [node.target]
                        if isinstance(node, (ast.For, ast.AsyncFor))
                        else [i.optional_vars for i in node.items if i.optional_vars is not None]
                    )
                    if any(isinstance(n, ast.Name) and n.id == name for h in heads for n in ast.walk(h)):
                        out.append(node)
                visit(node.body)
                visit(getattr(node, "orelse", []))
            elif isinstance(node, ast.If):
                visit(node.body)
                visit(node.orelse)
            elif isinstance(node, ast.Try):
                visit(node.body)
                for h in node.handlers:
                    visit(h.body)
                visit(node.orelse)
                visit(node.finalbody)

    visit(tree.body)
    return out


def _has_dynamic_names(tree: ast.Module) -> bool:
    """``from x import *``, a module ``__getattr__``, or writes to ``globals()``: names the source does not show."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and any(a.name == "*" for a in node.names):
            return True
        if isinstance(node, ast.FunctionDef) and node.name == "__getattr__" and node in tree.body:
            return True
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("globals", "setattr"):
            return True
    return False


def _absolute_module(node: ast.ImportFrom, module_name: str, is_package: bool) -> str | None:
    if node.level == 0:
        return node.module
    parts = module_name.split(".")
    keep = len(parts) - node.level + (1 if is_package else 0)
    if keep < 1:
        return None
    base = ".".join(parts[:keep])
    return f"{base}.{node.module}" if node.module else base


def _def_node(obj: Any, path: str | None) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    if path is None or not path.endswith(".py"):
        return None
    try:
        tree = ast.parse(Path(path).read_bytes())
    except (OSError, SyntaxError, ValueError):
        return None
    line = getattr(getattr(obj, "__code__", None), "co_firstlineno", None)
    for node in ast.walk(tree):
        if (
            isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.name == obj.__name__
            and (line is None or node.lineno == line or any(d.lineno == line for d in node.decorator_list))
        ):
            return node
    return None


def _check_kwargs_static(name: str, node: ast.FunctionDef | ast.AsyncFunctionDef, kwargs: dict) -> None:
    """:func:`_check_kwargs` on a ``def`` read from source: the names it accepts by keyword."""
    a = node.args
    if a.kwarg is not None:
        return
    accepted = [p.arg for p in a.args + a.kwonlyargs]
    unknown = sorted(set(kwargs) - set(accepted))
    if unknown:
        raise ValueError(f"kwargs: reward {name!r} got unknown argument(s) {unknown}; it accepts {accepted}")


def completions_annotation(name: str) -> str:
    """The annotation of the ``completions`` parameter of the reward ``name`` as text (``""`` when it has none,
    for a factory, whose reward is only known once it is called, or when it cannot be found), read without
    importing code: live for registered rewards and modules already imported, else from the ``def`` in source.
    TRL's conversational rewards say ``list[list[dict[str, str]]]`` (they read ``completion[0]["content"]``)."""
    if not isinstance(name, str) or name.endswith("()"):
        return ""
    try:
        if name in REWARDS or (":" in name and name.partition(":")[0] in sys.modules):
            obj = resolve_reward(name)
            target = obj.__call__ if inspect.isclass(obj) else obj
            p = inspect.signature(target).parameters.get("completions")
            if p is None or p.annotation is p.empty:
                return ""
            return p.annotation if isinstance(p.annotation, str) else str(p.annotation).replace("typing.", "")
        if ":" not in name:
            eps = _entry_points()
            if name not in eps:
                return ""
            name = eps[name].value
        kind, detail = static_lookup(name, depth=0)
    except Exception:  # not resolvable here: the other checks say why
        return ""
    node = detail[0] if kind == "function" else None
    args = [] if node is None else node.args.posonlyargs + node.args.args + node.args.kwonlyargs
    ann = next((a.annotation for a in args if a.arg == "completions"), None)
    return ast.unparse(ann) if ann is not None else ""


def describe_reward_code(name: str, kwargs: dict | None = None) -> str | None:
    """One line for the dry-run output about a reward that is code to import (``None`` for a registry name or an
    already imported module): where it is, and that it is imported and checked when training starts."""
    try:
        return check_reward_spec(name, kwargs or {})
    except ValueError:
        return None


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
