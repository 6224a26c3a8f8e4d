"""Colocate mode (``rollout.engine: vllm``, ``rollout.vllm_mode: colocate``, TRL's ``vllm_mode="colocate"``): vLLM
inside the training process, on the trainer's device.

The engine is :class:`.vllm_server.Engine`, the rollout server's own wrapper of ``vllm.LLM``, imported as a module
and held by :class:`ColocateEngine`, an :class:`~.engine.EngineClient` as the server's client
(:class:`~.engine.VLLMClient`) is: the same ``generate`` results, weight pushes and version check, with no HTTP and
no URL:

- vLLM's engine core runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), so ``collective_rpc`` calls the
  weight loader directly: each push hands the trainer's own tensors (the merged state dict of
  :func:`~.engine.engine_tensors`, bucket by bucket) to vLLM's ``reload_weights``, nothing written or serialised;
- media go to vLLM as the adapter's encoders loaded them (PIL images, sampled frames, waveforms), not PNG/base64;
- every generate answer still carries the version of the weights it was sampled with, checked against the version
  last pushed (a lost push stops the run with one line), as in server mode.

Between rollouts the engine sleeps (vLLM ``sleep(level=1)``: weights offloaded to host memory, KV cache freed, so
the trainer's backward pass has the GPU's memory) and wakes before the next push (``wake_up``), as TRL's colocate
mode does with ``vllm_enable_sleep_mode``. vLLM's sleep mode is CUDA-only: on the CPU backend the engine stays awake
(logged once) and holds its KV cache (``rollout.vllm_gpu_memory_utilization`` of host memory) throughout.

vLLM pins its own torch and transformers, so this runs only in ``.venv-colocate`` (``scripts/setup_colocate.sh``:
``.venv-vllm``'s packages plus mmgrpo's other dependencies at versions that fit them); the config check
(:func:`mmgrpo.preflight.preflight`) says so in one line anywhere else. One training process: several processes
would each need their own engine on their own device (TRL's ``external_launcher``), which is not wired here.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import torch
from torch import Tensor

from mmgrpo.types import EngineError

from .engine import EngineClient, engine_args, engine_item

logger = logging.getLogger(__name__)

COLOCATE_GPU_MEMORY_UTILIZATION = 0.3
"""vLLM's share of the GPU's memory when colocated and ``rollout.vllm_gpu_memory_utilization`` is unset (TRL's
``vllm_gpu_memory_utilization`` default, 0.3: the trainer's weights, gradients and optimizer state need the rest)."""


def colocate_args(cfg: Any) -> list[str]:
    """The colocated engine's options for ``cfg`` (:func:`~.engine.engine_args`, the server's; on CUDA with
    :data:`COLOCATE_GPU_MEMORY_UTILIZATION` unless set, and sleep mode unless ``rollout.vllm_enable_sleep_mode`` is
    false)."""
    args = engine_args(cfg)
    if torch.cuda.is_available():
        if cfg.rollout.vllm_gpu_memory_utilization is None:
            args += ["--gpu-memory-utilization", str(COLOCATE_GPU_MEMORY_UTILIZATION)]
        if cfg.rollout.vllm_enable_sleep_mode:
            args += ["--enable-sleep-mode"]
    return args


class ColocateEngine(EngineClient):
    """The vLLM engine in this process (the trainer's :class:`mmgrpo.types.EngineRollout`; ``generate``, ``push``,
    ``health``, ``version`` as :class:`~.engine.VLLMClient` has them)."""

    def __init__(self, args: list[str]):
        self.name = "the colocated vLLM engine"  # in error messages
        self.stale_hint = "a weight push did not reach it (a bug: please report it)"
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine core in this process: no pickled weights
        from . import vllm_server

        options = vllm_server.parser().parse_args(args)
        self.sleeps = options.enable_sleep_mode
        if not self.sleeps:
            logger.warning(
                "colocated vLLM does not sleep between rollouts (%s): it keeps its KV cache while the trainer updates",
                "vLLM's sleep/wake_up is CUDA-only, this engine runs on CPU"
                if not torch.cuda.is_available()
                else "rollout.vllm_enable_sleep_mode: false",
            )
        # vLLM's CPU worker replaces torch.set_num_threads with a no-op that warns (its threads are bound to cores);
        # in one process its own input processor then calls that no-op on every request: one warning per call
        logging.getLogger("vllm.v1.worker.cpu_worker").addFilter(_NoThreadWarning())
        self.engine = vllm_server.Engine(options)
        self.asleep = False

    def health(self) -> dict:
        return {"ok": True, "version": self.engine.version, "model": self.engine.model}

    def _media_item(self, kind: str, item: Any) -> Any:
        return engine_item(kind, item)  # as vLLM takes it: no PNG or base64 in one process

    def _generate(self, body: dict) -> dict:
        self._wake()
        try:
            return self.engine.sample(body)
        except Exception as e:  # vLLM's own error, as one line (the server's 500 answer in server mode)
            raise EngineError(f"{self.name} failed: {type(e).__name__}: {e}") from e
        finally:
            self._sleep()  # the trainer's update needs the memory

    def push(self, tensors: dict[str, Tensor] | list, version: int, base: int | None = None) -> bool:
        """Load the trainer's ``tensors`` (Hugging Face names; made, or :class:`.weight_buckets.Lazy` items) into the
        engine as weights version ``version``, bucket by bucket (:mod:`.weight_sync`: a LoRA run's merged layers are
        made one bucket at a time); with ``base``, a part of the model on top of version ``base``, refused (False)
        unless the engine holds it; the version must move forward and the tensors match the served model (the
        server's checks, :mod:`.engine_http`)."""
        from . import weight_buckets as wb
        from . import weight_sync
        from .engine_http import Refused

        self._wake()
        items = weight_sync.lazy(tensors) if isinstance(tensors, dict) else tensors
        buckets = wb.plan(items, self.bucket_bytes)
        try:
            for i, bucket in enumerate(buckets):
                made = {e.name: item.get() for item, e in bucket}
                if self.engine.load_weights(made, version, base, bucket=(i, len(buckets))) is None:
                    return False
                del made
        except Refused as e:  # a version that does not move forward, a tensor the served model does not have
            raise EngineError(f"{self.name}: {e.message}") from None
        self.version = version
        return True

    def close(self) -> None:
        """Shut the engine down (before the trainer's accelerate teardown destroys the process group it uses)."""
        self.engine.shutdown()

    def _sleep(self) -> None:
        if self.sleeps and not self.asleep:
            self.engine.sleep()
            self.asleep = True

    def _wake(self) -> None:
        if self.asleep:
            self.engine.wake_up()
            self.asleep = False


class _NoThreadWarning(logging.Filter):
    """Drops the CPU worker's "doesn't allow to use `torch.set_num_threads`" warning (the thread count is kept)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "torch.set_num_threads" not in record.getMessage()
