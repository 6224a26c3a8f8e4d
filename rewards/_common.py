"""Small helpers shared by the built-in rewards (column access, ground-truth coercion, lengths, groups)."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence
from typing import Any

from .parsing import Which, answer_or_text, completion_text, parse_number


def column(
    columns: dict[str, Any],
    key: str,
    reward: str,
    n: int | None = None,
    what: str = "set the reward's *_key argument to use another",
) -> Sequence:
    """The column ``key`` (B values), or a ``KeyError`` naming the reward, the missing column (``what``: what it
    holds and what fills it) and those present; with ``n``, a ``ValueError`` when it does not hold ``n`` values."""
    if key not in columns:
        raise KeyError(f"reward {reward!r} needs the column {key!r} ({what}); the batch has columns {sorted(columns)}")
    values = columns[key]
    if n is not None and len(values) != n:
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


def option(name: str, default: Any, annotation: str) -> inspect.Parameter:
    """A keyword-only option of a reward's public signature (``annotation`` as text)."""
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation)


def reward_signature(options: Sequence[inspect.Parameter]) -> inspect.Signature:
    """The public signature of a reward whose decorator writes it:
    ``(completions, *, prompts=None, <options>, **columns) -> list[float | None]`` (annotations as text, as the
    rewards' modules write them under ``from __future__ import annotations``)."""
    P = inspect.Parameter
    return inspect.Signature(
        [
            P("completions", P.POSITIONAL_OR_KEYWORD, annotation="list"),
            P("prompts", P.KEYWORD_ONLY, default=None, annotation="list | None"),
            *options,
            P("columns", P.VAR_KEYWORD, annotation="Any"),
        ],
        return_annotation="list[float | None]",
    )


def whole_completion(completion: Any, which: Which, require_tags: bool) -> Any:
    """The ``extract`` of :func:`per_answer` for rewards that read the completion themselves (their own tag)."""
    return completion


_CONTEXT = ("which", "require_tags", "columns", "i")
"""What :func:`per_answer` passes a scoring function that names it: the answer rule, the tag rule, the batch's
columns and the sample's index (for rewards that read other columns of the sample: image geometry, durations)."""


def per_answer(
    name: str,
    *,
    column_key: str = "answer",
    require_tags: bool = True,
    extract: Callable[[Any, Which, bool], Any] = answer_or_text,
) -> Callable[[Callable[..., float]], Callable[..., list[float | None]]]:
    """The shape of every reward that scores one answer against one ground truth: write the scoring only.

    The decorated function scores one sample: ``score(pred, gt, *, <options>)`` → float, where ``pred`` is
    ``extract(completion, which, require_tags)`` (default :func:`~mmgrpo.rewards.parsing.answer_or_text`: the
    ``<answer>`` content, ``None`` when tags are required and absent) and ``gt`` the sample's ground truth, never
    ``None``. It may also name ``which``, ``require_tags``, ``columns`` and ``i`` to receive them. The decorator
    returns the reward with the public signature of a built-in reward —
    ``(completions, *, prompts=None, which="last", answer_key=column_key, require_tags=require_tags, <options>,
    **columns)``
    (what YAML ``kwargs`` are checked against, and what TRL's keyword call passes) — that reads the ground-truth
    column ``answer_key`` (a one-line ``KeyError`` naming the reward when absent) and gives ``None`` ("not
    applicable") where a sample's ground truth is ``None``.
    """

    tags_default = require_tags

    def deco(score: Callable[..., float]) -> Callable[..., list[float | None]]:
        params = inspect.signature(score).parameters
        context = [c for c in _CONTEXT if c in params]
        options = [p for p in params.values() if p.kind is p.KEYWORD_ONLY and p.name not in _CONTEXT]
        option_names = {p.name for p in options}

        @functools.wraps(score)
        def reward(
            completions: list,
            *,
            prompts: list | None = None,
            which: Which = "last",
            answer_key: str = column_key,
            require_tags: bool = tags_default,
            **kwargs: Any,
        ) -> list[float | None]:
            opts = {k: kwargs.pop(k) for k in list(kwargs) if k in option_names}
            columns = kwargs
            answers = column(columns, answer_key, name, len(completions))
            given = {"which": which, "require_tags": require_tags, "columns": columns}
            out: list[float | None] = []
            for i, (c, gt) in enumerate(zip(completions, answers)):
                if gt is None:
                    out.append(None)
                    continue
                ctx = {k: (i if k == "i" else given[k]) for k in context}
                out.append(score(extract(c, which, require_tags), gt, **ctx, **opts))
            return out

        shared = [
            option("which", "last", "Which"),
            option("answer_key", column_key, "str"),
            option("require_tags", tags_default, "bool"),
        ]
        reward.__signature__ = reward_signature([*shared, *options])
        return reward

    return deco
