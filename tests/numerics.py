"""Tolerances taken from the computation — dtype, reduction length, depth, magnitude — not from one machine's error.

Two floating-point evaluations of the same quantity that differ only in the order of their sums (another thread
count, another SIMD width such as AVX2 against AVX-512, a chunked kernel against a fused one, a prefix-shared
forward against a per-row one) are both correct and still differ. How much is bounded by the rounding model:

- A sum (or dot product) of n terms in a precision with unit roundoff u = eps/2 has a rounding error of at most
  γ_n·Σ|x_i|, γ_n = n·u/(1 − n·u), whatever the order (Higham, *Accuracy and Stability of Numerical Algorithms*,
  2nd ed., §3.1, eq. 3.4–3.5). That worst case is reached only by adversarial data.
- Treating the rounding errors as independent, zero-mean and bounded (Higham & Mary, "A New Approach to
  Probabilistic Rounding Error Analysis", SIAM J. Sci. Comput. 41(5), 2019, §2–3: sums and inner products), the
  error is at most γ̃_n(λ)·Σ|x_i| with probability at least 1 − 2n·exp(−λ²(1 − u)²/2), where
  γ̃_n(λ) = exp(λ·√n·u + n·u²/(1 − u)) − 1 ≈ λ·√n·u. We take λ = 8: a bound broken with probability under
  n·3e-14 per sum.
- A network stacks ``depth`` such reductions (attention and MLP of each layer, the head; a backward pass about
  doubles them). To first order their relative errors add, so one evaluation is within depth·γ̃_n(λ) of the exact
  value, relative to the ``scale`` of the terms, and two evaluations are within twice that of each other.

``scale`` is the magnitude of the summed terms. For a tensor it defaults to its largest entry (a gradient's
elements sum terms of about the tensor's largest size: a small element is a cancellation, whose error is that of
its terms, so an elementwise relative tolerance is wrong there). For log-probabilities it is ``logprob_scale``:
log p = z − logsumexp(z) rounds like the logits, of order one or the largest |log p|.

Where two paths are equal by construction (the same kernels in the same order), a test compares exactly instead and
says so. ``scripts/test_numerics.sh`` runs the tests that use these bounds under other thread counts and SIMD widths.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import torch

LAMBDA = 8.0
"""Confidence parameter λ of the probabilistic bound (Higham & Mary 2019): failure probability ≤ 2n·exp(−λ²/2)."""


def unit_roundoff(dtype: torch.dtype = torch.float32) -> float:
    """u = eps/2: 2⁻²⁴ for fp32, 2⁻⁵³ for fp64, 2⁻⁸ for bf16."""
    return torch.finfo(dtype).eps / 2


def gamma_tilde(n: int, dtype: torch.dtype = torch.float32, lam: float = LAMBDA) -> float:
    """γ̃_n(λ) = exp(λ√n·u + n·u²/(1 − u)) − 1: the probabilistic relative error bound of an n-term sum."""
    u = unit_roundoff(dtype)
    return math.expm1(lam * math.sqrt(max(n, 1)) * u + n * u * u / (1 - u))


def reorder_tol(*, terms: int, depth: int = 1, scale: float = 1.0, dtype: torch.dtype = torch.float32) -> float:
    """Largest |a − b| between two evaluations of one quantity that differ in summation order.

    ``terms``: the longest reduction (n); ``depth``: stacked reductions; ``scale``: magnitude of the summed terms.
    """
    return 2.0 * depth * gamma_tilde(terms, dtype) * scale


def elementwise_tol(*, ops: int, scale: float = 1.0, dtype: torch.dtype = torch.float32) -> float:
    """Largest |a − b| between two evaluations of an elementwise formula of ``ops`` rounded operations (a fused kernel
    against an unfused one, FMA against multiply-then-add): the deterministic γ_ops = ops·u/(1 − ops·u) of each
    side (Higham §3.1; no sum to average the errors), relative to ``scale``, the magnitude of the formula's terms."""
    u = unit_roundoff(dtype)
    return 2.0 * ops * u / (1 - ops * u) * scale


def gradient_scales(grads: Mapping[str, torch.Tensor | None]) -> dict[str, float]:
    """The scale each named gradient is compared on: its largest entry, except for an attention key bias (SigLIP's
    ``k_proj.bias``), which adds q·b to every score of a query — a shift softmax ignores — so its gradient is 0 up to
    rounding (~1e-11) and is compared on the scale of the same layer's query-bias gradient."""
    out = {}
    for name, g in grads.items():
        if g is None:
            continue
        partner = grads.get(name.replace("k_proj.bias", "q_proj.bias")) if "k_proj.bias" in name else None
        out[name] = float((partner if partner is not None else g).abs().max())
    return out


def logprob_scale(logp: torch.Tensor) -> float:
    """Scale of log-probabilities: at least 1 (logits of order one), else the largest finite |log p|."""
    finite = logp.detach()[torch.isfinite(logp.detach())]
    return max(1.0, float(finite.abs().max())) if finite.numel() else 1.0


@dataclass(frozen=True)
class Reductions:
    """A model's rounding budget: its longest reduction and how many reductions a forward stacks."""

    terms: int
    depth: int

    def backward(self) -> Reductions:
        """A backward pass runs the forward's reductions again, transposed, after them."""
        return Reductions(self.terms, 2 * self.depth)

    def tol(self, scale: float = 1.0, dtype: torch.dtype = torch.float32, stored: torch.dtype | None = None) -> float:
        """``dtype``: the precision the sums accumulate in. ``stored``: a lower precision every reduction's result is
        rounded to (bf16 weights and activations, whose matmuls accumulate in fp32 on CPU and GPU): one more rounding
        of relative size u(stored) per reduction, which two evaluations make independently at their order-dependent
        ties — the bound is then about depth·u(stored), whatever the agreement usually seen."""
        tol = reorder_tol(terms=self.terms, depth=self.depth, scale=scale, dtype=dtype)
        return tol if stored is None else tol + 2.0 * self.depth * unit_roundoff(stored) * scale

    def assert_close(self, got, want, *, scale: float | None = None, factor: float = 1.0, msg=None) -> None:
        """Within ``factor`` times the budget, relative to ``scale`` (default: ``want``'s largest entry)."""
        if scale is None:
            scale = float(want.detach().abs().max()) if want.numel() else 0.0
        torch.testing.assert_close(got, want, rtol=0, atol=factor * self.tol(scale), msg=msg)

    def assert_logprobs_close(self, got, want, *, factor: float = 1.0, msg=None) -> None:
        """Log-probabilities (or log-ratios) of two evaluations, on the log-prob scale; ``factor`` for what scales
        the rounding (a guidance scale s multiplies both branches' errors)."""
        self.assert_close(got, want, scale=logprob_scale(want), factor=factor, msg=msg)


_SIZE_KEYS = (
    "hidden_size",
    "intermediate_size",
    "vocab_size",
    "d_model",
    "encoder_ffn_dim",
    "decoder_ffn_dim",
    "out_hidden_size",
    "embed_dim",
    "image_token_embed_dim",
    "joint_attention_dim",
    "caption_projection_dim",
    "pooled_projection_dim",
)
_LAYER_KEYS = ("num_hidden_layers", "depth", "encoder_layers", "decoder_layers", "num_layers", "num_single_layers")


def _own(config) -> dict:
    """A config's own fields: a transformers config's attributes (not those a composite config forwards to its text
    config), or a diffusers config's mapping."""
    return dict(config) if isinstance(config, Mapping) else vars(config)


def _configs(config, seen=None):
    """``config`` and every sub-config (text, vision, audio, aligner...), once each."""
    seen = set() if seen is None else seen
    if id(config) in seen:
        return
    seen.add(id(config))
    yield config
    for value in _own(config).values():
        if hasattr(value, "to_dict") and hasattr(value, "model_type"):
            yield from _configs(value, seen)


def model_reductions(model, positions: int = 0) -> Reductions:
    """The forward's rounding budget from a transformers or diffusers model's config: ``terms`` = the longest
    reduction (hidden, MLP, vocabulary — the softmax's normaliser sums V terms —, a denoiser's latent elements C·S²,
    over which a transition's Gaussian log-density sums, or ``positions``, the attention's sum over the sequence);
    ``depth`` = 2 reductions (attention, MLP) per layer of every tower, plus the embedding/head and the connector
    between towers."""
    config = getattr(model, "config", model)
    sizes, depth = [positions], 1
    for c in _configs(config):
        own = _own(c)
        sizes += [own[k] for k in _SIZE_KEYS if isinstance(own.get(k), int)]
        if isinstance(own.get("in_channels"), int) and isinstance(own.get("sample_size"), int):
            sizes.append(own["in_channels"] * own["sample_size"] ** 2)
        depth += 2 * sum(own[k] for k in _LAYER_KEYS if isinstance(own.get(k), int)) + 1
    return Reductions(terms=max(sizes), depth=depth)


def adapter_reductions(adapter, positions: int = 0) -> Reductions:
    """``model_reductions`` of an adapter's policy model (LoRA and wrappers taken off)."""
    model = adapter._unwrapped() if hasattr(adapter, "_unwrapped") else adapter.model
    model = model.get_base_model() if hasattr(model, "get_base_model") else model
    model = getattr(model, "transformer", model)  # a diffusers pipeline: its denoiser
    return model_reductions(model, positions)


def weight_deltas(a: Mapping, b: Mapping) -> dict[str, float]:
    """The largest and the 99th-percentile |Δw| over every weight of two state dicts with the same keys."""
    diff = torch.cat([(a[n].float() - b[n].float()).abs().flatten() for n in a])
    return {"params": float(diff.max()), "params_p99": float(diff.kthvalue(max(1, int(0.99 * diff.numel()))).values)}


def assert_one_adamw_step_apart(d: Mapping, budget: Reductions, lr: float) -> None:
    """Two runs' weights after one AdamW step from the same start (``d`` from ``weight_deltas``). The first update
    lr·ĝ/(|ĝ| + ε) is scale-free: where |g| is far above rounding, a relative change τ of g moves it by about lr·τ, so
    the bulk (99 %) of the weights agree within 2·lr·τ, τ the step's backward budget; an element whose gradient is at
    rounding level may have its sign decided by the summation order, and no bound short of the whole step
    (|Δw| ≤ 2·lr) holds for it."""
    assert d["params"] <= 2 * lr, d
    assert d["params_p99"] <= 2 * lr * budget.backward().tol(), d
