"""A compiled decode step for the KV-expanded sampler: a static KV cache sized for the group, the step compiled.

The eager loop (:class:`.prefix_sharing.PrefixStepper`) runs every decoding step as a Python walk over the layers
(a dozen kernels each); with a small model or a small batch that step is launch-bound, not FLOP-bound. The
gpt-fast recipe (a static cache, the per-token forward under ``torch.compile``; on CUDA captured as a graph,
``mode="reduce-overhead"``) removes that overhead. Here, behind ``model.args.compile_decode``:

1. the P prompts are **prefilled eagerly** once (media included), as the eager loop does
   (:func:`.prefix_sharing.prefill`);
2. their keys/values are copied, G-expanded (row b from prompt b // G), into a static cache (a transformers ``Cache``
   of ``StaticLayer`` s, one per prefilled layer: what ``StaticCache`` builds for a full-attention decoder, without
   reading the layer count from a config that may describe an encoder too) of ``S = bucket(L + T)`` positions
   (``BUCKET``-token buckets, so prompts of nearby lengths share one compiled graph) and the 2-D attention mask
   becomes ``[B, S]``: the prompt's mask, then 0 for the positions not yet written;
3. each step writes its token's position into the mask (1) and calls the **compiled step**: the model's forward over
   one token per row with the static cache (``StaticLayer.update`` writes in place at its ``cumulative_length``,
   a tensor, so the step position is data, not a guard), rope positions continuing each prompt's.

The attention of a step sees the same keys as the eager loop's plus masked-out slots (weight exactly 0), so the
logits agree up to float rounding (inductor may fuse and reorder reductions) and keyed draws are the same unless a
rounding moves a uniform across a boundary of the cumulative distribution (tests/test_compiled_decode.py checks the
tokens on the tiny models).

Recompilation is bounded: the graph depends on (B, S, dtype, device) only, so a new prompt length inside a bucket
reuses the graph. Its guards (every parameter, every cache layer: ~1 ms of host time a token) are checked on the first
call of each input signature only (:func:`guards_once`). The static caches are kept per shape and overwritten in
place (:class:`CompiledDecoder` owns them: ``StaticLayer`` marks its buffers as static addresses, which CUDA graphs
replay from; no allocation per rollout). The
memory kept is one cache per (B, bucket) in use, 2·layers·B·H_kv·S·d values each, at most :data:`MAX_CACHES` of a
kind: the least recently used goes first (a 7B model's cache at B = 64, S = 1024 is ~4 GB, and prompts spread over
many buckets would otherwise keep one each for the whole run). A bucket met again after its cache went gets a new
one; CUDA graph trees then record the graph again for the new addresses (a recording, not a compilation).
:attr:`CompiledDecoder.compilations` counts the graphs compiled (a backend wrapper).

``compile_decode: auto`` (the default) takes the compiled step where the policy sits on a CUDA device and the eager
loop elsewhere: on the one GPU measured (an H200, SmolLM2-135M in bf16, 16 rows) the graph cut a decode token from
42.1 to 5.7 ms and the GRPO step from 1.95 to 0.65 s, while on a 2-core CPU inductor's step is no faster
(docs/benchmarks.md, "The first run: one NVIDIA H200"). Its price is one compilation per (B, bucket), ~40 s for
SmolLM2 on that GPU. ``true`` compiles on the CPU too; ``false`` never.

Not covered (the eager loop runs, with a one-time warning naming the reason; under ``auto``, an INFO line): caches
with sliding-window or other non-plain layers, sharded weights (FSDP: each forward is a collective), a missing C++
compiler for inductor on CPU.

The other token families reuse the same machinery (:class:`CompiledDecoder`: pooled static caches, the step compiled
once per shape and counted, :func:`load_prefix`, the fallback warning) with their own step function:
Whisper's encoder-decoder step (``modalities/speech/compiled_step.py``: the self-attention cache static and bucketed,
the cross-attention K/V computed once per prompt and copied G-expanded into a static cache of the encoder's length)
and the CFG image-token step (``modalities/ar_image/compiled_step.py``: the conditional and unconditional rows in one
static cache, the guided logits inside the compiled step).

Shape glossary: ``P`` prompts, ``G`` group size, ``B = P·G``, ``L`` padded prompt length, ``T`` completion tokens,
``S`` static cache length, ``V`` vocabulary, ``R`` rope sections.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import Tensor
from transformers.cache_utils import Cache, DynamicLayer, StaticLayer

from mmgrpo.compat import dynamo_supported, mark_static_address
from mmgrpo.config import ConfigError

from .. import _hf
from .decode import SamplingSpec, sampling_scores
from .prefix_sharing import core_model, info_once, position_arg, prefill, warn_fallback_once

CompileDecode = bool | Literal["auto"]
"""``model.args.compile_decode``: true | false | auto (compiled where the policy is on CUDA; :func:`wanted`)."""

logger = logging.getLogger(__name__)

MAX_CACHES = 2
"""Static caches of one kind (self-attention, Whisper's cross-attention) kept across rollouts, least recently used
dropped first (the module docstring)."""

BUCKET = 64
"""Static cache lengths are multiples of this many positions: prompts whose L + T fall in one bucket share a graph."""


def bucket_length(n: int, bucket: int = BUCKET) -> int:
    """The static cache length for ``n`` positions: ``n`` rounded up to a multiple of ``bucket``."""
    return -(-n // bucket) * bucket


def compiler_problem(device: torch.device) -> str | None:
    """None when ``torch.compile`` can build the step on ``device``; else why not (one line): inductor on CPU needs a
    C++ compiler on the PATH."""
    if device.type == "cpu" and not any(shutil.which(c) for c in ("g++", "c++", "clang++")):
        return (
            "inductor on CPU needs a C++ compiler (g++/clang++) on the PATH; install one or set compile_decode: false"
        )
    return None


def check_args(compile_decode: CompileDecode) -> None:
    """At load: refuse ``model.args.compile_decode: true`` where ``torch.compile`` cannot run at all (ConfigError, one
    line); ``auto`` then runs the eager loop. A missing C++ compiler or sharded weights fall back at sampling time
    instead (:func:`fallback_reason`)."""
    if compile_decode is True and not dynamo_supported():
        raise ConfigError(
            f"model.args.compile_decode: torch.compile is not supported on Python {sys.version.split()[0]} with torch "
            f"{torch.__version__}; set compile_decode: false"
        )


@dataclass
class CompiledDecoder:
    """The compiled decode step of one policy and its static caches, kept across rollouts (one graph per shape).

    ``backend`` is ``torch.compile``'s (``inductor``; tests may pass ``eager`` to count graphs cheaply); ``mode``
    defaults to ``reduce-overhead`` (CUDA graphs) on CUDA and inductor's default on CPU.
    """

    backend: str = "inductor"
    """torch.compile backend of the step."""
    bucket: int = BUCKET
    """Static cache lengths are multiples of this."""
    compilations: int = 0
    """Graphs compiled so far (every recompilation and graph-break piece counts one)."""
    caches: dict[tuple, Cache] = field(default_factory=dict)
    """Static caches by (kind, B, S, layers, dtype, device), overwritten in place for each rollout; in order of last
    use, at most :data:`MAX_CACHES` of a kind."""
    buffers: dict[tuple, Tensor] = field(default_factory=dict)
    """Other static step inputs by (kind, shape, dtype, device) (:meth:`static_buffer`)."""
    _steps: dict[tuple, Callable] = field(default_factory=dict)

    def _backend(self, graphs: bool) -> Callable:
        """The backend wrapper: count one compilation, then compile with ``self.backend`` (inductor with CUDA graphs
        when ``graphs``: what ``mode="reduce-overhead"`` sets)."""

        def compile_graph(gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
            self.compilations += 1
            if self.backend == "eager":
                return gm.forward
            from torch._inductor.compile_fx import compile_fx

            return compile_fx(gm, example_inputs, config_patches={"triton.cudagraphs": graphs})

        return compile_graph

    def step_fn(self, device: torch.device, fn: Callable | None = None) -> Callable:
        """``fn`` compiled for ``device`` (default :func:`_step`: ``(model, cache, tokens [B, 1], mask [B, S],
        positions) → logits [B, V]``), once per (function, device type); on CUDA captured as CUDA graphs. Its guards
        are evaluated on the first call of each input signature only (:func:`guards_once`)."""
        fn = fn or _step
        if (fn, device.type) not in self._steps:
            backend = self._backend(graphs=device.type == "cuda")
            compiled = guards_once(torch.compile(fn, backend=backend, dynamic=False))
            self._steps[fn, device.type] = grouped_kv_sdpa(compiled) if device.type == "cpu" else compiled
        return self._steps[fn, device.type]

    def static_cache(self, like: list[tuple[Tensor, Tensor]], B: int, S: int, kind: str = "self") -> Cache:
        """The pooled static cache of ``kind`` and shape (B, S), one ``StaticLayer`` per entry of ``like`` (per layer
        keys/values [*, H, *, d]: heads, head size, dtype and device are read from them). Built once per shape; its
        buffers keep their addresses across rollouts (:func:`load_prefix` overwrites them)."""
        k0 = like[0][0]
        key = (kind, B, S, len(like), k0.dtype, k0.device)
        cache = self.caches.pop(key, None)
        if cache is None:
            same_kind = [k for k in self.caches if k[0] == kind]  # oldest use first
            for old in same_kind[: max(len(same_kind) - MAX_CACHES + 1, 0)]:
                del self.caches[old]
            cache = Cache(layers=[StaticLayer(max_cache_len=S) for _ in like])
            for layer, (k, v) in zip(cache.layers, like, strict=True):
                layer.lazy_initialization(k[:1].expand(B, -1, -1, -1), v[:1].expand(B, -1, -1, -1))
        self.caches[key] = cache  # re-inserted: the dict's order is the order of last use
        return cache

    def static_buffer(self, value: Tensor, kind: str) -> Tensor:
        """A pooled copy of ``value`` at a fixed address (``torch._dynamo.mark_static_address``: a CUDA graph replays
        from it without copying it in), one per (kind, shape, dtype, device), overwritten in place."""
        key = (kind, tuple(value.shape), value.dtype, value.device)
        if key not in self.buffers:
            self.buffers[key] = torch.empty_like(value)
            mark_static_address(self.buffers[key])
        return self.buffers[key].copy_(value)


SKIP_GUARDS = True
"""Whether :func:`guards_once` skips the guards after a signature's first call (False: every call is guarded, the
A/B arm of ``benchmarks/compiled_decode.py --guarded-arm``)."""

SIGNATURES_KEPT = 64
"""Input signatures :func:`guards_once` remembers (the first seen go first; a dropped one is guarded again on its next
call, once)."""


def signature(args: tuple) -> tuple:
    """What a compiled step's guards depend on, per call: each tensor argument's shape, dtype and device, each number,
    string or None by value, any other object (the model, a cache) by identity; and the grad mode, the model's
    training flag and the autocast state of the tensors' device."""
    parts, device = [], "cpu"
    for a in args:
        if isinstance(a, Tensor):
            parts.append((tuple(a.shape), a.dtype, a.device))
            device = a.device.type
        elif a is None or isinstance(a, (bool, int, float, str)):
            parts.append((type(a), a))
        else:
            parts.append((type(a), id(a), getattr(a, "training", None)))
    return (*parts, torch.is_grad_enabled(), torch.is_autocast_enabled(device))


def guards_once(compiled: Callable) -> Callable:
    """``compiled`` with its Dynamo guards evaluated on the first call of each input :func:`signature` only.

    Each call of a ``torch.compile`` d step first checks its guards. These cover every parameter of the model and every
    layer of the static cache passed in, so they cost ~1 ms of host time a token: 1.36 ms of a 9.8 ms step of a
    30-layer model on this CPU, 0.76 ms of a 2.6 ms step of SmolLM2-135M on an H200 (both profiled). A decode loop
    calls the step with the same model, cache and shapes every token, so after the first call of a signature (which
    evaluates the guards and compiles if needed) the step runs under ``torch.compiler.set_stance(
    skip_guard_eval_unsafe=True)``: only the guards that tell compiled graphs apart run (the 64-token buckets). The
    signature covers what could change between tokens or rollouts: a new cache object, a new shape, another mode."""
    seen: dict[tuple, None] = {}

    def call(*args, **kwargs):
        key = signature((*args, *kwargs.values()))
        if key in seen and SKIP_GUARDS:
            with torch.compiler.set_stance("default", skip_guard_eval_unsafe=True):
                return compiled(*args, **kwargs)
        out = compiled(*args, **kwargs)
        seen[key] = None
        if len(seen) > SIGNATURES_KEPT:
            del seen[next(iter(seen))]
        return out

    return call


GQA_SWITCH = "TRANSFORMERS_SDPA_FORCE_GQA"
"""transformers' switch (``integrations/sdpa_attention.py``, ``use_gqa_in_sdpa``) for SDPA's own grouped-query heads."""


def grouped_kv_sdpa(step: Callable) -> Callable:
    """``step`` called with transformers' SDPA attention taking grouped key/value heads as they are (on CPU).

    With a mask, transformers' SDPA path expands the K/V heads of a grouped-query model to the query heads
    (``repeat_kv``) unless ``use_gqa_in_sdpa`` says the kernel takes them (on CUDA only without a mask). The eager
    decode loop avoids the copy with its own query packing (``pack_gqa``), which transformers skips under
    ``torch.compile``. The compiled step always has a mask (the static cache's unwritten positions), so each of its
    steps copied the whole static cache of every layer: 11 ms of a step's 12 on the benchmark Llama (B = 32, S = 512,
    6 query / 2 K/V heads). torch's CPU SDPA takes the mask with ``enable_gqa`` and gives the same values (the
    expansion only repeats K/V), so the step runs under transformers' own switch, set for the call (dynamo traces the
    graph inside it) and restored after it."""

    def call(*args, **kwargs):
        before = os.environ.get(GQA_SWITCH)
        os.environ[GQA_SWITCH] = "1"
        try:
            return step(*args, **kwargs)
        finally:
            if before is None:
                del os.environ[GQA_SWITCH]
            else:
                os.environ[GQA_SWITCH] = before

    return call


def load_prefix(cache: Cache, layers: list, rows: Tensor) -> int:
    """Copy the prefilled keys/values of plain dynamic ``layers`` ([P, H, L, d] each) into the static ``cache``,
    row b from prefix row ``rows[b]`` (the G-way expansion), positions ``L`` on zeroed; the cache continues at L.
    Returns L.

    Shape:
        rows: [B] indices into the P prefix rows; the cache's layers are [B, H, S, d] with S >= L
    """
    if not all(type(layer) is DynamicLayer for layer in layers):
        raise ValueError("static cache: the prefill cache has non-plain layers")
    L = layers[0].keys.shape[-2]
    for static, dynamic in zip(cache.layers, layers, strict=True):
        static.keys.zero_()
        static.values.zero_()
        static.keys[:, :, :L].copy_(dynamic.keys.index_select(0, rows))  # [B, H, L, d]
        static.values[:, :, :L].copy_(dynamic.values.index_select(0, rows))
        static.cumulative_length.fill_(L)
    return L


def _step(model: torch.nn.Module, cache: Cache, tokens: Tensor, mask: Tensor, positions: Tensor) -> Tensor:
    """One decoding step over the static cache: logits of the next token. tokens [B, 1], mask [B, S] → [B, V]."""
    out = model(input_ids=tokens, attention_mask=mask, position_ids=positions, use_cache=True, **_hf.kv_cache(cache))
    return out.logits[:, -1]  # [B, V]


def unsupported_reason(model: torch.nn.Module) -> str | None:
    """None when the static cache covers ``model``'s decoder; otherwise why the eager loop runs (one line)."""
    config = core_model(model).config.get_text_config(decoder=True)
    kinds = set(getattr(config, "layer_types", None) or ["full_attention"])
    if kinds != {"full_attention"} or getattr(config, "use_sliding_window", False):
        return f"layer types {sorted(kinds)} (sliding window or linear attention) need a static cache not covered here"
    return None


class StaticPrefixStepper:
    """:class:`~.decode.Stepper` of :class:`.prefix_sharing.PrefixStepper`'s distribution over a static cache and a
    compiled step (the module docstring)."""

    def __init__(self, model: torch.nn.Module, batch: dict[str, Tensor], reserve: int, decoder: CompiledDecoder):
        self.model, self.batch, self.reserve, self.decoder = model, batch, reserve, decoder

    def prefill(self, group_size: int) -> Tensor:
        prefix = prefill(self.model, self.batch)  # eager: media, prompts of any length
        P, L = prefix.attention_mask.shape
        rows = torch.arange(P, device=prefix.last_logits.device).repeat_interleave(group_size)  # [B]
        B, S = P * group_size, bucket_length(L + self.reserve, self.decoder.bucket)
        layers = prefix.cache.layers
        cache = self.decoder.static_cache([(la.keys, la.values) for la in layers], B, S)
        self.cache, self.L = cache, load_prefix(cache, layers, rows)
        self.mask = prefix.attention_mask.new_zeros((B, S))  # [B, S]
        self.mask[:, :L] = prefix.attention_mask.index_select(0, rows)
        self.next_position = prefix.next_position.index_select(1, rows)  # [R, B]
        self.step_fn = self.decoder.step_fn(prefix.last_logits.device)
        return prefix.last_logits.index_select(0, rows)  # [B, V]

    def scores(self, logits: Tensor, step: int, spec: SamplingSpec) -> Tensor:
        return sampling_scores(logits, step, spec)

    def step(self, tokens: Tensor, step: int) -> Tensor:
        self.mask[:, self.L + step] = 1
        positions = position_arg((self.next_position + step)[..., None])  # [R, B, 1] → the model's form
        return self.step_fn(self.model, self.cache, tokens[:, None], self.mask, positions).clone()  # [B, V]


def fallback_reason(model: torch.nn.Module, synced: bool) -> str | None:
    """Why the compiled step cannot run for ``model`` here (warned once by the caller), or None."""
    if synced:
        return "sharded weights (FSDP) run each forward as a collective; the compiled step is not used"
    return unsupported_reason(model) or compiler_problem(next(model.parameters()).device)


def wanted(setting: CompileDecode, device: torch.device) -> bool:
    """Whether ``compile_decode`` asks for the compiled step for a policy on ``device``: ``auto`` on CUDA only (where
    CUDA graphs remove the launch overhead that bounds a decode step; on the CPU inductor's step is no faster)."""
    if setting == "auto":
        return device.type == "cuda" and dynamo_supported()
    return bool(setting)


def use_compiled(setting: CompileDecode, model: torch.nn.Module, synced: bool) -> bool:
    """Whether a family's sampler takes its compiled static-cache stepper: ``compile_decode`` asks for it here
    (:func:`wanted`) and nothing in :func:`fallback_reason` stops it. Else the eager loop runs: asked for with
    ``true``, warned once with the reason; under ``auto``, said once at INFO level."""
    if not wanted(setting, next(model.parameters()).device):
        return False
    reason = fallback_reason(model, synced)
    if reason is not None:
        if setting == "auto":
            info_once(logger, f"compiled decode (compile_decode: auto) is not used: {reason}")
        else:
            warn_fallback(reason)
    return reason is None


def warn_fallback(reason: str) -> None:
    """Log once that sampling uses the eager loop instead of the compiled step."""
    warn_fallback_once("compiled decode (compile_decode)", reason)
