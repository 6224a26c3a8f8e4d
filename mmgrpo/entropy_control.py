"""Entropy control: the plain entropy bonus (TRL's ``entropy_coef``) and AEPO's temperature-guided REINFORCE term.

**Entropy bonus** (``algorithm.loss_terms.entropy_bonus``). The per-unit loss gains ``−c · H_t``, where
``H_t = −Σ_v π_θ(v | s_t) log π_θ(v | s_t)`` is the entropy of the sampling distribution (temperature and banned
tokens applied, as the log-probs) at each trained unit; it is aggregated like the policy loss, so under ``token_mean``
the loss is ``L_GRPO − c · mean_t H_t`` (the classic PPO entropy bonus, Schulman et al. 2017 Eq. 9; verl's
``entropy_coeff`` in ``verl/trainers/ppo/core_algos.py``/``dp_actor.py``; the authors' AEPO repository, below,
compares against it as "Entropy-Reg"). The entropy comes from the adapter's ``logprobs_and_entropy`` (token
adapters: ``modalities/tokens/entropy.py``, chunked over the vocabulary with its own backward, no ``[n, T, V]``
logits). **Cost:** the term runs that forward itself, one more forward + backward of the policy per minibatch. Its
metric ``entropy/mean`` (the mean entropy over the trained units, nats) is logged every step; ``coef: 0`` logs it
without changing the loss (bit-identical training: the term adds an exact 0 to the loss and its gradient).

**AEPO** (``algorithm.rollout_steps.aepo``): "Arbitrary Entropy Policy Optimization" (Wang, Li, Bai, Zhang, Cui,
Zhao, Wang 2025, arXiv 2510.08141; seed 002:185). The gradient, as the authors' README (597358816/AEPO
``README.md``, "Method Overview") states it:

    ∇J_AEPO = ∇J_GRPO + α · E_{q, o ∼ π_θ^T}[∇_θ log π_θ(o | q) · R(q, o)],
    T = T_high if H(π_θold) < H_target else T_low

a REINFORCE term on samples drawn at temperature T, which raises the entropy (T > 1) or lowers it (T < 1) until it
sits at the target. Implemented as the authors' code does it (``verl/trainer/ray_trainer.py``, ``fit()``, branch
``alg == "AEPO"``; defaults from ``verl/trainer/config.py`` and ``examples/qwen-math-7b-AEPO.sh``):

1. T = ``temperature_high`` (1.2) when the entropy ≤ ``target_entropy`` (their ``entropy_base``, 0.5), else
   ``temperature_low`` (0.8);
2. the first ``prompt_fraction`` (¼) of the step's prompts are sampled again, G each, at T, and scored;
3. their samples with a group advantage above ``advantage_threshold`` (0.05; GRPO's (r − mean)/(std + ε) within
   their own groups: the code's ``_select_by_advantage(..., absolute=False)``) are kept, at most
   ``reinforce_samples`` (60) of them, half that when the entropy is above the target;
4. they replace the first n samples of the step's batch, their old log-probs re-scored at the training temperature
   (the code's ``_compute_old_log_probs`` at temperature 1), and their advantage is pinned to 1 (the code's
   ``advantages = ones``): in the clipped surrogate with ratio 1 their gradient is ∇ log π_θ(o) · 1, the REINFORCE
   term with R = 1 on correct samples, α = their share of the aggregated units.

The other samples keep the advantages of their full groups (the code computes them before the replacement): the
replaced samples' rewards stay in ``batch.scores`` for the group statistics. **Departures (our reading):** the
entropy that picks T is the current batch's sampled-token estimate under π_old, −mean_t log π_old(y_t) (the README's
H(π_θold)); the code reads the same estimator (``actor/entropy_loss`` = −masked_mean(log_probs)) from the previous
step's update. The paper's own numbered equation could not be retrieved here (only the abstract and the README's
equation above); its α is implicit in the code (the share of replaced samples) and is not an option here either.
Metrics: ``aepo/entropy`` (the estimate), ``aepo/temperature`` (T), ``aepo/reinforce_samples`` (n per step),
``aepo/selected_fraction`` (kept share of the T-samples), ``aepo/width_mismatch`` (1 on a step whose T-rollout
had another width than the batch, a sampler that trims to the longest completion: nothing spliced).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated, Any

import torch
from torch import Tensor

from mmgrpo import advantages as adv_lib
from mmgrpo import noise
from mmgrpo.advantage_steps import STEP_KINDS
from mmgrpo.config import ConfigError, Range
from mmgrpo.losses import LOSS_TERMS, LossTerm, LossTermInputs
from mmgrpo.rollout_batch import RolloutBatch, RolloutContext
from mmgrpo.rollout_steps import ROLLOUT_STEPS, RolloutStep
from mmgrpo.scaffold import splice

AEPO_NOISE = 0xAE90
"""Tag mixed into the seed of AEPO's temperature rollout's keyed noise (apart from the step's own rollouts)."""
REINFORCE_COLUMN = "aepo_reinforce"
"""``rollout.extras`` column marking (True) the samples whose advantage the AEPO twin step pins to 1."""


# ------------------------------------------------------------------------------------------------ entropy bonus


@dataclass(frozen=True)
class EntropyBonusOptions:
    """``algorithm.loss_terms.entropy_bonus``."""

    coef: Annotated[float, Range(ge=0)] = 0.001
    """c, the bonus's weight (TRL's ``entropy_coef``; verl's former default ``entropy_coeff: 0.001``). 0 logs
    ``entropy/mean`` without changing the loss."""


def entropy_bonus_loss(entropy: Tensor, mask: Tensor, coef: float) -> tuple[Tensor, dict[str, Tensor]]:
    """ℓ_t = −c · H_t · m_t and the mean entropy over the valid units (``entropy/mean``).

    Shape:
        entropy (with grad), mask: [n, T] → loss [n, T], metrics of []
    """
    m = (mask > 0).float()  # [n, T]
    metrics = {"entropy/mean": (entropy.detach().float() * m).sum() / m.sum().clamp_min(1.0)}
    return -coef * entropy.float() * m, metrics


def entropy_bonus(inputs: LossTermInputs, options: EntropyBonusOptions) -> tuple[Tensor, dict[str, Tensor]]:
    """The ``entropy_bonus`` loss term: the adapter's entropy of the minibatch's units (one more forward), then
    :func:`entropy_bonus_loss`. Shape: [n, T] inputs → [n, T]."""
    _, entropy = inputs.adapter.logprobs_and_entropy(inputs.rollout, inputs.index)  # [n, T] each
    return entropy_bonus_loss(entropy.to(inputs.mask.device), inputs.mask, float(options.coef))


LOSS_TERMS.add("entropy_bonus", LossTerm(entropy_bonus), EntropyBonusOptions)


# ------------------------------------------------------------------------------------------------------- AEPO


@dataclass(frozen=True)
class AEPOOptions:
    """``algorithm.rollout_steps.aepo`` (defaults: the authors' ``verl/trainer/config.py`` and AEPO script)."""

    target_entropy: Annotated[float, Range(ge=0)] = 0.5
    """H, the entropy to hold (nats per token; the code's ``entropy_base``)."""
    temperature_high: Annotated[float, Range(gt=0)] = 1.2
    """T when the entropy is at or below the target (raises it)."""
    temperature_low: Annotated[float, Range(gt=0)] = 0.8
    """T when the entropy is above the target (lowers it)."""
    prompt_fraction: Annotated[float, Range(gt=0, le=1)] = 0.25
    """Share of the step's prompts sampled again at T (the first ⌈fraction · P⌉; the code's ``[: len // 4]``)."""
    reinforce_samples: Annotated[int, Range(ge=1)] = 60
    """At most this many T-samples replace batch samples (the code's ``reinforce_sample_num``), half when the
    entropy is above the target."""
    advantage_threshold: float = 0.05
    """A T-sample is kept when its GRPO advantage within its own group exceeds this (the code's 0.05)."""

    def __post_init__(self) -> None:
        if self.temperature_low > self.temperature_high:
            raise ConfigError(
                "algorithm.rollout_steps.aepo: temperature_low "
                f"{self.temperature_low} > temperature_high {self.temperature_high}; low must not exceed high"
            )


def batch_entropy(old_logprobs: Tensor, mask: Tensor) -> Tensor:
    """(Σ −log π_old · m, Σ m): the sampled-token entropy estimate's numerator and denominator (summed over
    processes by the caller before dividing). Shape: [B, T], [B, T] → [2]."""
    m = (mask > 0).float()  # [B, T]
    return torch.stack([-(old_logprobs.float() * m).sum(), m.sum()])  # [2]


def pick_temperature(entropy: float, o: AEPOOptions) -> float:
    """T = T_high when H ≤ H_target else T_low (the code's ``if entropy <= entropy_base``)."""
    return o.temperature_high if entropy <= o.target_entropy else o.temperature_low


def reinforce_selection(combined: Tensor, threshold: float, eps: float = 1e-6) -> Tensor:
    """Which samples of the T-groups to keep: GRPO advantage (r − mean) / (std + ε) within each group (unbiased std,
    as the code's ``compute_grpo_outcome_advantage``) above ``threshold``, as a flat sample mask.

    Shape: combined [p, G] → [p·G] bool
    """
    adv = adv_lib.grpo(combined, scale="group", unbiased=True, eps=eps)  # [p, G]
    return (adv > threshold).flatten()  # [p·G]


def reinforce_count(selected: int, entropy: float, o: AEPOOptions) -> int:
    """n = min(reinforce_samples, selected), halved (floor) when the entropy is above the target."""
    n = min(o.reinforce_samples, selected)
    return n if entropy <= o.target_entropy else n // 2


def aepo(ctx: RolloutContext, batch: RolloutBatch, o: AEPOOptions, memory: dict) -> RolloutBatch:
    """AEPO's entropy control (module docstring, steps 1-4): the step's batch with up to n samples replaced by
    correct temperature-T samples, marked in ``rollout.extras[REINFORCE_COLUMN]`` for the twin step; in place."""
    rollout, G = batch.rollout, ctx.group_size
    stats = batch_entropy(rollout.old_logprobs, rollout.mask).to(ctx.acc.device)  # [2]
    if ctx.acc.num_processes > 1:  # one T for every process
        stats = ctx.acc.reduce(stats, reduction="sum")
    entropy = float(stats[0] / stats[1].clamp_min(1.0))
    T = pick_temperature(entropy, o)
    p = max(1, math.ceil(o.prompt_fraction * len(batch.rows)))
    keys = ctx.keys(noise.mix(ctx.seed, AEPO_NOISE), ctx.positions[:p])
    with ctx.adapter.sampling_temperature(T):
        hot = ctx.rollout(batch.rows[:p], batch.indices[:p], keys)
    model = ctx.adapter.model  # the training model as the rollout scores it (wrapped: DDP/FSDP hooks run)
    hot.rollout.old_logprobs = ctx.adapter.batched_logprobs(hot.rollout, model) * hot.rollout.mask  # [p·G, T] at τ
    combined = adv_lib.combine_rewards(hot.scores.view(p, G, -1), ctx.weights)  # [p, G]
    chosen = reinforce_selection(combined, o.advantage_threshold).nonzero().flatten()  # [s]
    n = reinforce_count(len(chosen), entropy, o)
    if hot.rollout.mask.shape[1] != rollout.mask.shape[1]:  # a sampler that trims T to the longest completion
        n = 0  # (transformers' generate fallback): nothing spliced this step, counted
        batch.metrics["aepo/width_mismatch"] = 1.0
    marks = [False] * rollout.batch_size
    if n > 0:
        index = torch.arange(n)  # [n] the batch's first n samples, as the code's concat
        splice(ctx.adapter, rollout, index, hot.rollout, chosen[:n])
        marks[:n] = [True] * n
    rollout.extras[REINFORCE_COLUMN] = marks
    batch.metrics.update(
        {
            "aepo/entropy": entropy,
            "aepo/temperature": T,
            "aepo/reinforce_samples": float(n),
            "aepo/selected_fraction": len(chosen) / max(1, p * G),
        }
    )
    return batch


def pin_reinforce(state: Any, step: Any) -> None:
    """AEPO's twin in the advantage pipeline (``mmgrpo.advantage_steps``): the marked samples' per-unit advantage
    becomes 1 on their units (the code's ``advantages = ones``), and they enter the update whatever a filter did to
    their group. Shape: state.unit, state.mask [B, T], in place."""
    marks = state.rollout.extras.get(REINFORCE_COLUMN)
    if not marks or not any(marks):
        return
    rows = torch.tensor([b for b, x in enumerate(marks) if x], dtype=torch.long)  # [n]
    valid = state.rollout.mask[rows].to(state.unit.dtype)  # [n, T]
    state.unit[rows] = valid
    state.mask[rows] = state.rollout.mask[rows].to(state.mask.dtype)


def check_aepo(algorithm: Any, options: AEPOOptions) -> None:
    """Refuse at load what AEPO cannot combine with: group-level surrogates (the pinned samples are not a group)."""
    if algorithm.surrogate in ("reg_grpo", "dgpo"):
        raise ConfigError(
            f"algorithm.rollout_steps.aepo: surrogate {algorithm.surrogate!r} fits whole groups and cannot take AEPO's "
            "pinned REINFORCE samples; use ppo_clip (or another per-unit surrogate)"
        )


AEPO_NEEDS = ("sampling_temperature", "batched_logprobs", "splice_states")
"""The adapter methods AEPO calls (checked at load): sample at T, re-score at τ, splice the T-samples in."""

ROLLOUT_STEPS.add(
    "aepo",
    RolloutStep(
        "batch",
        aepo,
        needs=AEPO_NEEDS,
        check=check_aepo,
        excludes=("gt_injection", "dynamic_sampling", "gcpo", "scaffold", "cppo", "replay"),
        why="they replace or drop the same samples AEPO replaces",
    ),
    AEPOOptions,
)
STEP_KINDS.add("aepo", pin_reinforce, AEPOOptions)  # AEPO's twin in the advantage pipeline: the pinned advantages
