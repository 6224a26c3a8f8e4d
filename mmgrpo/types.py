"""The contracts between adapters, rewards and the group-relative core (DESIGN.md §2, §4).

Every adapter turns P prompts into B = P·G samples whose actions are T units (tokens, image tokens, denoising
transitions), each with the log-probability of the policy that sampled it. After ``rollout`` the core never
knows the modality: it sees a :class:`Rollout` and calls :meth:`PolicyAdapter.logprobs`.

Shape glossary: ``P`` prompts, ``G`` group size, ``B = P·G`` samples (group-major: sample ``b`` belongs to
prompt ``b // G``), ``T`` action units, ``K`` reward functions.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Iterable, Protocol, Sequence, runtime_checkable

import torch
from torch import Tensor


class RolloutState(Protocol):
    """Adapter-private state of a rollout (token ids, latents, sigmas, media features...).

    It must be able to take the rows of a minibatch; :func:`select_fields` does that for dataclasses whose
    tensor/list fields have B rows.
    """

    def select(self, index: Tensor) -> "RolloutState": ...


def select_fields(obj: Any, index: Tensor, batch_size: int) -> Any:
    """Return a copy of dataclass ``obj`` keeping rows ``index`` of every field that has ``batch_size`` rows.

    Tensors with first dimension ``batch_size`` and lists of length ``batch_size`` are indexed; nested objects
    with a ``select`` method are delegated to; everything else (shared per-prompt caches, scalars) is kept.
    """
    idx_list = index.tolist()
    changes = {}
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if isinstance(value, Tensor) and value.dim() > 0 and value.shape[0] == batch_size:
            changes[f.name] = value[index.to(value.device)]
        elif isinstance(value, list) and len(value) == batch_size:
            changes[f.name] = [value[i] for i in idx_list]
        elif hasattr(value, "select") and not isinstance(value, (Tensor, list)):
            changes[f.name] = value.select(index)
    return dataclasses.replace(obj, **changes)


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
    """

    outputs: list[Any]  # B decoded outputs: str for LMs, PIL images for generators
    old_logprobs: Tensor  # [B, T]
    mask: Tensor  # [B, T]
    group_size: int
    prompt_index: Tensor  # [B]
    truncated: Tensor  # [B]
    state: Any  # adapter-private, has .select(index)
    unit_sigmas: Tensor | None = None  # [B, T]
    unit_values: Tensor | None = None  # [B, T]
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
        for name in ("unit_sigmas", "unit_values"):
            t = getattr(self, name)
            if t is not None and t.shape != self.mask.shape:
                raise ValueError(f"Rollout.{name} {tuple(t.shape)} must match mask {tuple(self.mask.shape)}")
        for name, col in self.extras.items():
            if len(col) != B:
                raise ValueError(f"Rollout.extras[{name!r}] has {len(col)} rows, expected B={B}")

    def select(self, index: Tensor) -> "Rollout":
        """The rows ``index`` of this rollout (a minibatch); the adapter state is selected too."""
        return select_fields(self, index, self.batch_size)


@runtime_checkable
class PolicyAdapter(Protocol):
    """What the trainer needs from a model family (one file per family in ``modalities/``).

    ``prompts`` are dataset rows (dicts) as produced by a task; the adapter reads the keys it documents.
    ``model`` is the trained ``nn.Module``; the trainer replaces it with the accelerate-prepared (possibly
    DDP-wrapped) module, so adapters call ``self.model`` for differentiable forwards and unwrap it for sampling.
    """

    model: torch.nn.Module

    def rollout(self, prompts: list[dict], group_size: int) -> Rollout:
        """Sample G actions per prompt without gradient. Samples are group-major (b // G is the prompt)."""
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
        """Deterministic (greedy / ODE) outputs for held-out prompts, one per prompt."""
        ...


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
