"""Run-time faults outside the user's config, as one line each: host or device memory running out, a peer process
of a multi-process run dying, and the launcher dying under its ranks.

:func:`memory_line` and :func:`peer_line` turn the exception that reached ``mmgrpo train``'s top level
(:func:`mmgrpo.cli.main`) into the line it prints, or return None for any other exception (which keeps its
traceback). :func:`exit_with_launcher` makes a rank stop when the ``accelerate launch`` / ``torchrun`` process that
started it is gone, instead of training on as an orphan.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
import traceback
from typing import Any

from mmgrpo.config import TrainConfig

_OOM_TEXTS = ("can't allocate memory", "out of memory", "cannot allocate memory")
"""Lower-case parts of torch's allocation errors: ``DefaultCPUAllocator: can't allocate memory``, ``CUDA out of
memory`` (``torch.OutOfMemoryError``), ``Cannot allocate memory`` (errno 12)."""

_PEER_TEXTS = (
    "connection closed by peer",
    "connection reset by peer",
    "broken pipe",
    "remote process exited",
    "communicator was aborted",
)
"""Lower-case parts of a collective's error when another process of the group is gone: gloo's ``pair.cc``
(``Connection closed by peer``, ``Read error ...: Connection reset by peer``), NCCL's ``remote process exited or
there was a network error`` and an aborted communicator. Other collective errors (a shape mismatch) keep their
traceback."""


def _knobs(cfg: TrainConfig, tb: Any) -> str:
    """The options that size the phase the allocation failed in, read from the trainer's frames in ``tb``."""
    names = [frame.name for frame in traceback.extract_tb(tb)]
    a = cfg.algorithm
    T = "model.args.max_new_tokens" if "max_new_tokens" in (cfg.model.args or {}) else "the units per sample"
    rollout = (
        f"algorithm.group_size ({a.group_size}), algorithm.prompts_per_step ({a.prompts_per_step}) or {T} "
        "(the rollout holds all P·G samples at once)"
    )
    if "_update" in names:
        return (
            f"algorithm.minibatch_size ({a.minibatch_size} samples per forward/backward), or set "
            "model.args.gradient_checkpointing=true"
        )
    if "_evaluate" in names:
        return f"eval.batch_size ({cfg.eval.batch_size})"
    if "_warmup" in names:
        return f"warmup.batch_size ({cfg.warmup.batch_size})"
    if "rollout" in names or "_refill" in names:
        forward = "model.args.forward_batch_size (rows per no-grad log-prob forward), "
        return (forward if "_batched_no_grad" in names else "") + rollout
    if "train_step" in names:
        return rollout
    return "a smaller model, model.dtype=bfloat16 or model.lora.enabled=true (the model itself does not fit)"


def memory_line(e: BaseException, cfg: TrainConfig) -> str | None:
    """One line for an out-of-memory error (host or device) naming the options to lower; None for other errors."""
    import torch

    text = str(e).strip()
    if not (isinstance(e, (MemoryError, torch.OutOfMemoryError)) or any(s in text.lower() for s in _OOM_TEXTS)):
        return None
    device = "device" if isinstance(e, torch.OutOfMemoryError) or "cuda" in text.lower() else "host"
    size = ""
    if "tried to allocate" in text:  # "... you tried to allocate 31948800000 bytes" / "Tried to allocate 2.00 GiB"
        amount = text.lower().split("tried to allocate", 1)[1].split(".")[0].split("(")[0].strip()
        if amount.endswith("bytes") and amount.split()[0].isdigit():
            amount = f"{int(amount.split()[0]) / 1e9:,.1f} GB"
        size = f" (an allocation of {amount})"
    return f"out of {device} memory{size}; lower {_knobs(cfg, e.__traceback__)}"


def _dead_local_ranks() -> list[int] | None:
    """Global ranks of this machine's processes of the run that are gone, from the launcher's children (psutil);
    None when that cannot be told (no launcher, no psutil)."""
    try:
        import psutil

        env = os.environ
        rank, local_rank, local_world = int(env["RANK"]), int(env["LOCAL_RANK"]), int(env["LOCAL_WORLD_SIZE"])
        run_id = env.get("TORCHELASTIC_RUN_ID")
        alive = set()
        for child in psutil.Process().parent().children():
            try:
                child_env = child.environ()
                if child.status() != psutil.STATUS_ZOMBIE and child_env.get("TORCHELASTIC_RUN_ID") == run_id:
                    alive.add(int(child_env["RANK"]))
            except (psutil.Error, KeyError, ValueError):
                continue
    except Exception:  # no psutil, no launcher environment, no parent: unknown
        return None
    base = rank - local_rank
    return [r for r in range(base, base + local_world) if r not in alive and r != rank]


def peer_line(e: BaseException) -> str | None:
    """One line for a collective that failed because a peer process died; None for other errors (and one process)."""
    world = int(os.environ.get("WORLD_SIZE", "1") or 1)
    if world < 2 or not isinstance(e, RuntimeError):
        return None
    from torch.distributed import DistNetworkError

    text = str(e).strip()
    if not (isinstance(e, DistNetworkError) or any(s in text.lower() for s in _PEER_TEXTS)):
        return None
    cause = text.splitlines()[0] if text else type(e).__name__
    if "]" in cause[:200] and cause.startswith("["):  # drop gloo's "[/path/to/pair.cc:561] " source location
        cause = cause.split("]", 1)[1].strip()
    cause = cause.split(". ")[0].rstrip(".")[:200]
    dead = _dead_local_ranks()
    rank = os.environ.get("RANK", "?")
    if dead:
        who = f"rank {', '.join(map(str, dead))} of {world} died"
    else:
        who = "a peer process died" + (" (on another machine, or it had exited)" if dead == [] else "")
    why = "its own output or the launcher's report says why it ended"
    return f"{who}; rank {rank} stopped in a collective: {cause} ({why})"


POLL_S = 1.0
"""Seconds between two looks at the parent process."""

GRACE_S = 300.0
"""Seconds a rank whose launcher died has to finish its step and save before it is ended without a checkpoint."""


def exit_with_launcher() -> threading.Thread | None:
    """Stop this rank when the launcher that started it dies (``accelerate launch`` / ``torchrun`` SIGKILLed).

    Only for processes a launcher started (``TORCHELASTIC_RUN_ID`` or ``LOCAL_RANK`` set): a plain ``mmgrpo train``
    may outlive its shell (``nohup``). A daemon thread looks at the parent process id every :data:`POLL_S`
    seconds; once it changes (the rank was re-parented to init or a subreaper), it prints one line and sends this
    process SIGTERM, which the trainer takes as a stop at the end of the step with a checkpoint
    (:class:`mmgrpo.launch.StopSignal`), as when the launcher itself forwards a SIGTERM. A rank still alive
    :data:`GRACE_S` seconds later exits with status 1.
    """
    if "TORCHELASTIC_RUN_ID" not in os.environ and "LOCAL_RANK" not in os.environ:
        return None
    parent = os.getppid()
    if parent == 1:
        return None  # already orphaned, or started by init: nothing to watch

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(POLL_S)
        rank = os.environ.get("RANK", "?")
        print(
            f"mmgrpo: rank {rank}: the launcher (pid {parent}) is gone; stopping (in the training steps: at the end "
            "of the step, with a checkpoint; continue with resume=latest)",
            file=sys.stderr,
            flush=True,
        )
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(GRACE_S)
        print(f"mmgrpo: rank {rank}: still running {GRACE_S:.0f} s after its launcher died; exiting", file=sys.stderr)
        os._exit(1)

    thread = threading.Thread(target=watch, name="mmgrpo-launcher-watch", daemon=True)
    thread.start()
    return thread


__all__ = ["exit_with_launcher", "memory_line", "peer_line"]
