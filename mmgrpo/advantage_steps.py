"""The steps after the group estimator, one declared pipeline: advantages [P, G] → per-unit advantages [B, T].

``build(algorithm)`` turns the config into a list of :class:`Step`, each a registered component with its options
(:mod:`mmgrpo.options`), in this order:

1. each ``algorithm.advantage_transform`` (``ADVANTAGE_TRANSFORMS``, [P, G] → [P, G]: DGRPO's difficulty weight,
   LENS's negative groups), with ``advantage_transform_args[name]``;
2. ``algorithm.filter_zero_variance``: groups whose rewards are all equal leave the update (their mask rows are
   zeroed; DAPO's dynamic-sampling filter without resampling, arXiv 2503.14476 §3.2);
3. the shaper ``algorithm.shaping`` (``SHAPERS``, [P, G] → [B, T]; ``none`` broadcasts), with ``shaping_args``, or,
   for multi-turn rollouts with ``algorithm.credit`` other than ``trajectory``, its per-turn credit (``CREDITS``
   of :mod:`mmgrpo.credit`: GiGPO, MT-GRPO; :func:`mmgrpo.multiturn.unit_advantages`), with ``credit_args``;
4. ``algorithm.token_weighting`` (``TOKEN_WEIGHTINGS``: TW-GRPO's per-position weights, arXiv 2505.24718) times
   the per-unit advantages, with ``token_weighting_args``;
5. each configured rollout step (``algorithm.rollout_steps``) that is also a kind of this pipeline, with the same
   options: it may keep a subset of the samples (``state.rollout``, CPPO's pruning, :mod:`mmgrpo.cppo`).

``run(steps, state)`` applies them; the trainer calls it once per step (``Trainer.train_step``), so a new variant
is a registered component and a line in :func:`build`, not an ``if`` in the trainer. The metrics each step adds are
those the trainer logged before: ``advantage/kept_group_fraction``, ``advantage/token_weight_mean``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from mmgrpo import advantages as adv_lib
from mmgrpo import cppo, credit, multiturn, shaping
from mmgrpo.groups import Groups
from mmgrpo.options import as_kwargs, resolve
from mmgrpo.registry import Registry
from mmgrpo.shaping import NoOptions


@dataclass
class AdvantageState:
    """What the steps read and write.

    Shape:
        advantages: [P, G] from the estimator; [B, T] once shaped (``unit``)
        combined: [P, G] the weighted combined rewards (NaN = not applicable)
        mask: [B, T] the units that enter the update (the filter zeroes whole groups)
    """

    advantages: Tensor  # [P, G]
    combined: Tensor  # [P, G]
    mask: Tensor  # [B, T]
    rollout: Any
    adapter: Any
    metrics: dict[str, Tensor] = field(default_factory=dict)
    unit: Tensor | None = None  # [B, T] per-unit advantages, after the shaping step
    kept_units: float = 1.0
    """The share of the rollout's units the update trains on (a step that keeps a subset of the samples lowers it;
    :func:`saved_time`)."""
    groups: Groups | None = None
    """How the B samples fill the [P, G] grid (:mod:`mmgrpo.groups`); None: P groups of G (``__post_init__``)."""

    def __post_init__(self) -> None:
        if self.groups is None:
            self.groups = Groups.uniform(*self.advantages.shape)


@dataclass(frozen=True)
class Step:
    """One step of the pipeline: component ``name`` of the registry of ``kind``, with its ``options``."""

    kind: str
    name: str
    options: Any

    def __call__(self, state: AdvantageState) -> None:
        STEP_KINDS.get(self.kind)(state, self)


STEP_KINDS: Registry[Callable[[AdvantageState, Step], None]] = Registry("advantage step")
"""``apply(state, step)`` per kind of step: how a component of that kind's registry is applied to the state."""


TRANSFORM_INPUTS: Registry[Callable[[AdvantageState, Any], Tensor]] = Registry("advantage transform input")
"""``read(state, options) -> [P, G]``: what a transform takes as its third argument where that is not the sampling
policy's mean log-probability (:func:`_seq_logprob`), by transform name: ``seed_grpo`` reads answer cluster ids."""


def _seq_logprob(state: AdvantageState, options: Any = None) -> Tensor:
    """The sampling policy's mean log-probability of each sample's valid units. Shape: [P, G]."""
    r = state.rollout
    m = r.mask.float()  # [B, T]
    return state.groups.grid((r.old_logprobs.float() * m).sum(1) / m.sum(1).clamp_min(1.0))  # [P, G]


@TRANSFORM_INPUTS.register("seed_grpo")
def _answer_ids(state: AdvantageState, options: Any) -> Tensor:
    """Each sample's answer cluster id within its group (:func:`answer_clusters` of the rollout's outputs with
    ``options.answer_pattern``), NaN in the padding of ragged groups. Shape: [P, G]."""
    return state.groups.grid(answer_clusters(state.rollout.outputs, state.groups.sizes, options.answer_pattern))


def answer_clusters(outputs: list, sizes: tuple[int, ...], pattern: str) -> Tensor:
    """[B] cluster ids: within each consecutive group of ``sizes``, samples whose answer (the last match of
    ``pattern``, group 1 if it has one, stripped, case-folded) is equal share an id; a sample without an answer
    (no match, or an output that is not text) gets an id of its own."""
    regex, ids, start = re.compile(pattern, re.DOTALL), [], 0
    for n in sizes:
        seen: dict[str, int] = {}
        for j, out in enumerate(outputs[start : start + n]):
            found = regex.findall(out) if isinstance(out, str) else []
            key = found[-1] if found else None
            key = (key[0] if isinstance(key, tuple) else key).strip().casefold() if key is not None else None
            ids.append(float(seen.setdefault(key, len(seen) + n)) if key is not None else float(j))
        start += n
    return torch.tensor(ids)  # [B]


@STEP_KINDS.register("advantage_transform")
def _transform(state: AdvantageState, step: Step) -> None:
    """[P, G] → [P, G], given the sampling policy's mean log-probability of each sample's valid units (or the input
    the transform declares in ``TRANSFORM_INPUTS``)."""
    read = TRANSFORM_INPUTS.get(step.name) if step.name in TRANSFORM_INPUTS else _seq_logprob
    fn = adv_lib.ADVANTAGE_TRANSFORMS.get(step.name)
    state.advantages = fn(state.advantages, state.combined, read(state, step.options), **as_kwargs(step.options))


@STEP_KINDS.register("filter_zero_variance")
def _filter(state: AdvantageState, step: Step) -> None:
    """Zero the mask of groups whose rewards are all equal; logs the kept share of the P groups."""
    keep = ~adv_lib.zero_variance_groups(state.combined)  # [P]
    state.mask = state.mask * state.groups.repeat(keep)[:, None].float()  # [B, T]
    state.metrics["advantage/kept_group_fraction"] = keep.float().mean()


@STEP_KINDS.register("shaping")
def _shape(state: AdvantageState, step: Step) -> None:
    """[P, G] → [B, T] by the shaper, zero outside the (filtered) mask; ragged groups reach it as [B, 1]."""
    r, g = state.rollout, state.groups
    inputs = shaping.ShapingInputs(state.mask, g.per_sample(state.combined), r.unit_sigmas, r.unit_values)
    advantages = g.per_sample(state.advantages)  # [P, G], or [B, 1] for ragged groups
    state.unit = shaping.shape_advantages(step.name, advantages, inputs, as_kwargs(step.options))  # [B, T]


@STEP_KINDS.register("credit")
def _credit(state: AdvantageState, step: Step) -> None:
    """[P, G] → [B, T] by a multi-turn credit assignment (``algorithm.credit``, ``CREDITS``,
    :func:`mmgrpo.multiturn.unit_advantages`), in place of the shaper."""
    r = state.rollout
    inputs = shaping.ShapingInputs(state.mask, state.combined, r.unit_sigmas, r.unit_values)
    unit = multiturn.unit_advantages(step.name, step.options, state.advantages, inputs, r, state.metrics)  # [B, T]
    state.unit = unit


@STEP_KINDS.register("token_weighting")
def _token_weights(state: AdvantageState, step: Step) -> None:
    """Per-unit advantages times the per-position weights; logs their mean over the rollout's units."""
    fn = shaping.TOKEN_WEIGHTINGS.get(step.name)
    weights = fn(state.adapter, state.rollout, **as_kwargs(step.options))  # [B, T]
    state.unit = state.unit * weights  # [B, T]
    state.metrics["advantage/token_weight_mean"] = weights.sum() / state.rollout.mask.sum().clamp_min(1.0)


STEP_KINDS.add("cppo", cppo.prune, cppo.CPPOOptions)  # the pruning half of algorithm.rollout_steps.cppo


def build(a: Any) -> list[Step]:
    """The configured pipeline of ``a`` (an ``AlgorithmConfig``), each step's options resolved (config errors as at
    load)."""
    steps = [
        Step(
            "advantage_transform",
            name,
            resolve(
                adv_lib.ADVANTAGE_TRANSFORMS,
                name,
                a.advantage_transform_args.get(name),
                f"algorithm.advantage_transform_args.{name}",
            ),
        )
        for name in a.advantage_transform
    ]
    if a.filter_zero_variance:
        steps.append(Step("filter_zero_variance", "zero_variance", NoOptions()))
    if a.credit != "trajectory":  # multi-turn credit (GiGPO, MT-GRPO) replaces the per-sample shaper
        steps.append(
            Step("credit", a.credit, resolve(credit.CREDITS, a.credit, a.credit_args, "algorithm.credit_args"))
        )
    else:
        shaper = resolve(shaping.SHAPERS, a.shaping, a.shaping_args, "algorithm.shaping_args")
        steps.append(Step("shaping", a.shaping, shaper))
    if a.token_weighting != "none":
        where = "algorithm.token_weighting_args"
        steps.append(
            Step(
                "token_weighting",
                a.token_weighting,
                resolve(shaping.TOKEN_WEIGHTINGS, a.token_weighting, a.token_weighting_args, where),
            )
        )
    for name, args in a.rollout_steps.items():  # a rollout step with a twin here (CPPO's pruning), same options
        if name in STEP_KINDS:
            steps.append(Step(name, name, resolve(STEP_KINDS, name, args, f"algorithm.rollout_steps.{name}")))
    return steps


def saved_time(state: AdvantageState, update_s: float) -> dict[str, float]:
    """``perf/pruned_update_saved_s``: the update time the samples a step left out would have cost, at the step's
    cost per kept unit (update_s · (1/kept − 1)); empty when every sample is trained."""
    if state.kept_units >= 1.0:
        return {}
    return {"perf/pruned_update_saved_s": update_s * (1.0 / max(state.kept_units, 1e-6) - 1.0)}


def run(steps: list[Step], state: AdvantageState) -> AdvantageState:
    """Apply ``steps`` in order; ``state.unit`` holds the per-unit advantages [B, T] and ``state.mask`` the mask."""
    for step in steps:
        step(state)
    return state
