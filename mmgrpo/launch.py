"""Launch handling: the Accelerator for the way the run was started (one process, DDP, FSDP2, CPU processes).

:func:`make_accelerator` refuses the launches mmgrpo does not run (DeepSpeed, ``--cpu`` with several processes,
FSDP1, FSDP with settings it cannot honour) with one line each before anything loads, and turns a CPU launch of an
FSDP config into FSDP2 over gloo. :class:`StopSignal` turns SIGTERM/SIGINT into a stop at the end of the step.
"""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.utils import DistributedType, ProjectConfiguration

from mmgrpo.config import ConfigError, TrainConfig


def make_accelerator(cfg: TrainConfig, out: Path) -> Accelerator:
    """The run's Accelerator, after the launch checks (DeepSpeed and ``--cpu`` refused; FSDP checked)."""
    _refuse_deepspeed()
    _refuse_cpu_flag_with_several_processes()
    acc = Accelerator(
        cpu=_cpu_only_multiprocess(),
        log_with=cfg.logging.trackers or None,
        project_config=ProjectConfiguration(project_dir=str(out), logging_dir=str(out / "logs")),
    )
    _fsdp_on_cpu(acc)
    _check_fsdp(acc, cfg)
    return acc


def _cpu_only_multiprocess() -> bool:
    """True when launched as several processes on a machine without an accelerator.

    accelerate sets up gloo on CPU only when asked to (``Accelerator(cpu=True)``); ``accelerate launch
    --multi_gpu`` and ``torchrun`` start the processes but do not ask, so each would train alone.
    """
    has_accelerator = torch.accelerator.is_available() if hasattr(torch, "accelerator") else torch.cuda.is_available()
    return int(os.environ.get("WORLD_SIZE", "1")) > 1 and not has_accelerator


def _refuse_cpu_flag_with_several_processes() -> None:
    """``accelerate launch --num_processes 2 --cpu`` starts ONE process: with ``--cpu`` accelerate's ``launch_command``
    skips the multi-process launchers (``elif args.multi_gpu and not args.cpu``) and runs its simple launcher, which
    starts the script once and passes no process count. That single process cannot see the request except in
    its launcher's command line, read here (the parent process) so the run stops with one line instead of
    silently training one process."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 or os.environ.get("ACCELERATE_USE_CPU", "").lower() != "true":
        return
    try:
        import psutil

        launcher = psutil.Process().parent().cmdline()
    except Exception:  # no parent, no permission, no psutil: nothing to say
        return
    if "launch" not in launcher or "--cpu" not in launcher:
        return
    requested = 1
    for i, arg in enumerate(launcher):
        value = arg.split("=", 1)[1] if arg.startswith("--num_processes=") else None
        if arg in ("--num_processes", "--num-processes") and i + 1 < len(launcher):
            value = launcher[i + 1]
        if value is not None and value.isdigit():
            requested = int(value)
    if requested > 1:
        raise ConfigError(
            f"accelerate launch --num_processes {requested} --cpu starts one process (with --cpu accelerate uses its "
            "single-process launcher); for several CPU processes run ACCELERATE_USE_CPU=1 accelerate launch "
            "--config_file configs/accelerate/cpu_2proc.yaml ..., or, on a machine without a GPU, drop --cpu and "
            f"pass --multi_gpu --num_processes {requested} (mmgrpo then trains on CPU with gloo)"
        )


def _fsdp_on_cpu(acc: Accelerator) -> None:
    """Turn a CPU launch of an FSDP config into FSDP2 over gloo (accelerate alone would silently run DDP).

    ``accelerate launch`` with ``distributed_type: FSDP`` exports ``ACCELERATE_USE_FSDP=true`` and the
    ``FSDP_*`` settings, but on CPU accelerate's ``AcceleratorState`` (accelerate ``state.py``) selects
    ``MULTI_CPU`` and only promotes the ``MULTI_GPU``-like types to FSDP, so the plugin is dropped and the
    model is wrapped in DDP. Here the (shared) state is switched to FSDP with the plugin built from the same variables,
    so that ``prepare`` shards the model with ``torch.distributed.fsdp.fully_shard``, which runs on CPU tensors
    with gloo. FSDP1 (``FullyShardedDataParallel``) does not: torch raises "FSDP needs a non-CPU accelerator
    device, but no accelerator device is detected", so ``fsdp_version: 1`` on CPU is refused here.
    """
    if acc.distributed_type != DistributedType.MULTI_CPU or os.environ.get("ACCELERATE_USE_FSDP", "").lower() != "true":
        return
    from accelerate.utils import FullyShardedDataParallelPlugin

    plugin = FullyShardedDataParallelPlugin()
    if plugin.fsdp_version != 2:
        raise ConfigError(
            f"fsdp_config.fsdp_version: {plugin.fsdp_version} needs a GPU (torch's FSDP1 refuses CPU-only "
            "machines); set fsdp_version: 2 for CPU processes (configs/accelerate/fsdp_cpu_2proc.yaml)"
        )
    if acc.mixed_precision != "no":
        plugin.set_mixed_precision(acc.mixed_precision)
    from accelerate.state import PartialState

    PartialState().distributed_type = DistributedType.FSDP  # AcceleratorState() re-reads it from PartialState
    acc.state.distributed_type = DistributedType.FSDP
    acc.state.fsdp_plugin = plugin


def _refuse_deepspeed() -> None:
    """DeepSpeed launches (``ACCELERATE_USE_DEEPSPEED=true``) stop here with one line, before anything loads.

    Under DeepSpeed, ``Accelerator.backward`` runs the engine's ``step()`` (clip, optimizer step, zero grad) after
    every backward whose ``sync_gradients`` is set (accelerate ``utils/deepspeed.py``, ``DeepSpeedEngineWrapper``),
    i.e. once per minibatch here, whereas mmgrpo accumulates an update's minibatches and steps once, with its own
    clipping and non-finite skip; ``prepare`` also needs a dataloader or an integer
    ``train_micro_batch_size_per_gpu``, which the trainer has not. Until the update loop drives the engine
    itself, DeepSpeed runs are refused rather than run with a different update.
    """
    if os.environ.get("ACCELERATE_USE_DEEPSPEED", "").lower() == "true":
        raise ConfigError(
            "DeepSpeed launches are not supported: accelerate's DeepSpeed engine steps the optimizer inside every "
            "backward, while mmgrpo accumulates an update's minibatches and steps once; shard large models with "
            "FSDP2 instead (accelerate launch --config_file configs/accelerate/fsdp.yaml ...)"
        )


def _check_fsdp(acc: Accelerator, cfg: TrainConfig) -> None:
    """Refuse the FSDP settings mmgrpo does not run (one line each, before the model loads)."""
    if acc.distributed_type != DistributedType.FSDP:
        return
    plugin = acc.state.fsdp_plugin
    if plugin.fsdp_version != 2:
        raise ConfigError(
            f"fsdp_config.fsdp_version: {plugin.fsdp_version} is not supported; mmgrpo samples and checkpoints "
            "FSDP2 models (torch fully_shard): set fsdp_version: 2 (configs/accelerate/fsdp.yaml)"
        )
    if plugin.cpu_ram_efficient_loading and cfg.algorithm.beta > 0 and not cfg.model.lora.enabled:
        raise ConfigError(
            "fsdp_config.fsdp_cpu_ram_efficient_loading: true loads the weights on process 0 only, but full "
            "fine-tuning with algorithm.beta > 0 copies the frozen reference on every process at load time; set it "
            "to false, or use model.lora.enabled=true (the reference is then the adapter switched off)"
        )


class StopSignal:
    """SIGTERM and SIGINT (Ctrl-C) ask the run to stop at the end of the current step, after a checkpoint.

    A second SIGINT interrupts at once. Handlers are installed only from the main thread and restored after.
    """

    def __init__(self):
        self.received: str | None = None
        self._old: dict = {}
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._old[sig] = signal.signal(sig, self._handle)

    def _handle(self, signum, frame) -> None:
        if self.received is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.received = signal.Signals(signum).name

    def received_anywhere(self, acc: Accelerator) -> bool:
        """True on every process when any process was signalled (all must join the checkpoint)."""
        if acc.num_processes == 1:
            return self.received is not None
        flag = torch.tensor([1.0 if self.received else 0.0], device=acc.device)
        return bool(acc.reduce(flag, reduction="sum").item() > 0)

    def restore(self) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)
