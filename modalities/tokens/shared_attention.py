"""Attention that reads each prompt's keys/values once for its whole group (``model.args.shared_prefix_attention``).

The KV-expanded sampler (:class:`.prefix_sharing.PrefixStepper`) prefills each prompt once, then copies its cache G
ways, so every decoding step attends each of the B = P·G rows to its own copy of the prompt: G small attention
problems per prompt that read the same L keys and values G times. Hydragen (Juravsky et al. 2024, "Hydragen:
High-Throughput LLM Inference with Shared Prefixes", arXiv 2402.05099, §3) splits the softmax over the two parts of
the keys, the shared prefix and each row's own suffix, and merges the two partial results by their log-sum-exps:

    A(q, K) = (e^{lse_p} · A(q, K_p) + e^{lse_s} · A(q, K_s)) / (e^{lse_p} + e^{lse_s}),
    lse_x = log Σ_{k ∈ K_x} exp(q·k · scale)                                            (Hydragen §3.1, eq. 2–3)

so the queries of all G rows of a prompt are stacked into one matrix against the prompt's keys (one matmul per
prompt and K/V head instead of G matrix–vector products), and only the suffix part is per row. The merge is the
softmax over both key blocks; :func:`shared_prefix_attention` takes it as one softmax over [prompt scores ; own
scores], which needs fewer small ops per call than two partial softmaxes and their log-sum-exp weights. Exact in exact
arithmetic; in floating point it differs from the expanded cache's kernel by rounding
(tests/test_shared_attention.py checks the keyed tokens and log-probs against the expanded cache on tiny models
of each architecture).

How it plugs into transformers without touching the model: the prompt cache is not expanded; each full-attention
layer of it becomes a :class:`SharedPrefixLayer` (the prompt's keys/values [P, H_kv, L, d] and a buffer for the
rows' own keys/values, grouped by prompt, [P, H_kv, G, T, d]), and each decoding step runs the model with the
attention kernel :data:`KERNEL`, registered with transformers' ``AttentionInterface`` (public:
``AttentionInterface.register``), which transformers calls with the layer's query, the rows' own keys/values (what
the cache's ``update`` returns) and the forward's keyword arguments, where ``shared_prefix`` carries the cache. A
kernel transformers has no mask function for gets no mask (``masking_utils._preprocess_mask_arguments``), so no
[B, 1, 1, L + t] mask is built per step either: the prompt's padding is one additive bias per prompt, the suffix needs
none (one query per row, every own position visible).

The split-attention log-prob forward (:func:`completion_logits`) has the same shape of work: each of the U·G
completions continues its prompt, and :func:`.prefix_sharing.completion_logits` copies the prompt's keys/values G
ways per layer (``index_select``) (and sums their gradients back in the backward). Here the completions' queries are
stacked per prompt against the prompt's keys once, their own keys causal with the completion padding masked; the
prompt's keys/values still receive every completion's gradient, through the one matmul.

Where it applies (:func:`unsupported_reason`): decoder-only and media models whose text layers are all full
attention with the ``sdpa`` or ``eager`` kernel (the prefix-sharing families of :mod:`.prefix_sharing` without
sliding windows), fp32/bf16/fp16, one process or data-parallel (not sharded weights). Elsewhere the eager
expanded loop runs; the option is on by default, so that is said once at INFO level, not warned.

Shape glossary: ``P`` prompts, ``G`` group size, ``B = P·G`` rows (group-major), ``H`` query heads, ``H_kv`` K/V
heads, ``g = H / H_kv``, ``L`` prompt length (left-padded), ``n`` own positions so far, ``t`` new tokens, ``d`` head
dimension.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor
from transformers import AttentionInterface
from transformers.cache_utils import DynamicLayer

from mmgrpo import compat

from .. import _hf
from . import prefix_sharing
from .decode import append_positions

logger = logging.getLogger(__name__)

KERNEL = "mmgrpo_shared_prefix"
"""The name of :func:`shared_prefix_attention` in transformers' ``AttentionInterface``."""

KERNELS = ("sdpa", "eager")
"""The attention kernels the shared decode replaces (both compute plain softmax attention with the model's scaling)."""

TRAINING_MAX_RATIO = 0.5
"""The training forward takes the kernel only while completions are at most this many tokens per prompt token
(T ≤ 0.5·L). It materialises each prompt's [G·g·T, L + T] scores (the own block whole, then masked) where SDPA over
the index-selected prompt fuses them, so its gain (the prompt's keys and values read once, not copied G times) shrinks
as T grows against L. Forward + backward on the tiny Qwen2.5-VL, L = 43, G = 8, one thread (expanded ÷ shared time):
0.98 at T = 16, 0.85 at 64, 0.73 at 128, 0.49 at 256; at 8:1 (T = 16, L = 128) the kernel gained (docs/benchmarks.md).
The decode step (one query per row) takes it at any T."""


class SharedPrefixLayer(DynamicLayer):
    """One full-attention layer of the shared cache: the prompts' keys/values once, each row's own after them.

    ``update`` (a step's new keys/values) writes the rows' own part in place, grouped by prompt, and returns it; the
    kernel reads the prompt part from here. Past ``extra`` own positions it grows by concatenation, so a longer
    continuation is never wrong (the training forward reserves none).

    Shape:
        keys, values: [P, H_kv, L, d]; bias: [P, 1, 1, L] (0 at prompt tokens, -inf at left padding)
        own keys/values: [P, H_kv, G, n, d] (row b = p·G + i at [p, :, i]); own_bias: None or [P, 1, G, 1, n]
    """

    def __init__(self, keys: Tensor, values: Tensor, bias: Tensor, group: int, extra: int):
        super().__init__()
        P, H, _, d = keys.shape
        self.prompt_keys, self.prompt_values, self.bias, self.group = keys, values, bias[:, :, None], group
        self.own_bias: Tensor | None = None  # the training forward's completion padding, additive
        self._k = keys.new_empty((P, H, group, extra, d))
        self._v = values.new_empty((P, H, group, extra, d))
        self.device, self.is_initialized = keys.device, True
        self.keys, self.values = self._k[..., :0, :], self._v[..., :0, :]

    def update(self, key_states: Tensor, value_states: Tensor, *args, **kwargs) -> tuple[Tensor, Tensor]:
        """Append the rows' new keys/values ([B, H_kv, t, d]); the own part so far, [P, H_kv, G, n + t, d]."""
        key_states = key_states.unflatten(0, (-1, self.group)).transpose(1, 2)  # [P, H_kv, G, t, d]
        value_states = value_states.unflatten(0, (-1, self.group)).transpose(1, 2)
        self._k, self.keys = append_positions(self._k, self.keys, key_states)
        self._v, self.values = append_positions(self._v, self.values, value_states)
        return self.keys, self.values

    def get_seq_length(self) -> int:
        """Positions seen: the (padded) prompt and the own ones."""
        return self.prompt_keys.shape[-2] + self.keys.shape[-2]


def shared_prefix_attention(
    module: torch.nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs,
) -> tuple[Tensor, None]:
    """Attention of B rows over [their prompt's keys ; their own keys], the prompt's scores from one matmul per prompt
    and K/V head over the G rows' stacked queries (Hydragen, arXiv 2402.05099, §3.1: the softmax over the two key
    blocks, eq. 2–3, taken here as one softmax over both blocks' scores). Called by transformers' attention modules
    when the config selects :data:`KERNEL`; ``key``/``value`` are the rows' own (the cache's ``update``), the
    prompt's come from ``kwargs["shared_prefix"]`` (the cache) at ``module.layer_idx``. Query token i of t sits at
    own position n − t + i and sees own positions ≤ it.

    Shape:
        query [B, H, t, d], B = P·G, H = H_kv·g; key, value [P, H_kv, G, n, d]
        returns [B, t, H, d] (what transformers' kernels return), None
    """
    cache = kwargs.get("shared_prefix")
    if cache is None:
        raise RuntimeError(
            f"attention kernel {KERNEL!r} runs only inside the shared-prefix decode step (it needs the shared cache); "
            "set the model's attn_implementation back to sdpa or eager"
        )
    if kwargs.get("softcap") is not None or kwargs.get("s_aux") is not None or dropout:
        raise RuntimeError(f"attention kernel {KERNEL!r}: no logit soft-capping, attention sinks or dropout")
    layer: SharedPrefixLayer = cache.layers[module.layer_idx]
    B, H, t, d = query.shape
    P, Hkv, L = layer.prompt_keys.shape[:3]
    G, g, n = layer.group, H // Hkv, key.shape[-2]
    scale = d**-0.5 if scaling is None else scaling
    # queries grouped by prompt and K/V head: [P, G, H_kv, g, t, d] → [P, H_kv, G, g·t, d]
    q = (query * scale).reshape(P, G, Hkv, g, t, d).transpose(1, 2).reshape(P, Hkv, G, g * t, d)
    prompt_scores = q.reshape(P, Hkv, G * g * t, d) @ layer.prompt_keys.transpose(-1, -2)  # [P, H_kv, G·g·t, L]
    prompt_scores = prompt_scores.view(P, Hkv, G, g * t, L) + layer.bias
    own_scores = q @ key.transpose(-1, -2)  # [P, H_kv, G, g·t, n]
    if layer.own_bias is not None:  # the training forward: padding after a completion's end
        own_scores = own_scores + layer.own_bias
    if t > 1:
        seen = torch.arange(n, device=query.device) <= torch.arange(n - t, n, device=query.device)[:, None]  # [t, n]
        own_scores = own_scores.masked_fill(~seen.repeat(g, 1), float("-inf"))
    probs = torch.cat([prompt_scores, own_scores], dim=-1).float().softmax(dim=-1).to(value.dtype)  # [.., L + n]
    out = (probs[..., :L].reshape(P, Hkv, G * g * t, L) @ layer.prompt_values).view(P, Hkv, G, g * t, d)
    out = out + probs[..., L:] @ value  # [P, H_kv, G, g·t, d]
    return out.view(P, Hkv, G, g, t, d).permute(0, 2, 4, 1, 3, 5).reshape(B, t, H, d), None


AttentionInterface.register(KERNEL, shared_prefix_attention)


def text_attention_configs(model: torch.nn.Module) -> list:
    """The distinct configs the decoder's attention modules read their kernel from (those with a ``layer_idx``:
    the text layers, not a vision tower's)."""
    configs: dict[int, object] = {}
    for module in prefix_sharing.core_model(model).modules():
        config = getattr(module, "config", None)
        if hasattr(module, "layer_idx") and hasattr(module, "num_key_value_groups") and config is not None:
            configs[id(config)] = config
    return list(configs.values())


def unsupported_reason(model: torch.nn.Module) -> str | None:
    """Why the shared-prefix decode cannot run on ``model`` (None when it can)."""
    configs = text_attention_configs(model)
    if not configs:
        return "no decoder attention module with a layer index and K/V groups was found"
    kernels = {compat.attn_implementation(c) for c in configs}
    if not kernels <= set(KERNELS):
        return f"attention kernel {sorted(map(str, kernels))}; it replaces only {' / '.join(KERNELS)}"
    for config in configs:
        if getattr(config, "layer_types", None) and set(config.layer_types) != {"full_attention"}:
            return "sliding-window or linear-attention layers"
        if getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True):
            return "a sliding attention window"
        if getattr(config, "attn_logit_softcapping", None):
            return "attention logit soft-capping"
    return None


def use_shared(on: bool, model: torch.nn.Module, synced: bool) -> bool:
    """Whether the sampler takes :class:`SharedPrefixStepper`: ``shared_prefix_attention`` is ``on`` and the model
    allows it (else the expanded cache, the reason said once at INFO level)."""
    if not on:
        return False
    reason = "sharded weights (FSDP): not tested there" if synced else unsupported_reason(model)
    if reason is not None:  # on by default: said once, not as a warning
        prefix_sharing.info_once(logger, f"shared_prefix_attention: the expanded cache runs instead because {reason}")
    return reason is None


@contextmanager
def kernel(configs: list) -> Iterator[None]:
    """Within the block, ``configs`` select :data:`KERNEL`; restored after, also on error."""
    before = [compat.attn_implementation(c) for c in configs]
    try:
        for c in configs:
            compat.set_attn_implementation(c, KERNEL)
        yield
    finally:
        for c, name in zip(configs, before):
            compat.set_attn_implementation(c, name)


def share(cache, attention_mask: Tensor, group: int, extra: int) -> None:
    """Turn the prefilled prompt ``cache`` (per layer [P, H_kv, L, d]) into the shared cache, in place: each layer a
    :class:`SharedPrefixLayer` with room for ``extra`` own positions per row. ``attention_mask``: [P, L]."""
    layers = cache.layers
    if not all(type(layer) is DynamicLayer and layer.keys is not None for layer in layers):
        raise ValueError("shared-prefix decode: the prompt cache has layers other than plain full attention")
    bias = torch.zeros(attention_mask.shape, dtype=layers[0].keys.dtype, device=layers[0].keys.device)
    bias = bias.masked_fill(attention_mask.to(bias.device) == 0, float("-inf"))[:, None, None, :]  # [P, 1, 1, L]
    for i, layer in enumerate(layers):
        layers[i] = SharedPrefixLayer(layer.keys, layer.values, bias, group, extra)


class SharedPrefixStepper(prefix_sharing.PrefixStepper):
    """:class:`~.decode.Stepper` of the shared-prefix decode: the eager stepper's prefill (one per prompt), the
    prompt cache kept unexpanded (:func:`share`), each step through :data:`KERNEL`."""

    def prefill(self, group_size: int) -> Tensor:
        prefix = prefix_sharing.prefill(self.model, self.batch)
        share(prefix.cache, prefix.attention_mask, group_size, max(self.reserve, 1))
        P = prefix.last_logits.shape[0]
        rows = torch.arange(P, device=prefix.last_logits.device).repeat_interleave(group_size)  # [B]
        self.prefix = prefix_sharing.PromptPrefix(
            prefix.cache, prefix.last_logits[rows], prefix.attention_mask[rows], prefix.next_position[:, rows]
        )
        self.configs = text_attention_configs(self.model)
        return self.prefix.last_logits  # [B, V]

    def step(self, tokens: Tensor, step: int) -> Tensor:
        positions = self.prefix.next_position[..., None] + step  # [R, B, 1]
        with kernel(self.configs):
            out = self.model(
                input_ids=tokens[:, None],
                position_ids=prefix_sharing.position_arg(positions),
                use_cache=True,
                shared_prefix=self.prefix.cache,
                **_hf.kv_cache(self.prefix.cache),
            )
        return out.logits[:, -1]  # [B, V]


# ---------------------------------------------------------------------------------------------- training


def group_of(rows: Tensor, prompts: int) -> int | None:
    """G when completion i continues prompt i // G for every i (a rollout's group-major order), else None."""
    n = rows.numel()
    if n == 0 or n % prompts:
        return None
    G = n // prompts
    return G if torch.equal(rows.cpu(), torch.arange(prompts).repeat_interleave(G)) else None


def completion_logits(
    model: torch.nn.Module, batch: dict[str, Tensor], group: int, completions: Tensor, completion_mask: Tensor
) -> Tensor:
    """:func:`.prefix_sharing.completion_logits` through the shared kernel: the U prompts encoded once (with
    autograd), completion i continuing prompt i // ``group`` with its queries stacked per prompt against the prompt's
    keys (no G-fold ``index_select`` copy of them, nor its summing backward), its own keys causal and padding-masked.

    Shape:
        batch: left-padded prompts, input_ids/attention_mask [U, L] (+ media); completions, completion_mask [U·G, T]
        returns logits [U·G, T, V] (the model's dtype)
    """
    prefix = prefix_sharing.prefill(model, batch)
    U, T = prefix.last_logits.shape[0], completions.shape[1]
    rows = torch.arange(U, device=completions.device).repeat_interleave(group)  # [n]
    first = prefix.last_logits[rows][:, None]  # [n, 1, V]
    if T == 1:
        return first
    share(prefix.cache, prefix.attention_mask, group, 0)
    own = completion_mask[:, : T - 1].to(device=completions.device)  # [n, T-1]
    dtype = prefix.cache.layers[0].prompt_keys.dtype
    own_bias = torch.zeros(own.shape, dtype=dtype, device=own.device).masked_fill(own == 0, float("-inf"))
    for layer in prefix.cache.layers:
        layer.own_bias = own_bias.view(U, 1, group, 1, T - 1)
    positions = prefix.next_position[:, rows][..., None] + torch.arange(T - 1, device=completions.device)
    with kernel(text_attention_configs(model)):
        out = model(
            input_ids=completions[:, : T - 1],
            position_ids=prefix_sharing.position_arg(positions),  # [R, n, T-1] → the model's form
            use_cache=True,
            shared_prefix=prefix.cache,
            **_hf.kv_cache(prefix.cache),
        )
    return torch.cat([first, out.logits], dim=1)  # [n, T, V]
