"""Suggestions ("did you mean"): an unknown config field or reward name gets the closest valid one.

:func:`did_you_mean` is :func:`difflib.get_close_matches` with one answer; :data:`TRL_NAMES` maps the option names
of TRL's ``GRPOConfig`` / ``TrainingArguments`` that a user coming from TRL writes to where mmgrpo keeps them
(the tables of ``docs/from_trl.md``), so ``num_generations`` is answered with ``algorithm.group_size``.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

TRL_NAMES = {
    "num_generations": "algorithm.group_size",
    "num_iterations": "algorithm.epochs",
    "per_device_train_batch_size": "algorithm.prompts_per_step",
    "gradient_accumulation_steps": "algorithm.minibatch_size",
    "max_completion_length": "model.args.max_new_tokens",
    "temperature": "model.args.temperature",
    "mask_truncated_completions": "model.args.mask_truncated",
    "use_vllm": "rollout.engine",
    "vllm_mode": "rollout.vllm_mode",
    "vllm_server_timeout": "rollout.timeout_s",
    "vllm_gpu_memory_utilization": "rollout.vllm_gpu_memory_utilization",
    "scale_rewards": "algorithm.scale",
    "multi_objective_aggregation": "algorithm.combine",
    "reward_weights": "rewards[k].weight",
    "epsilon": "algorithm.surrogate_args.clip_low",
    "epsilon_high": "algorithm.surrogate_args.clip_high",
    "loss_type": "algorithm.aggregation",
    "importance_sampling_level": "algorithm.ratio_level",
    "beta": "algorithm.beta",
    "learning_rate": "optim.lr",
    "weight_decay": "optim.weight_decay",
    "max_grad_norm": "optim.max_grad_norm",
    "lr_scheduler_type": "optim.schedule",
    "warmup_steps": "optim.warmup_steps",
    "max_steps": "steps",
    "save_steps": "checkpoint.every",
    "save_total_limit": "checkpoint.keep_last",
    "resume_from_checkpoint": "resume",
    "logging_steps": "logging.every",
    "report_to": "logging.trackers",
    "eval_steps": "eval.every",
    "peft_config": "model.lora",
    "gradient_checkpointing": "model.args.gradient_checkpointing",
    "tools": "rollout.tools",
    "max_tool_calling_iterations": "rollout.max_turns",
    "environment_factory": "rollout.environment",
    "entropy_coef": "algorithm.loss_terms",
}
"""TRL option name → the mmgrpo config path that holds it (``docs/from_trl.md``)."""

_TRL_VALUES = {
    "use_vllm": "rollout.engine: vllm",
    "loss_type": "algorithm.aggregation (per loss_type)",
    "max_tool_calling_iterations": "rollout.max_turns (= iterations + 1: assistant turns)",
    "tools": "rollout.tools (registry names or package.module:function)",
    "entropy_coef": "algorithm.loss_terms.entropy_bonus.coef",
}
"""Where a TRL flag becomes a value rather than a field of the same meaning."""


def edit_distance(a: str, b: str) -> int:
    """Levenshtein distance: insertions, deletions and substitutions turning ``a`` into ``b``."""
    previous = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        current = [i]
        for j, cb in enumerate(b, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ca != cb)))
        previous = current
    return previous[-1]


def _closest(name: str, valid: Iterable[str]) -> tuple[int, str] | None:
    """(distance, name) of the valid name nearest ``name`` by :func:`edit_distance` (case-insensitive) within a
    third of its length (at least 1, so ``num_generation`` finds ``num_generations``), or ``None``."""
    lowered = name.lower()
    scored = sorted((edit_distance(lowered, v.lower()), v) for v in valid)
    if scored and scored[0][0] <= max(1, len(name) // 3):
        return scored[0]
    return None


def did_you_mean(name: str, valid: Iterable[str]) -> str | None:
    """The valid name closest to ``name``: by edit distance (:func:`_closest`), else difflib ratio >= 0.6
    (case-insensitive); ``None`` when none is close."""
    valid = list(valid)
    near = _closest(name, valid)
    if near is not None:
        return near[1]
    lowered = {v.lower(): v for v in valid}
    found = difflib.get_close_matches(name.lower(), list(lowered), n=1, cutoff=0.6)
    return lowered[found[0]] if found else None


def config_fields(root: type) -> dict[str, str]:
    """Every field of the config dataclass ``root`` (the training config) by its last name → its dotted path
    (``group_size`` → ``algorithm.group_size``); a name used in several sections keeps its first, shallowest path."""
    import dataclasses
    import typing

    out: dict[str, str] = {}
    todo: list[tuple[type, str]] = [(root, "")]
    while todo:
        cls, prefix = todo.pop(0)
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            out.setdefault(f.name, prefix + f.name)
            if dataclasses.is_dataclass(hints[f.name]):
                todo.append((hints[f.name], f"{prefix}{f.name}."))
    return out


def unknown_field(path: str, key: str, names: list[str], root: type | None = None) -> str:
    """The one-line error for the unknown field ``key`` (at dotted ``path``) among ``names``: TRL's name mapped to
    mmgrpo's, else the allowed names with the closest one suggested by edit distance: a name of this section, a
    TRL name (``num_generation`` → TRL's ``num_generations``, mmgrpo's ``algorithm.group_size``), or a field of
    another section of the config dataclass ``root`` (``group_size`` at the top → ``algorithm.group_size``)."""
    if key in TRL_NAMES and TRL_NAMES[key] != path:
        where = _TRL_VALUES.get(key, TRL_NAMES[key])
        return f"unknown field {path!r}: {key!r} is TRL's name; mmgrpo's is {where} (docs/from_trl.md)"
    message = f"unknown field {path!r}; allowed: {', '.join(names) or '(none)'}"
    here = _closest(key, names)
    trl = _closest(key, [n for n in TRL_NAMES if TRL_NAMES[n] != path])
    every = config_fields(root) if root is not None else {}
    fields = {leaf: dotted for leaf, dotted in every.items() if dotted != path and leaf not in names}
    elsewhere = _closest(key, fields)
    best = min((c for c in (here, trl, elsewhere) if c is not None), default=None, key=lambda c: c[0])
    if best is not None and best == trl and here != trl:
        where = _TRL_VALUES.get(trl[1], TRL_NAMES[trl[1]])
        return f"unknown field {path!r}: did you mean TRL's {trl[1]!r}? mmgrpo's is {where} (docs/from_trl.md)"
    if best is not None and best == elsewhere and here != elsewhere and ("." not in path or best[0] == 0):
        return f"{message}; did you mean {fields[elsewhere[1]]!r}?"
    close = did_you_mean(key, names)
    return f"{message}; did you mean {close!r}?" if close else message


__all__ = ["TRL_NAMES", "config_fields", "did_you_mean", "edit_distance", "unknown_field"]
