"""At μ = 1 the old log-probs are the update's own, detached: no log-prob forward after sampling (mmgrpo/on_policy.py).

On the tiny VLM of the quickstart: the same keyed rollout with the recompute forward and with π_old left to the
update gives the same tokens, one forward fewer per rollout chunk, and the same loss and gradients to fp32 rounding
(the recompute's ratio is 1 ± its forward rounding, the deferred one exactly 1).
"""

import math
import shutil

import pytest
import torch

from mmgrpo import noise, on_policy
from mmgrpo.loader import load_config
from mmgrpo.trainer import Trainer
from tests.adapter_cases import CASES, build
from tests.numerics import adapter_reductions
from tests.test_aggregation_minibatch import TINY
from tests.test_trainer import QUICK


@pytest.fixture(scope="module")
def trainer(tmp_path_factory, mmgrpo_cache):
    out = tmp_path_factory.mktemp("onpolicy")
    return Trainer(load_config(QUICK, [*TINY, "algorithm.minibatch_size=2", f"output_dir={out}"]))


def _counted_rollout(t: Trainer, rows: list[dict]):
    """A keyed rollout of ``rows`` (G = 4) and the number of forward calls of the policy model it made."""
    calls = []
    handle = t.adapter.unwrapped().register_forward_hook(lambda *_: calls.append(1))
    try:
        rollout = t.adapter.rollout(rows, 4, noise.NoiseKeys(7, 0, tuple(range(len(rows))), 4))
    finally:
        handle.remove()
    return rollout, len(calls)


def _update_grads(t: Trainer, rollout, unit_adv, mask) -> tuple[list[torch.Tensor], dict]:
    """The gradients ``Trainer._update`` hands to the optimizer (recorded, not stepped) and its metrics."""
    grads = []

    def record():
        grads.extend(p.grad.detach().clone() for p in t.adapter.trainable_parameters())
        t.optimizer.zero_grad(set_to_none=True)
        return torch.zeros(())

    t._optimizer_step = record
    try:
        metrics = t._update(rollout, unit_adv, mask, None)
    finally:
        del t._optimizer_step
    return grads, metrics


def test_deferred_old_logprobs_skip_a_forward_and_keep_loss_and_gradients(trainer):
    t = trainer
    rows = [t.task.train_rows()[i] for i in t.sampler.indices(0)]
    t.adapter.old_from_update = False
    recomputed, n_recompute = _counted_rollout(t, rows)
    t.adapter.old_logprobs_from_update()
    try:
        deferred, n_deferred = _counted_rollout(t, rows)
    finally:
        t.adapter.old_from_update = False
    assert torch.equal(recomputed.state.completion_ids, deferred.state.completion_ids)  # keyed: the same tokens
    assert torch.equal(recomputed.mask, deferred.mask)
    assert torch.isnan(deferred.old_logprobs).all() and torch.isfinite(recomputed.old_logprobs).all()
    assert n_deferred < n_recompute, (n_deferred, n_recompute)  # the recompute forward(s) saved

    mask = recomputed.mask  # [B, T]
    unit_adv = torch.linspace(-1.5, 2.0, recomputed.batch_size)[:, None] * mask  # [B, T]
    want, want_metrics = _update_grads(t, recomputed, unit_adv, mask)
    got, got_metrics = _update_grads(t, deferred, unit_adv, mask)
    assert sum(float(w.abs().sum()) for w in want) > 0
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6 * float(w.abs().max().clamp_min(1e-12)))
    assert math.isfinite(float(got_metrics["loss/policy"]))
    torch.testing.assert_close(got_metrics["loss/policy"], want_metrics["loss/policy"], rtol=1e-5, atol=1e-7)


def test_stored_old_logprobs_pass_through_bit_for_bit():
    stored = torch.tensor([[-1.25, 0.0, -3.5], [-0.5, -2.0, 0.0]])  # [n, T]
    logp = torch.randn(2, 3, requires_grad=True)  # [n, T]
    assert torch.equal(on_policy.old_logprobs(stored, logp), stored)
    stored[1] = on_policy.DEFERRED
    old = on_policy.old_logprobs(stored, logp)  # [n, T]
    assert torch.equal(old[0], stored[0]) and torch.equal(old[1], logp.detach()[1]) and not old.requires_grad


@pytest.mark.parametrize(
    "override,reason",
    [
        ([], None),
        (["algorithm.epochs=2"], "epochs=2"),
        (["algorithm.updates_per_epoch=2"], "updates_per_epoch=2"),
        (["algorithm.advantage_transform=[unlikeliness]"], "unlikeliness"),
        (["algorithm.rollout_steps={replay: {}}"], "replay"),
    ],
)
def test_the_forward_is_kept_where_old_logprobs_are_read(override, reason):
    cfg = load_config(QUICK, [*TINY, *override, "output_dir=unused"])
    why = on_policy.keeps_forward(cfg)
    assert why is None if reason is None else reason in why, why

    class Adapter:
        old_from_update = False

        def old_logprobs_from_update(self):
            self.old_from_update = True

    adapter = Adapter()
    assert on_policy.configure(adapter, cfg) is (reason is None) and adapter.old_from_update is (reason is None)


def test_one_step_at_mu_one_trains_without_the_forward(tmp_path, mmgrpo_cache):
    cfg = load_config(QUICK, [*TINY, "steps=1", f"output_dir={tmp_path / 'run'}"])
    t = Trainer(cfg)
    summary = t.run()
    assert t.adapter.old_from_update and summary["train/steps"] == 1


def _module_calls(fn):
    """``fn()`` and the number of ``nn.Module`` calls it made (every module, hooked globally)."""
    calls = []
    handle = torch.nn.modules.module.register_module_forward_hook(lambda *_: calls.append(1))
    try:
        return fn(), len(calls)
    finally:
        handle.remove()


@pytest.mark.parametrize("name", ["ar_image", "video", "audio_llm"])
def test_other_token_families_skip_the_forward(name, mmgrpo_cache):
    """AR image (its own rollout) and the VLM adapter's subclasses draw the same keyed units with one forward fewer;
    every unit is left to the update (NaN), where the log-ratio is exactly 0."""
    if name == "audio_llm" and shutil.which("espeak-ng") is None:
        pytest.skip("espeak-ng is not installed (apt-get install -y espeak-ng): no speech to synthesise")
    case = CASES[name]
    adapter = build(name, lora=False)
    rows, G = case.rows(), 2
    keys = noise.NoiseKeys(0, 1, (0, 1), G)
    adapter.old_from_update = False
    recomputed, n_recompute = _module_calls(lambda: adapter.rollout(rows, G, keys))
    adapter.old_from_update = True
    deferred, n_deferred = _module_calls(lambda: adapter.rollout(rows, G, keys))
    assert torch.equal(getattr(recomputed.state, case.drawn), getattr(deferred.state, case.drawn))
    assert n_deferred < n_recompute, (n_deferred, n_recompute)
    assert torch.isnan(deferred.old_logprobs).all() and torch.isfinite(recomputed.old_logprobs).all()
    logp = adapter.logprobs(deferred, torch.arange(deferred.batch_size))  # [B, T]
    assert torch.equal(logp - on_policy.old_logprobs(deferred.old_logprobs, logp), torch.zeros_like(logp))
    m = recomputed.mask > 0
    adapter_reductions(adapter).assert_logprobs_close(logp.detach()[m], recomputed.old_logprobs[m])


def test_multi_turn_rollout_leaves_old_logprobs_to_the_update(tiny_vlm_path):
    """The multi-turn driver (modalities/tokens/turns.py): a two-turn trajectory with a tool observation."""
    from tests.test_turns import CROP, _adapter, _rows, script

    adapter = _adapter(tiny_vlm_path)
    script(adapter, {0: [CROP, "<answer>red</answer>"], 1: ["<answer>blue</answer>"]})
    adapter.old_logprobs_from_update()
    rollout = adapter.rollout(_rows(1), group_size=2)
    assert rollout.mask.sum() > 0 and torch.isnan(rollout.old_logprobs).all()
    logp = adapter.logprobs(rollout, torch.arange(2))  # [2, T]
    assert torch.equal(logp - on_policy.old_logprobs(rollout.old_logprobs, logp), torch.zeros_like(logp))
