"""The rollout-level variants, one declared pipeline: what goes into the step's P groups before the advantages.

The advantage side has :mod:`mmgrpo.advantage_steps`; this is its twin for everything before the rewards meet the
estimator. Each variant is a registered :class:`RolloutStep` in :data:`ROLLOUT_STEPS`, with a typed options dataclass
(checked at load, :func:`check_config`), and runs at one of two stages:

* ``sample``: changes each fresh rollout before it is scored, ``apply(ctx, rows, rollout, options) -> metrics``.
  The trainer's one ``_rollout`` (sample → these steps → score) applies them to every rollout of the step, so a
  refill or an augmented rollout gets them too (TempSamp-R1's ground-truth injection, :mod:`mmgrpo.injection`);
* ``batch``: sees the step's scored groups and may replace them, ``apply(ctx, batch, options, memory) ->
  RolloutBatch``, in the declared order (DeepVideo-R1's difficulty augmentation, :mod:`mmgrpo.augmentation`; DAPO's
  dynamic-sampling refill, :mod:`mmgrpo.dynamic_sampling`; the variance-aware sampler's observation of the kept
  groups, :mod:`mmgrpo.sampling`). ``memory`` is the step's own dict, kept across training steps (the augmentation's
  window of batch means) and checkpointed where the step registers ``save``/``load`` (:func:`state_dict`).

A step may also register a ``plan``: before each rollout, the rows to sample and the groups they form
(:class:`mmgrpo.groups.Units`, :func:`plan`), e.g. Knapsack RL's budget per prompt (:mod:`mmgrpo.budgets`). Its
groups are then ragged (``RolloutBatch.groups``); the other configured steps must declare ``ragged=True`` (they read
``batch.groups``, not a fixed G), or are refused at load, as is anything its ``check`` refuses.

A step reaches the run only through the :class:`RolloutContext` the trainer hands it (roll out and score rows, the
step's noise keys, read dataset rows, the adapter, the accelerator's collectives), never through the trainer.

Configuration: the built-in steps keep their own sections (``algorithm.gt_injection``, ``algorithm.dynamic_sampling``,
``algorithm.difficulty_augmentation``: on when ``enabled``; the observation is on with a sampler that observes);
any other registered step is turned on by ``algorithm.rollout_steps: {name: {options}}``, in the order written,
after the built-in batch steps and before the sampler's observation. A new rollout-level variant is one function (or
one file) and its registration::

    @dataclass(frozen=True)
    class MyOptions:
        strength: float = 1.0
        \"\"\"What it does.\"\"\"

    def my_apply(ctx: RolloutContext, batch: RolloutBatch, options: MyOptions, memory: dict) -> RolloutBatch:
        ...  # e.g. ctx.rollout(rows, indices, ctx.keys(seed)) for more samples; return the batch to train on

    ROLLOUT_STEPS.add("my_step", RolloutStep("batch", my_apply), MyOptions)

The trainer does not change (docs/architecture.md, "Adding a rollout step").
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from accelerate.utils import gather_object

from mmgrpo import advantages as adv_lib
from mmgrpo import augmentation, budgets, cppo, dynamic_sampling, gcpo, injection, noise, replay, sampling, scaffold
from mmgrpo.config import (
    ConfigError,
    DifficultyAugmentationConfig,
    DynamicSamplingConfig,
    GroundTruthInjectionConfig,
)
from mmgrpo.groups import Units
from mmgrpo.groups import uniform as uniform_units
from mmgrpo.options import resolve
from mmgrpo.registry import Registry
from mmgrpo.rollout_batch import RolloutBatch, RolloutContext
from mmgrpo.shaping import NoOptions
from mmgrpo.types import Rollout

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RolloutStep:
    """A registered rollout-level variant."""

    stage: Literal["sample", "batch"]
    """``sample``: ``apply(ctx, rows, rollout, options) -> metrics`` on each fresh rollout before scoring;
    ``batch``: ``apply(ctx, batch, options, memory) -> RolloutBatch`` once per step after scoring."""
    apply: Callable[..., Any]
    needs: str | tuple[str, ...] | None = None
    """The adapter method(s) the step calls (checked at load: a one-line refusal naming the setting)."""
    section: str | None = None
    """``algorithm.<section>``, the config section (with ``enabled``) that holds its options, for the built-in steps;
    None: configured through ``algorithm.rollout_steps``."""
    excludes: tuple[str, ...] = ()
    """Steps it is not combined with (refused at load)."""
    why: str = "its second rollout would skip them"
    """Why ``excludes`` are refused (the load-time message says it)."""
    multi_turn: bool = False
    """Whether it works with multi-turn rollouts (``rollout.tools`` / ``rollout.environment``)."""
    save: Callable[[dict], Any] | None = None
    """``save(memory) -> state``: the step's memory as the checkpoint keeps it (JSON: lists, dicts, numbers,
    strings), one per process (:func:`state_dict`); None: not checkpointed, a resumed run starts it empty."""
    load: Callable[[dict, Any], None] | None = None
    """``load(memory, state)``: refill a fresh memory from what ``save`` returned, on resume
    (:func:`load_state_dict`)."""
    plan: Callable[..., Units] | None = None
    """``plan(ctx, rows, indices, keys, options, memory) -> Units``: the rows each of the step's rollouts samples and
    the groups they form (:mod:`mmgrpo.groups`: a budget per prompt); None: G per row."""
    check: Callable[[Any, Any], None] | None = None
    """``check(algorithm, options)``: refuse at load, in one line, the other settings it cannot combine with."""
    ragged: bool = False
    """Whether it reads groups of unequal size (``batch.groups``), so it may run beside a step with a ``plan``."""


ROLLOUT_STEPS: Registry[RolloutStep] = Registry("rollout step")
"""Name → :class:`RolloutStep`, with its options dataclass (:meth:`~mmgrpo.registry.Registry.options_class`)."""

OBSERVE = "observe_sampler"
"""The sampler's observation of the kept groups: on with a sampler that observes (``algorithm.sampler: variance``)."""


@dataclass(frozen=True)
class Step:
    """One step of a run's pipeline: registered step ``name`` with its resolved ``options`` and its ``memory``."""

    name: str
    options: Any
    memory: dict = field(default_factory=dict, compare=False)

    @property
    def spec(self) -> RolloutStep:
        return ROLLOUT_STEPS.get(self.name)


# ------------------------------------------------------------------------------------------- built-in steps


def _inject(ctx: RolloutContext, rows: list[dict], rollout: Rollout, o: GroundTruthInjectionConfig) -> dict:
    """TempSamp-R1: slot ``o.slot`` of each group becomes the row's ground truth, teacher-forced."""
    injected = injection.inject_ground_truth(
        ctx.adapter, rollout, rows, column=o.column, template=o.template, slot=o.slot
    )  # [B]
    return {"gt/injected_fraction": float(injected.float().mean())}  # share of the B samples


def _augment(ctx: RolloutContext, batch: RolloutBatch, o: DifficultyAugmentationConfig, memory: dict) -> RolloutBatch:
    """DeepVideo-R1: measure ΔR against the window of past batch means, augment the rows, roll out and score again."""
    window = memory["window"] = deque(memory.get("window", ()), maxlen=o.window)  # batch means of the last W steps
    P, G = len(batch.rows), ctx.group_size
    combined = adv_lib.combine_rewards(batch.scores.view(P, G, -1), ctx.weights)  # [P, G] NaN: n/a
    group_means = combined.nanmean(1).nan_to_num(0.0)  # [P]
    window_mean = sum(window) / len(window) if window else None
    window.append(float(group_means.mean()))
    metrics = {"augment/window_mean": window_mean or 0.0, "augment/hinted_fraction": 0.0}
    metrics |= {"augment/noised_fraction": 0.0, "augment/delta_mean": 0.0}
    if window_mean is None:  # the first step: no reference yet
        batch.metrics.update(metrics)
        return batch
    delta = augmentation.difficulty(window_mean, group_means)  # [P]
    seeds = [noise.mix(ctx.seed, augmentation.FRAME_NOISE, ctx.step, p) for p in ctx.positions]
    rows, hinted, noised = augmentation.augment_rows(ctx.adapter, batch.rows, delta.tolist(), seeds, o)
    again = ctx.rollout(rows, batch.indices, ctx.keys(noise.mix(ctx.seed, augmentation.RESAMPLE_NOISE)))
    metrics |= {"augment/hinted_fraction": float(hinted.float().mean())}
    metrics |= {"augment/noised_fraction": float(noised.float().mean()), "augment/delta_mean": float(delta.mean())}
    again.metrics.update(metrics)
    return again


def _refill(ctx: RolloutContext, batch: RolloutBatch, o: DynamicSamplingConfig, memory: dict) -> RolloutBatch:
    """DAPO: replace the zero-variance groups by groups of fresh prompts (:func:`mmgrpo.dynamic_sampling.refill`)."""
    P = len(batch.rows)
    metrics = dict(batch.metrics)

    def generate(k: int) -> tuple:  # generation batch k: P random rows, rolled out and scored
        idx = dynamic_sampling.refill_indices(
            ctx.n_rows, P, seed=ctx.seed, step=ctx.step, batch=k, rank=ctx.acc.process_index
        )
        more = ctx.rollout(ctx.read_rows(idx), idx, ctx.keys(noise.mix(ctx.seed, 0x5EED, k)))
        metrics["reward/errors"] = metrics.get("reward/errors", 0.0) + more.metrics.get("reward/errors", 0.0)
        return more.rows, more.rollout, more.scores, idx

    first = (batch.rows, batch.rollout, batch.scores, batch.indices)
    rows, indices, merged, scores, n_batches, short = dynamic_sampling.refill(
        ctx.acc, ctx.adapter, first, ctx.weights, o.max_num_gen_batches, generate
    )
    for k, name in enumerate(ctx.reward_names):  # the kept groups' reward means
        if f"reward/{name}" in metrics:
            metrics[f"reward/{name}"] = float(scores[:, k].nanmean())
    metrics["data/dynamic_gen_batches"] = float(n_batches)
    metrics["data/dynamic_short_groups"] = float(short)
    return RolloutBatch(rows, merged, scores, indices, metrics)


def _observe(ctx: RolloutContext, batch: RolloutBatch, o: NoOptions, memory: dict) -> RolloutBatch:
    """The variance-aware sampler records every process's groups: their rows, combined rewards and diversity."""
    P, G = len(batch.rows), batch.rollout.group_size  # (G + R under replay)
    seen = (
        torch.tensor(batch.indices),  # [P]
        adv_lib.combine_rewards(batch.scores.view(P, G, -1), ctx.weights),  # [P, G]
        sampling.distinct_n(batch.rollout.outputs, G),  # [P]
    )
    ctx.sampler.observe(*(ctx.acc.gather(t.to(ctx.acc.device)).cpu() for t in seen))
    return batch


ROLLOUT_STEPS.add(
    "gt_injection",
    RolloutStep("sample", _inject, needs="inject", section="gt_injection"),
    GroundTruthInjectionConfig,
)
ROLLOUT_STEPS.add(
    "difficulty_augmentation",
    RolloutStep(
        "batch",
        _augment,
        needs="augment_video",
        section="difficulty_augmentation",
        excludes=("dynamic_sampling", "gt_injection"),  # the augmented second rollout would skip them
        save=lambda memory: {"window": list(memory.get("window", ()))},  # resumed with the same window
        load=dict.update,
    ),
    DifficultyAugmentationConfig,
)
ROLLOUT_STEPS.add(
    "dynamic_sampling",
    RolloutStep("batch", _refill, needs="merge_states", section="dynamic_sampling"),
    DynamicSamplingConfig,
)
ROLLOUT_STEPS.add(OBSERVE, RolloutStep("batch", _observe, multi_turn=True), NoOptions)
ROLLOUT_STEPS.add(
    "knapsack_budget",
    RolloutStep(
        "batch",
        budgets.observe,
        plan=budgets.plan,
        check=budgets.check,
        ragged=True,
        save=lambda memory: {"rates": dict(memory.get("rates", {}))},  # {dataset row: its last success rate}
        load=dict.update,
    ),
    budgets.KnapsackOptions,
)
ROLLOUT_STEPS.add(
    "replay",
    RolloutStep(
        "batch", replay.apply, needs=("inject", "merge_states"), check=replay.check, save=replay.save, load=dict.update
    ),
    replay.ReplayOptions,
)
ROLLOUT_STEPS.add("gcpo", RolloutStep("batch", gcpo.apply, needs="inject", **gcpo.REFUSES), gcpo.GCPOOptions)
ROLLOUT_STEPS.add("scaffold", RolloutStep("batch", scaffold.apply, **scaffold.REFUSES), scaffold.ScaffoldOptions)
ROLLOUT_STEPS.add(  # the allocation half; the pruning is its twin in mmgrpo.advantage_steps
    "cppo",
    RolloutStep("batch", cppo.allocate, needs=("merge_states", "select_samples"), check=cppo.check),
    cppo.CPPOOptions,
)
BUILTIN_ORDER = ("gt_injection", "difficulty_augmentation", "dynamic_sampling")
"""The built-in steps with a config section, in pipeline order (the sampler's observation comes last)."""


# ------------------------------------------------------------------------------------------- the pipeline


def configured(a: Any) -> list[tuple[str, Any]]:
    """``(name, options)`` of each step ``a`` (an ``AlgorithmConfig``) turns on, in pipeline order, options resolved
    (a :class:`~mmgrpo.config.ConfigError` for an unknown name or option, as at load)."""
    steps = [(name, getattr(a, ROLLOUT_STEPS.get(name).section)) for name in BUILTIN_ORDER]
    steps = [(name, o) for name, o in steps if o.enabled]
    for name, args in a.rollout_steps.items():
        if name not in ROLLOUT_STEPS:
            raise ConfigError(
                f"algorithm.rollout_steps: unknown rollout step {name!r}; registered: {', '.join(ROLLOUT_STEPS)}"
            )
        section = ROLLOUT_STEPS.get(name).section
        if section is not None or name == OBSERVE:
            where = f"algorithm.{section}.enabled: true" if section else "algorithm.sampler: variance"
            raise ConfigError(f"algorithm.rollout_steps.{name}: turned on by {where}, not listed here")
        steps.append((name, resolve(ROLLOUT_STEPS, name, args, f"algorithm.rollout_steps.{name}")))
    if sampling.SAMPLERS.get(a.sampler).observes:
        steps.append((OBSERVE, NoOptions()))
    return steps


def check_config(a: Any, multi_turn: bool) -> dict[str, str]:
    """Refuse, in one line, what the configured steps do not support (unknown names or options, combinations they
    exclude, multi-turn rollouts); returns the adapter methods they need, ``{method: the setting that needs it}``."""
    steps = configured(a)
    names = [name for name, _ in steps]
    need = {}
    for name in names:
        spec = ROLLOUT_STEPS.get(name)
        where = f"algorithm.{spec.section}" if spec.section else f"algorithm.rollout_steps.{name}"
        setting = f"{where}.enabled" if spec.section else where
        if set(spec.excludes) & set(names):
            raise ConfigError(
                f"{where}: not combined with {' or '.join(spec.excludes)} ({spec.why}); turn one of them off"
            )
        planners = [n for n in names if ROLLOUT_STEPS.get(n).plan is not None and n != name]
        if planners and not spec.ragged and spec.plan is None:
            raise ConfigError(f"{setting}: not combined with {planners[0]} (it reads a fixed group size); turn one off")
        if spec.check is not None:
            spec.check(a, dict(steps)[name])
        if multi_turn and not spec.multi_turn:
            raise ConfigError(f"{setting} is not supported with rollout.tools (multi-turn rollouts) yet; turn it off")
        for method in (spec.needs,) if isinstance(spec.needs, str) else spec.needs or ():
            need[method] = setting
    return need


def build(a: Any) -> list[Step]:
    """The configured pipeline of ``a`` (an ``AlgorithmConfig``), each step with fresh memory."""
    return [Step(name, options) for name, options in configured(a)]


def plan(steps: list[Step], ctx: RolloutContext, rows: list[dict], indices: list[int], keys, G: int) -> Units:
    """The rows a rollout samples and the groups they form: a step's ``plan`` (a budget per prompt), else G per
    row (the fixed grid, unchanged)."""
    for s in steps:
        if s.spec.plan is not None:
            return s.spec.plan(ctx, rows, indices, keys, s.options, s.memory)
    return uniform_units(rows, keys, G)


def sample_steps(steps: list[Step]) -> list[Step]:
    """The steps applied to every fresh rollout before it is scored."""
    return [s for s in steps if s.spec.stage == "sample"]


def apply_sample_steps(steps: list[Step], ctx: RolloutContext, rows: list[dict], rollout: Rollout) -> dict:
    """Apply the ``sample`` steps to ``rollout`` (in place); their metrics."""
    metrics: dict[str, float] = {}
    for s in sample_steps(steps):
        metrics.update(s.spec.apply(ctx, rows, rollout, s.options))
    return metrics


def run(steps: list[Step], ctx: RolloutContext, batch: RolloutBatch) -> RolloutBatch:
    """Apply the ``batch`` steps in order to the step's first scored batch; the batch the step trains on."""
    for s in steps:
        if s.spec.stage == "batch":
            batch = s.spec.apply(ctx, batch, s.options, s.memory)
    return batch


def state_dict(steps: list[Step], acc: Any) -> dict:
    """The checkpointed memory of ``steps`` (those registered with ``save``), every process's:
    ``{"rollout_steps": {name: [state of process 0, 1, …]}}`` for ``trainer.json``, or ``{}`` when no step keeps
    any. A collective under several processes (``acc``, the accelerator): every process calls it."""
    mine = {s.name: s.spec.save(s.memory) for s in steps if s.spec.save is not None}
    if not mine:
        return {}
    every = gather_object([mine]) if acc.num_processes > 1 else [mine]  # [world] of {name: state}
    return {"rollout_steps": {name: [p[name] for p in every] for name in mine}}


def load_state_dict(steps: list[Step], saved: dict, acc: Any) -> None:
    """Refill each checkpointed step's memory with this process's state from ``saved`` (the trainer state a
    checkpoint returned); a step saved by another number of processes starts empty, with a warning."""
    states = saved.get("rollout_steps", {})
    for s in steps:
        if s.spec.load is None or s.name not in states:
            continue
        if len(states[s.name]) != acc.num_processes:
            logger.warning(
                "rollout step %s: its memory was saved by %d processes, resumed by %d: it starts empty",
                s.name,
                len(states[s.name]),
                acc.num_processes,
            )
            continue
        s.memory.clear()
        s.spec.load(s.memory, states[s.name][acc.process_index])


__all__ = [
    "OBSERVE",
    "ROLLOUT_STEPS",
    "RolloutBatch",
    "RolloutContext",
    "RolloutStep",
    "Step",
    "apply_sample_steps",
    "build",
    "check_config",
    "configured",
    "load_state_dict",
    "plan",
    "run",
    "state_dict",
]
