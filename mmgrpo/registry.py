"""A small name → object registry used wherever the signature is uniform.

One registry per protocol: estimators, surrogates, aggregations, KL estimators, shapers, adapters, tasks and
rewards each have their own. Duplicate names raise; an unknown name lists the valid ones.

A configurable component declares its options as a frozen dataclass (``algorithm.<x>_args`` is checked against it at
load, :func:`mmgrpo.options.resolve`): given at registration, ``@SHAPERS.register("temporal",
options=TemporalOptions)``, or as the annotation of the component's ``options`` parameter (the losses,
:mod:`mmgrpo.losses`). :meth:`Registry.options_class` finds it either way.
"""

from __future__ import annotations

import typing
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """Maps names to objects of one kind (``kind`` is used in error messages)."""

    def __init__(self, kind: str):
        self.kind = kind
        self._items: dict[str, T] = {}
        self._options: dict[str, type] = {}

    def register(self, name: str, options: type | None = None) -> Callable[[T], T]:
        """Decorator: ``@REGISTRY.register("grpo")``, with ``options`` the component's options dataclass where it
        has one. Registering a taken name raises ``ValueError``."""

        def deco(obj: T) -> T:
            self.add(name, obj, options)
            return obj

        return deco

    def add(self, name: str, obj: T, options: type | None = None) -> None:
        if name in self._items and self._items[name] is not obj:
            raise ValueError(f"{self.kind} {name!r} is already registered; pick another name")
        self._items[name] = obj
        if options is not None:
            self._options[name] = options

    def options_class(self, name: str) -> type:
        """The options dataclass component ``name`` declares: given at registration, else the annotation of its
        ``options`` parameter; ``TypeError`` naming the component when it declares none."""
        if name in self._options:
            return self._options[name]
        obj = self.get(name)
        hints = typing.get_type_hints(obj.__init__ if isinstance(obj, type) else obj)
        if "options" not in hints:
            raise TypeError(
                f"{self.kind} {name!r} declares no options dataclass: register it with options=<a frozen dataclass> "
                "or annotate its options parameter"
            )
        return hints["options"]

    def get(self, name: str) -> T:
        try:
            return self._items[name]
        except KeyError:
            raise KeyError(f"unknown {self.kind} {name!r}; valid: {', '.join(sorted(self._items))}") from None

    def names(self) -> list[str]:
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._items))
