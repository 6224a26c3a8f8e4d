"""Log-probabilities of the sampled tokens without the ``[n, T, V]`` log-softmax.

A token policy's log-prob is ``log softmax(scores)[token]`` with ``scores = mask(logits) / τ``: banned tokens at
−inf (they are never sampled, so they are not part of the distribution), then the temperature. Written as
``torch.log_softmax(scores).gather(...)`` this materialises fp32 copies of the ``[n, T, V]`` logits — the
upcast, the scaled scores and the log-softmax, which autograd keeps for the backward — and at a real vocabulary
(Qwen2.5-VL: V = 151,936) each of them is gigabytes per minibatch. Only one column of the log-softmax is wanted:

    log π(x_t) = s_t[x_t] − logsumexp_v s_t[v]

:func:`token_logprobs` gathers the token's score and computes the logsumexp over the vocabulary in chunks of
``chunk`` columns (each chunk upcast to fp32, masked and scaled, its logsumexp folded into a running one with
``logaddexp``). Its backward recomputes the softmax chunk by chunk from the saved logits and the ``[n, T]``
logsumexp, ``∂ log π(x_t) / ∂ℓ_t[v] = (1[v = x_t] − softmax(s_t)[v]) / τ`` (0 at banned tokens), writing each
chunk of the gradient in the logits' dtype. So the only ``[n, T, V]`` tensors are the logits, which the model
produced anyway, and their gradient, which autograd needs anyway; the extra memory is O(n·T·chunk).

The idea is that of TRL's ``selective_log_softmax`` (huggingface/trl, ``trl/trainer/utils.py``), which gathers
the token's logit and subtracts a row-chunked logsumexp; here the chunks run over the vocabulary, the mask and the
temperature are applied inside the chunks, and the backward is custom so no chunk's activations are kept.

The values equal ``torch.log_softmax(scores, -1).gather(-1, tokens)`` up to float rounding (the running
logsumexp sums in another order; tests/test_token_logprobs.py measures both values and gradients).

Shape glossary: ``n`` rows, ``T`` positions, ``V`` vocabulary; ``...`` any leading dimensions.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

DEFAULT_CHUNK = 4096
"""Vocabulary columns per chunk: the temporaries are a few fp32 tensors of n·T·chunk values."""


def token_logprobs(
    logits: Tensor,
    tokens: Tensor,
    *,
    temperature: float = 1.0,
    banned: Tensor | None = None,
    chunk: int = DEFAULT_CHUNK,
) -> Tensor:
    """fp32 ``log softmax(mask(logits) / temperature)`` at ``tokens``, differentiable w.r.t. ``logits``.

    ``logits`` may be in any float dtype (bf16 logits are upcast chunk by chunk, so the result is that of
    ``logits.float()``). Pass already-processed scores (e.g. guided logits) with the defaults.

    Shape:
        logits: [..., V] (any float dtype)
        tokens: [...] (long) the sampled token at each position
        banned: bool, broadcastable to [..., V] (e.g. [V], or [T, V] for position-dependent bans); True = −inf
        returns [...] fp32
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1, got {chunk}")
    return _TokenLogProbs.apply(logits, tokens, banned, float(temperature), int(chunk))


def banned_mask(
    vocab_size: int,
    always: Sequence[int] = (),
    early: Sequence[int] = (),
    early_steps: int = 0,
    steps: int = 1,
    device: torch.device | str | None = None,
) -> Tensor | None:
    """The ``banned`` argument of :func:`token_logprobs`: ``always`` at every position, ``early`` at the first
    ``early_steps`` of ``steps`` positions (a min-new-tokens EOS ban, Whisper's begin-suppressed tokens).

    Shape: returns bool [V] when only ``always`` is given, [steps, V] otherwise; None when nothing is banned.
    """
    early_steps = min(early_steps, steps) if early else 0
    if not always and not early_steps:
        return None
    mask = torch.zeros((steps, vocab_size) if early_steps else (vocab_size,), dtype=torch.bool, device=device)
    if always:
        mask[..., list(always)] = True
    if early_steps:
        mask[:early_steps, list(early)] = True
    return mask


def _chunk_scores(logits: Tensor, banned: Tensor | None, lo: int, hi: int, temperature: float) -> Tensor:
    """fp32 scores of vocabulary columns [lo, hi). [..., V] → [..., hi − lo]."""
    scores = logits[..., lo:hi].float()
    if banned is not None:
        scores = scores.masked_fill(banned[..., lo:hi], float("-inf"))
    return scores / temperature if temperature != 1.0 else scores


class _TokenLogProbs(torch.autograd.Function):
    """Chunked gather-minus-logsumexp with a chunked softmax backward (see the module docstring)."""

    @staticmethod
    def forward(ctx, logits: Tensor, tokens: Tensor, banned: Tensor | None, temperature: float, chunk: int) -> Tensor:
        V = logits.shape[-1]
        starts = range(0, V, chunk)
        peak = torch.stack([_chunk_scores(logits, banned, lo, lo + chunk, temperature).amax(-1) for lo in starts])
        peak = peak.amax(0)  # [...] max score of each row
        total = torch.zeros_like(peak)  # [...] Σ_v exp(s[v] − peak), fp32
        for lo in starts:
            total += torch.exp(_chunk_scores(logits, banned, lo, lo + chunk, temperature) - peak[..., None]).sum(-1)
        log_total = total.log()  # [...]
        index = tokens[..., None]  # [..., 1]
        picked = logits.gather(-1, index).float()  # [..., 1]
        if banned is not None:
            picked = picked.masked_fill(banned.expand(logits.shape).gather(-1, index), float("-inf"))
        picked = picked.squeeze(-1) / temperature if temperature != 1.0 else picked.squeeze(-1)  # [...]
        ctx.save_for_backward(logits, tokens, peak, log_total, banned)
        ctx.temperature, ctx.chunk = temperature, chunk
        return (picked - peak) - log_total  # [...] fp32, rounded as torch.log_softmax rounds

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        logits, tokens, peak, log_total, banned = ctx.saved_tensors
        tau, chunk = ctx.temperature, ctx.chunk
        V = logits.shape[-1]
        grad = torch.empty_like(logits)  # [..., V], the logits' dtype
        g = grad_out.float()[..., None]  # [..., 1]
        for lo in range(0, V, chunk):
            hi = min(lo + chunk, V)
            scores = _chunk_scores(logits, banned, lo, hi, tau)  # [..., c]
            probs = torch.exp((scores - peak[..., None]) - log_total[..., None])  # [..., c] softmax
            part = -g * probs  # [..., c]
            inside = (tokens >= lo) & (tokens < hi)  # [...]
            part.scatter_add_(-1, (tokens - lo).clamp(0, hi - lo - 1)[..., None], g * inside[..., None])
            if banned is not None:
                part = part.masked_fill(banned[..., lo:hi], 0.0)  # the mask's gradient is 0 at banned tokens
            grad[..., lo:hi] = part / tau if tau != 1.0 else part
        return grad, None, None, None, None


def completion_id_lists(completion_ids: Tensor, mask: Tensor) -> list[list[int]]:
    """The ``completion_ids`` reward column: each sample's tokens up to and including its first EOS, as TRL's
    ``GRPOTrainer`` passes them (``completion_ids_list``, trl/trainer/grpo_trainer.py); ``mask_truncated`` does
    not shorten them. Shape: [B, T] ids and [B, T] mask (1 up to the first EOS) → B lists."""
    return [ids[m.bool()].tolist() for ids, m in zip(completion_ids.cpu(), mask.cpu())]
