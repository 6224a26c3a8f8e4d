"""Whisper's compiled decode step (``model.args.compile_decode``): a static self- and cross-attention cache, the
decoder's per-token forward under ``torch.compile``.

The eager stepper (``adapter._WhisperStepper``) runs the decoder one token at a time through a dynamic
``EncoderDecoderCache``: a Python walk over the layers, launch-bound for a small model or batch. Here, with the
machinery of :mod:`mmgrpo.modalities.tokens.compiled_decode` (pooled static caches, one graph per shape, counted):

1. the P prompts' audio is **encoded once** and the decoder prompt (the forced prefix, Lp tokens, the same for every
   prompt: no padding) is **prefilled eagerly** once per prompt, exactly as the eager stepper does;
2. the self-attention keys/values are copied G-expanded (row b from prompt b // G) into a static cache of
   ``S = bucket(Lp + T)`` positions, and the **cross-attention keys/values** (computed once per prompt from the
   encoder states by the prefill) into a static cache of the encoder's length; an ``EncoderDecoderCache`` holds the
   two with every cross layer marked as computed (``is_updated``), so no step projects the encoder states again;
3. each step is one **compiled forward** of the decoder over one token per row: its position ``Lp + t`` (Whisper's
   learned position table, read as data), the ``[B, S]`` mask (1 up to the written positions, 0 after), the static
   self-attention layer writing in place at its ``cumulative_length``. The encoder states only give the call its
   shape (cross-attention reads the cache), so one pooled row of them, expanded inside the step, stands in for the B
   rows: a static address, nothing copied per step or per CUDA-graph replay.

The attention of a step sees the eager loop's keys plus masked-out slots (weight 0), so the logits agree up to float
rounding and the keyed draws are the same unless a rounding moves a uniform across a boundary of the cumulative
distribution (tests/test_compiled_decode_families.py). The sampling distribution (bans, temperature) is applied
outside the step, by the adapter's ``_scores``, as in the eager loop. Whisper pads every clip to its 30-second window,
so the encoder length is fixed and the graph depends on (B, bucket of Lp + T, dtype, device) only.

Shape glossary: ``P`` prompts, ``G`` group size, ``B = P·G``, ``Lp`` decoder-prompt length, ``T`` completion tokens,
``S`` static self-attention length, ``E`` encoder positions, ``D`` model width, ``V`` vocabulary.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from transformers.cache_utils import EncoderDecoderCache

from .. import _hf
from ..tokens.compiled_decode import CompiledDecoder, bucket_length, load_prefix
from ..tokens.decode import SamplingSpec


def whisper_step(
    model: torch.nn.Module, cache: EncoderDecoderCache, enc_row: Tensor, tokens: Tensor, mask: Tensor, positions: Tensor
) -> Tensor:
    """One decoder step over the static caches: logits of the next token.

    Shape:
        enc_row: [1, E, D] (its B-row expansion only shapes the call); tokens, positions: [B, 1]; mask: [B, S]
        returns [B, V]
    """
    enc = enc_row.expand(tokens.shape[0], -1, -1)  # [B, E, D] view
    out = model(
        encoder_outputs=(enc,),
        decoder_input_ids=tokens,
        decoder_attention_mask=mask,
        decoder_position_ids=positions,
        use_cache=True,
        **_hf.kv_cache(cache),
    )
    return out.logits[:, -1]  # [B, V]


class StaticWhisperStepper:
    """:class:`~mmgrpo.modalities.tokens.decode.Stepper` of the eager Whisper stepper's distribution over static
    caches and a compiled step (the module docstring). ``adapter`` is the :class:`.adapter.WhisperAdapter`."""

    def __init__(self, adapter: Any, model: torch.nn.Module, cache: Any, reserve: int, decoder: CompiledDecoder):
        self.adapter, self.model, self.audio, self.reserve, self.decoder = adapter, model, cache, reserve, decoder

    def prefill(self, group_size: int) -> Tensor:
        a = self.adapter
        enc = a._encode(self.model, self.audio.features)  # [P, E, D], once per prompt
        P = enc.shape[0]
        prefix = a.prefix.to(a.device).expand(P, -1)  # [P, Lp]
        out = self.model(encoder_outputs=(enc,), decoder_input_ids=prefix, use_cache=True)  # eager prefill
        kv = _hf.returned_cache(out)
        rows = torch.arange(P, device=a.device).repeat_interleave(group_size)  # [B]
        B, Lp = P * group_size, prefix.shape[1]
        S = bucket_length(Lp + self.reserve, self.decoder.bucket)
        own, cross = kv.self_attention_cache.layers, kv.cross_attention_cache.layers
        own_static = self.decoder.static_cache([(la.keys, la.values) for la in own], B, S)
        cross_static = self.decoder.static_cache([(la.keys, la.values) for la in cross], B, enc.shape[1], "cross")
        self.L = load_prefix(own_static, own, rows)
        load_prefix(cross_static, cross, rows)
        self.cache = EncoderDecoderCache(own_static, cross_static)  # every cross layer marked computed (is_updated)
        self.enc_row = self.decoder.static_buffer(enc[:1], "encoder_row")  # [1, E, D] the first prompt's states
        self.mask = prefix.new_zeros((B, S))  # [B, S]
        self.mask[:, : self.L] = 1
        self.step_fn = self.decoder.step_fn(enc.device, whisper_step)
        return out.logits[:, -1].index_select(0, rows)  # [B, V]

    def scores(self, logits: Tensor, step: int, spec: SamplingSpec) -> Tensor:
        return self.adapter._scores(logits, step == 0, spec.greedy)

    def step(self, tokens: Tensor, step: int) -> Tensor:
        self.mask[:, self.L + step] = 1
        positions = torch.full_like(tokens[:, None], self.L + step)  # [B, 1]
        return self.step_fn(self.model, self.cache, self.enc_row, tokens[:, None], self.mask, positions).clone()
