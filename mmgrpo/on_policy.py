"""π_old at μ = 1: the update's own log-probs, detached, with no log-prob forward after sampling (issue 52, item 2).

When each rollout gets exactly one optimizer update from one pass over it (``algorithm.epochs = 1`` and
``algorithm.updates_per_epoch = 1``), the policy that sampled the units is the one the update differentiates, so
π_old = sg(π_θ) and the ratio is 1 by construction (GRPO's objective with μ = 1, DeepSeekMath arXiv 2402.03300;
TRL's ``GRPOTrainer`` skips the old-log-prob forward in that case and uses ``per_token_logps.detach()``). The token
adapters then skip their no-grad log-prob forward after sampling and mark ``Rollout.old_logprobs`` with
:data:`DEFERRED` (NaN); the trainer fills each marked unit with the training forward's log-prob, detached
(:func:`old_logprobs`). The loss and its gradient are those of the recompute path up to the recompute's float rounding
(the ratio is exactly 1 here, 1 ± ~1e-7 there): ``tests/test_on_policy_old.py``. Whisper keeps its sampler's
log-probs (it never ran the forward) and the flow adapters their own π_old (DGPO's is the reference's).

The forward is kept where π_old is read before or beside the update, or is not the current policy:
- μ > 1 or several updates per epoch (the later minibatches see an updated policy);
- a rollout engine (``rollout.engine: vllm``): the truncated importance weights π_old / π_engine are computed before
  the update (``mmgrpo/importance.py``);
- ``algorithm.ratio_norm`` (GRPO-Guard normalises the log-ratio itself);
- advantage transforms that read the sampling policy's mean log-probability (``mmgrpo/advantage_steps.py``);
- rollout steps other than those that only add on-policy samples of the current policy (:data:`ON_POLICY_STEPS`):
  replay's stored μ, AEPO's re-scoring at another temperature, scaffold's hinted donors read or set π_old.

A NaN left in a unit that is read elsewhere shows as NaN, never as a silent zero.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import torch
from torch import Tensor

from mmgrpo import advantage_steps, rollout_steps

DEFERRED = float("nan")
"""The value of ``Rollout.old_logprobs`` the adapter did not compute: the update's own log-prob, detached, is used."""

ON_POLICY_STEPS = frozenset(
    {"gt_injection", "dynamic_sampling", "difficulty_augmentation", "observe_sampler", "knapsack_budget", "cppo"}
)
"""Rollout steps whose samples are all drawn (or injected and scored) by the current policy, with π_old the current
policy's log-probs: with them the old-log-prob forward can still be skipped at μ = 1."""


@runtime_checkable
class OldFromUpdate(Protocol):
    """An adapter that can leave π_old to the update (:data:`DEFERRED`) instead of a log-prob forward after sampling."""

    def old_logprobs_from_update(self) -> None:
        """From now on, rollouts leave ``old_logprobs`` :data:`DEFERRED` (NaN) wherever they would recompute them."""


def keeps_forward(cfg: Any) -> str | None:
    """Why the old-log-prob forward is needed under ``cfg`` (a ``TrainConfig``), or None at μ = 1 on-policy."""
    a = cfg.algorithm
    if a.epochs != 1 or a.updates_per_epoch != 1:
        return f"algorithm.epochs={a.epochs}, updates_per_epoch={a.updates_per_epoch}: the ratio leaves 1"
    if cfg.rollout.engine != "native":
        return f"rollout.engine={cfg.rollout.engine}: importance weights read π_old before the update"
    if a.ratio_norm:
        return "algorithm.ratio_norm: GRPO-Guard normalises the recomputed log-ratio"
    reads = [s.name for s in advantage_steps.build(a) if s.kind == "advantage_transform"]
    reads = [n for n in reads if n not in advantage_steps.TRANSFORM_INPUTS]
    if reads:
        return f"algorithm.advantage_transform {reads[0]} reads the sampling policy's log-probs"
    steps = [name for name, _ in rollout_steps.configured(a) if name not in ON_POLICY_STEPS]
    if steps:
        return f"rollout step {steps[0]} reads or sets π_old"
    return None


def configure(adapter: Any, cfg: Any) -> bool:
    """Tell ``adapter`` to skip its old-log-prob forward when ``cfg`` allows it (:func:`keeps_forward` is None) and
    the adapter can (:class:`OldFromUpdate`); True when it now does."""
    if keeps_forward(cfg) is not None or not isinstance(adapter, OldFromUpdate):
        return False
    adapter.old_logprobs_from_update()
    return True


def deferred_like(mask: Tensor) -> Tensor:
    """``old_logprobs`` left to the update: :data:`DEFERRED` everywhere. Shape: mask [B, T] -> [B, T] float32."""
    return torch.full(mask.shape, DEFERRED, dtype=torch.float32)


def old_logprobs(stored: Tensor, logprobs: Tensor) -> Tensor:
    """π_old of a minibatch: the stored log-probs, and the training forward's, detached, where they are
    :data:`DEFERRED`. Without a deferred unit the result equals ``stored`` bit for bit.

    Shape: stored [n, T] (on the device of ``logprobs``), logprobs [n, T] -> [n, T]."""
    return torch.where(torch.isnan(stored), logprobs.detach().to(stored.dtype), stored)  # [n, T]
