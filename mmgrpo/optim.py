"""The optimizer of a run: torch's AdamW as ``optim`` configures it (mmgrpo/config.py, ``OptimConfig``)."""

from __future__ import annotations

import torch

from mmgrpo.config import OptimConfig

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


def build_adamw(params: list[torch.nn.Parameter], o: OptimConfig, fsdp: bool) -> torch.optim.AdamW:
    """AdamW over ``params``: fused as TRL's default ``adamw_torch_fused`` where it fits and the weights are not FSDP
    shards (``o.fused`` null), or as ``o.fused`` says."""
    fused = o.fused if o.fused is not None else not fsdp and fused_adamw_fits(params)
    return torch.optim.AdamW(params, lr=o.lr, betas=tuple(o.betas), weight_decay=o.weight_decay, fused=fused or None)
