"""The trainer's side of a streamed weight push: buckets of ``rollout.push_bucket_mb``, over HTTP or NCCL.

Every push (:meth:`.engine.VLLMClient.push`) plans its buckets once (:func:`.weight_buckets.plan`: model order, at most
``push_bucket_mb`` each, whole decoder layers, a larger layer alone) and sends them one after the other; the engine
loads each as it arrives and takes the new version only with the last one (:class:`.engine_http.WeightGate`). The
trainer's extra host memory for a push is therefore one bucket being sent plus the tensor being copied into it — at most
two buckets whatever the model's size (where one decoder layer is larger than a bucket: that layer plus one tensor)
(``tests/test_weight_sync.py`` measures it) — where it used to be a second copy of the whole model plus its serialised
file.

Two channels carry a bucket (``rollout.weight_sync``):

* ``http`` (default, any machine): the bucket as a safetensors body of ``POST /update_weights`` with
  ``X-Weights-Bucket: i/n``.
* ``nccl`` (trainer and engine on GPUs of one NCCL fabric): TRL's approach (``trl/extras/vllm_client.py``
  ``VLLMClient.init_communicator`` and ``update_named_param``; ``trl/scripts/vllm_serve.py``
  ``WeightSyncWorkerExtension``): a ``StatelessProcessGroup`` + ``PyNcclCommunicator`` between the trainer (the
  highest rank) and the engine's workers, set up by ``POST /init_communicator``; per bucket its entries go as JSON to
  ``POST /update_weights_nccl`` and its flat buffer is broadcast from the trainer's GPU
  (:func:`.weight_buckets.pack` into a CUDA buffer). It needs CUDA and vLLM in the training environment: asked for
  without them, the config is refused at load in one line (``mmgrpo.loader._check_weight_sync``); nothing falls
  back silently.

The bucketing, ordering and packing are :mod:`.weight_buckets`' for both channels; the CPU tests run the NCCL
channel's send/receive over a gloo group (the broadcast is the only part they replace).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from mmgrpo.types import EngineError

from . import weight_buckets as wb

DEFAULT_BUCKET_MB = 256.0
"""``rollout.push_bucket_mb``'s default: large enough that a bucket's fixed cost (one request, one reload call) is
small next to its transfer, small next to a GPU host's memory."""


def bucket_bytes(mb: float) -> int:
    """``push_bucket_mb`` in bytes (MiB)."""
    return max(1, int(mb * (1 << 20)))


def lazy(tensors: dict[str, torch.Tensor]) -> list[wb.Lazy]:
    """Tensors already made (a test's, another client's push) as :class:`.weight_buckets.Lazy` items."""
    return [wb.Lazy(k, wb.dtype_name(v.dtype), tuple(v.shape), lambda v=v: v) for k, v in tensors.items()]


def http_buckets(items: list[wb.Lazy], bucket_size: int):
    """``(i, n, safetensors body)`` of each bucket of ``items``, made one at a time (the previous body is dropped by
    the caller before the next is made)."""
    buckets = wb.plan(items, bucket_size)
    for i, bucket in enumerate(buckets):
        yield i, len(buckets), wb.pack([(it, e) for it, e in bucket])
        bucket.clear()  # the plan holds no made tensor, but drop the references to the thunks too


class NcclChannel:
    """The NCCL channel of one trainer to one vLLM server (``rollout.weight_sync: nccl``); untested without GPUs.

    ``communicator`` has vLLM's ``PyNcclCommunicator`` interface (``broadcast(tensor, src)``, ``group.barrier()``);
    :meth:`connect` makes it as TRL's ``VLLMClient.init_communicator`` does. ``post(path, json)`` is the client's
    authenticated request."""

    def __init__(self, communicator: Any, rank: int, device: Any, post: Callable[[str, dict], dict]):
        self.communicator, self.rank, self.device, self.post = communicator, rank, device, post

    @classmethod
    def connect(cls, client: Any, host: str, port: int) -> NcclChannel:
        """``POST /init_communicator`` (the server's workers join ranks 0..W-1 of a new group at ``host:port``), then
        join it as rank W from this process's current CUDA device."""
        from vllm.distributed.device_communicators.pynccl import PyNcclCommunicator
        from vllm.distributed.utils import StatelessProcessGroup

        info = client.post_json("/init_communicator", {"host": host, "port": port})
        rank = int(info["client_rank"])
        group = StatelessProcessGroup.create(host=host, port=port, rank=rank, world_size=rank + 1)
        device = torch.device("cuda", torch.cuda.current_device())
        return cls(PyNcclCommunicator(group, device=device), rank, device, client.post_json)

    def send(self, items: list[wb.Lazy], version: int, base: int | None, bucket_size: int) -> dict:
        """Push ``items`` bucket by bucket: each bucket's entries to ``/update_weights_nccl`` (the server checks them
        and starts receiving), its flat buffer broadcast from this rank; returns the last answer (or a refusal)."""
        buckets = wb.plan(items, bucket_size)
        out: dict = {}
        for i, bucket in enumerate(buckets):
            entries = [e for _, e in bucket]
            body = {"version": version, "base": base, "bucket": [i, len(buckets)], "entries": wb.entries_json(entries)}
            out = self.post("/update_weights_nccl", body)
            if out.get("refused"):
                return out
            send_bucket(bucket, lambda flat: self.communicator.broadcast(flat, src=self.rank), self.device)
            self.communicator.group.barrier()
        return out


def send_bucket(bucket: list[tuple[wb.Lazy, wb.Entry]], broadcast: Callable[[torch.Tensor], None], device: Any):
    """Pack ``bucket`` into one flat ``uint8`` buffer on ``device`` and broadcast it (the sender's side)."""
    flat = torch.empty(wb.data_bytes(e for _, e in bucket), dtype=torch.uint8, device=device)
    wb.pack(bucket, out=flat)
    broadcast(flat)
    del flat


def receive_bucket(entries: list[wb.Entry], broadcast: Callable[[torch.Tensor], None], device: Any):
    """Receive one bucket's flat buffer on ``device`` and view it as its ``(name, tensor)`` pairs (the engine's
    side: what it hands to ``load_weights``)."""
    flat = torch.empty(wb.data_bytes(entries), dtype=torch.uint8, device=device)
    broadcast(flat)
    return list(wb.unpack(entries, flat))


def push_error(name: str, version: int, out: dict) -> EngineError:
    """The one line when an engine did not take a push."""
    return EngineError(f"{name} did not take weights version {version}: {out}")
