"""Scaf-GRPO: tiered in-prompt hints for the groups that failed entirely (the "learning cliff").

Zhang, Wu, Zhu, Tan, Yu, He & Jia 2025, "Scaf-GRPO: Scaffolded Group Relative Policy Optimization for Enhancing LLM
Reasoning", arXiv 2510.19807 (ICLR 2026); seed lines 000:249 and 002:67. Official code: dvlab-research/Scaf-GRPO,
``hint_mix_grpo/trainer/ray_trainer.py`` (``RayPPOTrainer.fit``, the block after the first reward under
``with_hint``; ``build_new_message``, the hinted prompts; ``remove_uids_from_dataproto``) and
``sh/hint_mix_grpo/bs256_6k_mix.sh`` (its settings). The paper's §3 equations could not be retrieved here (only its
abstract and summaries of it were reachable); the rules below are *our reading*, taken from the official code where
the text is silent.

What is implemented (``algorithm.rollout_steps: {scaffold: {...}}``, a ``batch`` step of :mod:`mmgrpo.rollout_steps`):

1. guidance exemption: during the first ``exemption_steps`` training steps nothing is hinted, so that the
   "pseudo-hard" problems the model learns by itself are not helped (the paper: the first 15 % of training; the code:
   ``trainer.warmup_steps: 50``, hints from global step 51);
2. diagnosis: group p is stuck ("true-hard") when none of its G samples succeeded,
   ``stuck_p = ∧_g [r_{p,g} < success]`` with r the combined reward (the code: every reward 0, success = reward 1);
3. tiered hints: the row's tier columns (``tiers``, abstract to concrete: Knowledge → Planning → Solution), each a
   list of parts; level ℓ = (tier k, its first j parts, j = 1..``max_parts``), tier-major, so the L levels go from
   least to most help. The hinted prompt is ``q ⊕ h_ℓ = prompt + template(label_k, parts joined by spaces)``
   (the code: ``Question: …\\n{Knowledge|Solution} Hints: …``, 4 cumulative parts per tier; its released
   ``build_new_message`` has the Planning tier commented out, 8 levels, while the paper and the code's hint statistics
   have three tiers, the default here). Every stuck prompt is sampled once at every level, all levels in one rollout
   (the code does the same: one sample per level);
4. minimal hint: ``ℓ*_p = min{ℓ : r(o_{p,ℓ}) ≥ success}``; when no level succeeds the group stays as sampled;
5. on-policy group augmentation: the hinted sample replaces sample ``slot`` of its group (the code: the first),
   ``Ĝ_p = (G_p \\ {o_{p,slot}}) ∪ {o_{p,ℓ*}}``, and the group advantage is the configured estimator's over Ĝ_p
   (GRPO, G = 4, rewards (1, 0, 0, 0), unbiased std: Â = (1.5, −0.5, −0.5, −0.5));
6. the loss is the configured surrogate; the hinted sample keeps its hinted prompt, so its ratio is
   ``π_θ(o_t | q ⊕ h, o_<t) / π_old(o_t | q ⊕ h, o_<t)`` with π_old the log-probs it was sampled with: on-policy,
   1 at the first update (the code's default ``replace_hint_prompt: False``, the whole sample, prompt included,
   replaces the failed one; its ``True`` variant, the response under the plain prompt, is not implemented).

Departures: a sample succeeds when its combined reward reaches ``success`` (a NaN score never does); keyed noise of
the hinted samples is per (prompt position, level); the hinted sample keeps the score its own rollout gave it (a
group-aware reward scored it in a group of one); the code's per-epoch hint statistics are the step's metrics
``scaffold/*`` (docs/metrics.md). Token adapters with the :class:`HintSplice` capability (vlm, video), single-turn,
string prompts; refused with ``gt_injection`` (it would inject into the one-sample hinted groups) and
``dynamic_sampling`` (it drops the stuck groups before this step sees them).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any, Protocol, runtime_checkable

import torch
from torch import Tensor

from mmgrpo import advantages as adv_lib
from mmgrpo import noise
from mmgrpo.augmentation import with_hint
from mmgrpo.config import Range
from mmgrpo.errors import ConfigError
from mmgrpo.rollout_batch import RolloutBatch, RolloutContext
from mmgrpo.types import Rollout

HINT_NOISE = 0x5CAF
"""Tag mixed into the seed of the hinted rollout's keyed noise (apart from the step's own rollouts)."""
SETTING = "algorithm.rollout_steps.scaffold"
REFUSES = {
    "needs": "splice_states",
    "excludes": ("gt_injection", "dynamic_sampling", "gcpo"),
    "why": "gt_injection would inject into the one-sample hinted groups; dynamic_sampling drops the stuck groups; gcpo "
    "fills them with the reference answer",
}
"""The registration's capability and refusals (:data:`mmgrpo.rollout_steps.ROLLOUT_STEPS`), and why."""


@dataclass(frozen=True)
class ScaffoldOptions:
    """``algorithm.rollout_steps: {scaffold: {...}}``."""

    tiers: list[str] = field(default_factory=lambda: ["hint_knowledge", "hint_planning", "hint_solution"])
    """Row columns of the hint tiers, least help first; each a list of parts (or one string, one part). A row
    without them is never hinted. The ``arithmetic`` task writes these three with ``task.args.hints: true``."""
    labels: list[str] = field(default_factory=lambda: ["Knowledge Hints", "Planning Hints", "Solution Hints"])
    """One label per tier, shown before its parts (the code's labels)."""
    max_parts: Annotated[int, Range(ge=1)] = 4
    """Levels per tier: the first 1, 2, …, up to this many parts of the tier (the code's 4)."""
    exemption_steps: Annotated[int, Range(ge=0)] = 0
    """Guidance exemption: no hints during the first this many training steps (the paper: 15 % of training)."""
    success: float = 1.0
    """A sample succeeds when its combined reward is at least this; a group with none is stuck."""
    slot: int = 0
    """Which sample of a stuck group the hinted sample replaces (the code: the first; −1 = the last)."""
    template: str = "\n{label}: {hint}"
    """Appended to the row's string prompt: str.format with the tier's ``label`` and ``hint``, its parts joined."""

    def __post_init__(self) -> None:
        if len(self.labels) != len(self.tiers):
            raise ConfigError(
                f"{SETTING}.labels: {len(self.labels)} labels for {len(self.tiers)} tiers; give one label per tier"
            )


@runtime_checkable
class HintSplice(Protocol):
    """Adapter capability: samples of one rollout state replaced by samples of another, each keeping its own prompt."""

    def splice_states(self, state: Any, index: Tensor, donor: Any, donor_index: Tensor) -> Any:
        """A state equal to ``state`` but for samples ``index`` [n], which become samples ``donor_index`` [n] of
        ``donor`` (their units and their prompts); ``state`` and ``donor`` unchanged."""
        ...


def stuck_groups(combined: Tensor, success: float) -> Tensor:
    """The groups none of whose samples succeeded: ``∧_g [r_{p,g} < success]`` (NaN never succeeds).

    Shape:
        combined: [P, G] → [P] bool
    """
    return ~(combined >= success).any(dim=1)  # [P]


def tier_parts(value: Any) -> list[str]:
    """The non-empty parts of a tier column: a list of strings, or one string (one part); None: no parts."""
    if value is None:
        return []
    values = [value] if isinstance(value, str) else list(value)
    return [str(v).strip() for v in values if str(v).strip()]


def hint_levels(row: dict, o: ScaffoldOptions) -> list[str]:
    """The row's hint texts, least help first: per tier k (in order), the first j = 1..``max_parts`` of its parts
    joined by spaces, through ``o.template`` with the tier's label."""
    levels = []
    for column, label in zip(o.tiers, o.labels, strict=True):
        parts = tier_parts(row.get(column))
        for j in range(1, min(len(parts), o.max_parts) + 1):
            levels.append(o.template.format(label=label, hint=" ".join(parts[:j])))
    return levels


def minimal_level(solved: list[list[bool]]) -> list[int]:
    """``ℓ* = min{ℓ : solved[ℓ]}`` per stuck prompt (its levels in order); −1 where no level succeeded."""
    return [next((level for level, ok in enumerate(levels) if ok), -1) for levels in solved]


def splice(adapter: HintSplice, rollout: Rollout, index: Tensor, donor: Rollout, donor_index: Tensor) -> None:
    """Samples ``index`` [n] of ``rollout`` become samples ``donor_index`` [n] of ``donor`` (in place): outputs,
    extras, old log-probs, mask, ``truncated``, the engine's log-probs and, through the adapter, the units and the
    (hinted) prompt each is scored under."""
    for i, j in zip(index.tolist(), donor_index.tolist(), strict=True):
        rollout.outputs[i] = donor.outputs[j]
        for key, column in rollout.extras.items():
            column[i] = donor.extras[key][j]
    rollout.old_logprobs[index] = donor.old_logprobs[donor_index].to(rollout.old_logprobs.dtype)  # [n, T]
    rollout.mask[index] = donor.mask[donor_index].to(rollout.mask.dtype)  # [n, T]
    rollout.truncated[index] = donor.truncated[donor_index]  # [n]
    if rollout.engine_logprobs is not None:
        rollout.engine_logprobs[index] = donor.engine_logprobs[donor_index].to(rollout.engine_logprobs.dtype)
    rollout.state = adapter.splice_states(rollout.state, index, donor.state, donor_index)


def _hinted_rows(batch: RolloutBatch, stuck: Tensor, o: ScaffoldOptions) -> tuple[list[dict], list[tuple[int, int]]]:
    """The hinted rows of the stuck groups, group by group and level by level, and their ``(group, level)``."""
    rows, owners = [], []
    for p in stuck.nonzero().flatten().tolist():
        for level, text in enumerate(hint_levels(batch.rows[p], o)):
            rows.append(with_hint(batch.rows[p], text, SETTING, p))
            owners.append((p, level))
    return rows, owners


def _roll_hinted(ctx: RolloutContext, batch: RolloutBatch, rows: list[dict], owners: list[tuple[int, int]]):
    """One sample of each hinted row (keyed per prompt position and level), or None when no process has any."""
    count = torch.tensor(float(len(rows)), device=ctx.acc.device)
    if ctx.acc.num_processes > 1:  # every process rolls out when one does (a sharded model's forwards are collective)
        count = ctx.acc.reduce(count, reduction="sum")
    if float(count) == 0:
        return None
    if not rows:  # this process has none but another has: one throw-away sample, kept out of the batch
        rows, owners = batch.rows[:1], [(0, -1)]
    positions = [noise.mix(ctx.positions[p], level) for p, level in owners]
    keys = ctx.keys(noise.mix(ctx.seed, HINT_NOISE), positions, 1)
    return ctx.rollout(rows, [batch.indices[p] for p, _ in owners], keys, 1)


def apply(ctx: RolloutContext, batch: RolloutBatch, o: ScaffoldOptions, memory: dict) -> RolloutBatch:
    """Scaf-GRPO (module docstring): after the exemption, each stuck group's sample ``o.slot`` becomes the hinted
    sample of the least hint level that succeeded. In place; logs ``scaffold/stuck_groups``,
    ``scaffold/hinted_groups`` (shares of the P groups), ``scaffold/hint_level`` (mean 1-based ℓ* of the hinted
    groups, 0 when none) and ``scaffold/hint_samples`` (hinted samples drawn per group)."""
    P, G = len(batch.rows), ctx.group_size
    if not -G <= o.slot < G:
        raise ConfigError(f"{SETTING}.slot: {o.slot} is outside the group of {G} samples")
    metrics = dict.fromkeys(("stuck_groups", "hinted_groups", "hint_level", "hint_samples"), 0.0)
    if ctx.step >= o.exemption_steps:
        combined = adv_lib.combine_rewards(batch.scores.view(P, G, -1), ctx.weights)  # [P, G]
        stuck = stuck_groups(combined, o.success)  # [P]
        rows, owners = _hinted_rows(batch, stuck, o)
        hinted = _roll_hinted(ctx, batch, rows, owners)
        metrics |= {"stuck_groups": float(stuck.float().mean()), "hint_samples": len(rows) / P}
        if hinted is not None and rows:
            metrics |= _augment(ctx, batch, hinted, owners, o)
    batch.metrics.update({f"scaffold/{k}": v for k, v in metrics.items()})
    return batch


def _augment(
    ctx: RolloutContext, batch: RolloutBatch, hinted: RolloutBatch, owners: list[tuple[int, int]], o: ScaffoldOptions
) -> dict[str, float]:
    """Put each stuck group's least successful hint level's sample into its slot ``o.slot``; the metrics."""
    G = ctx.group_size
    combined = adv_lib.combine_rewards(hinted.scores.view(len(owners), 1, -1), ctx.weights)[:, 0]  # [N]
    groups = sorted({p for p, _ in owners})
    solved = [[bool(combined[n] >= o.success) for n, (q, _) in enumerate(owners) if q == p] for p in groups]
    best = minimal_level(solved)  # [S]
    first = {p: owners.index((p, 0)) for p in groups}  # the group's first hinted sample
    chosen = [(p, first[p] + level) for p, level in zip(groups, best, strict=True) if level >= 0]
    if chosen:
        index = torch.tensor([p * G + o.slot % G for p, _ in chosen], dtype=torch.long)  # [n]
        donors = torch.tensor([n for _, n in chosen], dtype=torch.long)  # [n]
        splice(ctx.adapter, batch.rollout, index, hinted.rollout, donors)
        batch.scores[index] = hinted.scores[donors].to(batch.scores.dtype)  # [n, K]
    levels = [level + 1 for level in best if level >= 0]
    return {
        "hinted_groups": len(chosen) / len(batch.rows),
        "hint_level": sum(levels) / len(levels) if levels else 0.0,
    }


__all__ = [
    "HINT_NOISE",
    "REFUSES",
    "HintSplice",
    "ScaffoldOptions",
    "apply",
    "hint_levels",
    "minimal_level",
    "splice",
    "stuck_groups",
    "tier_parts",
]
