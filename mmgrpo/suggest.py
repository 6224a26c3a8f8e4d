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
}
"""TRL option name → the mmgrpo config path that holds it (``docs/from_trl.md``)."""

_TRL_VALUES = {
    "use_vllm": "rollout.engine: vllm",
    "loss_type": "algorithm.aggregation (per loss_type)",
    "max_tool_calling_iterations": "rollout.max_turns (= iterations + 1: assistant turns)",
    "tools": "rollout.tools (registry names or package.module:function)",
}
"""Where a TRL flag becomes a value rather than a field of the same meaning."""


def did_you_mean(name: str, valid: Iterable[str]) -> str | None:
    """The valid name closest to ``name`` (difflib ratio >= 0.6, case-insensitive), or ``None``."""
    valid = list(valid)
    lowered = {v.lower(): v for v in valid}
    found = difflib.get_close_matches(name.lower(), list(lowered), n=1, cutoff=0.6)
    return lowered[found[0]] if found else None


def unknown_field(path: str, key: str, names: list[str]) -> str:
    """The one-line error for the unknown field ``key`` (at dotted ``path``) among ``names``: TRL's name mapped to
    mmgrpo's, else the allowed names with the closest one suggested."""
    if key in TRL_NAMES and TRL_NAMES[key] != path:
        where = _TRL_VALUES.get(key, TRL_NAMES[key])
        return f"unknown field {path!r}: {key!r} is TRL's name; mmgrpo's is {where} (docs/from_trl.md)"
    message = f"unknown field {path!r}; allowed: {', '.join(names) or '(none)'}"
    close = did_you_mean(key, names)
    return f"{message}; did you mean {close!r}?" if close else message


__all__ = ["TRL_NAMES", "did_you_mean", "unknown_field"]
