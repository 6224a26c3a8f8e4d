"""bf16 compute with fp32 master weights (accelerate's ``mixed_precision: bf16``: the forward under bf16 autocast), the
documented GPU setting, against fp32, for every family of the contract table (tests/adapter_cases.py), on the CPU.

One fp32 keyed rollout per family; then the GRPO surrogate at ratio 1, ``L = −Σ A·log π·mask / Σ mask`` with fixed
advantages A [B, 1], and its gradient, once in fp32 and once with the adapter's log-prob forward under
``torch.autocast("cpu", dtype=torch.bfloat16)``. The weights stay fp32 (the master copy the optimizer updates) and the
log-probs come out fp32, so the log-ratio and advantage math runs in fp32 (mmgrpo/losses.py).

Tolerance (tests/numerics.py): the model's reductions read from its config, each result rounded to bf16 once
(``Reductions.tol(stored=torch.bfloat16)``, about 2·depth·2⁻⁸ relative), on the scale of the largest |log π| times
the largest |A| for the loss and relative to each gradient's largest entry (the backward's budget) for the gradients;
the flow family's Gaussian log-densities divide the mean's rounding by the step's variance, so it is compared on its
own log-density scale the same way. The measured error is printed relative to that budget.
"""

import pytest
import torch

from mmgrpo import noise
from tests.adapter_cases import CASES, build
from tests.numerics import adapter_reductions

FAMILIES = ["vlm", "video", "ar_image", "whisper", "audio_llm", "flow"]


def _loss_and_grads(adapter, rollout, adv, autocast: bool):
    params = [p for p in adapter.trainable_parameters() if p.requires_grad]
    index = torch.arange(rollout.batch_size)
    ctx = torch.autocast("cpu", dtype=torch.bfloat16) if autocast else torch.autocast("cpu", enabled=False)
    with ctx:
        logp = adapter.logprobs(rollout, index)  # [B, T]
    m = rollout.mask.to(logp.device)  # [B, T]
    loss = -(logp.float() * adv * m).sum() / m.sum().clamp_min(1.0)  # [] fp32 advantage math
    grads = torch.autograd.grad(loss, params, allow_unused=True)
    return logp.detach(), loss.detach(), grads


@pytest.mark.parametrize("name", FAMILIES)
def test_bf16_compute_matches_fp32_within_bf16_rounding(name, mmgrpo_cache):
    if name in ("whisper", "audio_llm"):
        import shutil

        if shutil.which("espeak-ng") is None:
            pytest.skip("espeak-ng is not installed (apt-get install -y espeak-ng): no speech to synthesise")
    case = CASES[name]
    adapter = build(name, lora=False)
    rows, G = case.rows(), 2
    rollout = adapter.rollout(rows, G, noise.NoiseKeys(0, 1, (0, 1), G))
    assert rollout.mask.sum() > 0
    adv = torch.linspace(-1.0, 1.5, rollout.batch_size)[:, None]  # [B, 1]
    lp32, loss32, g32 = _loss_and_grads(adapter, rollout, adv, autocast=False)
    lp16, loss16, g16 = _loss_and_grads(adapter, rollout, adv, autocast=True)
    assert {p.dtype for p in adapter.trainable_parameters()} == {torch.float32}  # fp32 master weights
    assert lp16.dtype == torch.float32 and loss16.dtype == torch.float32  # fp32 log-ratio and advantage math
    m = rollout.mask > 0
    assert not torch.equal(lp16[m], lp32[m]), "autocast changed nothing: the forward did not run in bf16"
    budget = adapter_reductions(adapter)
    scale = float(lp32[m].abs().max().clamp_min(1.0))
    tol = budget.tol(scale, stored=torch.bfloat16)
    err = float((lp16 - lp32)[m].abs().max())
    print(f"{name}: log-prob error {err:.3g} = {err / tol:.3f} of the bf16 budget {tol:.3g}")
    assert err <= tol, (err, tol)
    loss_tol = budget.tol(scale * float(adv.abs().max()), stored=torch.bfloat16)
    assert abs(float(loss16 - loss32)) <= loss_tol, (float(loss16), float(loss32), loss_tol)
    back = budget.backward()
    # a parameter's gradient is a sum over upstream gradients rounded in bf16 whatever its own size, so every
    # gradient is held to the budget on the scale of the largest one (a small gradient's own maximum is no bound on
    # the rounding it inherits: flow's smallest tensors missed theirs by 4 % under AVX2 kernels)
    gscale = max(float(w.abs().max()) for w in g32 if w is not None)
    gtol = back.tol(gscale, stored=torch.bfloat16)
    checked = 0
    for g, w in zip(g16, g32, strict=True):
        if w is None or float(w.abs().max()) == 0.0:
            continue
        assert g is not None and float((g - w).abs().max()) <= gtol, (float((g - w).abs().max()), gtol)
        checked += 1
    assert checked > 0
