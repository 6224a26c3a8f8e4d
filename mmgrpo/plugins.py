"""Registries of adapters and tasks, looked up by the names in a training config.

``ADAPTERS`` entries are ``build(args: dict, *, seed: int) -> PolicyAdapter``; ``TASKS`` entries are
``build(args: dict, *, seed: int) -> Task``. Each builder validates its own ``args`` with
:func:`mmgrpo.config.from_dict` against a dataclass, so a typo names the field and the allowed ones, and
declares that dataclass as ``build.args_class`` so ``load_config`` checks the options before anything is built.
Adapter builders declare the class they return as ``build.adapter_class`` and task builders ``build.task_class``:
``load_config`` checks that they have the optional capabilities the config needs (:mod:`mmgrpo.types`).
Adapter builders also take the keyword arguments ``lora`` (LoraConfig), ``dtype`` (str) and
``need_reference`` (bool: β > 0 and no LoRA, so keep a frozen reference copy).
Built-in adapters register when :mod:`mmgrpo.modalities` is imported, built-in tasks when :mod:`mmgrpo.tasks` is
(:func:`mmgrpo.loader.load_builtins` imports both).
"""

from __future__ import annotations

from mmgrpo.registry import Registry

ADAPTERS: Registry = Registry("adapter")
TASKS: Registry = Registry("task")
