"""The optimizer of a run: torch's AdamW as ``optim`` configures it (mmgrpo/config.py, ``OptimConfig``)."""

from __future__ import annotations

import torch
from torch.optim.lr_scheduler import LambdaLR

from mmgrpo import schedules
from mmgrpo.config import ConfigError, OptimConfig, TrainConfig

FUSED_ADAMW_DEVICES = frozenset({"cpu", "cuda"})
"""Devices whose fused AdamW kernel torch ships (``torch.optim.AdamW(fused=True)``)."""


def fused_adamw_fits(params: list[torch.nn.Parameter]) -> bool:
    """Whether ``optim.fused: null`` picks AdamW's fused kernel: every trainable tensor a plain floating-point
    parameter on a device that has the kernel. The fused step updates each tensor in one pass; torch's per-tensor
    step allocates temporaries of the tensor's size (√v̂, then its quotient), which at a 151,936-row embedding is
    2 × 78 MB on top of the weights, gradients and moments."""
    return bool(params) and all(
        type(p) is torch.nn.Parameter and p.device.type in FUSED_ADAMW_DEVICES and p.is_floating_point() for p in params
    )


def build_optimizer(adapter, cfg: TrainConfig, fsdp: bool) -> tuple[torch.optim.AdamW, LambdaLR]:
    """The run's AdamW over the adapter's trainable parameters (:func:`build_adamw`; their names in ``adapter.model``
    for ``optim.lr_multipliers``) and its learning-rate schedule (``optim.warmup_steps``, ``optim.schedule``)."""
    o = cfg.optim
    names = {id(p): n for n, p in adapter.model.named_parameters()}
    optimizer = build_adamw(list(adapter.trainable_parameters()), o, fsdp, names)
    schedule = LambdaLR(optimizer, lambda s: schedules.lr_lambda(s, o.warmup_steps, cfg.steps, o.schedule))
    return optimizer, schedule


def build_adamw(params: list[torch.nn.Parameter], o: OptimConfig, fsdp: bool, names: dict[int, str] | None = None):
    """AdamW over ``params``: fused as TRL's default ``adamw_torch_fused`` where it fits and the weights are not FSDP
    shards (``o.fused`` null), or as ``o.fused`` says; one parameter group per ``o.lr_multipliers`` key that names a
    parameter (``names``: ``id(parameter)`` → its name in the model), then one for the rest."""
    fused = o.fused if o.fused is not None else not fsdp and fused_adamw_fits(params)
    groups = lr_groups(params, o, names or {})
    return torch.optim.AdamW(groups, lr=o.lr, betas=tuple(o.betas), weight_decay=o.weight_decay, fused=fused or None)


def lr_groups(params: list[torch.nn.Parameter], o: OptimConfig, names: dict[int, str]) -> list[dict]:
    """AdamW parameter groups of ``o.lr_multipliers``: a parameter joins the group of the first key its name contains
    (lr × multiplier), else the base group (lr); empty groups are left out."""
    keys = list(o.lr_multipliers)
    members: dict[str | None, list] = {k: [] for k in [*keys, None]}
    for p in params:
        name = names.get(id(p), "")
        members[next((k for k in keys if k in name), None)].append(p)
    unmatched = [k for k in keys if not members[k]]
    if unmatched:
        raise names_error("optim.lr_multipliers", unmatched, [names.get(id(p), "") for p in params])
    groups = [{"params": members[k], "lr": o.lr * o.lr_multipliers[k], "name": k} for k in keys]
    return groups + ([{"params": members[None], "lr": o.lr, "name": "base"}] if members[None] else [])


def names_error(field: str, unmatched: list[str], names: list[str]) -> ConfigError:
    """The one-line error for parameter-name keys of ``field`` that match no trainable parameter, listing the parts
    the ``names`` of the trainable parameters hold (their first three dotted parts, wrappers' ``model`` / ``module``
    left out)."""
    parts = sorted({part for n in names for part in n.split(".")[:3]} - {"", "model", "module"})
    return ConfigError(f"{field}: {unmatched} match no trainable parameter name; names contain {parts}")
