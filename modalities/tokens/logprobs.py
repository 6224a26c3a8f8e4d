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

import logging
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import torch
from torch import Tensor

from mmgrpo.compat import graph_task_id, has_forward_hooks
from mmgrpo.hostmem import trim_heap

from .. import _hf

logger = logging.getLogger(__name__)

LATE_GRADIENT_MIN_BYTES = 32 * 2**20
"""A tied head's weight gradient (fp32) at least this large is computed at the end of the backward (:class:`TiedGrad`);
a smaller one in the head's backward. 32 MiB is where glibc maps a block of its own instead of reusing freed heap
(mmgrpo/hostmem.py): below it the gradient adds little to the peak and the extra pass over the logits is not worth
it (on the real-mix benchmark model, a 1.2 MB gradient, deferring cost ~8% of the step and saved nothing)."""

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


# ------------------------------------------------------------------------------------- fused lm_head


DEFAULT_ROWS = 1024
"""Rows (positions) per block of the fused path: its temporaries are a few fp32 tensors of rows × chunk values."""


def linear_token_logprobs(
    hidden: Tensor,
    weight: Tensor,
    tokens: Tensor,
    *,
    bias: Tensor | None = None,
    temperature: float = 1.0,
    banned: Tensor | None = None,
    rows: int = DEFAULT_ROWS,
    chunk: int = DEFAULT_CHUNK,
    round_to: torch.dtype | None = None,
    late: TiedGrad | None = None,
) -> Tensor:
    """fp32 ``log softmax(mask(hidden @ weight.T + bias) / temperature)`` at ``tokens``, without the logits.

    The fused linear log-prob: the lm_head's matmul, the mask, the temperature and the log-sum-exp run block by
    block — ``rows`` positions × ``chunk`` vocabulary columns — so neither the ``[..., V]`` logits nor their
    gradient ever exists; the backward recomputes each block's logits and accumulates the gradients of
    ``hidden``, ``weight`` and ``bias`` in fp32. It is the idea of Liger-Kernel's fused linear cross-entropy
    (Hsu et al. 2024, arXiv 2410.10989; linkedin/Liger-Kernel ``ops/fused_linear_cross_entropy.py``) and of
    cut-cross-entropy (Wijmans et al. 2024, arXiv 2411.09009), written in torch so it runs on any device; here the
    output is one log-prob per position (the loss weighs each one), so unlike Liger's scalar loss the gradient
    cannot be folded into the forward and the backward recomputes the logits (4 matmuls of the head's size per
    forward + backward instead of 3).

    Per block the logits are ``hidden.float() @ weight.float().T`` (fp32 accumulation; bf16 weights are upcast
    block by block). With ``round_to`` (e.g. bf16) each block is instead computed in that dtype — the product a
    bf16 model's own head computes (fp32 accumulation inside the kernel, the result rounded to bf16) — and then
    upcast, so the log-probs are those of the logits the model samples from (:func:`head_logprobs` does this for a
    low-precision head); the backward still runs in fp32 (the rounding passes the gradient through, as a cast does).
    The log-sum-exp is the online one (a running max and a rescaled running sum, as in flash attention). Values and
    gradients equal :func:`token_logprobs` on ``hidden @ weight.T + bias`` to float rounding
    (tests/test_fused_logprobs.py).

    Shape:
        hidden: [..., H] (any float dtype); weight: [V, H]; bias: [V] or None; tokens: [...] (long)
        banned: bool, broadcastable to [..., V] ([V], or [T, V] for position-dependent bans); True = −inf
        returns [...] fp32
    """
    check_blocks(temperature, rows, chunk)
    if hidden.shape[-1] != weight.shape[-1] or hidden.shape[:-1] != tokens.shape:
        raise ValueError(
            f"shapes do not match: hidden {tuple(hidden.shape)}, weight {tuple(weight.shape)}, "
            f"tokens {tuple(tokens.shape)} (want [..., H], [V, H], [...])"
        )
    lead = tokens.shape
    banned, ban_row = flat_bans(banned, lead)
    out = _LinearTokenLogProbs.apply(
        hidden.reshape(-1, hidden.shape[-1]), weight, bias, tokens.reshape(-1), banned, ban_row,
        float(temperature), int(rows), int(chunk), round_to, late,
    )  # fmt: skip
    return out.reshape(lead)


def check_blocks(temperature: float, rows: int, chunk: int) -> None:
    """The fused lm_head's arguments (:func:`linear_token_logprobs`, :func:`.entropy.linear_token_entropy`): a
    positive temperature and blocks of at least one row and one vocabulary column; ``ValueError`` otherwise."""
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if rows < 1 or chunk < 1:
        raise ValueError(f"rows and chunk must be >= 1, got {rows} and {chunk}")


def flat_bans(banned: Tensor | None, lead: torch.Size) -> tuple[Tensor | None, Tensor | None]:
    """``banned`` as one row per ban pattern, and the pattern each flattened position of ``lead`` uses: position r
    reads row ``ban_row[r]`` of the returned ``[n, V]`` (a ``[V]`` ban is one row for all, a ``[T, V]`` ban one per
    position), so the blocks of the fused head mask without expanding the bans to ``[N, V]``. (None, None) without
    bans.

    Shape:
        banned: bool [..., V], broadcastable to lead + [V]; lead: the positions' shape [...] (N positions)
        returns banned [n, V], ban_row [N] long
    """
    if banned is None:
        return None, None
    ban_row = torch.arange(banned[..., 0].numel(), device=banned.device).reshape(banned.shape[:-1])  # [...]
    return banned.reshape(-1, banned.shape[-1]), ban_row.expand(lead).reshape(-1)  # [n, V], [N]


def _block_scores(
    h: Tensor, weight: Tensor, bias: Tensor | None, banned: Tensor | None, ban_rows: Tensor | None,
    lo: int, hi: int, temperature: float, round_to: torch.dtype | None,
) -> Tensor:  # fmt: skip
    """fp32 scores of vocabulary columns [lo, hi) for the rows ``h``, a new tensor the caller may overwrite.
    [r, H] → [r, hi − lo]."""
    if round_to is not None:  # the head's own product in its dtype, then upcast
        b = None if bias is None else bias[lo:hi].to(round_to)
        scores = torch.nn.functional.linear(h.to(round_to), weight[lo:hi].to(round_to), b).float()  # [r, c]
    else:
        scores = h.float() @ weight[lo:hi].float().T  # [r, c]
        if bias is not None:
            scores.add_(bias[lo:hi].float())
    # scores is a fresh tensor from here on: the rest works in place (one [r, c] buffer per block)
    if banned is not None:
        scores.masked_fill_(banned[ban_rows, lo:hi], float("-inf"))
    return scores.div_(temperature) if temperature != 1.0 else scores


class _LinearTokenLogProbs(torch.autograd.Function):
    """Blocked matmul + online log-sum-exp; the backward recomputes each block (see linear_token_logprobs)."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, tokens, banned, ban_row, temperature, rows, chunk, round_to, late):
        N, V = hidden.shape[0], weight.shape[0]
        peak = hidden.new_full((N,), float("-inf"), dtype=torch.float32)  # [N] running max score
        total = hidden.new_zeros((N,), dtype=torch.float32)  # [N] Σ exp(s − peak)
        picked = hidden.new_full((N,), float("-inf"), dtype=torch.float32)  # [N] the token's score
        for r0 in range(0, N, rows):
            r1 = min(r0 + rows, N)
            h = hidden[r0:r1] if round_to is not None else hidden[r0:r1].float()  # [r, H]
            tok = tokens[r0:r1]  # [r]
            br = None if ban_row is None else ban_row[r0:r1]
            m, s, p = peak[r0:r1], total[r0:r1], picked[r0:r1]  # views, updated in place
            for lo in range(0, V, chunk):
                hi = min(lo + chunk, V)
                scores = _block_scores(h, weight, bias, banned, br, lo, hi, temperature, round_to)  # [r, c]
                inside = (tok >= lo) & (tok < hi)  # [r]
                here = scores.gather(-1, (tok - lo).clamp(0, hi - lo - 1)[:, None]).squeeze(-1)  # [r]
                p.copy_(torch.where(inside, here, p))
                new = torch.maximum(m, scores.amax(-1))  # [r]
                safe = new.masked_fill(new == float("-inf"), 0.0)  # all −inf so far: nothing to rescale
                s.mul_(torch.exp(m - safe)).add_(scores.sub_(safe[:, None]).exp_().sum(-1))  # scores consumed
                m.copy_(new)
        log_total = total.log()  # [N]
        ctx.save_for_backward(hidden, weight, bias, tokens, banned, ban_row, peak, log_total)
        ctx.temperature, ctx.rows, ctx.chunk, ctx.round_to, ctx.late = temperature, rows, chunk, round_to, late
        return (picked - peak) - log_total  # [N] fp32, rounded as torch.log_softmax rounds

    @staticmethod
    def backward(ctx, grad_out):
        saved = ctx.saved_tensors
        hidden, weight, bias = saved[:3]
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        setting = (ctx.temperature, ctx.rows, ctx.chunk, ctx.round_to)
        g_all = grad_out.float()  # [N]
        later = need_w and ctx.late is not None and weight.numel() * 4 >= LATE_GRADIENT_MIN_BYTES  # see TiedGrad
        grad_h = torch.zeros(hidden.shape, dtype=torch.float32, device=hidden.device) if need_h else None  # [N, H]
        grad_w = None
        if need_w and not later:
            grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)  # [V, H]
        grad_b = torch.zeros((weight.shape[0],), dtype=torch.float32, device=weight.device) if need_b else None  # [V]
        if need_h or grad_w is not None or need_b:
            for r0, r1, lo, hi, h, part in _gradient_blocks(saved, g_all, *setting):
                if need_h:
                    grad_h[r0:r1] += part @ weight[lo:hi].float()  # [r, H]
                if grad_w is not None:
                    grad_w[lo:hi] += part.T @ h  # [c, H]
                if need_b:
                    grad_b[lo:hi] += part.sum(0)
        if later:  # recomputed from the saved tensors when the weight's gradient is due; a 0-stride stand-in now
            ctx.late.add_head(lambda out: _weight_gradient(out, saved, g_all, *setting))
            grad_w = torch.zeros((), dtype=weight.dtype, device=weight.device).expand(weight.shape)
        return (
            None if grad_h is None else grad_h.to(hidden.dtype),
            None if grad_w is None else grad_w.to(weight.dtype),
            None if grad_b is None else grad_b.to(bias.dtype),
            *([None] * 8),
        )


def _gradient_blocks(
    saved: tuple, g_all: Tensor, tau: float, rows: int, chunk: int, round_to: torch.dtype | None
) -> Iterator[tuple[int, int, int, int, Tensor, Tensor]]:
    """The blocks of ∂(Σ g·log π)/∂logits that :class:`_LinearTokenLogProbs`'s backward multiplies out, each
    recomputed from the saved tensors: yields (r0, r1, lo, hi, h [r, H] fp32, part [r, c])."""
    hidden, weight, bias, tokens, banned, ban_row, peak, log_total = saved
    N, V = hidden.shape[0], weight.shape[0]
    for r0 in range(0, N, rows):
        r1 = min(r0 + rows, N)
        h = hidden[r0:r1].float()  # [r, H]
        tok, g = tokens[r0:r1], g_all[r0:r1, None]  # [r], [r, 1]
        br = None if ban_row is None else ban_row[r0:r1]
        shift = (peak[r0:r1] + log_total[r0:r1])[:, None]  # [r, 1] log-sum-exp of each row
        for lo in range(0, V, chunk):
            hi = min(lo + chunk, V)
            scores = _block_scores(h, weight, bias, banned, br, lo, hi, tau, round_to)  # [r, c] as forward
            part = scores.sub_(shift).exp_().mul_(-g)  # [r, c] −g·softmax, in the scores' buffer
            inside = (tok >= lo) & (tok < hi)  # [r]
            part.scatter_add_(-1, (tok - lo).clamp(0, hi - lo - 1)[:, None], g * inside[:, None])
            if banned is not None:
                part.masked_fill_(banned[br, lo:hi], 0.0)  # the mask's gradient is 0 at banned tokens
            if tau != 1.0:
                part.div_(tau)  # [r, c] ∂/∂logits
            yield r0, r1, lo, hi, h, part


def _weight_gradient(out: Tensor, saved: tuple, g_all: Tensor, *setting) -> None:
    """Add the head weight's gradient into ``out`` [V, H] fp32 (in place): the deferred half of the backward."""
    for _, _, lo, hi, h, part in _gradient_blocks(saved, g_all, *setting):
        out[lo:hi] += part.T @ h  # [c, H]


# ------------------------------------------------------------------------------- models' output heads

_SCALED_LOGITS = ("final_logit_softcapping", "logit_scale", "logits_scaling", "output_multiplier_scale")
"""Config fields of families whose forward rescales the head's output (Gemma 2's soft-capping, Cohere's scale...)."""


def fusable_head(model: torch.nn.Module, head: torch.nn.Module | None = None) -> torch.nn.Linear | None:
    """The output layer that :func:`head_outputs_hidden` can bypass, or None to keep the logits path.

    ``head`` defaults to the model's ``get_output_embeddings()`` (under DDP/accelerate and peft wrappers). It
    qualifies when it is a plain ``nn.Linear`` (tied or not; a LoRA-wrapped head is not), its weight is not an
    FSDP shard (a ``DTensor``, gathered only inside the module's own forward), no forward hook is registered on
    it (a hook expects logits), and the model's config names no rescaling of the logits after the head.
    """
    core = _hf.unwrap(model, peft=True)
    if head is None:
        get = getattr(core, "get_output_embeddings", None)
        head = get() if get is not None else None
    if type(head) is not torch.nn.Linear or type(head.weight) is not torch.nn.Parameter:
        return None  # a LoRA / quantised head, or a DTensor shard (FSDP2)
    if has_forward_hooks(head):
        return None  # a hook expects the logits
    config = getattr(core, "config", None)
    configs = [config, getattr(config, "get_text_config", lambda: None)()] if config is not None else []
    if any(getattr(c, name, None) not in (None, 1, 1.0) for c in configs for name in _SCALED_LOGITS):
        return None
    return head


@contextmanager
def tied_embedding_grad(model: torch.nn.Module, head: torch.nn.Linear | None) -> Iterator[TiedGrad | None]:
    """Inside the block, a training forward's input-embedding lookups send their gradient through a
    :class:`TiedGrad` when the embedding shares its weight with ``head`` (a tied lm_head scored by
    :func:`linear_token_logprobs`); yields it (pass it as that call's ``late``), else None.

    The tied weight's gradient is the head's (dense: every vocabulary row gets −softmax) plus the lookups' (the rows
    of the tokens fed). Left to autograd it costs more than one ``[V, H]`` tensor — a dense lookup gradient is one
    (``embedding_dense_backward``), a sparse one (``nn.Embedding(sparse=True)``) is added to the head's out of place
    (torch 2.14's input buffer sums a dense and a sparse gradient into a new tensor) — and the head's is allocated
    first thing in the backward, on top of every activation the forward kept: 78 MB each at Qwen2.5-VL's
    151,936 × 128 in fp32, 1.2 GB at its 3B's 151,936 × 2,048. With the :class:`TiedGrad` one ``[V, H]`` gradient is
    made — from :data:`LATE_GRADIENT_MIN_BYTES` up at the end of the backward, when the activations are gone. Nothing
    changes when ``head`` is None (no fused head), when the weights are untied, or when no gradient is recorded
    (sampling, old log-probs).

    The :class:`TiedGrad` tells backwards apart by torch's private ``torch._C._current_graph_task_id``; where a torch
    lacks it (:func:`graph_task_id` is None), the lookups and the head leave the gradient to plain autograd — the
    same gradient, with autograd's larger peak — and a debug line says so.
    """
    emb = None
    if graph_task_id() is None:
        logger.debug("mmgrpo: torch._C._current_graph_task_id is missing; the tied head's gradient is autograd's")
    elif head is not None and torch.is_grad_enabled() and head.weight.requires_grad:
        get = getattr(_hf.unwrap(model, peft=True), "get_input_embeddings", None)
        emb = get() if get is not None else None
        if type(emb) is not torch.nn.Embedding or emb.weight is not head.weight or emb.sparse or emb.max_norm:
            emb = None
    if emb is None:
        yield None
        return
    tied = TiedGrad(emb.weight)
    saved = emb.__dict__.get("forward")
    emb.forward = lambda ids: _TiedLookup.apply(ids, emb.weight, emb.padding_idx, tied)
    try:
        yield tied
    finally:
        if saved is None:
            del emb.forward
        else:
            emb.forward = saved


class TiedGrad:
    """The gradient of a weight shared by the input embedding and a fused lm_head, assembled when autograd is about
    to accumulate it into ``.grad`` (:func:`tied_embedding_grad`).

    During the backward the head (:class:`_LinearTokenLogProbs` with ``late``) hands autograd a 0-stride stand-in
    and registers how to compute its part — when the gradient has at least :data:`LATE_GRADIENT_MIN_BYTES`; a
    smaller one it computes at once and hands autograd, and the hook adds the lookups' rows into it. Each lookup
    (:class:`_TiedLookup`) hands autograd nothing and registers its ids and output gradient. A hook on the weight,
    run at the accumulation — after every lookup's backward, since each lookup is one of its inputs, so after the
    whole backward — returns the heaps' freed pages to the system (:func:`mmgrpo.hostmem.trim_heap`: the
    activations are freed by then), allocates the one ``[V, H]`` gradient (fp32), adds the head's part (one more
    pass over the vocabulary blocks: the scores are recomputed) and the lookups' rows (``index_add_``), and hands it
    to autograd, which makes it ``.grad`` (optimizers, clipping and DDP see an ordinary dense gradient, once per
    backward).

    Entries are tagged with the backward that made them (``torch._C._current_graph_task_id``): a backward that
    never reaches the weight's accumulation (``torch.autograd.grad`` of other inputs) leaves entries that a later
    backward drops instead of adding. The hook is registered at the first lookup and removes itself when it runs.
    """

    def __init__(self, weight: Tensor):
        self.weight = weight
        self.heads: list[tuple[int, Callable[[Tensor], None]]] = []  # (backward, adds the head's part into [V, H])
        self.rows: list[tuple[int, Tensor, Tensor]] = []  # (backward, ids [...], output gradient [..., H])
        self.handle = None

    def watch(self) -> None:
        if self.handle is None:
            self.handle = self.weight.register_hook(self._assemble)

    def add_head(self, add: Callable[[Tensor], None]) -> None:
        self.heads.append((graph_task_id()(), add))

    def add_rows(self, ids: Tensor, grad: Tensor) -> None:
        self.rows.append((graph_task_id()(), ids, grad))

    def _assemble(self, grad: Tensor) -> Tensor:
        self.handle.remove()
        self.handle = None
        task = graph_task_id()()
        heads = [add for t, add in self.heads if t == task]
        rows = [(ids, g) for t, ids, g in self.rows if t == task]
        self.heads, self.rows = [], []
        if not heads and not rows:  # only a stale hook's entries: another TiedGrad of this backward has the head
            return grad
        if all(st == 0 for st in grad.stride()):  # the head's stand-in (zeros): the gradient is made here
            if grad.device.type == "cpu":  # the host heap holds CPU activations only; a GPU's memory is torch's
                trim_heap()
            out = torch.zeros(grad.shape, dtype=torch.float32, device=grad.device)  # [V, H]
        else:  # a dense gradient made for this backward (the head's, below the threshold, or a sum): add into it
            out = grad if grad.dtype == torch.float32 else grad.float()
        for add in heads:
            add(out)
        for ids, g in rows:
            out.index_add_(0, ids.reshape(-1), g.reshape(-1, out.shape[1]).to(out.dtype))
        return out.to(grad.dtype)


class _TiedLookup(torch.autograd.Function):
    """``F.embedding(ids, weight, padding_idx)`` whose weight gradient goes through ``tied`` (a :class:`TiedGrad`);
    the padding row gets no gradient, as in ``nn.Embedding``."""

    @staticmethod
    def forward(ctx, ids, weight, padding_idx, tied):
        ctx.save_for_backward(ids)
        ctx.padding_idx, ctx.tied = padding_idx, tied
        tied.watch()
        return torch.nn.functional.embedding(ids, weight, padding_idx)

    @staticmethod
    def backward(ctx, grad_out):
        (ids,) = ctx.saved_tensors
        if ctx.padding_idx is not None:
            grad_out = grad_out.masked_fill((ids == ctx.padding_idx)[..., None], 0.0)
        ctx.tied.add_rows(ids, grad_out)
        return None, None, None, None


def _identity(x: Tensor) -> Tensor:
    return x


@contextmanager
def head_outputs_hidden(head: torch.nn.Module | None) -> Iterator[None]:
    """Inside the block, ``head(x)`` returns ``x``: a model's forward then hands back, as its ``logits``, the
    hidden states its head would have projected (after the model's own ``logits_to_keep`` slicing), and the
    ``[..., V]`` logits are never computed. ``None`` changes nothing. The head's parameters stay registered; a
    ``forward`` another library set on the instance (accelerate's hooks) is restored afterwards."""
    if head is None:
        yield
        return
    saved = head.__dict__.get("forward")
    head.forward = _identity
    try:
        yield
    finally:
        if saved is None:
            del head.forward
        else:
            head.forward = saved


def head_logprobs(
    out: Tensor,
    head: torch.nn.Linear | None,
    tokens: Tensor,
    *,
    temperature: float = 1.0,
    banned: Tensor | None = None,
    late: TiedGrad | None = None,
) -> Tensor:
    """:func:`linear_token_logprobs` of ``out`` through ``head`` when ``head`` is given (``out`` is then the hidden
    states a forward under :func:`head_outputs_hidden` returned), else :func:`token_logprobs` of the logits ``out``.
    ``late``: the :class:`TiedGrad` that :func:`tied_embedding_grad` yielded for this forward.

    Shape: out [..., H] or [..., V]; tokens [...]; banned broadcastable to [..., V]; returns [...] fp32
    """
    if head is None:
        return token_logprobs(out, tokens, temperature=temperature, banned=banned)
    dtype = torch.promote_types(out.dtype, head.weight.dtype)  # the dtype of the logits the head would produce
    round_to = dtype if torch.finfo(dtype).bits < 32 else None  # bf16/fp16 models: the logits they sample from
    return linear_token_logprobs(
        out, head.weight, tokens, bias=head.bias, temperature=temperature, banned=banned, round_to=round_to, late=late
    )


def vocab_size(out: Tensor, head: torch.nn.Linear | None) -> int:
    """V of the distribution scored from ``out`` (hidden states when ``head`` is given, logits otherwise)."""
    return out.shape[-1] if head is None else head.out_features
