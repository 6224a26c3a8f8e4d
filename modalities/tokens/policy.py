"""What every token policy shares once it can score tokens: log-probs, reference log-probs, LoRA/frozen reference.

A token policy (VLM, video, audio LLM, Whisper, autoregressive image) defines
``_token_logprobs(model, state, index) -> [n, T]``: the log-probabilities of rows ``index`` of its rollout state
under ``model``, differentiable when grad is on. A text-token family whose sampler bans tokens (suppressed ids
everywhere, some ids for the first steps) defines instead ``_completion_logits(model, state, index, head)`` (the
forward) and ``_early_bans()``; the default ``_token_logprobs`` then scores the completions through the fused
lm_head when the head allows it, with the sampler's bans and temperature (``modalities/tokens/logprobs.py``).
:class:`TokenPolicy` builds the rest of the :class:`~mmgrpo.types.PolicyAdapter` log-prob surface on it,
identically for every family:

- ``logprobs``: the policy (possibly DDP/FSDP-wrapped, so the wrapper's forward hooks run), masked;
- ``ref_logprobs``: the frozen reference copy when there is one (full fine-tuning with β > 0), else the same
  model with its LoRA adapter disabled (peft's ``disable_adapter``) — the reference of TRL and verl with LoRA;
- ``_batched_no_grad``: no-grad log-probs in ``args.forward_batch_size`` chunks (old/reference log-probs);
- ``unwrapped``, ``token_logprobs``, ``batched_logprobs``, ``teacher_forced_loss``: the public names of these for the
  rollout drivers (:class:`~.sampler.TokenSampler`; the private ones stay the implementation subclasses override);
- ``sync_reference`` (after a supervised warm-up the KL anchors to the warmed-up model, as RLHF anchors to its
  SFT model), ``trainable_parameters`` and ``export_info`` (what the model card says about the saved model).

Subclasses set ``model``, ``reference`` and ``args`` (with ``forward_batch_size``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from mmgrpo import sharding
from mmgrpo.types import Rollout

from .. import _hf
from .entropy import head_entropy
from .logprobs import banned_mask, fusable_head, head_logprobs, tied_embedding_grad, vocab_size


@dataclass
class CompletionState:
    """Adapter-private rollout state of a text-token policy (VLM, video, audio LLM, Whisper).

    Shape:
        completion_ids: [B, T] sampled tokens (pad after the end token)
        prompt_of: [B] the prompt of ``cache`` each sample continues
    """

    completion_ids: Tensor  # [B, T]
    prompt_of: Tensor  # [B]
    cache: Any
    """What was computed once per prompt: the VLM's processor encodings, Whisper's log-mel features."""


class TokenPolicy:
    """Log-prob plumbing shared by the token policies (see the module docstring)."""

    model: torch.nn.Module
    reference: torch.nn.Module | None
    args: Any

    suppress_ids: list[int]
    pad_id: int
    old_from_update: bool = False
    """True once the trainer leaves π_old to the update at μ = 1 (:func:`mmgrpo.on_policy.configure`): rollouts skip
    the no-grad log-prob forward after sampling and mark ``old_logprobs`` NaN (:data:`mmgrpo.on_policy.DEFERRED`)."""

    def old_logprobs_from_update(self) -> None:
        """Rollouts from now on leave π_old to the update (:class:`mmgrpo.on_policy.OldFromUpdate`)."""
        self.old_from_update = True

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "_token_logprobs" in cls.__dict__:  # a family that scores its tokens its own way (AR image's CFG head):
            cls.logprobs_and_entropy = None  # no entropy from the shared head path; refused at load (has_method)

    def _token_logprobs(self, model: torch.nn.Module, state: Any, index: Tensor) -> Tensor:
        """Log-probs [n, T] of the sampled units of rows ``index`` of ``state`` under ``model``: the completions'
        tokens under the sampling distribution (temperature, ``suppress_ids`` banned everywhere and
        ``_early_bans`` at the first steps), through the fused lm_head when the head is a plain linear layer."""
        return self._scored(model, state, index, entropy=False)[0]

    def _scored(self, model: torch.nn.Module, state: Any, index: Tensor, entropy: bool) -> tuple[Tensor, Tensor | None]:
        """(log-probs [n, T], the sampling distribution's entropy [n, T] or None) of rows ``index`` from ONE
        forward; both through the fused lm_head when the head allows it (``logprobs.py``, ``entropy.py``)."""
        head = fusable_head(model)
        with tied_embedding_grad(model, head) as tied:  # a tied head's one [V, H] gradient, made last
            comp, out = self._completion_logits(model, state, index, head)  # [n, T], [n, T, V] or [n, T, H]
        early_ids, early_steps = self._early_bans()
        V = vocab_size(out, head)
        banned = banned_mask(V, self.suppress_ids, early_ids, early_steps, steps=comp.shape[1], device=out.device)
        comp = comp.to(out.device)
        tau = self.args.temperature
        logp = head_logprobs(out, head, comp, temperature=tau, banned=banned, late=tied)  # [n, T]
        return logp, head_entropy(out, head, temperature=tau, banned=banned) if entropy else None

    def logprobs_and_entropy(self, rollout: Rollout, index: Tensor) -> tuple[Tensor, Tensor]:
        """(:meth:`logprobs`, the entropy of the sampling distribution at each unit) of rows ``index``, both masked
        and differentiable, from one forward (the entropy loss terms, :mod:`mmgrpo.entropy_control`).
        Shape: [n, T] each."""
        logp, ent = self._scored(self.model, rollout.state, index, entropy=True)
        m = rollout.mask[index].to(logp.device)  # [n, T]
        return logp * m, ent * m

    @contextmanager
    def sampling_temperature(self, temperature: float) -> Iterator[None]:
        """Inside the block the policy samples and scores at ``temperature`` (``args.temperature``), restored after:
        AEPO's temperature-T rollouts (:mod:`mmgrpo.entropy_control`), whose old log-probs are then re-scored."""
        saved = self.args.temperature
        self.args.temperature = float(temperature)
        try:
            yield
        finally:
            self.args.temperature = saved

    def _completion_logits(
        self, model: torch.nn.Module, state: Any, index: Tensor, head: torch.nn.Linear | None = None
    ) -> tuple[Tensor, Tensor]:
        """(completion ids [n, T], logits [n, T, V] predicting them) of rows ``index`` under ``model``; with
        ``head`` (the model's fusable lm_head) the hidden states [n, T, H] it would project instead."""
        raise NotImplementedError(f"{type(self).__name__} defines neither _token_logprobs nor _completion_logits")

    def _early_bans(self) -> tuple[list[int], int]:
        """Token ids the sampler bans at the first steps only, and for how many steps."""
        return [], 0

    def _teacher_forced_loss(self, targets: list[list[int]], cache: Any) -> Tensor:
        """Mean token cross-entropy of ``targets`` (token ids, one list per prompt of ``cache``, end token included)
        given their prompts: the warm-up's supervised loss, scored as the completions are.

        Shape:
            targets: P lists of T_p ids → []
        """
        T = max(len(t) for t in targets)
        comp = torch.full((len(targets), T), self.pad_id, dtype=torch.long)  # [P, T]
        valid = torch.zeros((len(targets), T))  # [P, T]
        for i, t in enumerate(targets):
            comp[i, : len(t)] = torch.tensor(t)
            valid[i, : len(t)] = 1
        rows = torch.arange(len(targets))
        state = CompletionState(completion_ids=comp, prompt_of=rows, cache=cache)
        logp = self._token_logprobs(self.model, state, rows)  # [P, T]
        valid = valid.to(logp.device)
        return -(logp * valid).sum() / valid.sum()

    def _unwrapped(self) -> torch.nn.Module:
        return _hf.unwrap(self.model)  # DDP / accelerate wrappers

    @property
    def device(self) -> torch.device:
        return next(self._unwrapped().parameters()).device

    def logprobs(self, rollout: Rollout, index: Tensor) -> Tensor:
        out = self._token_logprobs(self.model, rollout.state, index)
        return out * rollout.mask[index].to(out.device)

    @torch.no_grad()
    def _batched_no_grad(self, rollout: Rollout, model: torch.nn.Module) -> Tensor:
        chunks = []
        for start in range(0, rollout.batch_size, self.args.forward_batch_size):
            idx = torch.arange(start, min(start + self.args.forward_batch_size, rollout.batch_size))
            chunks.append(self._token_logprobs(model, rollout.state, idx).cpu())
        return torch.cat(chunks)  # [B, T]

    @torch.no_grad()
    def ref_logprobs(self, rollout: Rollout, index: Tensor) -> Tensor:
        model = self._unwrapped()
        if self.reference is not None:
            ctx, model = nullcontext(), self.reference
        elif hasattr(model, "disable_adapter"):
            ctx = model.disable_adapter()
        else:
            raise RuntimeError("no reference policy: enable model.lora or build the adapter with need_reference=True")
        with ctx:
            out = self._token_logprobs(model, rollout.state, index)
        return out * rollout.mask[index].to(out.device)

    def sync_reference(self) -> None:
        """Make the frozen reference equal to the current policy; with LoRA the reference stays the
        adapter-disabled base model."""
        if self.reference is not None:
            self.reference.load_state_dict(sharding.full_state_dict(self._unwrapped()))  # FSDP: gathered

    # ------------------------------------------------ public surface (modalities/tokens/sampler.py TokenSampler)

    def unwrapped(self) -> torch.nn.Module:
        """The policy without accelerate's wrappers (DDP / FSDP): its config, ``generate``, parameters."""
        return self._unwrapped()

    def token_logprobs(self, model: torch.nn.Module, state: Any, index: Tensor) -> Tensor:
        """Log-probs [n, T] of the sampled units of rows ``index`` [n] of ``state`` under ``model``
        (:meth:`_token_logprobs`), differentiable when grad is on."""
        return self._token_logprobs(model, state, index)

    def batched_logprobs(self, rollout: Rollout, model: torch.nn.Module) -> Tensor:
        """Log-probs [B, T] of every row of ``rollout`` under ``model``, no grad, ``args.forward_batch_size`` rows
        per forward (:meth:`_batched_no_grad`)."""
        return self._batched_no_grad(rollout, model)

    def teacher_forced_loss(self, targets: list[list[int]], cache: Any) -> Tensor:
        """Mean token cross-entropy of ``targets`` given the prompts of ``cache`` (:meth:`_teacher_forced_loss`).
        Shape: P lists of T_p ids → []."""
        return self._teacher_forced_loss(targets, cache)

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        return [p for p in self._unwrapped().parameters() if p.requires_grad]

    PIPELINE_TAG = ""
    """The Hugging Face hub task of the exported model (``image-text-to-text``, ...), for the model card."""
    TINY_MODULE = ""
    """The module whose ``resolve_model_path(name, seed)`` builds this family's built-in tiny models."""

    SAMPLING_KEYS = ("max_new_tokens", "min_new_tokens", "temperature", "top_p", "top_k", "repetition_penalty")
    """The ``model.args`` that are ``generate`` arguments of the same meaning (``top_k: 0`` is off in both)."""

    def sampling_settings(self) -> dict:
        """The ``generate`` arguments the rollouts sampled with (``mmgrpo_sampling.json`` and the model card next to
        exported weights): ``do_sample`` and the family's :data:`SAMPLING_KEYS` among its options, all of them, so
        transformers' own defaults (``top_k=50``) never stand in for the run's."""
        options = vars(self.args)
        return {"do_sample": True, **{k: options[k] for k in self.SAMPLING_KEYS if k in options}}

    def export_info(self) -> dict:
        """How the saved model loads outside mmgrpo (:func:`mmgrpo.modalities._hf.export_info`)."""
        return _hf.export_info(
            self._unwrapped(), self.args.name_or_path, pipeline_tag=self.PIPELINE_TAG, tiny_module=self.TINY_MODULE
        )


def sampled_rollout(
    outputs: list, mask: Tensor, ended: Tensor, group_size: int, state: Any, engine: Tensor | None, mask_truncated: bool
) -> Rollout:
    """The :class:`Rollout` of B = P·G sampled completions (group-major), before its old log-probs (zeros until the
    adapter sets them): ``mask`` [B, T] is 1 up to and including each end token, and under ``mask_truncated`` (DAPO's
    overlong filter, ``model.args.mask_truncated``) 0 everywhere on a sample that never ended (``ended`` [B] false).
    ``state`` is the adapter's, with ``prompt_of`` [B]; ``engine`` the rollout engine's log-probs [B, T] or None."""
    if mask_truncated:
        mask = mask * ended.float()[:, None]  # [B, T]
    return Rollout(
        outputs=outputs,
        old_logprobs=torch.zeros_like(mask),
        mask=mask,
        group_size=group_size,
        prompt_index=state.prompt_of.clone(),
        truncated=~ended,
        state=state,
        engine_logprobs=engine,
    )


__all__ = ["TokenPolicy", "sampled_rollout"]
