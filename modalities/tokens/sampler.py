"""The public sampling surface of the token families, and the rollout drivers built on it.

A rollout driver turns prompts into a :class:`~mmgrpo.types.Rollout` by calling a token policy's sampler: the
single-turn driver (one completion per sample, ``modalities/vlm/adapter.py``'s ``SingleTurn``) or the multi-turn one
(tool calls or an environment answer each turn, :class:`~.turns.TurnRunner`). Both read the policy only through
:class:`TokenSampler`, the operations listed here with their shapes; the VLM adapter and the adapters built on it
(video, audio LLM) implement it. The adapter is built with its driver (``BuildContext.rollout``,
:mod:`mmgrpo.plugins`) and delegates ``rollout`` / ``evaluate`` / ``supervised_loss`` to it
(:class:`RolloutDriver`).

Shape glossary: ``P`` prompts, ``G`` group size, ``B = P·G``, ``T`` completion tokens, ``n`` rows of a minibatch,
``L`` prompt tokens (left-padded), ``E`` end-token ids.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any, Protocol, runtime_checkable

import torch
from torch import Tensor

from mmgrpo import noise
from mmgrpo.types import Rollout

from .engine import EnginePrompt
from .media import MediaEncoder


class SamplerOptions(Protocol):
    """The ``model.args`` fields a rollout driver reads (``VLMArgs`` has them)."""

    temperature: float
    """Log-probs are of logits / temperature."""
    mask_truncated: bool
    """Drop samples that hit their token budget without the end token from the loss."""
    old_logprobs: str
    """``recompute`` (a no-grad log-prob forward after sampling) | ``sampler`` (as drawn)."""
    prefix_sharing: bool
    """Log-prob forwards may encode each prompt once (``modalities/tokens/prefix_sharing.py``)."""
    min_new_tokens: int
    """The end token is banned for the first N tokens (0: never)."""


@runtime_checkable
class TokenSampler(Protocol):
    """What a rollout driver may call on a token policy: encode prompts, sample, collate, score tokens, sample on the
    rollout engine. Prompt encodings are processor outputs, one dict per prompt with ``input_ids [1, L_p]``,
    ``attention_mask [1, L_p]`` and its media tensors (``pixel_values``, ``image_grid_thw``, ...)."""

    model: torch.nn.Module
    """The policy, possibly wrapped by accelerate (DDP/FSDP): forwards through it run the wrapper's hooks."""
    processor: Any
    """The Hugging Face processor (the tokenizer for a text-only model)."""
    tokenizer: Any
    """The Hugging Face tokenizer."""
    args: SamplerOptions
    encoders: list[MediaEncoder]
    """The media encoders of the prompts (image, video, audio), in the order their parts precede the text."""
    is_multimodal: bool
    """Any medium: the processor (not the tokenizer) renders prompts."""
    eos_ids: Tensor  # [E]
    pad_id: int
    engine: Any
    """The rollout engine (``rollout.engine: vllm``) sampling the completions, or ``None`` (the native decode loop)."""

    @property
    def device(self) -> torch.device: ...

    def unwrapped(self) -> torch.nn.Module:
        """The policy without accelerate's wrappers (its config, its ``generate``)."""
        ...

    def media_scope(self) -> AbstractContextManager[None]:
        """Decoded media stay pinned inside the scope (a prompt's media are decoded once for its G samples)."""
        ...

    def encode_prompt(self, row: dict) -> dict[str, Tensor]:
        """One row's processor outputs: the chat template applied (with the driver's ``template_kwargs``), the
        media loaded by the encoders. ``input_ids``: [1, L_p]."""
        ...

    def sample(
        self, encodings: list[dict[str, Tensor]], n: int, greedy: bool, keys: noise.NoiseKeys | None = None
    ) -> tuple[Tensor, Tensor | None]:
        """``n`` completions of each of the P ``encodings`` (group-major) through the native decode loop: token ids
        [P·n, T] (pad after the end token) and the log-probs they were drawn with [P·n, T] (``None`` when not
        known)."""
        ...

    def collate(
        self,
        encodings: list[dict[str, Tensor]],
        completions: Tensor | None = None,
        completion_mask: Tensor | None = None,
    ) -> dict[str, Tensor]:
        """One model batch on the policy's device: the prompts left-padded to [n, L], followed by ``completions``
        [n, T] attended where ``completion_mask`` [n, T] is 1 (default: up to the first end token)."""
        ...

    def completion_mask(self, completion_ids: Tensor) -> Tensor:
        """1 up to and including the first end token, 0 after it. Shape: [n, T] → [n, T]."""
        ...

    def decode(self, completion_ids: Tensor) -> list[str]:
        """The texts of completions [n, T] (up to their end token, special tokens dropped)."""
        ...

    def token_logprobs(self, model: torch.nn.Module, state: Any, index: Tensor) -> Tensor:
        """Log-probs [n, T] of the sampled tokens of rows ``index`` [n] of a rollout ``state`` under ``model``
        (the sampling distribution: temperature, banned tokens), differentiable when grad is on."""
        ...

    def batched_logprobs(self, rollout: Rollout, model: torch.nn.Module) -> Tensor:
        """:meth:`token_logprobs` of every row of ``rollout``, no grad, in ``forward_batch_size`` chunks. [B, T]."""
        ...

    def teacher_forced_loss(self, targets: list[list[int]], cache: Any) -> Tensor:
        """Mean token cross-entropy of ``targets`` (P lists of token ids, end token included) given the prompts of
        ``cache``: the warm-up's loss. Shape: → []."""
        ...

    def engine_prompts(self, rows: list[dict], encodings: list[dict[str, Tensor]]) -> list[EnginePrompt]:
        """The rollout engine's request of each row: its prompt text and the very media its encoding used."""
        ...

    def engine_sample(
        self, requests: list[EnginePrompt], n: int, keys: noise.NoiseKeys | None, greedy: bool = False
    ) -> tuple[Tensor, Tensor]:
        """``n`` completions of each request on the rollout engine: token ids [len·n, T] (pad after the end) and the
        engine's log-probs [len·n, T]."""
        ...

    def image_columns(
        self, rows: list[dict], encodings: list[dict[str, Tensor]], loaded_sizes: list | None
    ) -> dict[str, list]:
        """Per-prompt reward columns of the images the model saw (``image_grid_thw``, ``resized_image_size``,
        ``image_size``), P values each; ``{}`` when no prompt has an image."""
        ...

    def shares_prefix(self, model: torch.nn.Module, what: str, enabled: bool) -> bool:
        """Whether the forward ``what`` takes the prompt-sharing path for ``model`` (warns once when not covered)."""
        ...


@runtime_checkable
class RolloutDriver(Protocol):
    """How a token adapter rolls out, evaluates and computes its warm-up loss: single-turn or multi-turn, chosen
    once when the adapter is built."""

    def rollout(self, prompts: list[dict], group_size: int, keys: noise.NoiseKeys | None = None) -> Rollout:
        """B = P·G samples of the P ``prompts`` with their old log-probs (the adapter's ``rollout``)."""
        ...

    def evaluate(self, prompts: list[dict]) -> list[str]:
        """One greedy output per prompt (a :class:`~mmgrpo.types.Transcript` for a multi-turn one)."""
        ...

    def supervised_loss(self, rows: list[dict]) -> Tensor:
        """Teacher-forced loss of ``row["target"]`` given the row's prompt (the warm-up). Shape: → []."""
        ...

    def template_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of ``apply_chat_template`` for the prompts (a tool template and schemas, or none)."""
        ...


__all__ = ["RolloutDriver", "SamplerOptions", "TokenSampler"]
