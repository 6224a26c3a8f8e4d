"""Registries of adapters and tasks, looked up by the names in a training config, and the specs they hold.

A model family registers an :class:`AdapterSpec` in ``ADAPTERS``, a task a :class:`TaskSpec` in ``TASKS``: the
options dataclass of its ``model.args`` / ``task.args``, the class it builds and the function that builds it from
validated options. :func:`mmgrpo.loader.validate` reads the specs before anything is built: the options are checked
against the dataclass (a typo names the field and the allowed ones) and the class has the optional capabilities the
config needs (:mod:`mmgrpo.types`). A spec is called like a builder,
``spec(args: dict, *, seed=0[, lora=, dtype=, need_reference=, reward_scorer=, rollout=])``; a third-party plugin
may register a plain function of that signature instead (its options and capabilities are then checked once it is
built).
Built-in adapters register when :mod:`mmgrpo.modalities` is imported, built-in tasks when :mod:`mmgrpo.tasks` is
(:func:`mmgrpo.loader.load_builtins` imports both).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from mmgrpo.config import LoraConfig, RolloutConfig, from_dict
from mmgrpo.registry import Registry

Options = TypeVar("Options")


RewardScorer = Callable[[list[tuple[Any, float, dict]], str], Callable[[list, list[dict], int], Any]]
"""``reward_scorer(entries, where) -> score``: ``entries`` are ``(name, weight, kwargs)``, ``where`` the config field
they came from (named by its errors); ``score(outputs, rows, G) -> Tensor[B]`` is Σ_k w_k·reward_k of the B = P·G
outputs answering the P rows (:class:`mmgrpo.rewards.WeightedScore`)."""


@dataclass(frozen=True)
class BuildContext:
    """What the trainer passes every adapter builder besides its options."""

    seed: int = 0
    """Seed of the built-in tiny models' random weights (and nothing else)."""
    lora: LoraConfig | None = None
    """``model.lora``: wrap the policy with LoRA adapters when enabled."""
    dtype: str = "float32"
    """``model.dtype``: float32 | bfloat16 | float16."""
    need_reference: bool = False
    """Keep a frozen copy of the policy as the KL reference (β > 0 without LoRA, whose reference is the base)."""
    rollout: RolloutConfig | None = None
    """The config's ``rollout`` section: when it names tools or an environment, an adapter that declares
    :class:`~mmgrpo.types.MultiTurn` builds its multi-turn driver from it (``modalities/tokens/turns.py``); None or
    neither: single-turn rollouts."""
    reward_scorer: RewardScorer | None = None
    """Builds one scoring callable from reward entries, for a family that scores its own intermediate outputs (the
    flow adapter's ``value_rewards``); the trainer passes :func:`mmgrpo.rewards.weighted_scorer`, so no family
    builds a reward runner itself. None: the builder has none (the demo, which never rolls out)."""


@dataclass(frozen=True)
class Inputs:
    """What an adapter reads of a row, declared on its :class:`AdapterSpec` and checked on the first rows at load
    (:mod:`mmgrpo.row_check`), so a row the adapter would silently ignore part of is refused before any model
    loads."""

    media: tuple[str, ...] = ()
    """Media kinds (``image``, ``video``, ``audio``) its prompts consume; a row holding another kind is refused,
    naming an adapter that reads it. Empty: text prompts only."""
    media_required: bool = False
    """Every row must hold one of ``media`` (the speech adapters: audio)."""
    prompt: bool = True
    """It reads the row's ``prompt`` text (Whisper does not: its decoder prompt is fixed by the model)."""
    outputs: str = "text"
    """What its samples are, ``text`` or ``image`` (PIL images: flow, AR image): the reward load check
    (``mmgrpo/reward_check.py``) calls each reward on synthetic samples of this kind before the model loads."""


@dataclass(frozen=True)
class EngineModel:
    """What a rollout engine (``rollout.engine: vllm``) serves for a model family: the checkpoint directory (a
    built-in tiny name resolved to its cached directory, as the adapter resolves it, so both load the same weights)
    and the media items a prompt may hold. Declared by the family on its :class:`AdapterSpec` (``engine_model``), so
    the engine code names no family and imports no tiny-model builder."""

    path: str
    """The model directory (or hub id) the engine loads."""
    max_videos: int = 0
    """Videos per prompt (the video adapter's rows: one)."""
    max_audios: int = 0
    """Audio clips per prompt (the audio LLM's and Whisper's rows: one)."""


def serves(
    resolve: Callable[..., str], *, max_videos: int = 0, max_audios: int = 0
) -> Callable[[Any, int], EngineModel]:
    """The ``engine_model`` of a family whose options name the model in ``name_or_path``: the engine loads
    ``resolve(name_or_path, seed=seed)`` (a built-in tiny name → its cached directory, as the adapter resolves it),
    with these media limits per prompt."""
    return lambda options, seed: EngineModel(resolve(options.name_or_path, seed=seed), max_videos, max_audios)


@dataclass(frozen=True)
class AdapterSpec(Generic[Options]):
    """A model family, declared: ``ADAPTERS.add("vlm", AdapterSpec(args=VLMArgs, cls=VLMAdapter, load=_load))``."""

    args: type[Options]
    """The dataclass ``model.args`` is checked against (before any model loads)."""
    cls: type
    """The adapter class ``load`` returns; its optional capabilities are checked at config load."""
    load: Callable[[Options, BuildContext], Any]
    """``load(options, context) -> adapter``: loads the model and processor and builds the adapter."""
    units_per_sample: Callable[[Options], int | None] | None = None
    """The units per sample T as a function of the options where they fix it (the flow adapter: one per step), so
    ``algorithm.chunk_sizes`` is checked at load."""
    inputs: Inputs | None = None
    """What the adapter reads of a row (media kinds, prompt); None: not declared, rows are not checked for it."""
    load_check: Callable[[Options], str | None] | None = None
    """What ``load`` would hit first, checked without loading anything (a named real model not set up): a one-line
    problem or None. The load-time check (``mmgrpo.preflight``, ``--dry-run``) raises it as a ``ConfigError``."""
    engine_model: Callable[[Options, int], EngineModel] | None = None
    """``engine_model(options, seed)``: what a vLLM rollout engine serves for this family (:class:`EngineModel`);
    None: the family has no engine path (``rollout.engine: vllm`` is refused for it, naming those that have one)."""

    def options(self, args: dict | None) -> Options:
        return from_dict(self.args, args or {}, "model.args")

    def __call__(
        self,
        args: dict | None,
        *,
        seed: int = 0,
        lora: LoraConfig | None = None,
        dtype: str = "float32",
        need_reference: bool = False,
        reward_scorer: RewardScorer | None = None,
        rollout: RolloutConfig | None = None,
    ) -> Any:
        ctx = BuildContext(seed, lora, dtype, need_reference, reward_scorer=reward_scorer, rollout=rollout)
        return self.load(self.options(args), ctx)


@dataclass(frozen=True)
class TaskSpec(Generic[Options]):
    """A task, declared: ``TASKS.add("shapes", TaskSpec(args=ShapesArgs, cls=ShapesTask, load=...))``."""

    args: type[Options]
    """The dataclass ``task.args`` is checked against."""
    cls: type
    """The task class ``load`` returns (its optional methods, e.g. ``warmup_rows``, are checked at config load)."""
    load: Callable[[Options, int], Any]
    """``load(options, seed) -> task``."""

    def options(self, args: dict | None) -> Options:
        return from_dict(self.args, args or {}, "task.args")

    def __call__(self, args: dict | None, *, seed: int = 0) -> Any:
        return self.load(self.options(args), seed)


ADAPTERS: Registry = Registry("adapter")
TASKS: Registry = Registry("task")
