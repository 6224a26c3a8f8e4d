"""What changes when the policy's weights are sharded over processes (FSDP2, ``torch.distributed.fsdp.fully_shard``).

Under DDP every process holds the whole model; under FSDP2 each parameter is a ``DTensor`` of which a process holds
one shard, and the whole tensor exists only inside the model's forward/backward (gathered by the hooks
``fully_shard`` installs on the root module and on each wrapped block). Three consequences, handled here:

- **Whole weights are a collective.** ``module.state_dict()`` returns this process's shards; the whole tensors come
  from ``torch.distributed.checkpoint.state_dict.get_model_state_dict(full_state_dict=True)``, which every process
  must call (:func:`full_state_dict`).
- **Forward passes are collectives.** Each forward all-gathers the weights, so every process must run the same
  number of forwards: a sampler that stops when its own rows are finished must go on until all processes have
  finished (:func:`done_everywhere`; transformers' ``generate(synced_gpus=True)`` does the same).
- **Only the root module's forward gathers the root's own weights** (those outside separately wrapped blocks), so
  a method that calls sub-modules directly, as transformers' ``generate`` does, must run as a forward
  (:func:`as_forward`).

The blocks wrapped separately are the model's ``_no_split_modules`` that it contains (:func:`block_classes`).

See the PyTorch FSDP2 notes (``torch/distributed/fsdp/_fully_shard/_fully_shard.py``, ``fully_shard`` docstring)
and ``torch/distributed/checkpoint/state_dict.py``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from mmgrpo.compat import no_split_modules


def is_sharded(module: torch.nn.Module) -> bool:
    """True when ``module`` is an FSDP2 root (its weights are DTensor shards)."""
    from torch.distributed.fsdp import FSDPModule

    return isinstance(module, FSDPModule)


def full_state_dict(module: torch.nn.Module, *, main_only: bool = False) -> dict[str, Tensor]:
    """Every tensor of ``module``, whole; under FSDP a collective that every process must call.

    ``main_only``: under FSDP the tensors are gathered to CPU on process 0 and the other processes get ``{}``
    (what a checkpoint written by process 0 needs, without a whole copy per process). Unsharded modules return
    ``module.state_dict()`` on every process.
    """
    if not is_sharded(module):
        return module.state_dict()
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(module, options=StateDictOptions(full_state_dict=True, cpu_offload=main_only))


def broadcast_from_main(module: torch.nn.Module) -> None:
    """Copy process 0's parameters and buffers into every process's ``module`` (a collective), before sharding.

    DDP does this when it wraps a model; ``fully_shard`` keeps each process's own values for its shard, so a model
    whose initialisation differs between processes (e.g. a LoRA draw after a process built a cached tiny model)
    would otherwise train a mixture of the processes' initial weights.
    """
    import torch.distributed as dist

    with torch.no_grad():
        for t in [*module.parameters(), *module.buffers()]:
            dist.broadcast(t.data, src=0)


def load_full_state_dict(module: torch.nn.Module, state: dict[str, Tensor]) -> None:
    """Load whole tensors (every process passes the same ``state``) into the shards of an FSDP2 module (strict)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    set_model_state_dict(module, state, options=StateDictOptions(full_state_dict=True, strict=True))


def as_forward(module: torch.nn.Module, name: str):
    """``module.<name>`` (e.g. ``generate``), run by FSDP as if it were ``forward``: the root's own weights are
    gathered before it and released after, and the first call makes ``module`` the root. Unsharded: unchanged.

    transformers' ``generate`` runs the vision encoder of a VLM outside the root's ``forward`` and, through peft,
    calls the wrapped model's ``forward`` rather than the root's;
    ``torch.distributed.fsdp.register_fsdp_forward_method`` puts the root's FSDP hooks around the whole call
    (patched once per module).
    """
    if is_sharded(module) and name not in vars(module):
        from torch.distributed.fsdp import register_fsdp_forward_method

        register_fsdp_forward_method(module, name)
    return getattr(module, name)


def call_as_forward(module: torch.nn.Module, fn, *args):
    """``fn(*args)`` run by FSDP as a forward of ``module`` (the root's own weights gathered around it), for code
    that calls a sub-module of the root directly (Whisper's encoder, whose convolutions and position embeddings are
    root weights). Unsharded: ``fn(*args)``."""
    if not is_sharded(module):
        return fn(*args)
    if "_mmgrpo_call" not in vars(module):
        from torch.distributed.fsdp import register_fsdp_forward_method

        module._mmgrpo_call = lambda f, *a: f(*a)
        register_fsdp_forward_method(module, "_mmgrpo_call")
    return module._mmgrpo_call(fn, *args)


def block_classes(module: torch.nn.Module) -> list[str]:
    """The class names of ``module``'s ``_no_split_modules`` that occur in it: the blocks FSDP's transformer-based
    wrap policy shards separately. transformers lists the blocks of every sub-model a composite may hold (LLaVA's
    CLIP tower names ``CLIPTextEmbeddings``, SigLIP's its text embeddings and pooling head), and accelerate's
    ``FullyShardedDataParallelPlugin.set_auto_wrap_policy`` raises on a listed class the model does not contain."""
    present = {type(m).__name__ for m in module.modules()}
    return sorted(name for name in no_split_modules(module) if name in present)


def local(t: Tensor) -> Tensor:
    """This process's shard of a DTensor; any other tensor unchanged."""
    from torch.distributed.tensor import DTensor

    return t.to_local() if isinstance(t, DTensor) else t


def done_everywhere(done: bool, device: torch.device | str = "cpu") -> bool:
    """True when ``done`` is true on every process (an all-reduce; call it on all processes, in step)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return done
    flag = torch.tensor([1.0 if done else 0.0], device=device)  # [1]
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item() > 0)
