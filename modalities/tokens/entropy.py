"""The entropy of the sampling distribution at every position, from the fused lm_head, without the ``[n, T, V]`` logits.

A token policy samples from ``π = softmax(s)`` with ``s = mask(hidden @ W.T + b) / τ`` (banned tokens at −inf, then
the temperature: ``modalities/tokens/logprobs.py``). Its entropy at a position is

    H = −Σ_v π_v log π_v = logsumexp(s) − Σ_v π_v s_v

(TRL's ``entropy_from_logits``, huggingface/trl ``trl/trainer/utils.py``, and verl's ``entropy_from_logits``,
volcengine/verl ``verl/utils/torch_functional.py``, compute it on the materialised logits). Here it runs block by
block — ``rows`` positions × ``chunk`` vocabulary columns — with an online reduction: per row a running maximum
``m``, ``S = Σ exp(s − m)`` and ``A = Σ exp(s − m)·(s − m)``; a block that raises the maximum from ``m`` to ``m'``
rescales both, ``A ← e^{m−m'}(A + (m − m')·S)``, ``S ← e^{m−m'}·S``. At the end ``H = log S − A / S`` (shift-free:
no cancellation of two large numbers). The backward recomputes each block's scores and multiplies out

    ∂H/∂s_v = −π_v (log π_v + H)        (0 at banned tokens, ÷τ for the logits)

into the gradients of ``hidden``, ``weight`` and ``bias`` (fp32 accumulation), so neither the logits nor their
gradient ever exists, as in :func:`~mmgrpo.modalities.tokens.logprobs.linear_token_logprobs`.
:func:`token_entropy` is the same quantity on logits a model already produced (the unfused path, and the tests'
reference). tests/test_entropy.py compares both paths' values and gradients and measures the fused path's peak
memory at Qwen2.5's vocabulary (151,936).

Shape glossary: ``n`` rows, ``T`` positions, ``V`` vocabulary, ``H`` hidden size; ``...`` any leading dimensions.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .logprobs import DEFAULT_CHUNK, DEFAULT_ROWS, _block_scores, check_blocks, flat_bans


def token_entropy(logits: Tensor, *, temperature: float = 1.0, banned: Tensor | None = None) -> Tensor:
    """fp32 entropy of ``softmax(mask(logits) / temperature)`` at every position, on materialised logits (autograd's
    own backward). Shape: logits [..., V]; banned broadcastable to [..., V] (True = −inf); returns [...]."""
    scores = logits.float()  # [..., V]
    if banned is not None:
        scores = scores.masked_fill(banned, float("-inf"))
    if temperature != 1.0:
        scores = scores / temperature
    logp = torch.log_softmax(scores, dim=-1)  # [..., V]
    return -(logp.exp() * logp.masked_fill(torch.isinf(logp), 0.0)).sum(-1)  # [...]


def linear_token_entropy(
    hidden: Tensor,
    weight: Tensor,
    *,
    bias: Tensor | None = None,
    temperature: float = 1.0,
    banned: Tensor | None = None,
    rows: int = DEFAULT_ROWS,
    chunk: int = DEFAULT_CHUNK,
    round_to: torch.dtype | None = None,
) -> Tensor:
    """fp32 entropy of ``softmax(mask(hidden @ weight.T + bias) / temperature)`` at every position, block by block
    (the module docstring): no ``[..., V]`` tensor in the forward or the backward. ``round_to`` as in
    ``linear_token_logprobs`` (the head's own low-precision product, then upcast; fp32 backward).

    Shape:
        hidden: [..., H]; weight: [V, H]; bias: [V] or None
        banned: bool, broadcastable to [..., V] ([V], or [T, V] for position-dependent bans); True = −inf
        returns [...] fp32
    """
    check_blocks(temperature, rows, chunk)
    if hidden.shape[-1] != weight.shape[-1]:
        raise ValueError(f"shapes do not match: hidden {tuple(hidden.shape)}, weight {tuple(weight.shape)}")
    lead = hidden.shape[:-1]
    banned, ban_row = flat_bans(banned, lead)
    flat = hidden.reshape(-1, hidden.shape[-1])  # [N, H]
    out = _LinearTokenEntropy.apply(flat, weight, bias, banned, ban_row, float(temperature), rows, chunk, round_to)
    return out.reshape(lead)


class _LinearTokenEntropy(torch.autograd.Function):
    """Blocked matmul + online (max, Σe, Σe·z) reduction; the backward recomputes each block."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, banned, ban_row, temperature, rows, chunk, round_to):
        N, V = hidden.shape[0], weight.shape[0]
        peak = hidden.new_full((N,), float("-inf"), dtype=torch.float32)  # [N] running max score m
        total = hidden.new_zeros((N,), dtype=torch.float32)  # [N] S = Σ exp(s − m)
        moment = hidden.new_zeros((N,), dtype=torch.float32)  # [N] A = Σ exp(s − m)·(s − m)
        for r0 in range(0, N, rows):
            r1 = min(r0 + rows, N)
            h = hidden[r0:r1] if round_to is not None else hidden[r0:r1].float()  # [r, H]
            br = None if ban_row is None else ban_row[r0:r1]
            m, s, a = peak[r0:r1], total[r0:r1], moment[r0:r1]  # views, updated in place
            for lo in range(0, V, chunk):
                hi = min(lo + chunk, V)
                z = _block_scores(h, weight, bias, banned, br, lo, hi, temperature, round_to)  # [r, c]
                new = torch.maximum(m, z.amax(-1))  # [r]
                safe = new.masked_fill(new == float("-inf"), 0.0)  # all −inf so far: nothing to rescale
                shift = (m - safe).masked_fill(m == float("-inf"), 0.0)  # [r] m − m' (0 before any finite score)
                scale = torch.exp(m - safe)  # [r] e^{m − m'} (0 before any finite score)
                a.add_(shift * s).mul_(scale)
                s.mul_(scale)
                z.sub_(safe[:, None])  # [r, c] s − m'
                e = z.exp()  # [r, c]
                s.add_(e.sum(-1))
                a.add_(e.mul_(z.nan_to_num_(neginf=0.0)).sum(-1))  # banned: e = 0, z = −inf → 0
                m.copy_(new)
        ent = total.log() - moment / total  # [N] H = log S − A / S
        log_z = peak + total.log()  # [N] logsumexp(s)
        ctx.save_for_backward(hidden, weight, bias, banned, ban_row, log_z, ent)
        ctx.setting = (temperature, rows, chunk, round_to)
        return ent

    @staticmethod
    def backward(ctx, grad_out):
        hidden, weight, bias, banned, ban_row, log_z, ent = ctx.saved_tensors
        tau, rows, chunk, round_to = ctx.setting
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        N, V = hidden.shape[0], weight.shape[0]
        g_all = grad_out.float()  # [N]
        grad_h = torch.zeros(hidden.shape, dtype=torch.float32, device=hidden.device) if need_h else None  # [N, H]
        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if need_w else None  # [V, H]
        grad_b = torch.zeros((V,), dtype=torch.float32, device=weight.device) if need_b else None  # [V]
        for r0 in range(0, N, rows):
            r1 = min(r0 + rows, N)
            h = hidden[r0:r1].float()  # [r, H]
            hs = hidden[r0:r1] if round_to is not None else h
            br = None if ban_row is None else ban_row[r0:r1]
            lz, H, g = log_z[r0:r1, None], ent[r0:r1, None], g_all[r0:r1, None]  # [r, 1] each
            for lo in range(0, V, chunk):
                hi = min(lo + chunk, V)
                logp = _block_scores(hs, weight, bias, banned, br, lo, hi, tau, round_to).sub_(lz)  # [r, c] log π
                p = logp.exp()  # [r, c]
                part = p.mul_(logp.nan_to_num_(neginf=0.0).add_(H)).mul_(-g)  # [r, c] g·∂H/∂s (0 where banned)
                if tau != 1.0:
                    part.div_(tau)  # [r, c] ∂/∂logits
                if need_h:
                    grad_h[r0:r1] += part @ weight[lo:hi].float()  # [r, H]
                if need_w:
                    grad_w[lo:hi] += part.T @ h  # [c, H]
                if need_b:
                    grad_b[lo:hi] += part.sum(0)
        return (
            None if grad_h is None else grad_h.to(hidden.dtype),
            None if grad_w is None else grad_w.to(weight.dtype),
            None if grad_b is None else grad_b.to(bias.dtype),
            *([None] * 6),
        )


def head_entropy(
    out: Tensor, head: torch.nn.Linear | None, *, temperature: float = 1.0, banned: Tensor | None = None
) -> Tensor:
    """:func:`linear_token_entropy` of ``out`` through ``head`` when ``head`` is given (``out`` is then the hidden
    states a forward under ``head_outputs_hidden`` returned), else :func:`token_entropy` of the logits ``out``; a
    low-precision head's product is rounded as the model's own (``head_logprobs`` does the same).

    Shape: out [..., H] or [..., V]; banned broadcastable to [..., V]; returns [...] fp32
    """
    if head is None:
        return token_entropy(out, temperature=temperature, banned=banned)
    dtype = torch.promote_types(out.dtype, head.weight.dtype)
    round_to = dtype if torch.finfo(dtype).bits < 32 else None
    return linear_token_entropy(
        out, head.weight, bias=head.bias, temperature=temperature, banned=banned, round_to=round_to
    )
