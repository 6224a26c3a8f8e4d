"""YAML for configs, refusing a key written twice in one mapping.

YAML 1.2 requires the keys of a mapping to be unique, but PyYAML keeps the last value of a repeated key without a
word, so ``optim: {lr: 1e-5}`` written again lower down (``optim: {lr: 1e-3}``) silently wins. :func:`load` is
``yaml.safe_load`` with that refused in one line naming the key and both line numbers. Merge keys (``<<: *base``)
still override what they merge, as YAML intends: only keys written out in the same mapping are compared.
"""

from __future__ import annotations

from typing import Any

import yaml

from mmgrpo.errors import ConfigError

_MERGE = "tag:yaml.org,2002:merge"


class _DuplicateKey(Exception):
    """A key written twice in one mapping: its text and the two lines (1-based)."""

    def __init__(self, key: str, first: int, second: int):
        super().__init__(key)
        self.key, self.first, self.second = key, first, second


class _UniqueKeyLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` whose mappings refuse a repeated key (:class:`_DuplicateKey`)."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == _MERGE:
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    first = seen.get(key)
                except TypeError:  # an unhashable key: SafeLoader refuses it itself
                    continue
                line = key_node.start_mark.line + 1
                if first is not None:
                    raise _DuplicateKey(str(key), first, line)
                seen[key] = line
        return super().construct_mapping(node, deep=deep)


def load(text: str, where: str) -> Any:
    """``yaml.safe_load(text)``, refusing a repeated key with a one-line :class:`ConfigError` that starts with
    ``where`` (the file, or the override); other YAML errors are raised as ``yaml.YAMLError``, as safe_load does."""
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)
    except _DuplicateKey as e:
        raise ConfigError(
            f"{where}: key {e.key!r} is written twice in one mapping (lines {e.first} and {e.second}); YAML keeps "
            "only one, so delete the other"
        ) from None
