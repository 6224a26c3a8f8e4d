"""``rollout.tools`` named by import path, held to the one code policy of every callable a config names.

A tool is a registry name (:data:`mmgrpo.tools.TOOLS`: the built-ins ``crop``, ``zoom``, ``select_frames`` and what
one's own module registers) or, like a reward, code: ``module:function`` (a typed function with a Google docstring,
TRL's ``tools=``) or ``module:instance`` (an object with ``name``, ``schema`` and ``__call__``,
:class:`mmgrpo.tools.Tool`). The code is held to the **rewards' code policy** (``rewards/code_policy.py``, the same
functions as rewards and environments use): never the standard library (``os:fork``, ``os:abort``), never an
installed library (``torch.hub:download_url_to_file``) unless the person running the command names its module in
``MMGRPO_TRUSTED_REWARD_MODULES`` (:data:`mmgrpo.rewards.code_policy.TRUST_ENV`: the environment, not the config,
vouches for it); one's own modules (next to the config, the working directory, a source tree on ``PYTHONPATH``) and
mmgrpo's own ``mmgrpo.tools`` are allowed. Refusals are one :class:`ConfigError` line at load, ``--dry-run`` included.

When the code runs follows the rewards too (:func:`mmgrpo.rewards.registry.current_policy`):

- loading a config (:func:`check_tools`, from :func:`mmgrpo.multiturn.check_config`) never imports a tool module:
  the function is found in its module's source (:func:`mmgrpo.rewards.registry.static_lookup`);
- ``--dry-run`` (policy ``check``) imports none either: :func:`resolve_tools` answers with placeholders
  (:class:`NotLoadedTool`), as rewards are not imported at ``--dry-run`` (there is no flag that imports them);
- ``train`` (policy ``import``) imports each module once, checks the live object and builds its schema in the
  preflight, before the model loads (a function without types or docstring is one line);
- ``mmgrpo demo`` (policy ``registered``) imports a run's own tools only with ``--trust-run-config``; without it
  the tool's calls are answered with an error observation saying so.
"""

from __future__ import annotations

import importlib
import inspect
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from mmgrpo.config import ConfigError
from mmgrpo.rewards import registry as code
from mmgrpo.rewards.code_policy import is_stdlib, library_refusal, live_library_refusal

DOCS = "docs/reliability.md#tools-and-environments-code-and-bounds"

_LOADED: dict[str, Any] = {}
"""Tools imported under the ``import`` policy, by spec (each module is imported and checked once)."""


class NotLoadedTool:
    """Stands for a tool whose code the policy in force did not import (``--dry-run``, an untrusted demo): the
    model sees its name, and each call is answered with an error observation saying why it did not run."""

    def __init__(self, spec: str, reason: str):
        self.spec, self.reason = spec, reason
        self.name = spec.partition(":")[2]
        self.schema = {
            "type": "function",
            "function": {"name": self.name, "description": "(not loaded)", "parameters": {"type": "object"}},
        }

    def __call__(self, arguments: dict[str, Any], context: Any) -> Any:
        from mmgrpo.tools import Observation

        message = f"tool {self.spec!r} was not loaded: {self.reason}"
        return Observation(text=f"Error: {message}", error=message)


def _where(spec: str) -> str:
    return f"rollout.tools: {spec!r}"


def _origin(spec: str) -> tuple[str, str]:
    """``(module, attr)`` of ``spec``, refused in one line before anything is imported: a malformed reference, the
    standard library, a module that cannot be found, an installed library the code policy does not allow."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr or "." in attr or spec.endswith("()"):
        raise ConfigError(f"{_where(spec)}: a tool by import path is 'package.module:function' (no '()'), or a name")
    if is_stdlib(module_name):
        raise ConfigError(
            f"{_where(spec)} names the Python standard library module {module_name!r}, not a tool; name a typed "
            f"function of your own module ({DOCS})"
        )
    if module_name in sys.modules:
        return module_name, attr
    found = code.find_module_file(module_name)
    if found is None:
        raise ConfigError(
            f"{_where(spec)}: cannot find module {module_name!r} (a module of your own must be next to the config "
            "file, in the working directory, or on PYTHONPATH)"
        )
    refusal = library_refusal(spec, module_name, found.origin, "tool")
    if refusal is not None:
        raise ConfigError(f"rollout.tools: {refusal}")
    return module_name, attr


def static_check(spec: str) -> str:
    """``spec`` found in its module's source without importing it; returns the tool's name (its attribute). A
    class or a module is refused; a name bound otherwise (an instance, a decorated function) is checked when
    training starts."""
    module_name, attr = _origin(spec)
    if module_name in sys.modules:  # imported already: looking runs nothing
        return _live(spec, module_name, attr).name
    try:
        kind, detail = code.static_lookup(spec, kind="tool")
    except ValueError as e:  # the reward checker's words: a missing attribute, a syntax error, a library
        raise ConfigError(f"rollout.tools: {str(e).replace('reward ', 'tool ', 1)}") from None
    if kind in ("class", "module"):
        raise ConfigError(
            f"{_where(spec)} is the {kind} {detail}, not a tool; name a typed function with a Google docstring, "
            "or a Tool instance (name, schema, __call__)"
        )
    return attr


def _live(spec: str, module_name: str, attr: str) -> Any:
    """The tool ``spec`` names in its imported module, checked under the code policy: a plain function of one's own
    code (wrapped in :class:`mmgrpo.tools.FunctionTool`: its schema inferred here), or a Tool instance whose class
    is one's own."""
    from mmgrpo.tools import FunctionTool, Tool

    obj = vars(sys.modules[module_name]).get(attr)
    if obj is None:
        raise ConfigError(f"{_where(spec)}: module {module_name!r} has no attribute {attr!r}")
    if isinstance(obj, Tool) and not inspect.isfunction(obj) and not inspect.isclass(obj):
        cls = type(obj)
        refusal = "the standard library" if is_stdlib(cls.__module__) else live_library_refusal(spec, cls, "tool")
        if refusal is not None:
            raise ConfigError(f"{_where(spec)} is an instance of {cls.__module__}.{cls.__qualname__}: {refusal}")
        return obj
    try:
        code.check_code_object(spec, obj, kind="tool")
    except code.RewardCodeError as e:
        line = str(e).replace("reward ", "tool ", 1).split("; an import path")[0]
        raise ConfigError(f"rollout.tools: {line}") from None
    try:
        return FunctionTool(obj)
    except TypeError as e:
        raise ConfigError(f"{_where(spec)}: {e}") from None


def load_tool(spec: str) -> Any:
    """Import the tool ``spec`` names and check it (:func:`_live`); once per spec."""
    if spec not in _LOADED:
        module_name, attr = _origin(spec)
        try:
            importlib.import_module(module_name)
        except Exception as e:  # the user's module failed to import: one line
            reason = (str(e).splitlines() or [""])[0][:200]
            raise ConfigError(
                f"{_where(spec)}: importing module {module_name!r} raised {type(e).__name__}: {reason}"
            ) from None
        _LOADED[spec] = _live(spec, module_name, attr)
    return _LOADED[spec]


def resolve_tools(specs: Sequence[Any]) -> list[Any]:
    """``rollout.tools`` for :func:`mmgrpo.tools.load_tools` under the code policy in force (module docstring):
    registry names and objects as they are; an import path imported and checked (``import``), or a
    :class:`NotLoadedTool` (``check``: found in source first; ``registered``: not looked for)."""
    policy = code.current_policy()
    out: list[Any] = []
    for spec in specs:
        if not isinstance(spec, str) or ":" not in spec:
            out.append(spec)
        elif policy == "import":
            out.append(load_tool(spec))
        elif policy == "check":
            static_check(spec)
            out.append(NotLoadedTool(spec, "--dry-run imports no tool module (it is imported when training starts)"))
        else:
            out.append(NotLoadedTool(spec, "the demo runs a run's own code only with --trust-run-config"))
    return out


def check_tools(specs: Sequence[str], limits: Mapping[str, Any] | None = None) -> None:
    """``rollout.tools`` at load, importing nothing: registry names known, import paths under the code policy and
    found in source (not looked for under ``registered``), no two tools of one name; ``rollout.tool_limits``'
    ``isolation`` one of :data:`mmgrpo.tools.worker.ISOLATIONS`. One :class:`ConfigError`."""
    from mmgrpo.tools import get_tool
    from mmgrpo.tools.worker import ISOLATIONS

    isolation = (limits or {}).get("isolation", "auto")
    if isolation not in ISOLATIONS:
        raise ConfigError(
            f"rollout.tool_limits.isolation: {isolation!r} is not one of {', '.join(ISOLATIONS)} (process: a forked "
            "worker killed with its process group at the deadline; thread: for a tool that needs the GPU)"
        )

    names = []
    for spec in specs:
        if ":" in spec:
            if code.current_policy() != "registered":
                names.append(static_check(spec))
            continue
        try:
            names.append(get_tool(spec).name)
        except KeyError as e:
            raise ConfigError(f"rollout.tools: {str(e).strip(chr(39))}") from None
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ConfigError(f"rollout.tools: two tools are named {twice}; each tool name must be unique (rename one)")
