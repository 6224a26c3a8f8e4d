"""Entropy control (mmgrpo/entropy_control.py): AEPO's pieces worked by hand, its step on the tiny VLM (temperature-T
samples spliced in, re-scored at the training temperature, advantage pinned to 1), the entropy bonus in a trainer
step, and the combinations refused at load in one line."""

import math

import pytest
import torch

from mmgrpo.config import ConfigError
from mmgrpo.entropy_control import (
    REINFORCE_COLUMN,
    AEPOOptions,
    batch_entropy,
    pick_temperature,
    pin_reinforce,
    reinforce_count,
    reinforce_selection,
)
from tests.test_trainer import QUICK, ROOT, SMALL

AEPO = ROOT / "configs/variant_aepo.yaml"
BONUS = ROOT / "configs/variant_entropy_bonus.yaml"


def test_temperature_and_count_follow_the_entropy_by_hand():
    """The code's rule: H ≤ H_target → T_high and n = min(N, selected); H > H_target → T_low and n halved."""
    o = AEPOOptions(target_entropy=0.5, temperature_high=1.2, temperature_low=0.8, reinforce_samples=10)
    assert pick_temperature(0.5, o) == 1.2 and pick_temperature(0.49, o) == 1.2 and pick_temperature(0.51, o) == 0.8
    assert reinforce_count(7, 0.3, o) == 7 and reinforce_count(25, 0.3, o) == 10
    assert reinforce_count(7, 0.9, o) == 3 and reinforce_count(25, 0.9, o) == 5


def test_reinforce_selection_by_hand():
    """GRPO advantage within each group (unbiased std), kept above 0.05: rewards (1, 0, 0, 0) → mean 1/4, std 1/2,
    A = (1.5, −0.5, −0.5, −0.5); (1, 1, 0, 0) → std 1/√3, A = ±√3/2 = ±0.866; (1, 1, 1, 1) → A = 0, none kept."""
    combined = torch.tensor([[1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]])
    keep = reinforce_selection(combined, 0.05)
    assert keep.tolist() == [True, False, False, False, True, True, False, False, False, False, False, False]
    assert not reinforce_selection(combined, 1.6).any()  # 1.5 is the largest advantage


def test_batch_entropy_is_the_sampled_token_estimate():
    """−mean log π_old over valid units: log π = [[−1, −2, ·], [−3, ·, ·]] → (1 + 2 + 3) / 3 = 2."""
    old = torch.tensor([[-1.0, -2.0, -7.0], [-3.0, -5.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    num, den = batch_entropy(old, mask).tolist()
    assert (num, den) == (6.0, 3.0)


class _State:
    def __init__(self, unit, mask, rollout):
        self.unit, self.mask, self.rollout = unit, mask, rollout


class _Rollout:
    def __init__(self, mask, marks):
        self.mask, self.extras = mask, {REINFORCE_COLUMN: marks} if marks is not None else {}


def test_pin_sets_the_marked_samples_advantage_to_one_on_their_units():
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [1.0, 1.0, 1.0]])  # [B, T]
    unit = torch.tensor([[-0.5, -0.5, 0.0], [2.0, 0.0, 0.0], [0.3, 0.3, 0.3]])
    filtered = mask.clone()
    filtered[0] = 0.0  # a filter dropped sample 0's group
    state = _State(unit.clone(), filtered, _Rollout(mask, [True, False, False]))
    pin_reinforce(state, None)
    torch.testing.assert_close(state.unit, torch.tensor([[1.0, 1.0, 0.0], [2.0, 0.0, 0.0], [0.3, 0.3, 0.3]]))
    torch.testing.assert_close(state.mask, mask)
    untouched = _State(unit.clone(), mask.clone(), _Rollout(mask, None))
    pin_reinforce(untouched, None)  # no AEPO marks: nothing changes
    assert torch.equal(untouched.unit, unit)


def _trainer(tmp_path, config, extra=()):
    from mmgrpo.loader import load_config
    from mmgrpo.trainer import Trainer

    cfg = load_config(config, SMALL + [f"output_dir={tmp_path}", "steps=1", "warmup.steps=0", *extra])
    return Trainer(cfg)


def _with_length(trainer):
    """Rewards plus the completion's length / 10: every group has a reward contrast (an untrained model scores 0)."""
    runner = trainer.rewards

    class WithLength:
        weights, names = runner.weights, runner.names

        def __call__(self, outputs, prompts, columns, **kwargs):
            scores, metrics = runner(outputs, prompts, columns, **kwargs)  # [B, K]
            return scores + torch.tensor([[len(o) / 10] for o in outputs], dtype=scores.dtype), metrics

    trainer.rewards = WithLength()


@pytest.mark.parametrize("target,temperature", [(10.0, 1.2), (0.0, 0.8)])
def test_aepo_step_splices_temperature_samples_rescored_at_the_training_temperature(
    tmp_path, mmgrpo_cache, target, temperature
):
    """On the tiny VLM: T follows the entropy estimate (a target of 10 nats is above it: T_high; 0 below: T_low);
    the first n samples become T-samples marked for the twin, whose old log-probs are the policy's at the training
    temperature (ratio 1 in the update), different from their log-probs at T; the adapter's temperature is restored."""
    from mmgrpo import rollout_steps

    trainer = _trainer(
        tmp_path, AEPO, [f"algorithm.rollout_steps.aepo.target_entropy={target}", "algorithm.prompts_per_step=4"]
    )
    _with_length(trainer)
    adapter = trainer.adapter
    tau = adapter.args.temperature
    trainer._rollout_s = 0.0  # as train_step sets it
    ctx = trainer._rollout_context(0)
    first = trainer._rollout(ctx, trainer._sample_rows(0), trainer.sampler.indices(0), ctx.keys(trainer.cfg.seed))
    before = list(first.rollout.outputs)
    batch = rollout_steps.run(trainer.rollout_steps, ctx, first)
    assert adapter.args.temperature == tau
    assert batch.metrics["aepo/temperature"] == temperature
    n = int(batch.metrics["aepo/reinforce_samples"])
    marks = batch.rollout.extras[REINFORCE_COLUMN]
    assert n > 0 and marks == [True] * n + [False] * (batch.rollout.batch_size - n)
    assert batch.rollout.outputs[n:] == before[n:]
    idx = torch.arange(n)
    with torch.no_grad():
        now = adapter.logprobs(batch.rollout, idx)  # [n, T] at the training temperature
        with adapter.sampling_temperature(temperature):
            at_t = adapter.logprobs(batch.rollout, idx)
    m = batch.rollout.mask[:n]
    torch.testing.assert_close(batch.rollout.old_logprobs[:n] * m, now * m, rtol=0, atol=1e-5)
    assert float(((at_t - now).abs() * m).max()) > 1e-3  # the check can fail: T's log-probs differ


def test_a_trainer_step_with_aepo_and_the_entropy_bonus(tmp_path, mmgrpo_cache):
    """One step trains with both: the entropy is logged and positive, the pinned samples enter the update."""
    trainer = _trainer(tmp_path, AEPO, ["algorithm.loss_terms.entropy_bonus.coef=0.01"])
    _with_length(trainer)
    metrics = trainer.train_step(0)
    assert math.isfinite(metrics["loss/policy"]) and metrics["entropy/mean"] > 0.05
    assert metrics["loss/entropy_bonus"] == pytest.approx(-0.01 * metrics["entropy/mean"], rel=1e-4)
    assert metrics["aepo/temperature"] in (0.8, 1.2)


def test_entropy_bonus_with_coef_zero_trains_exactly_as_grpo(tmp_path, mmgrpo_cache):
    """coef 0 logs entropy/mean and leaves the step bit-identical: the same loss and gradient norm as without it."""
    plain = _trainer(tmp_path / "plain", QUICK).train_step(0)
    logged = _trainer(tmp_path / "logged", QUICK, ["algorithm.loss_terms.entropy_bonus.coef=0.0"]).train_step(0)
    assert "entropy/mean" in logged and "entropy/mean" not in plain
    for key in ("loss/policy", "optim/grad_norm", "kl/mean"):
        assert logged[key] == plain[key], key


@pytest.mark.parametrize(
    "config, overrides, message",
    [
        (AEPO, ["algorithm.dynamic_sampling.enabled=true"], "not combined with"),
        (AEPO, ["algorithm.surrogate=reg_grpo"], "fits whole groups"),
        (AEPO, ["algorithm.rollout_steps.aepo.temperature_low=1.5"], "low must not exceed high"),
        (AEPO, ["algorithm.rollout_steps.aepo.temperatur=1.5"], "temperatur"),
        (BONUS, ["algorithm.loss_terms.entropy_bonus.coef=-1"], "coef"),
        (ROOT / "configs/flow_grpo.yaml", ["algorithm.loss_terms.entropy_bonus.coef=0.01"], "logprobs_and_entropy"),
        (ROOT / "configs/ar_image_grpo.yaml", ["algorithm.loss_terms.entropy_bonus.coef=0.01"], "logprobs_and_entropy"),
        (ROOT / "configs/flow_grpo.yaml", ["algorithm.rollout_steps.aepo.target_entropy=0.5"], "needs an adapter"),
    ],
)
def test_unsupported_combinations_are_refused_at_load_in_one_line(config, overrides, message):
    from mmgrpo.loader import load_config

    with pytest.raises(ConfigError) as e:
        load_config(config, overrides)
    assert message in str(e.value) and "\n" not in str(e.value)
