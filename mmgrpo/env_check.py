"""``rollout.environment`` at load: one's own environment by reference, and the protocol probe on the first row.

A config names an environment as a registered name (``gridworld``: :data:`mmgrpo.tools.ENVIRONMENTS`) or, like a
reward, as code: ``module:Class`` (built once per trajectory with ``rollout.environment_args``) or
``module:factory()`` (a function called once per trajectory with them, returning the environment). The module is
found as a reward module is: next to the config (its folder is on ``sys.path``, :func:`mmgrpo.loader.load_config`),
in the working directory, or on ``sys.path``; and it is held to the **rewards' code policy**
(:mod:`mmgrpo.rewards.code_policy`, reused, not a second one): never the standard library, never an installed
library unless ``MMGRPO_TRUSTED_REWARD_MODULES`` names it, only a class or a plain function.

When it runs follows the rewards too (:func:`mmgrpo.rewards.registry.reward_code_policy`): ``--dry-run`` (policy
``check``) finds the class or function in the module's source and imports nothing; ``train`` (policy ``import``)
imports it, checks the live object, registers it (:data:`mmgrpo.tools.env.REFERENCES`) and probes it: build one
instance, ``reset`` it from the first training row and ``step`` it once with an empty reply (:data:`PROBE_ACTION`),
each call bounded and checked as mid-run (:mod:`mmgrpo.tools.env_guard`); a fault is one :class:`ConfigError` line
naming the method, what it returned and what the protocol expects, before the model loads. (Registered environments
are checked by :func:`mmgrpo.multiturn.check_config`, which builds one with the options; mid-run they are bounded
the same way.)
"""

from __future__ import annotations

import importlib
import inspect
import sys
from collections.abc import Mapping
from typing import Any

from mmgrpo.config import ConfigError, TrainConfig, check_kwargs
from mmgrpo.rewards import registry as reward_code  # the rewards' code policy, applied to environments as well
from mmgrpo.rewards.code_policy import TRUST_ENV, is_stdlib, library_refusal, live_library_refusal

PROBE_ACTION = ""
"""The reply the load check steps the environment with: an empty turn, which the protocol answers with an error
observation (``error`` set), not an exception."""

DOCS = "docs/agents.md#your-own-environment"


def check_environment(cfg: TrainConfig, row: Mapping[str, Any] | None) -> None:
    """``rollout.environment`` (module docstring): a reference checked under the code policy in force (found in
    source at ``--dry-run``; imported, registered and its options checked for training), then the environment
    probed on ``row`` (the first training row; ``None``: no row, no probe). One :class:`ConfigError` line each."""
    from mmgrpo.tools import LIMITS
    from mmgrpo.tools.env import environment_factory, is_reference

    spec = cfg.rollout.environment
    if spec is None or not is_reference(spec):  # registered ones: checked by mmgrpo.multiturn.check_config
        return
    policy = reward_code.current_policy()  # "check": --dry-run; "registered": the demo of an untrusted run
    if policy == "registered":
        return
    if policy == "check" and _module_name(spec) not in sys.modules:
        static_check(spec)  # read in its source, never imported
        return
    load_reference(spec)  # under "check" its module is imported already: nothing runs
    check_kwargs(environment_factory(spec), cfg.rollout.environment_args, "rollout.environment_args")
    if policy == "import" and row is not None:  # the user's code is not called at --dry-run
        probe(spec, cfg.rollout.environment_args, row, {**LIMITS, **cfg.rollout.tool_limits})


def _module_name(spec: str) -> str:
    return spec.removesuffix("()").partition(":")[0]


def _origin_refusal(spec: str) -> None:
    """Where the code of ``spec`` comes from, before anything is imported: a module that can be found, not the
    standard library, not an installed library the code policy refuses (one line each)."""
    base = spec.removesuffix("()")
    module_name, _, attr = base.partition(":")
    if not module_name or not attr or "." in attr:
        raise ConfigError(
            f"rollout.environment {spec!r}: a reference is 'module:Class' or 'module:factory()' ({DOCS}), or a "
            "registered name"
        )
    if is_stdlib(module_name):
        raise ConfigError(
            f"rollout.environment {spec!r} names the Python standard library module {module_name!r}, not an "
            "environment; name a class of your own module"
        )
    if module_name in sys.modules:
        return
    found = reward_code.find_module_file(module_name)
    if found is None:
        raise ConfigError(
            f"rollout.environment {spec!r}: cannot find module {module_name!r} (a module of your own must be next to "
            "the config file, in the working directory, or on PYTHONPATH)"
        )
    if library_refusal(spec, module_name, found.origin, "environment") is not None:
        raise ConfigError(_library_line(spec, module_name))


def _library_line(spec: str, module_name: str) -> str:
    return (
        f"rollout.environment {spec!r} is code of the installed library {module_name}, not of your own modules (the "
        f"rewards' code policy, docs/rewards.md#code-policy); to allow it anyway, run with {TRUST_ENV}={module_name}"
    )


def static_check(spec: str) -> None:
    """``spec`` found in its module's source without importing it (``--dry-run``): a ``class`` for ``module:Class``,
    a ``def`` for ``module:factory()``; what the source cannot show is checked when training starts."""
    _origin_refusal(spec)
    try:
        kind, detail = reward_code.static_lookup(spec.removesuffix("()"), kind="environment")
    except ValueError as e:  # the reward checker's words: a missing attribute, a syntax error
        raise ConfigError(str(e).replace("reward ", "rollout.environment ", 1)) from None
    if kind in ("class", "function"):
        _check_spelling(spec, kind == "class")
    elif kind == "module":
        raise ConfigError(f"rollout.environment {spec!r} is the module {detail}, not a class or function")


def _check_spelling(spec: str, is_class: bool) -> None:
    """A class is written ``module:Class``, a function that builds the environment ``module:factory()``."""
    if is_class and spec.endswith("()"):
        raise ConfigError(
            f"rollout.environment {spec!r} is a class: write {spec.removesuffix('()')!r} (it is built with "
            "rollout.environment_args once per trajectory)"
        )
    if not is_class and not spec.endswith("()"):
        raise ConfigError(
            f"rollout.environment {spec!r} is a function: write '{spec}()' to call it with rollout.environment_args "
            "once per trajectory (it returns the environment), or name the environment's class"
        )


def load_reference(spec: str) -> None:
    """Import the class or factory ``spec`` names, check it under the code policy (a class or a plain function of
    one's own code; :func:`mmgrpo.rewards.registry.check_code_object` for functions) and register it in
    :data:`mmgrpo.tools.env.REFERENCES`."""
    from mmgrpo.tools.env import REFERENCES

    _origin_refusal(spec)
    module_name, _, attr = spec.removesuffix("()").partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as e:  # the user's module failed to import: one line
        raise ConfigError(
            f"rollout.environment {spec!r}: importing module {module_name!r} raised {type(e).__name__}: "
            f"{(str(e).splitlines() or [''])[0][:200]}"
        ) from None
    if attr not in vars(module):
        raise ConfigError(f"rollout.environment {spec!r}: module {module_name!r} has no attribute {attr!r}")
    obj = vars(module)[attr]
    if inspect.isclass(obj):
        _check_spelling(spec, True)
        if is_stdlib(obj.__module__):
            raise ConfigError(f"rollout.environment {spec!r} is a class of the Python standard library, not yours")
        if live_library_refusal(spec, obj, "environment") is not None:
            raise ConfigError(_library_line(spec, obj.__module__))
    elif inspect.isfunction(obj):
        _check_spelling(spec, False)
        try:
            reward_code.check_code_object(spec, obj)
        except reward_code.RewardCodeError as e:
            raise ConfigError(
                str(e).replace("reward ", "rollout.environment ", 1).split("; an import path")[0]
            ) from None
    else:
        raise ConfigError(
            f"rollout.environment {spec!r} is a {type(obj).__name__} object, not a class or a function that builds "
            "the environment"
        )
    REFERENCES[spec] = obj


def probe(spec: str, options: Mapping[str, Any], row: Mapping[str, Any], limits: Mapping[str, Any]) -> None:
    """Build environment ``spec`` with ``options``, ``reset`` it from ``row`` and ``step`` it once with
    :data:`PROBE_ACTION`, bounded and checked by :mod:`mmgrpo.tools.env_guard`; a fault is one line."""
    from mmgrpo.tools import Environment, make_environment
    from mmgrpo.tools.env_guard import EnvironmentFault, checked_reset, checked_step, env_limits

    where = f"rollout.environment {spec!r}"
    try:
        env = make_environment(spec, **options)
    except Exception as e:
        reason = (str(e).splitlines() or [""])[0][:200]
        raise ConfigError(
            f"{where}: building it with rollout.environment_args raised {type(e).__name__}: {reason}"
        ) from None
    if not isinstance(env, Environment):
        raise ConfigError(
            f"{where}: building it returned a {type(env).__name__}, which lacks reset(row) / step(action_text); the "
            "protocol expects an object with both (docs/agents.md#environments)"
        )
    bounds = env_limits(limits)
    try:
        checked_reset(env, row, bounds)
        checked_step(env, PROBE_ACTION, bounds)
    except EnvironmentFault as e:
        raise ConfigError(f"{where}: {e} (the load check's call on the first training row, {DOCS})") from None
