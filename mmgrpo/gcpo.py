"""GCPO: the reference answer joins a group only when every sample of the group failed ("go gold").

GCPO (Wu & Liu 2025, "GCPO: When Contrast Fails, Go Gold", arXiv 2510.07790; code github.com/AchoWu/GCPO, not
stored here and not read) observes that GRPO learns nothing from a group whose samples all failed: every reward
is equal, every advantage zero. When that happens (and only then) one sample of the group is replaced by the
golden answer (GA), the dataset's reference, so the group holds one success to contrast with. What is implemented
(the paper's equations could not be retrieved here: the method as its abstract and the summaries state it, *our
reading* of the details):

* failure: a sample failed when its score s_b ≤ ``threshold`` (default 0: a wrong answer's accuracy), where s_b is
  the reward ``reward`` names (default: the weighted sum of the rewards, as the advantage sees it); a group is
  all-failed when every one of its G samples failed (a NaN score, "not applicable", is not a failure)::

      inject_p = ∧_{g=1..G} [ s_{p,g} ≤ threshold ]                                 (our reading)

* the gold sample: slot ``slot`` (−1 = the last) of each all-failed group becomes ``template`` filled from the
  row's ``column`` + EOS, teacher-forced (its old log-probs are the current policy's, ratio 1 at the first update,
  as :mod:`mmgrpo.injection` does for TempSamp-R1); the group is scored again (every sample: a group-aware reward
  sees the new group) and its advantage comes from the configured group estimator over the G samples, the GA
  included, as for any sample. E.g. G = 4, rewards (0, 0, 0, 1) with the GA last, GRPO with the unbiased std:
  mean 0.25, std 0.5, A_GA = 1.5 and A = −0.5 for each failed sample;
* every other group is left exactly as sampled (no slot replaced, no score changed).

The paper pairs the injection with a sequence-level importance ratio and no KL term: those are separate keys here
(``algorithm.surrogate: gspo``, ``algorithm.beta: 0``). Departures: the reward metrics of the step are those of
the sampled completions (before the GA joins); rows without the ``column`` are never injected. Token adapters only
(the :class:`~mmgrpo.injection.TeacherForcing` capability), single-turn rollouts; refused with
``algorithm.gt_injection`` (which injects into every group) and ``algorithm.dynamic_sampling`` (which drops the
all-failed groups before this step sees them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from mmgrpo import advantages as adv_lib
from mmgrpo import injection
from mmgrpo.errors import ConfigError


@dataclass(frozen=True)
class GCPOOptions:
    """``algorithm.rollout_steps: {gcpo: {...}}``."""

    column: str = "answer"
    """Dataset column holding the reference answer; rows without it are never injected."""
    template: str = "<answer>{answer}</answer>"
    """The gold completion: str.format with ``answer`` = the column's value (as ``algorithm.gt_injection.template``)."""
    slot: int = -1
    """Which sample of an all-failed group is replaced (−1 = the last)."""
    reward: str | None = None
    """The reward function (its ``rewards[].name``) whose score judges failure; None: the weighted sum of all."""
    threshold: float = 0.0
    """A sample failed when its score is ≤ this (0: a wrong answer of a 0/1 accuracy reward)."""


REFUSES = {
    "excludes": ("gt_injection", "dynamic_sampling"),
    "why": "gt_injection injects into every group; dynamic_sampling drops the all-failed groups gcpo injects into",
}
"""What the registration (:data:`mmgrpo.rollout_steps.ROLLOUT_STEPS`) refuses at load, and why."""


def all_failed(scores: Tensor, threshold: float) -> Tensor:
    """The groups whose every sample failed: ``scores[p, g] ≤ threshold`` for all g (NaN never fails).

    Shape:
        scores: [P, G] → [P] bool
    """
    return (scores <= threshold).all(dim=1)  # [P]; NaN <= x is False


def judged_scores(batch: Any, ctx: Any, o: GCPOOptions) -> Tensor:
    """The score that judges failure of each sample, [B]: reward ``o.reward``'s, or the weighted sum of all.
    ``batch``/``ctx``: :class:`mmgrpo.rollout_steps.RolloutBatch` / ``RolloutContext`` (not imported here: that
    module registers this step, and the package keeps no import circle)."""
    if o.reward is None:
        return adv_lib.combine_rewards(batch.scores[:, None, :], ctx.weights)[:, 0]  # [B]
    if o.reward not in ctx.reward_names:
        raise ConfigError(
            f"algorithm.rollout_steps.gcpo.reward: {o.reward!r} is not a configured reward; "
            f"use one of {', '.join(ctx.reward_names)} or null (the weighted sum)"
        )
    return batch.scores[:, ctx.reward_names.index(o.reward)]  # [B]


def apply(ctx: Any, batch: Any, o: GCPOOptions, memory: dict) -> Any:
    """GCPO (module docstring): the gold answer into slot ``o.slot`` of each all-failed group, teacher-forced;
    those groups scored again; the others untouched. In place; logs ``gcpo/failed_groups`` and
    ``gcpo/injected_groups`` (shares of the P groups). Groups of any sizes (``batch.groups``)."""
    sizes = batch.groups.sizes  # [P] n_p (G each unless a step planned budgets)
    starts = [sum(sizes[:p]) for p in range(len(sizes))]  # [P] the first sample of each group
    if not all(-n <= o.slot < n for n in sizes):
        raise ConfigError(f"algorithm.rollout_steps.gcpo.slot: {o.slot} is outside a group of {min(sizes)} samples")
    judged = batch.groups.grid(judged_scores(batch, ctx, o)[:, None], fill=float("-inf"))[..., 0]  # [P, W]
    failed = all_failed(judged, o.threshold)  # [P]; a group's padding (−inf) counts as failed
    texts = injection.ground_truth_texts(batch.rows, o.column, o.template)
    groups = [p for p in range(len(sizes)) if failed[p] and texts[p] is not None]
    index = torch.tensor([starts[p] + o.slot % sizes[p] for p in groups], dtype=torch.long)  # [n]
    # called even with no group to inject: under FSDP every process must run the adapter's one forward
    ctx.adapter.inject(batch.rollout, index, [texts[p] for p in groups])
    for p in groups:  # the group's every sample scored again: a group-aware reward sees the new group
        samples = list(range(starts[p], starts[p] + sizes[p]))  # [n_p]
        extras = {key: [column[b] for b in samples] for key, column in batch.rollout.extras.items()}
        outputs = [batch.rollout.outputs[b] for b in samples]
        rescored, _ = ctx.score([batch.rows[p]], outputs, extras, sizes[p])  # [n_p, K]
        batch.scores[samples] = rescored.to(batch.scores.dtype)
    batch.metrics["gcpo/failed_groups"] = float(failed.float().mean())
    batch.metrics["gcpo/injected_groups"] = len(groups) / len(sizes)
    return batch


__all__ = ["REFUSES", "GCPOOptions", "all_failed", "apply", "judged_scores"]
