"""bf16 weights on CPU: the tiny Qwen2.5-VL built with ``dtype="bfloat16"`` samples, and its log-probs are fp32 with a
first ratio of 1 within bf16 rounding, whether ``old_logprobs`` come from the no-grad recompute or from the sampler
(a KV-cached decode, a different computation in bf16), on minibatches other than the rollout's forward batch.

Tolerance (tests/numerics.py): the model's reductions read from its config, accumulated in fp32 and each rounded to
bf16 once (``Reductions.tol(stored=torch.bfloat16)``), relative to the largest |logit| the head produced (log p =
z − logsumexp z moves by at most twice the largest change of z). Measured here: 0 (recompute) and 4.8e-7
(sampler), far inside the bound, because two orders rarely round a bf16 result differently; the bound is what
another machine's kernels may give.
"""

import json
import math

import pytest
import torch

from mmgrpo import losses
from mmgrpo.modalities.vlm.adapter import build_vlm_adapter
from mmgrpo.tasks.shapes import ShapesArgs, ShapesTask
from tests.numerics import adapter_reductions


def _record_logit_scale(model) -> list[float]:
    """Largest |logit| of every forward of ``model``'s output head, appended to the returned list (at least 1)."""
    seen = [1.0]
    head = model.get_output_embeddings()
    head.register_forward_hook(lambda mod, args, out: seen.append(float(out.detach().float().abs().max())))
    return seen


@pytest.mark.parametrize("old_logprobs", ["recompute", "sampler"])
def test_bf16_ratio_is_one_before_the_first_update(tiny_vlm_path, old_logprobs):
    torch.manual_seed(0)
    args = {"name_or_path": tiny_vlm_path, "max_new_tokens": 8, "temperature": 0.9, "old_logprobs": old_logprobs}
    adapter = build_vlm_adapter(args, dtype="bfloat16")
    assert next(adapter.model.parameters()).dtype == torch.bfloat16
    logits = _record_logit_scale(adapter.model)
    rows = ShapesTask(ShapesArgs(train_size=3, eval_size=1)).train_rows()
    rollout = adapter.rollout(rows, group_size=4)
    assert rollout.old_logprobs.dtype == torch.float32
    B, T = rollout.mask.shape
    for index in [torch.arange(B), torch.tensor([1, 5, 6, 10]), torch.tensor([3])]:  # minibatches of the update
        logp = adapter.logprobs(rollout, index)  # [n, T]
        assert logp.dtype == torch.float32
        mask = rollout.mask[index].bool()
        assert mask.any()
        log_ratio = (logp.detach().cpu() - rollout.old_logprobs[index])[mask]
        tol = 2 * adapter_reductions(adapter).tol(max(logits), stored=torch.bfloat16)
        assert tol < 0.5 and float(log_ratio.abs().max()) <= tol, (float(log_ratio.abs().max()), tol)
    adv = torch.randn(B, 1).expand(B, T) * rollout.mask
    per_unit, _ = losses.SURROGATES.get("ppo_clip")(
        logp - rollout.old_logprobs[index].to(logp.device),
        adv[index],
        rollout.mask[index],
        losses.PPOClipOptions(clip_low=0.2, clip_high=0.2),
    )
    loss = losses.AGGREGATIONS.get("token_mean")(per_unit, rollout.mask[index], max_units=T)
    assert loss.dtype == torch.float32 and torch.isfinite(loss)
    loss.backward()
    grads = [p.grad for p in adapter.trainable_parameters() if p.grad is not None]
    assert grads and all(g.dtype == torch.bfloat16 and torch.isfinite(g).all() for g in grads)


def test_accelerate_bf16_trainer_step_keeps_fp32_ratio(tmp_path, monkeypatch, request, mmgrpo_cache):
    """``accelerate launch --mixed_precision bf16`` (the environment variable it sets): the model runs under bf16
    autocast, and the first update's ratio (one minibatch = the whole rollout, before any step) is 1 within bf16
    rounding (the module's docstring)."""
    from accelerate.state import AcceleratorState

    from mmgrpo.loader import load_config
    from mmgrpo.trainer import Trainer
    from tests.test_trainer import QUICK, SMALL

    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "bf16")
    AcceleratorState._reset_state()  # an earlier test's Accelerator (mixed_precision "no") would be reused
    request.addfinalizer(AcceleratorState._reset_state)  # and later tests must not inherit bf16
    overrides = ["algorithm.minibatch_size=8", "steps=1", "eval.before=false", "eval.after=false", "warmup.steps=1"]
    trainer = Trainer(load_config(QUICK, SMALL + overrides + [f"output_dir={tmp_path / 'run'}"]))
    assert trainer.acc.mixed_precision == "bf16"
    seen = set()
    model = trainer.acc.unwrap_model(trainer.adapter.model)
    model.get_output_embeddings().register_forward_hook(lambda mod, args, out: seen.add(out.dtype))
    logits = _record_logit_scale(model)
    trainer.run()
    assert torch.bfloat16 in seen, f"lm_head never ran under bf16 autocast: {seen}"
    step = [json.loads(x) for x in (tmp_path / "run/metrics.jsonl").read_text().splitlines() if '"reward/mean"' in x]
    assert len(step) == 1
    tol = math.expm1(2 * adapter_reductions(trainer.adapter).tol(max(logits), stored=torch.bfloat16))
    assert tol < 0.5, tol
    assert abs(step[0]["loss/ratio_mean"] - 1.0) <= tol and step[0]["loss/ratio_max"] <= 1.0 + tol, (step[0], tol)
    assert all(math.isfinite(v) for v in step[0].values())
