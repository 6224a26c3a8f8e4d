"""The CFG image-token generator's compiled decode step (``model.args.compile_decode``): one static KV cache for the
conditional and unconditional rows, the per-token forward and the guidance under ``torch.compile``.

The eager stepper (``adapter._GuidedStepper``) feeds each image token to both branches through a dynamic cache, a
Python walk over the layers per token: for T = 576 tokens (Janus-Pro at 384 px) that overhead is paid 576 times per
image. Here, with the machinery of :mod:`mmgrpo.modalities.tokens.compiled_decode` (pooled static caches, one graph
per shape, counted):

1. the P prompts' conditional and unconditional rows (left-padded, ``[2P, L]``) are **prefilled eagerly** once, as
   the eager stepper does;
2. their keys/values are copied into one static cache of ``2B`` rows (conditional rows b < B, unconditional rows
   B + b, each from its prompt b // G: the eager stepper's row order) and ``S = bucket(L + T)`` positions; the
   ``[2B, S]`` mask is the prompt's (0 on the left padding), then 0 for the positions not yet written;
3. each step writes its token's position into the mask and runs one **compiled step**: the image-token embedding of
   the drawn tokens (fed to both branches), the backbone over the static cache (positions continuing each row's
   prompt), the generation head, and the guided logits ℓ_u + s·(ℓ_c − ℓ_u) in fp32 (``adapter.guided_logits``).

The image length T is fixed by the model (h·w tokens), so the graph depends on (B, bucket of L + T, dtype, device)
only: prompts of different lengths inside a bucket share it. The attention of a step sees the eager loop's keys plus
masked-out slots (weight 0), so the guided logits agree up to float rounding and the keyed draws are the same unless
a rounding moves a uniform across a boundary of the cumulative distribution (tests/test_compiled_decode_families.py).

Shape glossary: ``P`` prompts, ``G`` group size, ``B = P·G``, ``L`` padded prompt length, ``T`` image tokens, ``S``
static cache length, ``D`` hidden size, ``V`` image codebook size.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from transformers.cache_utils import Cache

from .. import _hf
from ..tokens.compiled_decode import CompiledDecoder, bucket_length, load_prefix


def guided_step(
    base: torch.nn.Module,
    family: Any,
    cache: Cache,
    tokens: Tensor,
    mask: Tensor,
    positions: Tensor,
    scale: float,
    guided: bool,
) -> Tensor:
    """One CFG step over the static cache: the guided logits of the next image token (the adapter's
    ``_GuidedStepper._logits`` of the backbone's last hidden state).

    Shape:
        tokens: [B] drawn image tokens; mask: [2B, S] (or [B, S] unguided); positions: [2B, 1]
        returns [B, V] fp32
    """
    both = torch.cat([tokens, tokens]) if guided else tokens  # [2B]
    out = family.backbone(base)(
        inputs_embeds=family.embed_image(base, both[:, None]),  # [2B, 1, D]
        attention_mask=mask,
        position_ids=positions,
        use_cache=True,
        **_hf.kv_cache(cache),
    )
    logits = family.image_logits(base, out.last_hidden_state[:, -1]).float()  # [2B, V]
    if not guided:
        return logits
    cond, uncond = logits.chunk(2)  # [B, V] each
    return uncond + scale * (cond - uncond)  # adapter.guided_logits


class StaticGuidedStepper:
    """:class:`~mmgrpo.modalities.tokens.decode.Stepper` of the eager CFG stepper's distribution over a static cache
    and a compiled step (the module docstring). ``adapter`` is the :class:`.adapter.ARImageAdapter`; the eager
    stepper's prefill and scores are reused (``eager``: its ``_GuidedStepper`` for these prompts, not yet run)."""

    def __init__(self, eager: Any, decoder: CompiledDecoder):
        self.eager, self.decoder = eager, decoder

    def prefill(self, group_size: int) -> Tensor:
        e, a = self.eager, self.eager.adapter
        P = len(e.ids)
        prompt_ids, mask = a._prompt_batch(e.ids)  # [2P, L]
        cache, last = a._prefill(e.model, prompt_ids, mask)  # eager: one prefill per prompt and branch
        rows = a._branch_rows(torch.arange(P, device=a.device).repeat_interleave(group_size), P)  # [2B]
        S = bucket_length(mask.shape[1] + e.reserve, self.decoder.bucket)
        layers = cache.layers
        self.cache = self.decoder.static_cache([(la.keys, la.values) for la in layers], rows.shape[0], S)
        self.L = load_prefix(self.cache, layers, rows)
        self.mask = mask.new_zeros((rows.shape[0], S))  # [2B, S]
        self.mask[:, : self.L] = mask.index_select(0, rows)
        self.pos = self.mask.sum(1, keepdim=True)  # [2B, 1] position of the first image token
        self.base = a._base(e.model)
        self.step_fn = self.decoder.step_fn(a.device, guided_step)
        return e._logits(last.index_select(0, rows))  # [B, V]

    def scores(self, logits: Tensor, step: int, spec: Any) -> Tensor:
        return self.eager.scores(logits, step, spec)

    def step(self, tokens: Tensor, step: int) -> Tensor:
        a = self.eager.adapter
        self.mask[:, self.L + step] = 1
        out = self.step_fn(
            self.base, a.family, self.cache, tokens, self.mask, self.pos + step, a.args.guidance_scale, a.guided
        )
        return out.clone()  # [B, V]
