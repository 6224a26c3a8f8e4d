"""An update split into minibatches has the gradient of one loss over the whole update, for every aggregation.

Run through ``Trainer._update`` on the tiny VLM: the optimizer step is replaced by a recorder of the
accumulated gradients, compared with one backward of the whole-update loss built from the same library
functions (``losses.SURROGATES`` / ``losses.AGGREGATIONS``) without any minibatch weighting.

Tolerance (tests/numerics.py): the minibatches' forwards and backwards batch other rows together and their
gradients are summed minibatch by minibatch, so the two agree within the tiny model's backward rounding budget
(reductions read from its config, one more sum over the B minibatches), relative to each gradient's largest entry;
a log-ratio of the recompute within the forward budget on the log-prob scale.
"""

import pytest
import torch

from mmgrpo import losses
from mmgrpo.loader import load_config
from mmgrpo.trainer import Trainer
from tests.numerics import Reductions, adapter_reductions, elementwise_tol
from tests.test_trainer import QUICK

TINY = [
    "algorithm.prompts_per_step=1",
    "algorithm.group_size=4",
    "model.args.max_new_tokens=5",
    "model.args.min_new_tokens=5",
    "task.args.train_size=8",
    "task.args.eval_size=4",
    "warmup.steps=0",
    "logging.trackers=[]",
    "logging.progress=false",
    "optim.max_grad_norm=0",
    "algorithm.beta=0",
]


@pytest.fixture(scope="module")
def trainer(tmp_path_factory, mmgrpo_cache):
    out = tmp_path_factory.mktemp("agg")
    t = Trainer(load_config(QUICK, [*TINY, f"output_dir={out}"]))
    rows = [t.task.train_rows()[i] for i in t.sampler.indices(0)]
    t.rollout = t.adapter.rollout(rows, 4)  # B = 4 samples, T = 5
    return t


def _recorded_update(t: Trainer, unit_adv, mask) -> list[torch.Tensor]:
    """Gradients ``_update`` hands to the optimizer (one update), recorded instead of stepped."""
    grads = []

    def record():
        params = t.adapter.trainable_parameters()
        grads.extend(torch.zeros_like(p) if p.grad is None else p.grad.detach().clone() for p in params)
        t.optimizer.zero_grad(set_to_none=True)
        return torch.zeros(())

    t._optimizer_step = record
    try:
        t._update(t.rollout, unit_adv, mask, None)
    finally:
        del t._optimizer_step
    return grads


def _whole_update_grads(t: Trainer, unit_adv, mask) -> list[torch.Tensor]:
    a, r = t.cfg.algorithm, t.rollout
    t.optimizer.zero_grad(set_to_none=True)
    logp = t.adapter.logprobs(r, torch.arange(r.batch_size))  # [B, T]
    per_unit, _ = losses.SURROGATES.get(a.surrogate)(
        logp - r.old_logprobs,
        unit_adv,
        mask,
        losses.resolve_options(a).surrogate,
    )
    losses.AGGREGATIONS.get(a.aggregation)(per_unit, mask, max_units=mask.shape[1]).backward()
    grads = [
        torch.zeros_like(p) if p.grad is None else p.grad.detach().clone() for p in t.adapter.trainable_parameters()
    ]
    t.optimizer.zero_grad(set_to_none=True)
    return grads


CASES = [
    ("token_mean", 1),
    ("token_mean", 3),
    ("token_mean", 4),
    ("seq_mean_token_mean", 1),
    ("seq_mean_token_mean", 3),
    ("seq_sum_const_norm", 1),
    ("seq_sum_const_norm", 3),
]  # B = 4: 4 is "all"


@pytest.mark.parametrize("aggregation,minibatch_size", CASES)
def test_minibatch_gradients_equal_the_whole_update(trainer, aggregation, minibatch_size):
    t = trainer
    t.cfg.algorithm.aggregation, t.cfg.algorithm.minibatch_size = aggregation, minibatch_size
    B, T = t.rollout.old_logprobs.shape
    mask = torch.zeros(B, T)
    for b, n in enumerate([1, 5, 3, 0][:B]):  # very different lengths, one sample fully masked
        mask[b, :n] = 1.0
    unit_adv = torch.linspace(-1.5, 2.0, B)[:, None] * mask  # [B, T]
    got = _recorded_update(t, unit_adv, mask)
    want = _whole_update_grads(t, unit_adv, mask)
    total = sum(float(w.abs().sum()) for w in want)
    assert total > 0
    forward = adapter_reductions(t.adapter, positions=T)
    budget = Reductions(forward.terms, forward.depth + 1).backward()  # + the sum over minibatches
    for g, w in zip(got, want):
        budget.assert_close(g, w)


def test_worked_example_token_mean_is_one_mean_over_the_update(trainer):
    """Two samples with 1 and 3 valid tokens, A = +1, log-ratio 0, minibatch_size=1: every token's gradient
    d loss / d log π is −1/4 (DAPO's token mean over the 4 tokens), not −1/2 and −1/6 (mean per minibatch)."""
    t = trainer
    t.cfg.algorithm.aggregation, t.cfg.algorithm.minibatch_size = "token_mean", 1
    B, T = t.rollout.old_logprobs.shape
    mask = torch.zeros(B, T)
    mask[0, :1] = 1.0
    mask[1, :3] = 1.0  # samples 2.. fully masked: the update holds the example's 4 tokens
    unit_adv = mask.clone()  # A = +1 on every valid token
    seen = {}
    original = t.adapter.logprobs

    def logprobs(rollout, index):
        out = original(rollout, index)
        out.retain_grad()
        seen[int(index[0])] = out
        return out

    t.adapter.logprobs = logprobs
    try:
        _recorded_update(t, unit_adv, mask)
    finally:
        del t.adapter.logprobs
    # d(−A·r/4)/d log π = −r/4 with r = exp(log π − log π_old): a few elementwise roundings (exp, the clip's select,
    # the 1/4 weight and the mask), the ratio 1 up to the recompute's forward rounding
    ratio0 = (seen[0].detach()[0] - t.rollout.old_logprobs[0]).exp()
    torch.testing.assert_close(seen[0].grad[0, :1], -0.25 * ratio0[:1], atol=elementwise_tol(ops=4, scale=0.25), rtol=0)
    ratio1 = (seen[1].detach()[0] - t.rollout.old_logprobs[1]).exp()
    torch.testing.assert_close(seen[1].grad[0, :3], -0.25 * ratio1[:3], atol=elementwise_tol(ops=4, scale=0.25), rtol=0)
    recompute, old = seen[1].detach()[0, :3], t.rollout.old_logprobs[1, :3]
    adapter_reductions(t.adapter, positions=T).assert_logprobs_close(recompute, old)


def test_aggregation_units_by_hand():
    mask = torch.tensor([[1.0, 0.0, 0.0], [1.0, 1.0, 1.0], [0.0, 0.0, 0.0]])
    assert float(losses.TokenMeanOptions().units(mask)) == 4.0
    assert float(losses.SeqMeanTokenMeanOptions().units(mask)) == 2.0
    assert float(losses.SeqSumConstNormOptions().units(mask)) == 3.0
