"""The fused entropy of the sampling distribution (modalities/tokens/entropy.py) against the logits path, its memory at
a real vocabulary, the token adapter's one-forward ``logprobs_and_entropy``, and the entropy-bonus loss term.

Tolerances as tests/test_fused_logprobs.py: both paths sum the same terms in another order (the normaliser and the
moment over V, on H-term logits), values on the entropy's scale, gradients relative to the tensor's largest entry.
"""

import math
import subprocess
import sys

import pytest
import torch

from mmgrpo.modalities.tokens.entropy import linear_token_entropy, token_entropy
from mmgrpo.modalities.tokens.logprobs import banned_mask
from tests.numerics import Reductions, model_reductions
from tests.test_fused_logprobs import _Sizes

N, T, H, V = 3, 5, 16, 1000
KERNEL = Reductions(terms=V, depth=2)


def _inputs(seed=0, bias=False):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(N, T, H, generator=g).requires_grad_()  # [n, T, H]
    weight = (torch.randn(V, H, generator=g) / math.sqrt(H) * 3).requires_grad_()  # [V, H]
    b = torch.randn(V, generator=g).requires_grad_() if bias else None  # [V]
    return hidden, weight, b


def test_entropy_by_hand():
    """H = −Σ π log π on small hand-worked distributions: uniform over 4 → ln 4; two of them banned → ln 2; logits
    (0, ln 3) → π = (1/4, 3/4), H = ln 4 − (3/4) ln 3 = 0.5623351; at τ = 0.5 the scores are (0, 2 ln 3) → π = (1/10,
    9/10), H = ln 10 − (9/10)·2 ln 3 = 0.3250830."""
    zero = torch.zeros(1, 4)
    assert float(token_entropy(zero)) == pytest.approx(math.log(4), abs=1e-6)
    ban = torch.tensor([False, True, False, True])
    assert float(token_entropy(zero, banned=ban)) == pytest.approx(math.log(2), abs=1e-6)
    two = torch.tensor([[0.0, math.log(3)]])
    assert float(token_entropy(two)) == pytest.approx(0.5623351, abs=1e-6)
    assert float(token_entropy(two, temperature=0.5)) == pytest.approx(0.3250830, abs=1e-6)
    # the fused path on the same numbers: hidden [1, 1] times a [2, 1] weight gives the logits (0, ln 3)
    hidden, weight = torch.ones(1, 1), torch.tensor([[0.0], [math.log(3)]])
    assert float(linear_token_entropy(hidden, weight, chunk=1)) == pytest.approx(0.5623351, abs=1e-6)
    assert float(linear_token_entropy(hidden, weight, temperature=0.5)) == pytest.approx(0.3250830, abs=1e-6)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("rows,chunk", [(1024, 4096), (4, 128), (7, 37)])  # one block; uneven; odd sizes
@pytest.mark.parametrize("with_ban", [True, False])
@pytest.mark.parametrize("bias", [False, True])
def test_values_and_gradients_equal_the_logits_path(temperature, rows, chunk, with_ban, bias):
    hidden, weight, b = _inputs(bias=bias)
    banned = banned_mask(V, always=[5, 17, 999], early=[0, 1], early_steps=2, steps=T) if with_ban else None
    weights = torch.randn(N, T, generator=torch.Generator().manual_seed(1))  # a loss that weights each position
    ref = token_entropy(torch.nn.functional.linear(hidden, weight, b), temperature=temperature, banned=banned)
    out = linear_token_entropy(
        hidden, weight, bias=b, temperature=temperature, banned=banned, rows=rows, chunk=chunk
    )  # fmt: skip
    assert out.dtype == torch.float32 and out.shape == (N, T)
    assert float(ref.detach().min()) > 0.1  # a spread distribution: the comparison is not of zeros
    torch.testing.assert_close(out, ref, rtol=0, atol=KERNEL.tol(float(ref.detach().abs().max())))
    inputs = [x for x in (hidden, weight, b) if x is not None]
    got = torch.autograd.grad((out * weights).sum(), inputs)
    want = torch.autograd.grad((ref * weights).sum(), inputs)
    for g, w in zip(got, want):
        assert float(w.abs().max()) > 1e-3
        torch.testing.assert_close(g, w, rtol=0, atol=KERNEL.backward().tol(float(w.abs().max())))


def test_bf16_head_rounds_its_logits_as_the_model_does():
    """round_to=bf16 (a bf16 model's head): the entropy of the bf16-rounded logits; fp32 gradients within bf16."""
    hidden, weight, _ = _inputs()
    hb, wb = hidden.detach().bfloat16().requires_grad_(), weight.detach().bfloat16().requires_grad_()
    ref = token_entropy(hb @ wb.T, temperature=0.8)
    out = linear_token_entropy(hb, wb, temperature=0.8, rows=4, chunk=100, round_to=torch.bfloat16)
    torch.testing.assert_close(out, ref, rtol=0, atol=KERNEL.tol(float(ref.detach().abs().max())))
    (g_out,) = torch.autograd.grad(out.sum(), hb)
    (g_ref,) = torch.autograd.grad(ref.sum(), hb)
    torch.testing.assert_close(g_out.float(), g_ref.float(), rtol=2**-7, atol=1e-2 * float(g_ref.abs().max()))


def test_no_tensor_of_n_t_v_elements_at_a_real_vocabulary():
    """Qwen2.5's V = 151,936: forward and backward never create a tensor of n·T·V elements (the largest are the
    weight's gradient [V, H] and one [n·T, chunk] block); the logits path does."""
    n, t, h, v = 2, 64, 32, 151_936
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(n, t, h, generator=g, requires_grad=True)
    weight = (torch.randn(v, h, generator=g) / 4).requires_grad_()
    with _Sizes() as fused:
        linear_token_entropy(hidden, weight, temperature=0.9).sum().backward()
    assert max(fused.numels) < n * t * v and max(fused.numels) == v * h
    with _Sizes() as plain:
        token_entropy(hidden @ weight.T, temperature=0.9).sum().backward()
    assert n * t * v in plain.numels  # the check can fail: the logits path creates them


_PEAK = """
import sys, torch
from mmgrpo.modalities.tokens.entropy import linear_token_entropy, token_entropy
torch.set_num_threads(1)
def status(key):  # kB
    return next(int(x.split()[1]) for x in open("/proc/self/status") if x.startswith(key))
n, t, h, v = 2, 64, 32, 151_936
g = torch.Generator().manual_seed(0)
hidden = torch.randn(n, t, h, generator=g, requires_grad=True)
weight = (torch.randn(v, h, generator=g) / 4).requires_grad_()
small = torch.randn(1, 2, h, requires_grad=True)
linear_token_entropy(small, weight[:64]).sum().backward(); token_entropy(small @ weight[:64].T).sum().backward()
open("/proc/self/clear_refs", "w").write("5")  # the peak (VmHWM) restarts from the current resident size
before = status("VmRSS:")
if sys.argv[1] == "fused":
    linear_token_entropy(hidden, weight).sum().backward()
else:
    token_entropy(hidden @ weight.T).sum().backward()
print((status("VmHWM:") - before) * 1024)
"""


def _peak_bytes(path: str) -> int:
    """The rise of the process's peak resident memory (VmHWM, reset first) over one forward + backward, in a fresh
    interpreter."""
    out = subprocess.run(
        [sys.executable, "-c", _PEAK, path], capture_output=True, text=True, timeout=300, check=True
    )  # fmt: skip
    return int(out.stdout.split()[-1])


def test_peak_memory_at_a_real_vocabulary_stays_under_one_logits_tensor():
    """Measured peak (Linux's VmHWM) of forward + backward at V = 151,936, n·T = 128: the fused path adds less than one
    fp32 [n, T, V] logits tensor (77.8 MB; it holds the [V, H] weight gradient, 19.4 MB, and blocks of 2 MB); the
    logits path adds more than two (the logits, the log-softmax, their gradients)."""
    logits_bytes = 2 * 64 * 151_936 * 4
    fused, plain = _peak_bytes("fused"), _peak_bytes("plain")
    assert fused < logits_bytes, (fused, logits_bytes)
    assert plain > 2 * logits_bytes, (plain, logits_bytes)


def _tiny_vlm_rollout():
    from tests.adapter_cases import CASES, build

    adapter = build("vlm", lora=False)
    rollout = adapter.rollout(CASES["vlm"].rows()[:2], group_size=2)
    return adapter, rollout


def test_adapter_logprobs_and_entropy_equal_the_logits_path(monkeypatch, mmgrpo_cache):
    """The tiny Qwen2.5-VL (tied head): ``logprobs_and_entropy`` gives ``logprobs`` exactly, and the entropy and its
    parameter gradients of the fused head equal the logits path's (``fusable_head`` off) within the model's budget."""
    import mmgrpo.modalities.tokens.policy as policy

    adapter, rollout = _tiny_vlm_rollout()
    budget = model_reductions(adapter.model)
    idx = torch.arange(rollout.batch_size)
    params = [p for p in adapter.model.parameters() if p.requires_grad]

    def run():
        logp, ent = adapter.logprobs_and_entropy(rollout, idx)  # [n, T] each
        grads = torch.autograd.grad(ent.sum(), params, allow_unused=True)
        return logp.detach(), ent.detach(), grads

    logp, ent, g_fused = run()
    torch.testing.assert_close(logp, adapter.logprobs(rollout, idx).detach(), rtol=0, atol=0)
    m = rollout.mask
    assert float((ent * m).sum() / m.sum()) > 0.1 and bool((ent[m == 0] == 0).all())
    with monkeypatch.context() as mp:
        mp.setattr(policy, "fusable_head", lambda model, head=None: None)
        _, ent_plain, g_plain = run()
    torch.testing.assert_close(ent, ent_plain, rtol=0, atol=budget.tol(float(ent_plain.abs().max())))
    for got, want in zip(g_fused, g_plain):
        assert (got is None) == (want is None)
        if want is not None:
            torch.testing.assert_close(got, want, rtol=0, atol=budget.backward().tol(float(want.abs().max()) + 1e-12))


def test_entropy_bonus_loss_by_hand():
    """ℓ_t = −c·H_t·m_t; entropy/mean over the valid units: H = [[1, 2, 9], [3, 0, 0]], m = [[1, 1, 0], [1, 0, 0]],
    c = 0.1 → ℓ = [[−0.1, −0.2, 0], [−0.3, 0, 0]], mean H = (1 + 2 + 3) / 3 = 2."""
    from mmgrpo.entropy_control import entropy_bonus_loss

    ent = torch.tensor([[1.0, 2.0, 9.0], [3.0, 0.0, 0.0]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    loss, metrics = entropy_bonus_loss(ent, mask, 0.1)
    torch.testing.assert_close(loss, torch.tensor([[-0.1, -0.2, 0.0], [-0.3, 0.0, 0.0]]))
    assert float(metrics["entropy/mean"]) == pytest.approx(2.0)
    (g,) = torch.autograd.grad(loss.sum(), ent)  # ∂ℓ/∂H = −c on valid units: the bonus raises the entropy
    torch.testing.assert_close(g, -0.1 * mask)
