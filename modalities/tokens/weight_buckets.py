"""The layout of a streamed weight push, shared by both ends and both channels (HTTP and NCCL).

A push is the policy's tensors in model order, cut into **buckets** of at most ``bucket_bytes``, a decoder layer (or
vision block) never split over two (:func:`group_of`: vLLM reloads a fused layer only from one call; a layer larger than
a bucket goes alone in its own). Inside a bucket the tensors lie back to back in one flat byte buffer, widest dtype
first so that every tensor starts at a multiple of its own item size (a flat buffer can then be viewed as each tensor in
place, on any device), at the offsets :func:`plan` gives. The two channels carry that same buffer:

* **HTTP** (:mod:`.engine`, :mod:`.vllm_server`): a bucket is a safetensors file, i.e. an 8-byte header length,
  the JSON header (:func:`safetensors_header`: each tensor's dtype, shape and ``data_offsets``) and the flat
  buffer — any safetensors reader loads it, and the server's checks (:mod:`.engine_http`) read its header first.
* **NCCL** (:mod:`.weight_sync`): the header goes as JSON over HTTP and the flat buffer is broadcast from the
  trainer's GPU to the engine's, which views it as the tensors (:func:`unpack`).

So the sender never holds more than one bucket plus the tensor being copied into it (:func:`pack`) — two buckets,
or one layer and one tensor where a layer is larger than a bucket — and the engine
loads bucket by bucket (vLLM's ``load_weights`` / ``reload_weights`` take an iterable of ``(name, tensor)``).

Sources: TRL ``trl/extras/vllm_client.py`` (``VLLMClient.update_named_param``: one metadata request per tensor,
then a ``PyNcclCommunicator.broadcast`` of it) and ``trl/scripts/vllm_serve.py`` (``WeightSyncWorkerExtension.
update_named_param``: allocate, receive, ``load_weights([(name, weight)])``); here one request and one broadcast per
bucket instead of per tensor. The safetensors format: ``huggingface/safetensors`` ``docs/source/index.mdx``.

Standard library at import (the server imports it under ``.venv-vllm``, beside :mod:`.engine_http`); torch only
inside :func:`pack` and :func:`unpack`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import struct
from collections.abc import Callable, Iterable, Iterator
from typing import Any

ITEMSIZE = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
    "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8,
}  # fmt: skip
"""safetensors dtype names → bytes per element."""
TORCH_NAMES = {
    "F64": "float64", "F32": "float32", "BF16": "bfloat16", "F16": "float16", "I64": "int64", "I32": "int32",
    "I16": "int16", "I8": "int8", "U8": "uint8", "BOOL": "bool", "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2",
}  # fmt: skip
"""safetensors dtype names → ``torch`` attribute names."""


def dtype_name(dtype: Any) -> str:
    """A torch dtype (``torch.bfloat16``) → its safetensors name (``BF16``); a KeyError for one safetensors lacks."""
    short = str(dtype).removeprefix("torch.")
    return next(k for k, v in TORCH_NAMES.items() if v == short)


@dataclasses.dataclass(frozen=True)
class Entry:
    """One tensor of a bucket: its name, safetensors dtype, shape and byte span ``[start, end)`` in the bucket."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    start: int
    end: int


@dataclasses.dataclass
class Lazy:
    """A tensor to push, known by name, dtype (safetensors name) and shape before it exists; ``get()`` makes it
    (a parameter as it is; a LoRA layer's merged weight, computed then) — called once, when its bucket is packed."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    get: Callable[[], Any]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * ITEMSIZE[self.dtype]


def group_of(name: str) -> str:
    """The load group of a tensor: its name up to its first all-digit component (a decoder layer, a vision block:
    ``model.layers.3.self_attn.q_proj.weight`` → ``model.layers.3``), else its module (``model.norm.weight`` →
    ``model.norm``). A bucket never splits a group.

    vLLM's in-place reload (``vllm/model_executor/model_loader/reload/layerwise.py``) processes a layer once all of
    its weights arrived within one ``reload_weights`` call, and materialises a partly loaded one from what it got:
    a fused ``qkv_proj`` whose q, k and v came in two buckets served garbage (seen on the CPU engine: greedy
    completions of token 0 after a push in 64 kB buckets). vLLM fuses within a block (q/k/v, gate/up, a MoE layer's
    experts), never across blocks, so a block is the unit."""
    parts = name.split(".")
    cut = next((i for i, p in enumerate(parts) if p.isdigit()), None)
    return ".".join(parts[: cut + 1] if cut is not None else parts[:-1])


def plan(items: Iterable[Lazy], bucket_bytes: int) -> list[list[tuple[Lazy, Entry]]]:
    """Cut ``items`` (model order) into buckets of at most ``bucket_bytes`` data bytes, whole load groups
    (:func:`group_of`) at a time — a group larger than that alone in its own bucket; inside each bucket the tensors
    sorted widest dtype first (stable), each at its byte span.

    Deterministic: the same items and size give the same buckets, on the trainer and in the tests."""
    if bucket_bytes < 1:
        raise ValueError(f"bucket_bytes must be positive, got {bucket_bytes}")
    groups: dict[str, list[Lazy]] = {}
    for item in items:
        groups.setdefault(group_of(item.name), []).append(item)
    buckets: list[list[Lazy]] = [[]]
    used = 0
    for members in groups.values():
        size = sum(m.nbytes for m in members)
        if buckets[-1] and used + size > bucket_bytes:
            buckets.append([])
            used = 0
        buckets[-1].extend(members)
        used += size
    out = []
    for bucket in buckets:
        if not bucket:
            continue
        offset, placed = 0, []
        for item in sorted(bucket, key=lambda it: -ITEMSIZE[it.dtype]):  # stable: model order within a width
            placed.append((item, Entry(item.name, item.dtype, tuple(item.shape), offset, offset + item.nbytes)))
            offset += item.nbytes
        out.append(placed)
    return out


def data_bytes(entries: Iterable[Entry]) -> int:
    """The flat buffer's size: the end of the last span."""
    return max((e.end for e in entries), default=0)


def safetensors_header(entries: Iterable[Entry]) -> bytes:
    """The 8-byte length and JSON header of a safetensors file holding ``entries`` (padded with spaces to a multiple
    of 8 bytes, as safetensors writes it, so that the data starts aligned)."""
    header = {e.name: {"dtype": e.dtype, "shape": list(e.shape), "data_offsets": [e.start, e.end]} for e in entries}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text


def entries_json(entries: Iterable[Entry]) -> list[dict]:
    """A bucket's entries as JSON (the NCCL channel's metadata request)."""
    return [dataclasses.asdict(e) | {"shape": list(e.shape)} for e in entries]


def entries_from_json(rows: list[dict]) -> list[Entry]:
    """Inverse of :func:`entries_json`, checking that the spans tile ``[0, size)`` in order and fit their dtype."""
    out, offset = [], 0
    for row in rows:
        shape = tuple(int(s) for s in row["shape"])
        e = Entry(str(row["name"]), str(row["dtype"]), shape, int(row["start"]), int(row["end"]))
        if e.dtype not in ITEMSIZE or e.start != offset or e.end - e.start != math.prod(e.shape) * ITEMSIZE[e.dtype]:
            raise ValueError(f"bucket entry {e.name!r}: span {e.start}..{e.end} is not {e.dtype} {list(e.shape)}")
        out.append(e)
        offset = e.end
    return out


def pack(bucket: list[tuple[Lazy, Entry]], out: Any = None, header: bool = True) -> Any:
    """Make each tensor of ``bucket`` (``Lazy.get``, one at a time) and copy its bytes to its span.

    ``out``: a flat ``torch.uint8`` buffer of :func:`data_bytes` (the NCCL channel's, on the GPU); else a new
    ``bytearray`` holding the safetensors file (``header``) or the data alone. At most one made tensor is alive
    beside the buffer: the sender's extra memory is one bucket plus its largest tensor."""
    import torch

    entries = [e for _, e in bucket]
    if out is None:
        head = safetensors_header(entries) if header else b""
        buf = bytearray(len(head) + data_bytes(entries))
        buf[: len(head)] = head
        flat = torch.frombuffer(buf, dtype=torch.uint8) if len(buf) else torch.empty(0, dtype=torch.uint8)
        data, result = flat[len(head) :], buf
    else:
        data, result = out, out
    for item, e in bucket:
        t = item.get().detach()
        if tuple(t.shape) != e.shape or dtype_name(t.dtype) != e.dtype:
            raise ValueError(f"{e.name}: made {t.dtype} {list(t.shape)}, planned {e.dtype} {list(e.shape)}")
        if e.end > e.start:
            data[e.start : e.end].copy_(t.contiguous().reshape(-1).view(torch.uint8), non_blocking=False)
        del t
    return result


def unpack(entries: list[Entry], data: Any) -> Iterator[tuple[str, Any]]:
    """``(name, tensor)`` of each entry, viewed in place in the flat ``torch.uint8`` buffer ``data`` (no copy)."""
    import torch

    for e in entries:
        dtype = getattr(torch, TORCH_NAMES[e.dtype])
        yield e.name, data[e.start : e.end].view(dtype).reshape(e.shape)
