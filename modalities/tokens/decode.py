"""The one decode loop of every token family: a model-specific :class:`Stepper` and a shared :func:`decode`.

Every token policy — VLM, video and audio LLMs (KV-expanded prompt sharing, :mod:`.prefix_sharing`), Whisper
(encoder–decoder, :mod:`mmgrpo.modalities.speech.adapter`) and autoregressive image generation with classifier-free
guidance (:mod:`mmgrpo.modalities.ar_image.adapter`) — samples G completions per prompt the same way:

1. **prefill** the P prompts once and expand the cache G ways (group-major rows, sample b of prompt b // G);
2. per step t, turn the stepper's logits into the fp32 **scores** of the sampling distribution (banned tokens at
   −inf, temperature applied; the family decides what "logits" are: a CFG mix for AR image, suppressed
   timestamp tokens for Whisper);
3. **draw** one token per row (:func:`draw_token`: greedy argmax, inversion with one uniform per row, or
   ``torch.multinomial`` — HF ``generate``'s draw) and keep its log-prob ``scores[token] − logsumexp(scores)``
   (the distribution before top-k/top-p truncation, as the training forward computes it);
4. keep the EOS/length bookkeeping (tokens after a row's first EOS are ``pad_id`` with log-prob 0);
5. stop when every row has finished — with ``spec.synced`` (sharded weights, FSDP), when every row of **every
   process** has (:func:`mmgrpo.sharding.done_everywhere`), because each forward of a sharded model is a collective
   and a process that stopped early would leave the others waiting. The check reads a device flag on the host, a
   synchronisation: on CUDA it runs every :data:`STOP_CHECK_EVERY` steps, so the host queues the next steps while
   the device runs this one (steps past the last EOS only add pad tokens: the output is the same);
6. otherwise **step**: feed the drawn tokens and get the next logits.

Only :meth:`Stepper.prefill`, :meth:`Stepper.scores` and :meth:`Stepper.step` are family code; drawing, noise,
EOS and the cross-process stop live here once.

Noise. :func:`decode` takes the rollout's :class:`mmgrpo.noise.NoiseKeys` explicitly (the trainer's default
``rollout_noise: keyed``): row b draws its token at step t by inversion with the uniform u[b, t] of its own keyed
generator, so its tokens do not depend on the other rows of the batch or on the process. Without keys the draw
uses the global RNG (or ``generator``): inversion with ``torch.rand`` or ``torch.multinomial`` (``spec.draw``).

Shape glossary: ``P`` prompts, ``G`` group size, ``B = P·G`` (group-major), ``T`` completion tokens, ``V``
vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor
from transformers.cache_utils import Cache, DynamicLayer, EncoderDecoderCache

from mmgrpo import noise, sharding


@dataclass
class SamplingSpec:
    """How tokens are drawn; the log-probs returned are those of ``log_softmax(scores)`` before top-k/top-p."""

    max_new_tokens: int
    eos_ids: list[int]
    pad_id: int
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_new_tokens: int = 0
    suppress_ids: tuple[int, ...] = ()
    greedy: bool = False
    synced: bool = False  # sharded weights (FSDP): keep stepping until every process's rows have finished
    draw: str = "multinomial"  # multinomial (HF generate's draws under a seed) | inverse_cdf (one uniform per row)


class Stepper(Protocol):
    """The model-specific half of :func:`decode`. One instance serves one decode call."""

    def prefill(self, group_size: int) -> Tensor:
        """Run the P prompts once, expand their cache G ways; the logits of the first completion token. [B, V]."""
        ...

    def scores(self, logits: Tensor, step: int, spec: SamplingSpec) -> Tensor:
        """fp32 scores of the sampling distribution at completion step ``step`` (before top-k/top-p). [B, V]."""
        ...

    def step(self, tokens: Tensor, step: int) -> Tensor:
        """Feed the tokens drawn at completion step ``step`` ([B]); the logits of the next token. [B, V]."""
        ...


def sampling_scores(logits: Tensor, step: int, spec: SamplingSpec) -> Tensor:
    """fp32 scores at completion step ``step``: ``suppress_ids`` (and the EOS ids before ``min_new_tokens``) at
    −inf, then the temperature (not when greedy). The default :meth:`Stepper.scores`. [n, V] → [n, V]."""
    scores = logits.float()
    banned = list(spec.suppress_ids) + (spec.eos_ids if step < spec.min_new_tokens else [])
    if banned:
        scores[:, banned] = float("-inf")
    if not spec.greedy and spec.temperature != 1.0:
        scores = scores / spec.temperature
    return scores


def truncate(scores: Tensor, top_k: int, top_p: float) -> Tensor:
    """Top-k then nucleus truncation (HF's rules: keep ties at the k-th score; keep at least one token). [n, V]."""
    if 0 < top_k < scores.shape[-1]:
        kth = torch.topk(scores, top_k).values[:, -1:]  # [n, 1]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if top_p < 1.0:
        sorted_scores, order = torch.sort(scores, descending=False)  # [n, V]
        cum = sorted_scores.softmax(dim=-1).cumsum(dim=-1)
        drop = cum <= 1 - top_p
        drop[:, -1] = False
        scores = scores.masked_fill(drop.scatter(1, order, drop), float("-inf"))
    return scores


def draw_token(
    scores: Tensor, spec: SamplingSpec, u: Tensor | None = None, generator: torch.Generator | None = None
) -> tuple[Tensor, Tensor]:
    """One token per row from ``softmax(truncate(scores))`` and its log-prob under ``softmax(scores)``.

    The log-prob is ``scores[token] − logsumexp(scores)``: one gather and one reduction, no ``[B, V]``
    log-softmax. ``spec.draw`` picks how the categorical draw is made:

    * ``multinomial``: ``torch.multinomial(softmax(warped))`` (with ``generator`` if given), HF ``generate``'s
      draw, so a fixed seed gives generate's tokens. On CPU its one-sample path draws V exponentials per row (the
      exponential race of ``aten/src/ATen/native/Distributions.cpp``, pytorch/pytorch), ~40 ns each: at
      V = 151,936 and B = 32 that is ~0.2 s per decoding step, more than the lm_head matmul.
    * ``inverse_cdf``: :func:`mmgrpo.noise.draw_by_inversion` with one ``torch.rand`` uniform per row; the same
      distribution, other draws.

    Given ``u`` (the row's keyed uniform, :mod:`mmgrpo.noise`) the draw is by inversion with it, whatever
    ``spec.draw`` says.

    Shape:
        scores: [B, V] fp32 (banned tokens at −inf, temperature applied); u: [B] in [0, 1) or None
        returns token [B] long, logprob [B] fp32
    """
    if spec.greedy:
        token = scores.argmax(dim=-1)  # [B]
        return token, scores.gather(1, token[:, None]).squeeze(1) - scores.logsumexp(dim=-1)
    truncated = spec.top_k > 0 or spec.top_p < 1.0
    warped = truncate(scores, spec.top_k, spec.top_p) if truncated else scores  # [B, V]
    if u is not None or spec.draw == "inverse_cdf":
        if u is None:
            u = torch.rand(scores.shape[0], dtype=torch.float64, device=scores.device, generator=generator)  # [B]
        top = warped.amax(dim=-1, keepdim=True)  # [B, 1]
        weights = (warped - top).exp_()  # [B, V] unnormalised probabilities, 0 at banned/truncated tokens
        token, total = noise.draw_by_inversion(weights, u)  # [B], [B] fp64
        lse = scores.logsumexp(dim=-1) if truncated else top.squeeze(1) + total.log().float()  # [B]
    elif spec.draw == "multinomial":
        token = torch.multinomial(warped.softmax(dim=-1), num_samples=1, generator=generator).squeeze(1)  # [B]
        lse = scores.logsumexp(dim=-1)  # [B]
    else:
        raise ValueError(f"SamplingSpec.draw: {spec.draw!r} not allowed; choose multinomial | inverse_cdf")
    return token, scores.gather(1, token[:, None]).squeeze(1) - lse


STOP_CHECK_EVERY = {"cuda": 8}
"""Decoding steps between two stop checks, by device type (1 elsewhere). Each check waits for the device: with CUDA
graphs a step's host work (the draw, the graph launch) and its device work then run one after the other instead of
overlapping. On an H200 (SmolLM2-135M, 16 rows, fp32) the profiled step was ~2.6 ms of host time and ~6.2 ms of
kernels (benchmarks/step_profile.py). At most ``STOP_CHECK_EVERY - 1`` steps run after every row has ended."""


@torch.no_grad()
def decode(
    stepper: Stepper,
    group_size: int,
    spec: SamplingSpec,
    keys: noise.NoiseKeys | None = None,
    generator: torch.Generator | None = None,
) -> tuple[Tensor, Tensor]:
    """Sample ``group_size`` completions per prompt: the one decode loop (see the module docstring).

    ``keys`` (ignored when greedy) must describe exactly the B rows the stepper expands to; ``generator`` feeds
    the unkeyed draws (default: the global RNG).

    Shape:
        returns completion_ids [B, T] (long, pad after EOS, on the logits' device), logprobs [B, T] fp32 (0 there)
    """
    logits = stepper.prefill(group_size)  # [B, V]
    B, T, device = logits.shape[0], spec.max_new_tokens, logits.device
    u = None
    if keys is not None and not spec.greedy:
        keys.check(B, "decode")
        u = noise.uniforms(keys.generators(), T, device)  # [B, T] float64, one per row and step
    eos = torch.tensor(spec.eos_ids, dtype=torch.long, device=device)
    ids = torch.full((B, T), spec.pad_id, dtype=torch.long, device=device)  # [B, T]
    logprobs = torch.zeros((B, T), dtype=torch.float32, device=device)  # [B, T]
    done = torch.zeros(B, dtype=torch.bool, device=device)  # [B]
    check = STOP_CHECK_EVERY.get(device.type, 1)
    for t in range(T):
        scores = stepper.scores(logits, t, spec)  # [B, V] fp32
        token, step_logp = draw_token(scores, spec, None if u is None else u[:, t], generator)  # [B], [B]
        token = torch.where(done, torch.full_like(token, spec.pad_id), token)
        ids[:, t] = token
        logprobs[:, t] = torch.where(done, torch.zeros_like(step_logp), step_logp)
        done = done | torch.isin(token, eos)
        if t == T - 1 or ((t + 1) % check == 0 and all_done(done, spec.synced)):
            break
        logits = stepper.step(token, t)  # [B, V]
    return ids, logprobs


class ReservedLayer(DynamicLayer):
    """A KV-cache layer whose keys/values live in a buffer reserved for the whole completion.

    transformers' ``DynamicLayer.update`` grows the cache by ``torch.cat`` at every decoding step, so step t copies
    all L + t cached positions of every layer (an O((L + T)·T) copy over a completion, and a fresh allocation per
    layer and step). Here the prompt's keys/values are copied once into a buffer with room for ``extra`` more
    positions, each step writes its new positions in place, and ``keys``/``values`` are views of the filled part
    (same values, same shapes: attention and the mask sizes are unchanged). Past the reserved room it falls back
    to growing by concatenation, so a longer continuation is never wrong. For sampling only (in-place writes).
    """

    def __init__(self, keys: Tensor, values: Tensor, extra: int):
        super().__init__()
        n = keys.shape[-2]
        self._k = keys.new_empty((*keys.shape[:-2], n + extra, keys.shape[-1]))  # [B, H, L + extra, d]
        self._v = values.new_empty((*values.shape[:-2], n + extra, values.shape[-1]))
        self._k[..., :n, :].copy_(keys)
        self._v[..., :n, :].copy_(values)
        self.device, self.is_initialized = keys.device, True
        self.keys, self.values = self._k[..., :n, :], self._v[..., :n, :]

    def update(self, key_states: Tensor, value_states: Tensor, *args, **kwargs) -> tuple[Tensor, Tensor]:
        self._k, self.keys = append_positions(self._k, self.keys, key_states)
        self._v, self.values = append_positions(self._v, self.values, value_states)
        return self.keys, self.values

    def reorder_cache(self, beam_idx: Tensor) -> None:
        """Rows ``beam_idx`` of the buffer (room included): reserving before the G-way expansion copies the P
        prompts once and expands into buffers that already have the room."""
        n = self.keys.shape[-2]
        self._k = self._k.index_select(0, beam_idx.to(self._k.device))
        self._v = self._v.index_select(0, beam_idx.to(self._v.device))
        self.keys, self.values = self._k[..., :n, :], self._v[..., :n, :]


def append_positions(buffer: Tensor, filled: Tensor, new: Tensor) -> tuple[Tensor, Tensor]:
    """Write ``new`` after ``filled`` (the filled front of ``buffer`` along positions, dim −2) in place; past the
    buffer's room, grow by concatenation as transformers does. Returns (the buffer, its filled front).

    Shape: buffer [..., S, d]; filled [..., n, d]; new [..., t, d] → [..., max(S, n + t), d], [..., n + t, d]"""
    n = filled.shape[-2]
    m = n + new.shape[-2]
    if m > buffer.shape[-2]:
        buffer = torch.cat([filled, new], dim=-2)
    else:
        buffer[..., n:m, :].copy_(new)
    return buffer, buffer[..., :m, :]


def reserve_cache(cache: Cache, extra: int) -> None:
    """Give every plain dynamic layer of ``cache`` (full attention, already filled) room for ``extra`` more
    positions, in place (:class:`ReservedLayer`). Other layer kinds (sliding window, static, quantized, linear
    attention) are left as they are."""
    layers = cache.self_attention_cache.layers if isinstance(cache, EncoderDecoderCache) else cache.layers
    for i, layer in enumerate(layers):
        if type(layer) is DynamicLayer and layer.is_initialized and layer.keys is not None and layer.keys.dim() == 4:
            layers[i] = ReservedLayer(layer.keys, layer.values, extra)


def all_done(done: Tensor, synced: bool) -> bool:
    """Whether decoding can stop: every row here has finished and, when ``synced``, every row of every process."""
    finished = bool(done.all())
    return sharding.done_everywhere(finished, done.device) if synced else finished
