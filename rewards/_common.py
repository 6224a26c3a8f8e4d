"""Small helpers shared by the built-in rewards (column access, ground-truth coercion, lengths, groups)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .parsing import completion_text, parse_number


def column(columns: dict[str, Any], key: str, reward: str, n: int) -> Sequence:
    """The column ``key`` (B values), or a ``KeyError`` naming the reward, the missing column and those present."""
    if key not in columns:
        raise KeyError(
            f"reward {reward!r} needs the column {key!r} (set the reward's *_key argument to use another); "
            f"the batch has columns {sorted(columns)}"
        )
    values = columns[key]
    if len(values) != n:
        raise ValueError(f"reward {reward!r}: column {key!r} has {len(values)} values for {n} completions")
    return values


def gt_number(gt: Any, reward: str) -> float:
    """A ground-truth number from a number or a string that holds one; a ``ValueError`` otherwise."""
    if isinstance(gt, bool):
        raise ValueError(f"reward {reward!r}: ground truth {gt!r} is not a number")
    if isinstance(gt, (int, float)):
        return float(gt)
    value = parse_number(str(gt), which="last")
    if value is None:
        raise ValueError(f"reward {reward!r}: cannot read a number from the ground truth {gt!r}")
    return value


def lengths(completions: list, columns: dict[str, Any], unit: str, reward: str) -> list[int]:
    """Completion lengths in ``unit``: ``"tokens"`` (``len`` of the ``completion_ids`` column, padding not
    counted when it is a mask-less list), ``"words"`` (whitespace split) or ``"chars"``."""
    if unit == "tokens":
        if "completion_ids" not in columns:
            raise KeyError(
                f"reward {reward!r} counts tokens but the batch has no 'completion_ids' column; pass "
                "unit='words' or unit='chars', or provide completion_ids"
            )
        return [len(ids) for ids in columns["completion_ids"]]
    if unit == "words":
        return [len(completion_text(c).split()) for c in completions]
    if unit == "chars":
        return [len(completion_text(c)) for c in completions]
    raise ValueError(f"reward {reward!r}: unit must be 'tokens', 'words' or 'chars', got {unit!r}")


def group_ids(prompts: Sequence, columns: dict[str, Any], group_key: str) -> list[Any]:
    """The group of each sample: the ``group_key`` column if present, else the prompt itself (samples with
    equal prompts form a group; unhashable prompts are compared by ``repr``)."""
    if group_key in columns:
        return list(columns[group_key])
    out = []
    for p in prompts:
        try:
            hash(p)
            out.append(p)
        except TypeError:
            out.append(repr(p))
    return out
