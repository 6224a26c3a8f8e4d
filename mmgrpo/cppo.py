"""CPPO: prune the completions with the smallest |advantage| before the update, and allocate more prompts to refill.

CPPO (Lin et al. 2025, "CPPO: Accelerating the Training of Group Relative Policy Optimization-Based Reasoning
Models", arXiv 2503.22342; code: github.com/lzhxmu/CPPO). After GRPO's group-normalised advantages A_i are computed
over the whole group, only the completions with the largest |A_i| enter the policy loss — the others contribute the
least to the gradient (the paper's analysis: each completion's gradient is weighted by A_i) — so the reference and
policy forwards and the backward run on fewer completions. Its "dynamic completion allocation" fills the freed room
with completions of extra questions: the step rolls out P / (1 − r) prompts and keeps (1 − r) of their completions,
so the update trains on about as many completions as GRPO's, from more prompts.

What we implement (``algorithm.rollout_steps: {cppo: {pruning_rate: r, scope, allocation}}``), from the authors'
code, because the paper's method section could not be retrieved here (the search tools returned its abstract and the
repository README only; its tables give k = G·(1 − r) completions kept per question):

1. Allocation (rollout stage, :func:`allocate`, ``allocation: true``): the step's P prompts become
   P' = ⌊P / (1 − r)⌋ — ``cppo_verl/recipe/cppo/src/cppo_ray_trainer.py`` sets
   ``train_batch_size = int(train_batch_size / (1.0 - pruning_rate))`` — the P' − P extra rows drawn at random
   from the data (keyed by seed, step and process, as DAPO's refill draws them, :mod:`mmgrpo.dynamic_sampling`) and
   rolled out under their own noise keys. Departure: the authors take the extra questions from the data stream.
2. Advantages: the configured estimator over each of the P' whole groups (unchanged: pruning comes after).
3. Pruning (advantage stage, :func:`keep_indices`, the last step of the advantage pipeline), with A_b the sample's
   advantage after the advantage transforms:

   - ``scope: batch`` (the authors' code, both versions): keep the k = ⌊B·(1 − r)⌋ samples of the batch with the
     largest |A_b| (``cppo_ray_trainer.py``: ``k = int(advantages.shape[0] * retain_rate)``,
     ``torch.topk(abs_advantages, k)``; ``src/open_r1/grpo_trainer_gsm.py`` prunes ``int(B * pruning)`` of the
     device batch with ``largest=False``), in their original order;
   - ``scope: group`` (our reading of the paper's per-question k): keep the k_p = max(1, ⌊n_p·(1 − r)⌋) samples of
     each group p with the largest |A_b|.

   Ties are broken by position (a stable sort), so a step is reproducible. Each process prunes its own samples (the
   authors' OpenR1 code prunes each device batch), every process keeping the same number.

The kept samples form a smaller rollout (each sample keeps its own prompt: ``adapter.select_samples``), which the
reference forward, the μ epochs of updates and the completion metrics read; the estimator's metrics and the reward
metrics stay those of all samples. Logged: ``cppo/kept_fraction`` (k / B), ``cppo/kept_unit_fraction`` (the kept
samples' share of the units) and ``perf/pruned_update_saved_s``, the update time the pruned units would have cost
at the step's measured cost per kept unit (``perf/update_s``·(1/kept_unit_fraction − 1); an estimate: the measured
saving is the step-time difference in docs/variants.md).

Refused at load: the group-level surrogates (they need whole groups per minibatch), multi-turn rollouts, a budget
step's ragged groups and replay's groups of G + R beside allocation (allocation adds groups of G), and adapters
without ``select_samples``/``merge_states``.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor

from mmgrpo import dynamic_sampling, noise
from mmgrpo.config import ConfigError
from mmgrpo.groups import Groups
from mmgrpo.losses import GROUP_SURROGATES
from mmgrpo.rollout_batch import RolloutBatch, RolloutContext
from mmgrpo.types import Rollout

ALLOCATION_NOISE = 0xC990A1
"""Mixed into the seed of the allocation's rollouts (round j: ``mix(seed, ALLOCATION_NOISE, j)``)."""


@dataclass(frozen=True)
class CPPOOptions:
    """``algorithm.rollout_steps.cppo`` (:mod:`mmgrpo.cppo`, CPPO arXiv 2503.22342)."""

    pruning_rate: float = 0.5
    """r in [0, 1): the share of the completions pruned before the update (the authors' ``pruning_rate``)."""
    scope: Literal["batch", "group"] = "batch"
    """batch: the ⌊B(1 − r)⌋ largest |A| of the process's batch (the authors' code) | group: ⌊n_p(1 − r)⌋ (≥ 1) per
    group."""
    allocation: bool = True
    """Roll out ⌊P / (1 − r)⌋ prompts per step instead of P (the paper's dynamic completion allocation)."""


def keep_indices(advantages: Tensor, sizes: tuple[int, ...], pruning_rate: float, scope: str = "batch") -> Tensor:
    """The samples CPPO keeps: those with the largest |advantage|, in their original order.

    ``batch``: k = max(1, ⌊B(1 − r)⌋) over the whole batch; ``group``: k_p = max(1, ⌊n_p(1 − r)⌋) in each group p of
    ``sizes`` (group-major). Ties go to the earlier sample (stable sort).

    Shape:
        advantages: [B] (NaN counts as 0); sizes: [P] with Σ sizes = B -> [k] long, ascending
    """
    a = advantages.detach().float().nan_to_num(0.0).abs()  # [B]
    if scope == "batch":
        k = max(1, int(a.numel() * (1.0 - pruning_rate)))
        order = torch.sort(-a, stable=True).indices  # [B] largest |A| first, ties by position
        return order[:k].sort().values  # [k]
    if scope != "group":
        raise ValueError(f"cppo scope must be batch | group, got {scope!r}")
    kept, start = [], 0
    for n in sizes:
        k = max(1, int(n * (1.0 - pruning_rate)))
        order = torch.sort(-a[start : start + n], stable=True).indices  # [n]
        kept.append(order[:k].sort().values + start)
        start += n
    return torch.cat(kept)  # [k]


def allocated_prompts(P: int, pruning_rate: float) -> int:
    """P' = ⌊P / (1 − r)⌋, the prompts a step rolls out under allocation (the authors' ``train_batch_size``)."""
    return max(P, int(P / (1.0 - pruning_rate)))


def select_rollout(adapter: Any, rollout: Rollout, keep: Tensor) -> Rollout:
    """The rollout of samples ``keep`` [k] only, each its own group of one (``group_size`` 1), each continuing its own
    prompt (``adapter.select_samples``: the prompt encodings are shared, not copied)."""
    pick = lambda t: None if t is None else t[keep]  # [k, T]
    idx = keep.tolist()
    return dataclasses.replace(
        rollout,
        outputs=[rollout.outputs[i] for i in idx],
        old_logprobs=rollout.old_logprobs[keep],
        mask=rollout.mask[keep],
        group_size=1,
        prompt_index=torch.arange(len(idx)),
        truncated=rollout.truncated[keep],
        state=adapter.select_samples(rollout.state, keep),
        unit_sigmas=pick(rollout.unit_sigmas),
        unit_values=pick(rollout.unit_values),
        engine_logprobs=pick(rollout.engine_logprobs),
        turn_of_token=pick(rollout.turn_of_token),
        extras={key: [col[i] for i in idx] for key, col in rollout.extras.items()},
    )


def prune(state: Any, step: Any) -> None:
    """The advantage-pipeline step: keep the samples of :func:`keep_indices` in ``state`` (an
    :class:`~mmgrpo.advantage_steps.AdvantageState`): its rollout, per-unit advantages and mask; logs the kept
    shares and sets ``state.kept_units`` (the update-time estimate of :func:`mmgrpo.advantage_steps.saved_time`)."""
    o: CPPOOptions = step.options
    r = state.rollout
    if r.engine_logprobs is not None:
        raise ValueError(
            "algorithm.rollout_steps.cppo: not supported with rollout.engine vllm yet (its importance weights are "
            "per sample of the whole batch); use rollout.engine native or turn cppo off"
        )
    per_sample = state.groups.flat(state.advantages)  # [B]
    keep = keep_indices(per_sample, state.groups.sizes, o.pruning_rate, o.scope)  # [k]
    units = state.mask.sum().clamp_min(1.0)  # []
    kept_units = state.mask[keep].sum() / units  # []
    group_of = state.groups.ids()[keep]  # [k]
    sizes = torch.bincount(group_of, minlength=state.groups.count)  # [P]
    state.groups = Groups(tuple(int(n) for n in sizes if n > 0), int(sizes.max()))
    state.rollout = select_rollout(state.adapter, r, keep)
    state.unit = state.unit[keep]  # [k, T]
    state.mask = state.mask[keep]  # [k, T]
    state.kept_units = float(kept_units)
    state.metrics["cppo/kept_fraction"] = torch.tensor(len(keep) / len(per_sample))
    state.metrics["cppo/kept_unit_fraction"] = kept_units.detach()


def allocate(ctx: RolloutContext, batch: RolloutBatch, options: CPPOOptions, memory: dict) -> RolloutBatch:
    """The rollout step: add the ⌊P / (1 − r)⌋ − P extra prompts' groups to the step's batch (none without
    ``allocation``), drawn at random and rolled out in rounds of at most P rows under keyed noise."""
    P = len(batch.rows)
    extra = allocated_prompts(P, options.pruning_rate) - P if options.allocation else 0
    if extra == 0:
        return batch
    parts: list[tuple[Rollout, list[int]]] = [(batch.rollout, list(range(P)))]
    rows, indices, scores = list(batch.rows), list(batch.indices), [batch.scores]
    metrics = dict(batch.metrics)
    for j in range(math.ceil(extra / P)):
        m = min(P, extra - j * P)
        idx = dynamic_sampling.refill_indices(
            ctx.n_rows, m, seed=ctx.seed, step=ctx.step, batch=ALLOCATION_NOISE + j, rank=ctx.acc.process_index
        )
        keys = ctx.keys(noise.mix(ctx.seed, ALLOCATION_NOISE, j), ctx.positions[:m])
        more = ctx.rollout(ctx.read_rows(idx), idx, keys)
        parts.append((more.rollout, list(range(m))))
        rows, indices, scores = rows + more.rows, indices + list(idx), scores + [more.scores]
        metrics["reward/errors"] = metrics.get("reward/errors", 0.0) + more.metrics.get("reward/errors", 0.0)
    merged = dynamic_sampling.merge_groups(ctx.adapter, parts)
    scores_all = torch.cat(scores)  # [P'·G, K]
    for k, name in enumerate(ctx.reward_names):  # the reward means over every rolled-out group
        if f"reward/{name}" in metrics:
            metrics[f"reward/{name}"] = float(scores_all[:, k].nanmean())
    metrics["cppo/prompts"] = float(len(rows))
    return RolloutBatch(rows, merged, scores_all, indices, metrics)


def check(algorithm: Any, options: CPPOOptions) -> None:
    """Refuse at load, in one line, a pruning rate outside [0, 1), allocation beside replay's larger groups, and the
    surrogates that need whole groups."""
    if not 0.0 <= options.pruning_rate < 1.0:
        raise ConfigError(
            f"algorithm.rollout_steps.cppo.pruning_rate must be in [0, 1), got {options.pruning_rate}; e.g. 0.5"
        )
    if options.allocation and "replay" in algorithm.rollout_steps:
        raise ConfigError(
            "algorithm.rollout_steps.cppo: allocation is not combined with replay (its groups of G + R samples and the "
            "extra prompts' groups of G do not merge); set cppo.allocation: false or turn replay off"
        )
    if algorithm.surrogate in GROUP_SURROGATES:
        raise ConfigError(
            f"algorithm.rollout_steps.cppo: not combined with surrogate {algorithm.surrogate!r} (it needs whole "
            "groups per minibatch, pruning splits them); use ppo_clip or turn cppo off"
        )


__all__ = ["CPPOOptions", "allocate", "allocated_prompts", "check", "keep_indices", "prune", "select_rollout"]
