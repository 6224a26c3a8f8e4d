"""The contracts between adapters, rewards and the group-relative core (docs/architecture.md).

Every adapter turns P prompts into B = P·G samples whose actions are T units (tokens, image tokens, denoising
transitions), each with the log-probability of the policy that sampled it. After ``rollout`` the core never
knows the modality: it sees a :class:`Rollout` and calls :meth:`PolicyAdapter.logprobs`.

Shape glossary: ``P`` prompts, ``G`` group size, ``B = P·G`` samples (group-major: sample ``b`` belongs to
prompt ``b // G``), ``T`` action units, ``K`` reward functions.

Beyond :class:`PolicyAdapter`, adapters may offer optional capabilities (:class:`ExactKL`,
:class:`RatioNormInputs`, :class:`SupervisedLoss`, :class:`SyncReference`, :class:`FrozenReference`) and tasks
:class:`WarmupTask`; a configuration that needs one the adapter lacks fails at load (:func:`required_capabilities`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, runtime_checkable

import torch
from torch import Tensor

from mmgrpo.noise import NoiseKeys


@dataclass
class Rollout:
    """B = P·G sampled actions with the log-probs of the policy that sampled them.

    Shape:
        old_logprobs: [B, T] float32, log π_old(unit) (0 where ``mask`` is 0)
        mask: [B, T] float32, 1 for units that are trained, 0 for padding / deterministic (ODE) transitions
        prompt_index: [B] long, the row of the prompt (0..P-1 within this rollout) each sample belongs to
        truncated: [B] bool, the sample hit the unit budget before finishing (EOS not produced)
        unit_sigmas: [B, T] or None, noise level σ of each unit (flow/diffusion), for temporal shaping
        unit_values: [B, T] or None, dense per-unit value estimates (value-anchored shaping)
        engine_logprobs: [B, T] or None, log-probs under the inference engine that sampled the units (vLLM), for the
            importance-sampling correction of the engine/trainer mismatch (mmgrpo.importance)
        turn_of_token: [B, T] long or None, multi-turn trajectories (``rollout.tools``): the assistant turn of each
            unit the policy generated, −1 on observation tokens and padding (per-turn credit, mmgrpo.credit)
    """

    outputs: list[Any]  # B decoded outputs: str for LMs, PIL images for generators
    old_logprobs: Tensor  # [B, T]
    mask: Tensor  # [B, T]
    group_size: int
    prompt_index: Tensor  # [B]
    truncated: Tensor  # [B]
    state: Any  # adapter-private (token ids, latents, prompt encodings...), read by the adapter only
    unit_sigmas: Tensor | None = None  # [B, T]
    unit_values: Tensor | None = None  # [B, T]
    engine_logprobs: Tensor | None = None  # [B, T] log-probs of the inference engine that sampled (rollout.engine)
    turn_of_token: Tensor | None = None  # [B, T] assistant turn of each generated unit, −1 elsewhere (rollout.tools)
    extras: dict[str, list[Any]] = field(default_factory=dict)  # extra reward columns, each B long

    def __post_init__(self) -> None:
        self.validate()

    @property
    def batch_size(self) -> int:
        return self.old_logprobs.shape[0]

    def validate(self) -> None:
        B = len(self.outputs)
        if self.old_logprobs.dim() != 2 or self.old_logprobs.shape[0] != B:
            raise ValueError(f"Rollout.old_logprobs must be [B, T] with B={B}, got {tuple(self.old_logprobs.shape)}")
        if self.mask.shape != self.old_logprobs.shape:
            raise ValueError(
                f"Rollout.mask {tuple(self.mask.shape)} must match old_logprobs {tuple(self.old_logprobs.shape)}"
            )
        if self.prompt_index.shape != (B,) or self.truncated.shape != (B,):
            raise ValueError(f"Rollout.prompt_index and truncated must be [B]={B}")
        G = self.group_size
        if G < 1 or B % G:
            raise ValueError(f"Rollout has B={B} samples, not a multiple of group_size={G}")
        group_major = torch.arange(B // G).repeat_interleave(G)  # [B]
        if not torch.equal(self.prompt_index.cpu().long(), group_major):
            raise ValueError(
                f"Rollout.prompt_index must be group-major (sample b belongs to prompt b // G={G}), "
                f"got {self.prompt_index.tolist()[:16]}"
            )
        for name in ("unit_sigmas", "unit_values", "engine_logprobs", "turn_of_token"):
            t = getattr(self, name)
            if t is not None and t.shape != self.mask.shape:
                raise ValueError(f"Rollout.{name} {tuple(t.shape)} must match mask {tuple(self.mask.shape)}")
        for name, col in self.extras.items():
            if len(col) != B:
                raise ValueError(f"Rollout.extras[{name!r}] has {len(col)} rows, expected B={B}")


@runtime_checkable
class PolicyAdapter(Protocol):
    """What the trainer needs from a model family (``modalities/<family>/adapter.py``).

    ``prompts`` are dataset rows (dicts) as produced by a task; the adapter reads the keys it documents.
    ``model`` is the trained ``nn.Module``; the trainer replaces it with the accelerate-prepared (possibly
    DDP-wrapped) module, so adapters call ``self.model`` for differentiable forwards and unwrap it for sampling.
    """

    model: torch.nn.Module

    def rollout(self, prompts: list[dict], group_size: int, keys: NoiseKeys | None = None) -> Rollout:
        """Sample G actions per prompt without gradient. Samples are group-major (b // G is the prompt).

        ``keys`` (:class:`mmgrpo.noise.NoiseKeys`, the trainer's ``rollout_noise: keyed``) key each sample's noise
        by (seed, step, global prompt position, sample), so rollouts do not depend on the world size; ``None``:
        the adapter's own RNG. An adapter that cannot key its noise ignores them (and says so once)."""
        ...

    def logprobs(self, rollout: Rollout, index: Tensor) -> Tensor:
        """Log-probs [n, T] of the rows ``index`` under the current policy, differentiable, fp32."""
        ...

    def ref_logprobs(self, rollout: Rollout, index: Tensor) -> Tensor:
        """Log-probs [n, T] under the reference policy (LoRA disabled or a frozen copy), no gradient."""
        ...

    def trainable_parameters(self) -> Iterable[torch.nn.Parameter]: ...

    def save_pretrained(self, directory: str) -> None:
        """Write the trained weights in Hugging Face format (full model or PEFT adapter) to ``directory``."""
        ...

    def evaluate(self, prompts: list[dict]) -> list[Any]:
        """Deterministic (greedy / ODE) outputs for held-out prompts, one per prompt; a text output is an
        :class:`Answer` holding the reward columns ``rollout`` would give it (held-out rewards score as in training)."""
        ...


class Answer(str):
    """A held-out text output with the reward columns its sampling recorded beside it, one value each
    (``completion_ids``, the image sizes, a multi-turn trajectory's ``tool_calls`` and ``turn_rewards``...): the
    columns a training rollout gives the rewards in ``Rollout.extras``, so held-out outputs are scored with them
    (:func:`mmgrpo.evaluation.output_columns`). A plain ``str`` everywhere else; pickles as itself (outputs are
    gathered across processes)."""

    columns: dict[str, Any]
    """Reward column name → this output's value (the entry of ``Rollout.extras[name]`` a rollout would give it)."""

    def __new__(cls, text: str, columns: dict[str, Any] | None = None) -> Answer:
        out = super().__new__(cls, text)
        out.columns = dict(columns or {})
        return out

    def __reduce__(self) -> tuple:
        return (Answer, (str(self), self.columns))


class Transcript(Answer):
    """A multi-turn answer: the assistant turns' text joined by newlines (what rewards, samples and most task metrics
    read, as a plain ``str``), with the turns kept apart in :attr:`turns` for metrics that replay them one by one
    (the sokoban task steps its game with each turn), and the whole exchange in :attr:`messages` for display (the
    demo). Its :attr:`columns` are the trajectory's reward columns (:class:`Answer`). Pickles as itself."""

    turns: tuple[str, ...]
    """The assistant turns' text, in order."""
    cut_last: bool
    """The last turn was cut before its end token (``max_new_tokens`` or the trajectory's token budget), so no tool
    or environment answered it: its action was not taken."""
    messages: tuple[dict, ...]
    """Every message in order: ``{"role": "assistant" | "tool" | "user", "text": str, "images": [PIL.Image, ...]}``,
    the tool or environment observations with the images the policy was shown (crops, frames, rendered states)."""
    turn_rewards: tuple[float, ...]
    """The reward each turn's observation carried (an environment's step reward; 0 where none), the ``turn_rewards``
    column a training rollout gives the rewards (``env_return``): the demo scores an answer with it."""

    def __new__(
        cls,
        turns: Sequence[str],
        cut_last: bool = False,
        messages: Sequence[dict] = (),
        turn_rewards: Sequence = (),
        columns: dict[str, Any] | None = None,
    ) -> Transcript:
        out = super().__new__(cls, "\n".join(turns), columns)
        out.turns, out.cut_last, out.messages = tuple(turns), bool(cut_last), tuple(messages)
        out.turn_rewards = tuple(float(r) for r in turn_rewards)
        return out

    def __reduce__(self) -> tuple:
        return (Transcript, (self.turns, self.cut_last, self.messages, self.turn_rewards, self.columns))


class EngineError(RuntimeError):
    """The rollout engine (``rollout.engine: vllm``) is unreachable, failed, or serves other weights than the
    trainer's. One line; the run stops (the last good checkpoint is kept)."""


class DataError(ValueError):
    """A dataset row cannot be used: a missing column, a missing/empty/unreadable media file, a bad line.

    The message is one line naming the file, the row and the column when they are known. Raised when a row is
    read (``Task.train_rows()[i]``) or its media decoded; the trainer skips such training rows and counts them
    (``data/skipped_rows``).
    """


@runtime_checkable
class Task(Protocol):
    """A prompt source with a held-out split and its own evaluation metric (synthetic tasks, user datasets).

    Rows are dicts: the keys the adapter reads (``prompt``, ``image``...) plus ground truth columns that reach
    the rewards (``answer``...). The splits are sequences (anything with ``__len__`` and ``__getitem__``), so a
    dataset can open row ``i`` — and its media — only when it is sampled; reading a row may raise
    :class:`DataError`.
    """

    def train_rows(self) -> Sequence[dict]: ...

    def eval_rows(self) -> Sequence[dict]: ...

    def score(self, outputs: list[Any], rows: list[dict]) -> dict[str, float] | None:
        """Evaluation metrics (means over rows) of deterministic outputs, e.g. ``{"accuracy": 0.93}``; ``None``
        lets the trainer score them with the configured rewards (each reward's mean and the combined reward)."""
        ...


# ------------------------------------------------------------------------------- optional capabilities
#
# What some adapters (and tasks) offer beyond ``PolicyAdapter``. The trainer checks them with ``isinstance``;
# ``mmgrpo.loader.validate`` checks, before any model is built, that the adapter class a builder declares
# (``AdapterSpec.cls``) has every capability the configuration needs (:func:`required_capabilities`).


@runtime_checkable
class ForwardRecord(Protocol):
    """The training forward returns what it computed besides the log-probs (the flow adapter's transition means),
    an explicit record the trainer hands to ``exact_kl`` / ``ratio_norm_inputs`` of the same minibatch, so they
    reuse it instead of running the model again (no cache keyed by object identity inside the adapter)."""

    def logprobs_with_forward(self, rollout: Rollout, index: Tensor) -> tuple[Tensor, Any]:
        """(``logprobs(rollout, index)`` [n, T], the forward's record)."""
        ...


@runtime_checkable
class ExactKL(Protocol):
    """Closed-form per-unit KL to the reference (Gaussian transitions); needed by ``algorithm.kl: gaussian_exact``."""

    def exact_kl(self, rollout: Rollout, index: Tensor, forward: Any = None) -> Tensor:
        """KL(π_θ ‖ π_ref) per unit of rows ``index``, differentiable through π_θ; ``forward``: the record of
        :class:`ForwardRecord` for these rows (``None``: the adapter runs the forward). Shape: [n, T]."""
        ...


@runtime_checkable
class RatioNormInputs(Protocol):
    """Per-unit transition std and mean_D(μ_θ − μ_old)²; needed by ``algorithm.ratio_norm`` (GRPO-Guard)."""

    def ratio_norm_inputs(self, rollout: Rollout, index: Tensor, forward: Any = None) -> dict[str, Tensor]:
        """``{"std": [n, T], "mean_sq_dist": [n, T]}``, the keyword arguments of ``shaping.ratio_norm``; ``forward``
        as in :meth:`ExactKL.exact_kl`."""
        ...


@runtime_checkable
class SupervisedLoss(Protocol):
    """Teacher-forced loss of target outputs; needed by a supervised warm-up (``warmup.steps > 0``)."""

    def supervised_loss(self, rows: list[dict]) -> Tensor:
        """Scalar loss of ``row["target"]`` given the row's prompt, differentiable."""
        ...


@runtime_checkable
class SyncReference(Protocol):
    """The reference policy can be reset to the current policy (after warm-up, the KL anchors to it)."""

    def sync_reference(self) -> None: ...


@runtime_checkable
class FrozenReference(Protocol):
    """The adapter may hold a frozen reference copy (``None`` with LoRA); the trainer checkpoints it."""

    reference: torch.nn.Module | None


@runtime_checkable
class WarmupTask(Protocol):
    """A task with supervised warm-up rows (prompt columns + ``target``); needed by ``warmup.steps > 0``."""

    def warmup_rows(self, seed: int) -> list[dict]: ...


@runtime_checkable
class EngineRollout(Protocol):
    """A rollout engine as the trainer owns it (``rollout.engine: vllm``; TRL's ``VLLMGeneration`` is the model):
    exactly what the trainer uses. It is built once (:func:`mmgrpo.loader.load_engine`: a vLLM server's client, or
    vLLM in this process), handed to the adapter (:class:`UsesEngine`), which supplies its prompts and media, and
    closed when training ends.

    ``version`` is the weights version every answer must carry: process 0 pushes (``push_model``, in buckets and
    over the channel ``configure_push`` set from the ``rollout`` section), the other processes set it to the version
    pushed. ``name`` is the engine in error messages."""

    name: str
    version: int

    def health(self) -> dict: ...

    def configure_push(self, rollout: Any, sender: bool = True) -> None: ...

    def push_model(self, model: torch.nn.Module, version: int) -> None: ...

    def close(self) -> None: ...


@runtime_checkable
class UsesEngine(Protocol):
    """An adapter that samples its rollouts on a rollout engine (:class:`EngineRollout`) the trainer hands it; its
    ``rollout`` then returns the engine's samples, re-scored by the policy, with ``engine_logprobs``."""

    def use_engine(self, engine: EngineRollout) -> None: ...


@runtime_checkable
class MultiTurn(Protocol):
    """Multi-turn, tool-using rollouts (``rollout.tools`` / ``rollout.environment``): the adapter parses tool calls in
    its chat template's format, runs the tools (or steps the environment) and appends their observations (mask 0)
    until the trajectory ends (docs/agents.md).

    A declared property of the class (``multi_turn = True``), not a method: the adapter is given the ``rollout``
    section when it is built (:class:`mmgrpo.plugins.BuildContext`) and builds its turn driver then; nothing switches
    it on afterwards."""

    multi_turn: ClassVar[bool]


ADAPTER_CAPABILITIES: dict[str, type] = {
    "use_engine": UsesEngine,
    "multi_turn": MultiTurn,
    "exact_kl": ExactKL,
    "ratio_norm_inputs": RatioNormInputs,
    "supervised_loss": SupervisedLoss,
    "sync_reference": SyncReference,
}
"""Capability name (the method the class defines, or the class attribute it sets to True) → protocol."""


def declares(obj: object, name: str) -> bool:
    """Whether ``obj`` (an instance or a class) has capability ``name``: a method of that name, or a class attribute
    of that name set to True (a declared property, :class:`MultiTurn`)."""
    value = getattr(obj, name, None)
    return value is True or callable(value)


def capability_text(name: str) -> str:
    """How an error names capability ``name``: ``name()`` for a method, ``multi_turn = True`` for a declared
    property (:class:`MultiTurn`)."""
    return f"{name} = True" if name == "multi_turn" else f"{name}()"


def capabilities(cls: type) -> frozenset[str]:
    """The optional capabilities an adapter class implements (methods defined on the class, properties it declares;
    no instance needed)."""
    return frozenset(name for name in ADAPTER_CAPABILITIES if declares(cls, name))


def required_capabilities(
    *, kl: str, ratio_norm: bool, warmup_steps: int, engine: str = "native", tools: bool = False
) -> dict[str, str]:
    """Adapter capabilities a configuration needs, each with the config field that needs it."""
    need = {}
    if tools:
        need["multi_turn"] = "rollout.tools"
    if engine != "native":
        need["use_engine"] = f"rollout.engine: {engine}"
    if kl == "gaussian_exact":
        need["exact_kl"] = "algorithm.kl: gaussian_exact"
    if ratio_norm:
        need["ratio_norm_inputs"] = "algorithm.ratio_norm: true"
    if warmup_steps > 0:
        need["supervised_loss"] = "warmup.steps > 0"
    return need


@runtime_checkable
class SamplingSettings(Protocol):
    """The adapter reports the effective sampling values it used (written next to exported weights)."""

    def sampling_settings(self) -> dict: ...


@runtime_checkable
class TextTokenizer(Protocol):
    """A token adapter's Hugging Face tokenizer: held-out plain-text outputs (not :class:`Answer`, which carry their
    own) are re-tokenised with it for rewards that count tokens (the ``completion_ids`` column)."""

    tokenizer: Any


@runtime_checkable
class ExportInfo(Protocol):
    """The adapter describes its export for the model card (full model or LoRA, base model, library)."""

    def export_info(self) -> dict: ...


def has_method(obj: object, name: str) -> bool:
    """True when ``obj`` (an instance or a class) has a callable ``name``: the variant hooks of docs/variants.md,
    which are named by configuration rather than by a protocol."""
    return callable(getattr(obj, name, None))


def missing_method(adapter: object, needed: dict[str, str]) -> tuple[str, str] | None:
    """The first ``(method, why)`` of ``needed`` the adapter lacks: a capability of :data:`ADAPTER_CAPABILITIES`
    (:func:`declares`) or a variant hook (:func:`has_method`); ``None`` when it has them all."""
    for name, why in needed.items():
        if not (declares(adapter, name) if name in ADAPTER_CAPABILITIES else has_method(adapter, name)):
            return name, why
    return None


def frozen_reference(adapter: object) -> torch.nn.Module | None:
    """The adapter's frozen reference copy (:class:`FrozenReference`), or ``None``."""
    reference = adapter.reference if isinstance(adapter, FrozenReference) else None
    return reference if isinstance(reference, torch.nn.Module) else None
