"""Load-time upper bound on the size of one step: a config whose step cannot fit in this machine's memory stops at
load (``mmgrpo train`` and ``--dry-run``) with one line naming the key, instead of an allocation error deep in torch.

The rule is a lower bound on what any model needs, so it never refuses a config that could run. Each process holds,
for its ``B = P·G`` samples of ``T`` units (``algorithm.prompts_per_step`` · ``algorithm.group_size``, and the
family's units: ``AdapterSpec.units_per_sample`` where the adapter declares it, e.g. the flow adapter's
``num_steps``, else ``model.args.max_new_tokens``, else 1), at least the core's own ``[B, T]`` float32 tensors of
the step at once: ``old_logprobs``, ``mask`` and the per-unit ``advantages`` (:class:`~mmgrpo.types.Rollout`), plus
``ref_logprobs`` when ``algorithm.beta > 0`` — :data:`UNIT_BYTES` bytes per unit — and the ``[P, G, K]`` rewards.
The model's own memory (weights, the KV cache of sampling, activations) comes on top, so the bound is loose by
design: the sizes it refuses (``group_size=1000000000``) cannot fit whatever the model; sizes that fit this bound
but not the model's memory stop at run time with one line naming the knob (:mod:`mmgrpo.faults`).

The processes of one machine share its memory (``LOCAL_WORLD_SIZE`` under ``accelerate launch``), and the bound
is compared with the machine's physical memory (``psutil``, else ``os.sysconf``), not with what is free now: a
busy machine is a run-time matter, not a config error. Where neither can be read, :data:`HARD_CAP_BYTES` stands in.
"""

from __future__ import annotations

import os
from typing import Any

from mmgrpo.config import ConfigError, TrainConfig

UNIT_BYTES = 3 * 4
"""Bytes per action unit the core holds during a step whatever the model: float32 ``old_logprobs``, ``mask`` and
per-unit ``advantages`` (``[B, T]`` each); ``ref_logprobs`` adds 4 more when ``algorithm.beta > 0``."""

HARD_CAP_BYTES = 1 << 42
"""4 TiB: the bound used when this machine's memory cannot be read (no step this large runs on one machine)."""


def host_memory_bytes() -> int:
    """Physical memory of this machine in bytes (psutil, else ``os.sysconf``, else :data:`HARD_CAP_BYTES`)."""
    try:
        import psutil

        return int(psutil.virtual_memory().total)
    except Exception:  # no psutil, or an unusual platform
        pass
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return HARD_CAP_BYTES


def units_per_sample(cfg: TrainConfig, adapter_builder: Any) -> tuple[int, str | None]:
    """``(T, key)``: the units per sample the config fixes and the key that sets them (None: unknown, T = 1)."""
    from mmgrpo.plugins import AdapterSpec

    if isinstance(adapter_builder, AdapterSpec):
        options = adapter_builder.options(cfg.model.args)
        if adapter_builder.units_per_sample is not None:
            T = adapter_builder.units_per_sample(options)
            if T is not None:  # the key: the one integer option equal to T (the flow adapter's num_steps)
                keys = [k for k, v in vars(options).items() if type(v) is int and v == T]
                return int(T), f"model.args.{keys[0]}" if len(keys) == 1 else "model.args"
        T = vars(options).get("max_new_tokens")
        if isinstance(T, int) and T > 0:
            return T, "model.args.max_new_tokens"
    return 1, None


def step_bytes(cfg: TrainConfig, T: int) -> int:
    """Lower bound of one process's step in bytes (module docstring)."""
    a = cfg.algorithm
    B = a.prompts_per_step * a.group_size
    per_unit = UNIT_BYTES + (4 if a.beta > 0 else 0)
    return B * T * per_unit + B * 4 * len(cfg.rewards)


def check_step_fits(cfg: TrainConfig, adapter_builder: Any, memory: int | None = None) -> None:
    """Raise :class:`ConfigError` (one line) when one step's lower bound exceeds this machine's memory."""
    a = cfg.algorithm
    T, t_key = units_per_sample(cfg, adapter_builder)
    processes = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1))
    memory = host_memory_bytes() if memory is None else memory
    need = processes * step_bytes(cfg, T)
    if need <= memory:
        return
    per_sample = need // (processes * a.prompts_per_step * a.group_size) or 1
    fit_g = memory // (processes * a.prompts_per_step * per_sample)
    where = f" × {processes} processes on this machine" if processes > 1 else ""
    t_text = f" × {T} units ({t_key})" if t_key else ""
    others = "algorithm.prompts_per_step" + (f" or {t_key}" if t_key else "")
    raise ConfigError(
        f"algorithm.group_size: {a.group_size} samples × prompts_per_step {a.prompts_per_step}{t_text}{where} "
        f"need at least {_gb(need)} for the step's log-prob, mask and advantage tensors alone, more than this "
        f"machine's {_gb(memory)} of memory; lower algorithm.group_size (at most {fit_g} fits this bound, before "
        f"the model's own memory) or {others}"
    )


def _gb(n: int) -> str:
    return f"{n / 1e9:,.1f} GB" if n < 1e12 else f"{n / 1e12:,.1f} TB"


__all__ = ["HARD_CAP_BYTES", "UNIT_BYTES", "check_step_fits", "host_memory_bytes", "step_bytes", "units_per_sample"]
