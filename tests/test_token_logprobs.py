"""The chunked token log-prob (modalities/tokens/logprobs.py) against ``torch.log_softmax(...).gather(...)``.

Tolerances (tests/numerics.py): both paths sum the same V terms of the normaliser in another order (chunks of
columns against one log-softmax): values within that reduction's rounding bound on the log-prob scale, gradients
w.r.t. the logits relative to their largest entry; bf16 gradients within half a bf16 ulp more. The memory tests
record the tensors autograd saves and every tensor an op creates, and show that no fp32 [n, T, V] tensor other
than the logits and their gradient exists on the chunked path, where the reference path keeps one.
"""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from mmgrpo.modalities.tokens.logprobs import banned_mask, token_logprobs
from tests.numerics import Reductions

N, T, V = 3, 5, 1000
NORMALISER = Reductions(terms=V, depth=1)  # log π = z − logsumexp(z): one V-term reduction


def _inputs(seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    logits = (3 * torch.randn(N, T, V, generator=g)).to(dtype).requires_grad_()  # [n, T, V]
    tokens = torch.randint(0, V, (N, T), generator=g)  # [n, T]
    banned = banned_mask(V, always=[5, 17, 999], early=[0, 1], early_steps=2, steps=T)  # [T, V]
    tokens[0, 3], tokens[1, 2] = 0, 1  # a banned-early id where it is allowed
    tokens[2, 0] = 1  # and where it is banned: log π = −inf
    return logits, tokens, banned


def _reference(logits, tokens, banned, temperature):
    scores = logits.float().masked_fill(banned, float("-inf")) if banned is not None else logits.float()
    return torch.log_softmax(scores / temperature, dim=-1).gather(-1, tokens[..., None]).squeeze(-1)  # [n, T]


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("chunk", [1000, 128, 37])  # one chunk; uneven; a 1-column last chunk
@pytest.mark.parametrize("with_ban", [True, False])
def test_values_and_gradients_equal_the_full_log_softmax(temperature, chunk, with_ban):
    logits, tokens, banned = _inputs()
    banned = banned if with_ban else None
    weights = torch.randn(N, T, generator=torch.Generator().manual_seed(1))  # a loss that weights each token
    ref = _reference(logits, tokens, banned, temperature)
    out = token_logprobs(logits, tokens, temperature=temperature, banned=banned, chunk=chunk)
    assert out.dtype == torch.float32 and out.shape == (N, T)
    NORMALISER.assert_logprobs_close(out, ref)
    assert torch.isinf(out[2, 0]) == with_ban  # the banned sampled token
    finite = torch.isfinite(ref)
    (grad_ref,) = torch.autograd.grad((ref[finite] * weights[finite]).sum(), logits)
    (grad,) = torch.autograd.grad((out[finite] * weights[finite]).sum(), logits)
    NORMALISER.backward().assert_close(grad, grad_ref)
    if with_ban:
        assert grad[..., [5, 17, 999]].abs().max() == 0 and grad[:, :2, [0, 1]].abs().max() == 0


def test_bf16_logits_give_the_fp32_log_softmax_of_their_upcast():
    logits, tokens, banned = _inputs(dtype=torch.bfloat16)
    ref = _reference(logits, tokens, banned, 0.7)
    out = token_logprobs(logits, tokens, temperature=0.7, banned=banned, chunk=100)
    assert out.dtype == torch.float32
    NORMALISER.assert_logprobs_close(out, ref)
    finite = torch.isfinite(ref)
    (grad_ref,) = torch.autograd.grad(ref[finite].sum(), logits)
    (grad,) = torch.autograd.grad(out[finite].sum(), logits)
    assert grad.dtype == torch.bfloat16
    atol = NORMALISER.backward().tol(float(grad_ref.float().abs().max()))  # then rounded to bf16: half an ulp
    torch.testing.assert_close(grad.float(), grad_ref.float(), rtol=2**-8, atol=atol)


def test_banned_mask_shapes():
    assert banned_mask(10) is None
    assert banned_mask(10, early=[3], early_steps=0, steps=4) is None
    always = banned_mask(10, always=[2, 9])
    assert always.shape == (10,) and always.nonzero().flatten().tolist() == [2, 9]
    both = banned_mask(10, always=[2], early=[4], early_steps=2, steps=3)
    assert both.shape == (3, 10)
    assert both[:, 2].all() and both[:2, 4].all() and not both[2, 4]


def test_bad_arguments_are_named():
    logits, tokens, _ = _inputs()
    with pytest.raises(ValueError, match="temperature"):
        token_logprobs(logits, tokens, temperature=0.0)
    with pytest.raises(ValueError, match="chunk"):
        token_logprobs(logits, tokens, chunk=0)


# ----------------------------------------------------------------------------------------------------- memory


class _Allocations(TorchDispatchMode):
    """Records (op, bytes) of every tensor an op allocates (outputs that are views of an input are skipped)."""

    def __init__(self):
        super().__init__()
        self.allocations: list[tuple[str, int]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        inputs = {a.untyped_storage().data_ptr() for a in [*args, *kwargs.values()] if isinstance(a, torch.Tensor)}
        out = func(*args, **kwargs)
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in inputs:
                self.allocations.append((str(func), t.untyped_storage().nbytes()))
        return out


def _saved_for_backward(fn):
    """(numel, dtype, data_ptr) of every tensor autograd saves while running ``fn``."""
    saved = []

    def pack(t):
        saved.append((t.numel(), t.dtype, t.data_ptr()))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return out, saved


def test_no_full_vocabulary_tensor_is_saved_for_backward():
    logits, tokens, banned = _inputs()
    full = N * T * V
    _ref, saved_ref = _saved_for_backward(lambda: _reference(logits, tokens, banned, 0.7))
    assert any(numel == full and dtype == torch.float32 for numel, dtype, _ in saved_ref)  # the log-softmax
    _out, saved = _saved_for_backward(lambda: token_logprobs(logits, tokens, temperature=0.7, banned=banned, chunk=100))
    large = [(numel, ptr) for numel, _, ptr in saved if numel >= full]
    assert large == [(full, logits.data_ptr())], "only the logits themselves may be saved at [n, T, V]"
    assert sum(numel for numel, _, _ in saved) <= full + 3 * N * T + T * V  # + tokens, logsumexp, banned mask


def test_no_full_vocabulary_temporary_in_forward_or_backward():
    logits, tokens, banned = _inputs()
    full, chunk = 4 * N * T * V, 100  # bytes of an fp32 [n, T, V] tensor
    with _Allocations() as forward:
        out = token_logprobs(logits, tokens, temperature=0.7, banned=banned, chunk=chunk)
    assert max(nbytes for _, nbytes in forward.allocations) <= 4 * N * T * chunk
    with _Allocations() as backward:
        torch.autograd.grad(out[torch.isfinite(out)].sum(), logits)
    large = [op for op, nbytes in backward.allocations if nbytes > 4 * N * T * chunk]
    assert large == ["aten.empty_like.default"], large  # the gradient buffer, filled chunk by chunk
    with _Allocations() as naive:
        _reference(logits, tokens, banned, 0.7)
    assert sum(nbytes >= full for _, nbytes in naive.allocations) >= 2  # the check sees the naive path's copies
