"""Vision-language (and text-only) policies: image + text → text, the action units are generated tokens.

Covers Qwen2-VL, Qwen2.5-VL, Qwen3-VL, SmolVLM (Idefics3), LLaVA, LLaVA-OneVision, InternVL, Gemma 3 and any
``AutoModelForImageTextToText`` whose processor takes ``text=`` and ``images=``, plus text-only
``AutoModelForCausalLM`` models (rows without images); the prompt-sharing paths cover the architectures of
``docs/architecture.md`` ("Architectures and the fast path"), the others keep the naive path with a logged reason.

What this adapter guarantees (the adapter contract in ``docs/architecture.md``):
- Media are decoded and run through the processor once per prompt; the G samples of a prompt reuse that
  encoding. With ``kv_expand_rollout`` and ``prefix_sharing`` (default on; ``prefix_sharing.py``) the vision
  encoder and the prompt forward also run once per prompt: sampling prefills each prompt once and expands its
  KV cache G ways, and log-prob forwards encode each prompt once with its completions attending to it.
- Prompts are left-padded (a right-padded processor would shift multimodal positions, TRL #5785).
- ``old_logprobs`` and ``logprobs`` are log-probabilities of the *sampling* distribution: log-softmax of
  logits / temperature, in fp32 (bf16 logits upcast), computed without an [n, T, V] log-softmax and, when the
  lm_head is a plain linear layer, without the [n, T, V] logits: the training forward returns the last hidden
  states and the fused linear log-prob scores them block by block (``modalities/tokens/logprobs.py``).
  top-p / top-k truncation is applied when sampling but not in the log-probs (like TRL and verl without rollout
  correction), so keep them off for an unbiased ratio.
- A completion ends at the first EOS (included in the loss); tokens after it are masked. A completion that
  used all ``max_new_tokens`` without EOS is ``truncated``; ``mask_truncated`` drops it from the loss (DAPO).
- LoRA through peft; the reference policy is the same model with the adapter disabled, or a frozen copy
  when training the full model with ``beta > 0``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from typing import Annotated, Any, ClassVar, Literal

import torch
from torch import Tensor

from mmgrpo import noise, on_policy, sharding
from mmgrpo.config import ConfigError, Range, RolloutConfig
from mmgrpo.media import add_media_parts, check_media_content, media_content
from mmgrpo.plugins import ADAPTERS, AdapterSpec, BuildContext, Inputs, serves
from mmgrpo.types import Answer, DataError, Rollout

from .. import _hf, model_names
from ..tokens import compiled_decode, prefix_sharing, shared_attention
from ..tokens.decode import SamplingSpec, Stepper, decode
from ..tokens.engine import EnginePrompt, EngineSampling
from ..tokens.logprobs import (
    completion_id_lists,
    head_outputs_hidden,
)
from ..tokens.media import ImageEncoder, MediaEncoder, one_or_list
from ..tokens.policy import CompletionState, TokenPolicy, sampled_rollout
from ..tokens.sampler import RolloutDriver, TokenSampler
from ..tokens.tree import turn_driver
from ..tokens.turns import TurnState, trajectory_logits
from . import smolvlm
from .tiny import NAMES, resolve_model_path


@dataclass
class VLMArgs:
    """Options under ``model.args`` for ``model.adapter: vlm``."""

    name_or_path: str = "tiny-qwen2.5-vl"
    """Hub id or local directory of the model and its processor; ``tiny-qwen2.5-vl`` builds the built-in one."""
    max_new_tokens: Annotated[int, Range(ge=1)] = 32
    """Completion budget T (tokens)."""
    temperature: Annotated[float, Range(gt=0)] = 1.0
    """Sampling temperature; log-probs are of logits / temperature."""
    top_p: Annotated[float, Range(gt=0, le=1)] = 1.0
    """Nucleus sampling (1.0 = off). Not reflected in log-probs: keep 1.0 for an exact ratio."""
    top_k: Annotated[int, Range(ge=0)] = 0
    """Top-k sampling (0 = off). Not reflected in log-probs: keep 0 for an exact ratio."""
    mask_truncated: bool = False
    """Exclude completions that hit max_new_tokens without EOS from the loss."""
    system_prompt: str | None = None
    """Optional system message put before every prompt."""
    min_pixels: int | None = None
    """Processor's minimum image area (pixels); None keeps the processor's setting."""
    max_pixels: int | None = None
    """Processor's maximum image area (pixels); None keeps the processor's setting."""
    attn_implementation: str = "sdpa"
    """Attention kernel passed to from_pretrained: sdpa | eager | flash_attention_2."""
    trust_remote_code: bool = False
    """Allow model code from the hub (only for families transformers does not ship)."""
    freeze_vision: bool = False
    """Do not train the vision tower (its parameters keep requires_grad=False)."""
    forward_batch_size: Annotated[int, Range(ge=1)] = 64
    """Rows per no-grad forward when computing old/reference log-probs."""
    min_new_tokens: Annotated[int, Range(ge=0)] = 0
    """EOS is banned for the first N completion tokens (also in the log-probs); N = max_new_tokens fixes the length."""
    prefix_sharing: bool = True
    """Log-prob forwards encode each prompt once and let its completions attend to it (split attention,
    modalities/tokens/prefix_sharing.py; equal to the naive forward up to float rounding). Uncovered families fall
    back."""
    gradient_checkpointing: bool = False
    """Recompute each decoder and vision layer in the backward pass instead of keeping its activations
    (transformers' activation checkpointing, non-reentrant): less memory, one more forward. Prompt sharing keeps
    working (one packed forward per minibatch, modalities/tokens/prefix_sharing.py)."""
    packed_training: bool | Literal["auto"] = "auto"
    """The split-attention log-prob forward packs each prompt and its completions into one row under a block mask
    (one cache-free forward, as under gradient checkpointing) instead of continuing the prompt's KV cache: the
    decoder runs once, not twice (prefill, then the completions), with no G-fold copy of the prompt's keys/values per
    layer, but masked slot × slot attention that grows with (G·T)². auto: packed where the policy is on CUDA, where
    a small model's step is launch-bound (SmolLM2-135M on an H200: the update 335 → 173 ms, half the kernel
    launches), not on the CPU, where packing is faster only while a prompt's G·(T−1) completion tokens are no longer
    than the prompt (docs/benchmarks.md, "The training forward in isolation"). Needs sdpa or eager attention (else
    the cache layout; warned under true, said once at INFO level under auto)."""
    kv_expand_rollout: bool = True
    """Sampling prefills each prompt once (vision encoder included) and expands its KV cache G ways; the same
    distribution as HF generate (its very draws with sample_draw: multinomial). False:
    generate(num_return_sequences=G), which prefills every prompt G times."""
    compile_decode: bool | Literal["auto"] = "auto"
    """The KV-expanded sampler's per-token step runs compiled over a static KV cache sized for the group
    (torch.compile: inductor on CPU, CUDA graphs on CUDA; modalities/tokens/compiled_decode.py): the same keyed
    draws up to float rounding, one graph per (B, 64-token bucket of L + T), each compiled once (~40 s for
    SmolLM2-135M on an H200). auto: on where the policy is on CUDA (there a decode token went from 42 to 5.7 ms),
    off on the CPU (no faster there; docs/benchmarks.md). true compiles on the CPU too and warns when it cannot
    run: without a C++ compiler, under FSDP or for sliding-window caches (auto then says so at INFO level). Needs
    kv_expand_rollout."""
    shared_prefix_attention: bool = True
    """Attention over a shared prompt reads its keys/values once for the group, not G copies: the eager KV-expanded
    sampler keeps each prompt's cache once and every decoding step stacks the G rows' queries against their prompt's
    keys in one matmul, under one softmax with each row's own keys (Hydragen, arXiv 2402.05099); the
    split-attention log-prob forward does the same for completions in group-major order no longer than half the
    prompt (no G-fold copy of the prompt's keys/values, nor its summing backward; longer ones run faster through
    SDPA over the copies: shared_attention.TRAINING_MAX_RATIO). modalities/tokens/shared_attention.py. The same tokens,
    log-probs and gradients up to float rounding. Falls back to the expanded cache (said once at INFO level) for
    sliding windows, soft-capping, flash/flex kernels and sharded weights; compile_decode, gradient checkpointing and
    packed_training take precedence."""
    sample_draw: Literal["inverse_cdf", "multinomial"] = "inverse_cdf"
    """How the KV-expanded sampler draws each token from the same softmax: inverse_cdf (one uniform per row and
    step) | multinomial (torch.multinomial, HF generate's draws: a fixed seed gives generate's tokens; on CPU it
    draws V exponentials per row, ~0.2 s per step at V = 151,936 and 32 rows). prefix_sharing.draw_token."""
    old_logprobs: Literal["recompute", "sampler"] = "recompute"
    """Source of old_logprobs: recompute (a no-grad log-prob forward after sampling) | sampler (the log-probs the
    KV-expanded sampling loop computed while drawing: no extra forward; they differ from the training forward by
    float rounding — ~1e-6 in fp32, more in bf16 — so the first ratio is 1 only up to that rounding). At μ = 1 with
    nothing reading π_old before the update, the trainer uses neither: the update's own log-probs, detached
    (mmgrpo/on_policy.py)."""
    overlong_prompts: Literal["error", "truncate"] = "error"
    """A prompt whose tokens plus max_new_tokens exceed the model's context: error (one line naming the length) |
    truncate (keep its last tokens, as TRL's max_prompt_length does, with a warning; never cuts media tokens)."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Extra keyword arguments for from_pretrained."""


class PromptCache:
    """Per-prompt processor outputs, shared by the G samples of each prompt (not indexed by sample)."""

    def __init__(self, encodings: list[dict[str, Tensor]]):
        self.encodings = encodings  # P dicts, each with input_ids [1, Lp_i] and media tensors


VLMState = CompletionState  # cache: PromptCache


class VLMAdapter(EngineSampling, TokenPolicy):
    """Token-level policy over a transformers VLM or causal LM (see the module docstring).

    It implements :class:`~..tokens.sampler.TokenSampler` and rolls out through the driver it is built with
    (``rollout``: the config's ``rollout`` section): multi-turn trajectories (:class:`~..tokens.turns.TurnRunner`)
    when it names tools or an environment, else one completion per sample (:class:`SingleTurn`)."""

    PIPELINE_TAG = "image-text-to-text"
    TINY_MODULE = "mmgrpo.modalities.vlm.tiny"
    multi_turn: ClassVar[bool] = True
    """Declared capability (:class:`mmgrpo.types.MultiTurn`): built with ``rollout.tools`` / ``rollout.environment``
    it drives multi-turn trajectories."""

    def __init__(
        self,
        model: torch.nn.Module,
        processor: Any,
        args: VLMArgs,
        reference: torch.nn.Module | None,
        encoders: list[MediaEncoder] | None = None,
        rollout: RolloutConfig | None = None,
    ):
        self.model = model
        self.processor = processor
        self.tokenizer = getattr(processor, "tokenizer", processor)
        self.args = args
        self.reference = reference
        self.tokenizer.padding_side = "left"
        self.pad_id = self.tokenizer.pad_token_id
        if self.pad_id is None:
            self.pad_id = self.tokenizer.eos_token_id
        gen_eos = getattr(self._unwrapped().generation_config, "eos_token_id", None)
        eos = gen_eos if gen_eos is not None else self.tokenizer.eos_token_id
        self.eos_ids = torch.tensor(eos if isinstance(eos, list) else [eos])
        if encoders is None:  # the media of the prompts, in the order their parts precede the text
            image = getattr(processor, "image_processor", None)
            size = getattr(image, "size", None)
            encoders = [ImageEncoder(args.min_pixels, args.max_pixels, size)] if image is not None else []
        self.encoders = list(encoders)
        self.is_multimodal = bool(self.encoders)  # any medium (image, video, audio): the processor renders prompts
        self.suppress_ids = self._media_token_ids()
        self._media_depth = 0
        config = self._unwrapped().config
        text_config = getattr(config, "text_config", None) or config
        self.context_length: int | None = getattr(text_config, "max_position_embeddings", None)
        self.truncated_prompts = 0
        self.compiled = compiled_decode.CompiledDecoder()  # the compiled step and its static caches (compile_decode)
        turns = rollout is not None and rollout.multi_turn  # tools or an environment answer each turn
        self.driver: RolloutDriver = turn_driver(self, rollout) if turns else SingleTurn(self)

    def _media_token_ids(self) -> list[int]:
        """Media placeholder tokens (image/video pads, vision start/end) the policy must never emit.

        A sampled ``<|image_pad|>`` would make the training forward see more image tokens than image features
        (TRL #3847). They are suppressed when sampling and masked out of the log-softmax, so the log-probs stay
        those of the sampling distribution.
        """
        names = ["image_token", "video_token", "vision_start_token", "vision_end_token", "audio_token", "boi_token"]
        names += ["start_image_token", "end_image_token", "eoi_token"]  # <img> ... </img> (InternVL), Gemma 3's
        # Both objects' (Gemma 3's processor names its <start_of_image> image_token, its tokenizer <image_soft_token>).
        tokens = {getattr(holder, n, None) for holder in (self.processor, self.tokenizer) for n in names}
        tokens |= {"<|image_pad|>", "<|video_pad|>", "<|vision_start|>", "<|vision_end|>"}
        vocab = self.tokenizer.get_vocab()
        return sorted(vocab[t] for t in tokens if isinstance(t, str) and t in vocab)

    # ------------------------------------------------------------------ prompts: processed once per prompt

    def _messages(self, row: dict, counts: dict[str, int]) -> list[dict]:
        """The chat of one row: a conversational prompt as given, else one user message with a ``{"type": kind}``
        part per media item (encoder order) before the text, after the optional system message."""
        prompt = row["prompt"]
        if isinstance(prompt, list):  # conversational: TRL's string content gets its media parts, as TRL adds them
            try:
                return add_media_parts(prompt, counts)
            except DataError as e:
                raise DataError(f"row 'prompt': {e}") from None
        try:  # an <image> / <video> placeholder in the text becomes that part at its place (EasyR1, LLaVA data)
            check_media_content(str(prompt), counts)
        except DataError as e:
            raise DataError(f"row 'prompt': {e}") from None
        content: Any = media_content(str(prompt), counts)
        if not self.is_multimodal:
            content = str(prompt)
        messages = [{"role": "user", "content": content}]
        if self.args.system_prompt:
            messages.insert(0, {"role": "system", "content": self.args.system_prompt})
        return messages

    @contextmanager
    def _media_scope(self) -> Iterator[None]:
        """Decoded media are pinned for one batch (rollout, evaluation, warm-up) and forgotten after it."""
        if self._media_depth == 0:
            for encoder in self.encoders:
                encoder.reset()
        self._media_depth += 1
        try:
            yield
        finally:
            self._media_depth -= 1
            if self._media_depth == 0:
                for encoder in self.encoders:
                    encoder.reset()

    def _encode_prompt(self, row: dict, media: dict[str, list] | None = None) -> dict[str, Tensor]:
        """Processor outputs for one row; ``media`` (kind → items) replaces what the encoders would load."""
        if "prompt" not in row:
            raise KeyError(f"prompt row has no 'prompt' key (keys: {sorted(row)}); the vlm adapter needs one")
        media = media or {}
        loaded = {e.kind: media[e.kind] if e.kind in media else e.load(row) for e in self.encoders}
        text = self._prompt_text(row, loaded)
        if not self.is_multimodal:
            return self._fit_context(dict(self.tokenizer([text], return_tensors="pt", add_special_tokens=False)))
        kwargs: dict[str, Any] = {}
        for encoder in self.encoders:
            if loaded[encoder.kind]:
                kwargs.update(encoder.processor_kwargs(loaded[encoder.kind]))
        enc = dict(self.processor(text=[text], return_tensors="pt", **kwargs))
        for encoder in self.encoders:
            if loaded[encoder.kind]:
                encoder.check(enc, loaded[encoder.kind])
        return self._fit_context(enc)

    def _prompt_text(self, row: dict, loaded: dict[str, list]) -> str:
        """The prompt as text (chat template applied, one placeholder per medium, not yet expanded)."""
        messages = self._messages(row, {kind: len(items) for kind, items in loaded.items()})
        if getattr(self.tokenizer, "chat_template", None) or getattr(self.processor, "chat_template", None):
            kwargs = self.driver.template_kwargs()  # multi-turn: the tools' template and schemas
            return self.processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False, **kwargs)
        return row["prompt"] if isinstance(row["prompt"], str) else str(messages)

    def _fit_context(self, enc: dict[str, Tensor]) -> dict[str, Tensor]:
        """Apply ``overlong_prompts`` to a prompt whose length plus ``max_new_tokens`` exceeds the context."""
        if self.context_length is None:
            return enc
        L, T = enc["input_ids"].shape[1], self.args.max_new_tokens
        budget = self.context_length - T
        if budget >= L:
            return enc
        media_cut = bool(torch.isin(enc["input_ids"][0, : L - budget], torch.tensor(self.suppress_ids)).any())
        if self.args.overlong_prompts != "truncate" or budget < 1 or media_cut:
            why = (
                "truncating would cut media tokens; " if media_cut and self.args.overlong_prompts == "truncate" else ""
            )
            raise DataError(
                f"row 'prompt': {L} prompt tokens + max_new_tokens {T} exceed the model's context of "
                f"{self.context_length} tokens; {why}shorten the prompt, lower max_new_tokens or set "
                "model.args.overlong_prompts: truncate"
            )
        self.truncated_prompts += 1
        if self.truncated_prompts == 1:
            logging.getLogger("mmgrpo.data").warning(
                "mmgrpo: a %d-token prompt was truncated to its last %d tokens (overlong_prompts: truncate); "
                "further truncations are counted in adapter.truncated_prompts",
                L,
                budget,
            )
        return {k: v[:, L - budget :] if v.dim() == 2 and v.shape[1] == L else v for k, v in enc.items()}

    def collate(
        self,
        encodings: list[dict[str, Tensor]],
        completions: Tensor | None = None,
        completion_mask: Tensor | None = None,
    ) -> dict[str, Tensor]:
        """Left-pad the prompts of ``encodings`` into one batch and append ``completions`` [n, T] if given, attended
        where ``completion_mask`` [n, T] is 1 (default: up to the first EOS).

        Sequence-aligned keys (shape [1, Lp]) are padded (input_ids with pad, others with 0) and extended
        with the completion; per-image keys (pixel_values, image_grid_thw...) are concatenated along dim 0, zero-padded
        first where the prompts' shapes differ past it (LLaVA-OneVision's ``pixel_values`` [images, tiles, C, H, W],
        a tile count per image: the model reads each image's first tiles, as ``image_sizes`` gives their number).
        """
        lengths = [e["input_ids"].shape[1] for e in encodings]
        L = max(lengths)
        T = 0 if completions is None else completions.shape[1]
        batch: dict[str, list[Tensor]] = {}
        for e, n in zip(encodings, lengths):
            for key, value in e.items():
                if value.dim() == 2 and value.shape == (1, n):
                    fill = self.pad_id if key == "input_ids" else 0
                    value = torch.cat([value.new_full((1, L - n), fill), value], dim=1)
                batch.setdefault(key, []).append(value)
        out = {k: torch.cat(_pad_to_largest(v), dim=0) for k, v in batch.items()}
        if completions is not None:
            comp_mask = self._completion_mask(completions) if completion_mask is None else completion_mask
            out["input_ids"] = torch.cat([out["input_ids"], completions], dim=1)
            for key in list(out):
                if key != "input_ids" and out[key].dim() == 2 and out[key].shape[1] == L:
                    extra = (
                        comp_mask.to(out[key].dtype)
                        if key == "attention_mask"
                        else out[key].new_zeros((len(encodings), T))
                    )
                    out[key] = torch.cat([out[key], extra], dim=1)
        device = self.device
        return {k: v.to(device) for k, v in out.items()}

    def _completion_mask(self, completion_ids: Tensor) -> Tensor:
        """1 up to and including the first EOS, 0 after it. Shape: [n, T] -> [n, T]."""
        is_eos = torch.isin(completion_ids, self.eos_ids.to(completion_ids.device))  # [n, T]
        after_eos = (is_eos.cumsum(dim=1) - is_eos.long()) > 0  # [n, T] strictly after the first EOS
        return (~after_eos).long()

    # ---------------------------------------------------------------------------------------- sampling

    def shares_prefix(self, model: torch.nn.Module, what: str, enabled: bool) -> bool:
        """Whether ``what`` takes the prompt-sharing path (modalities/tokens/prefix_sharing.py); warns once if not
        covered."""
        if not enabled:
            return False
        reason = prefix_sharing.unsupported_reason(model)
        if reason is not None:
            prefix_sharing.warn_fallback_once(what, reason)
        return reason is None

    def _sampling_spec(self, greedy: bool = False, synced: bool = False) -> SamplingSpec:
        """The sampling distribution of ``model.args`` (both engines draw from it; media placeholders banned)."""
        a = self.args
        return SamplingSpec(
            max_new_tokens=a.max_new_tokens,
            eos_ids=self.eos_ids.tolist(),
            pad_id=self.pad_id,
            temperature=a.temperature,
            top_k=a.top_k,
            top_p=a.top_p,
            min_new_tokens=a.min_new_tokens,
            suppress_ids=tuple(self.suppress_ids),
            greedy=greedy,
            synced=synced,
            draw=a.sample_draw,
        )

    @torch.no_grad()
    def _sample(
        self,
        encodings: list[dict[str, Tensor]],
        num_return_sequences: int,
        greedy: bool,
        keys: noise.NoiseKeys | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """Completion ids [B, T] (pad after EOS) and, from the KV-expanded sampler (the one decode loop,
        :mod:`mmgrpo.modalities.tokens.decode`), their log-probs [B, T]."""
        model = self._unwrapped()
        synced = sharding.is_sharded(model)  # FSDP: every process runs as many forwards as the longest one
        batch = self.collate(encodings)
        was_training = model.training
        model.eval()
        try:
            if self.shares_prefix(model, "sampling", self.args.kv_expand_rollout):
                spec = self._sampling_spec(greedy=greedy, synced=synced)
                completion, logprobs = decode(self._stepper(model, batch, spec), num_return_sequences, spec, keys)
                return completion.cpu(), logprobs.cpu()  # [B, T] each, pad / 0 after EOS
            a = self.args
            if not greedy and keys is not None:
                prefix_sharing.warn_fallback_once(
                    "rollout_noise=keyed", "generate draws from the process's RNG (rollouts depend on the world size)"
                )
            sampling = dict(do_sample=True, temperature=a.temperature, top_p=a.top_p, top_k=a.top_k)
            if greedy:
                sampling = dict(do_sample=False)
            generate = sharding.as_forward(model, "generate")  # FSDP: the root's weights gathered around it
            out = generate(
                **batch,
                max_new_tokens=self.args.max_new_tokens,
                min_new_tokens=self.args.min_new_tokens or None,
                num_return_sequences=num_return_sequences,
                pad_token_id=self.pad_id,
                eos_token_id=self.eos_ids.tolist(),
                suppress_tokens=self.suppress_ids or None,
                synced_gpus=True if synced else None,  # None: transformers decides (DeepSpeed ZeRO-3)
                **sampling,
            )
        finally:
            model.train(was_training)
        completion = out[:, batch["input_ids"].shape[1] :].cpu()  # [P·G, ≤T]
        if completion.shape[1] < self.args.max_new_tokens:  # all rows stopped early: pad to T
            pad = completion.new_full(
                (completion.shape[0], self.args.max_new_tokens - completion.shape[1]), self.pad_id
            )
            completion = torch.cat([completion, pad], dim=1)
        mask = self._completion_mask(completion)
        return torch.where(mask.bool(), completion, torch.full_like(completion, self.pad_id)), None  # [B, T]

    def _stepper(self, model: torch.nn.Module, batch: dict[str, Tensor], spec: SamplingSpec) -> Stepper:
        """The KV-expanded sampler's stepper (one prefill per prompt, the cache expanded G ways): the compiled
        static-cache step with ``compile_decode`` where it runs (:mod:`..tokens.compiled_decode`), else the eager one
        over the unexpanded prompt cache with ``shared_prefix_attention`` (:mod:`..tokens.shared_attention`), else
        over the expanded cache. ``batch``: the left-padded prompts, input_ids [P, L] (+ media)."""
        if compiled_decode.use_compiled(self.args.compile_decode, model, spec.synced):
            return compiled_decode.StaticPrefixStepper(model, batch, spec.max_new_tokens, self.compiled)
        if shared_attention.use_shared(self.args.shared_prefix_attention, model, spec.synced):
            return shared_attention.SharedPrefixStepper(model, batch, reserve=spec.max_new_tokens)
        return prefix_sharing.PrefixStepper(model, batch, reserve=spec.max_new_tokens)

    def _decode(self, completion_ids: Tensor) -> list[str]:
        mask = self._completion_mask(completion_ids).bool()
        rows = [ids[m & ~torch.isin(ids, self.eos_ids)].tolist() for ids, m in zip(completion_ids, mask)]
        return self.tokenizer.batch_decode(rows, skip_special_tokens=True)

    def _engine_prompts(self, prompts: list[dict], encodings: list[dict[str, Tensor]]) -> list[EnginePrompt]:
        """The engine's request of each row (:class:`~mmgrpo.modalities.tokens.engine.EngineSampling`): its prompt
        text and the media of every encoder (kind → loaded items), the very items (sampled frames, resized images) the
        trainer's encoding used; the engine must tokenize it into the encoding's ``input_ids``."""
        out = []
        with self._media_scope():  # inside rollout's scope: the media its encodings decoded, not decoded again
            for row, enc in zip(prompts, encodings):
                loaded = {e.kind: e.load(row) for e in self.encoders}
                out.append(EnginePrompt(self._prompt_text(row, loaded), loaded, enc["input_ids"][0].tolist()))
        return out

    def _engine_processor_kwargs(self) -> dict[str, Any]:
        """Processor options the engine must apply as the trainer does (an encoder's ``engine_kwargs``, e.g. the video
        encoder's ``videos_kwargs``: frames are not re-sampled)."""
        out: dict[str, Any] = {}
        for encoder in self.encoders:
            out.update(getattr(encoder, "engine_kwargs", {}))
        return out

    def rollout(self, prompts: list[dict], group_size: int, keys: noise.NoiseKeys | None = None) -> Rollout:
        return self.driver.rollout(prompts, group_size, keys)

    def merge_states(self, parts: list[tuple[VLMState, Tensor, Tensor]]) -> VLMState:
        """One state from samples [n] and their prompts [p] of several rollouts' states, in order (DAPO refill,
        ``mmgrpo.dynamic_sampling.merge_groups``); the samples of part j are the G samples of its prompts."""
        encodings = [state.cache.encodings[i] for state, _, prompts in parts for i in prompts.tolist()]
        ids = torch.cat([state.completion_ids[samples] for state, samples, _ in parts])  # [B, T]
        G = ids.shape[0] // max(1, len(encodings))
        return VLMState(
            completion_ids=ids,
            prompt_of=torch.arange(len(encodings)).repeat_interleave(G),
            cache=PromptCache(encodings),
        )

    def select_samples(self, state: VLMState, index: Tensor) -> VLMState:
        """The state of samples ``index`` [n] only, each continuing its own prompt; the prompt encodings are shared
        (CPPO's pruning, ``mmgrpo.cppo``)."""
        return VLMState(completion_ids=state.completion_ids[index], prompt_of=state.prompt_of[index], cache=state.cache)

    def splice_states(self, state: VLMState, index: Tensor, donor: VLMState, donor_index: Tensor) -> VLMState:
        """``state`` with samples ``index`` [n] replaced by samples ``donor_index`` [n] of ``donor``, each continuing
        its own (donor) prompt, appended to the prompt cache (Scaf-GRPO's hinted samples, ``mmgrpo.scaffold``)."""
        encodings = list(state.cache.encodings)
        ids = state.completion_ids.clone()  # [B, T]
        ids[index] = donor.completion_ids[donor_index].to(ids.dtype)
        prompt_of = state.prompt_of.clone()  # [B]
        prompt_of[index] = len(encodings) + torch.arange(len(index))
        encodings += [donor.cache.encodings[p] for p in donor.prompt_of[donor_index].tolist()]
        return VLMState(completion_ids=ids, prompt_of=prompt_of, cache=PromptCache(encodings))

    @torch.no_grad()
    def inject(self, rollout: Rollout, index: Tensor, texts: list[str]) -> None:
        """Replace samples ``index`` [n] by ``texts`` + EOS, teacher-forced (``mmgrpo.injection``, TempSamp-R1).

        Their old log-probs become the current policy's log-probs of the new tokens (the re-implementation's
        recomputed ``old_log_probs``), so their ratio is 1 before the first update.
        """
        state: VLMState = rollout.state
        if len(index) == 0:  # nothing to inject here; FSDP still needs this process's forward (one per call)
            if sharding.is_sharded(self._unwrapped()):
                self._token_logprobs(self.model, state, torch.tensor([0]))
            return
        T = state.completion_ids.shape[1]
        eos = int(self.eos_ids[0])
        for row, text in zip(index.tolist(), texts, strict=True):
            ids = self.tokenizer.encode(text, add_special_tokens=False) + [eos]
            if len(ids) > T:
                raise ValueError(
                    f"algorithm.gt_injection: the ground-truth completion {text!r} of sample {row} has {len(ids)} "
                    f"tokens with EOS, more than model.args.max_new_tokens={T}; raise max_new_tokens"
                )
            state.completion_ids[row] = torch.tensor(ids + [self.pad_id] * (T - len(ids)))
        comp = state.completion_ids[index]  # [n, T]
        mask = self._completion_mask(comp).float()  # [n, T]
        rollout.mask[index] = mask.to(rollout.mask.dtype)
        rollout.truncated[index] = False
        for row, text in zip(index.tolist(), self._decode(comp), strict=True):
            rollout.outputs[row] = text
        rollout.old_logprobs[index] = self._token_logprobs(self.model, state, index).cpu() * mask  # [n, T]

    def image_columns(
        self, prompts: list[dict], encodings: list[dict[str, Tensor]], loaded_sizes: list | None
    ) -> dict[str, list]:
        """Per-prompt reward columns for box rewards (``mmgrpo.rewards.visual``), when the prompts have images.

        ``image_grid_thw``: the processor's patch grid ``[t, h, w]``; ``resized_image_size``: ``(W, H)`` of the
        image the model saw (``grid · patch_size``, Qwen2.5-VL's absolute box space); ``image_size``: ``(W, H)``
        of the original image (a row's own ``image_size`` is kept, else the size the image encoder decoded).
        One value per image, unwrapped when the row has one image; ``None`` for rows without images.
        """
        if not any("image_grid_thw" in e for e in encodings):
            return {}
        patch = int(getattr(getattr(self.processor, "image_processor", None), "patch_size", 14))
        loaded_sizes = loaded_sizes or [None] * len(prompts)
        columns: dict[str, list] = {"image_grid_thw": [], "resized_image_size": [], "image_size": []}
        for row, enc, loaded in zip(prompts, encodings, loaded_sizes):
            grids = enc["image_grid_thw"].tolist() if "image_grid_thw" in enc else []
            resized = [(w * patch, h * patch) for _, h, w in grids]
            columns["image_grid_thw"].append(one_or_list(grids))
            columns["resized_image_size"].append(one_or_list(resized))
            columns["image_size"].append(row["image_size"] if row.get("image_size") is not None else loaded)
        return columns

    @torch.no_grad()
    def evaluate(self, prompts: list[dict]) -> list[str]:
        return self.driver.evaluate(prompts)

    # --------------------------------------------------------------------------------------- log-probs

    @torch.no_grad()
    def vocab_logits(self, rollout: Rollout, index: Tensor) -> Tensor:
        """Next-token logits [n, T, V] at the completion positions of samples ``index``, current policy, no gradient
        (TW-GRPO's intra-group divergence, ``mmgrpo.shaping.intragroup_divergence``). Model dtype; the caller asks
        for one group at a time."""
        return self._completion_logits(self.model, rollout.state, index)[1]

    def _completion_logits(
        self, model: torch.nn.Module, state: VLMState, index: Tensor, head: torch.nn.Linear | None = None
    ) -> tuple[Tensor, Tensor]:
        """(completion ids [n, T], logits [n, T, V] predicting them) of samples ``index`` under ``model``; with
        ``head`` (the model's fusable lm_head) the hidden states [n, T, H] it would project instead."""
        if isinstance(state, TurnState):  # multi-turn: targets are the policy's tokens, observations in the context
            return trajectory_logits(self, model, state, index, head)
        comp = state.completion_ids[index]  # [n, T]
        prompts = state.prompt_of[index]  # [n]
        T = comp.shape[1]
        with head_outputs_hidden(head):  # head given: the forward returns hidden states [.., H] in place of logits
            if self.shares_prefix(model, "log-prob forward", self.args.prefix_sharing):
                unique, rows = torch.unique(prompts, return_inverse=True)  # U prompts, each encoded once; rows [n]
                batch = self.collate([state.cache.encodings[p] for p in unique.tolist()])
                comp = comp.to(self.device)
                mask = self._completion_mask(comp)  # [n, T] on the policy's device, as comp
                if group := self._shared_group(model, rows, len(unique), batch["input_ids"].shape[1], T):
                    out = shared_attention.completion_logits(model, batch, group, comp, mask)
                else:  # the prompt's keys/values index-selected per completion, or the packed forward
                    out = prefix_sharing.completion_logits(
                        model, batch, rows.to(self.device), comp, mask, self.args.packed_training
                    )  # [n, T, V] logits or [n, T, H] hidden states, the model's dtype
            else:
                batch = self.collate([state.cache.encodings[p] for p in prompts.tolist()], comp)
                out = model(**batch, logits_to_keep=T + 1, use_cache=False).logits[:, :-1]  # [n, T, V | H]
        return comp, out

    def _shared_group(self, model: torch.nn.Module, rows: Tensor, prompts: int, L: int, T: int) -> int | None:
        """G when the log-prob forward takes the shared kernel (``shared_prefix_attention``): the cache layout (not
        checkpointed or packed), a model it supports, completions in group-major order and no longer than
        ``shared_attention.TRAINING_MAX_RATIO`` of the prompt's L positions (T of them); else None."""
        a = self.args
        if not a.shared_prefix_attention or prefix_sharing.checkpointing(model):
            return None
        if T > shared_attention.TRAINING_MAX_RATIO * L:  # long completions: index-selected prompt + fused SDPA wins
            return None
        if prefix_sharing.packs(model, a.packed_training) or shared_attention.unsupported_reason(model):
            return None
        return shared_attention.group_of(rows, prompts)

    def _early_bans(self) -> tuple[list[int], int]:
        return self.eos_ids.tolist(), self.args.min_new_tokens  # no EOS before min_new_tokens

    def save_pretrained(self, directory: str) -> None:
        """The model (or LoRA adapter, base named as in the config) and its processor, in Hugging Face format."""
        _hf.save_policy(self._unwrapped(), directory, self.args.name_or_path)
        self.processor.save_pretrained(directory)

    def supervised_loss(self, rows: list[dict]) -> Tensor:
        """Mean token cross-entropy of ``row['target']`` given the prompt (teacher forcing), for warm-up; with tools,
        a list of assistant turns whose tool calls run between them (``TurnRunner.supervised_loss``)."""
        return self.driver.supervised_loss(rows)

    # ------------------------------------------- public surface (modalities/tokens/sampler.py TokenSampler)

    def media_scope(self) -> AbstractContextManager[None]:
        """Decoded media pinned for one batch (:meth:`_media_scope`)."""
        return self._media_scope()

    def encode_prompt(self, row: dict) -> dict[str, Tensor]:
        """One row's processor outputs, ``input_ids`` [1, L_p] (:meth:`_encode_prompt`)."""
        return self._encode_prompt(row)

    def sample(
        self, encodings: list[dict[str, Tensor]], n: int, greedy: bool, keys: noise.NoiseKeys | None = None
    ) -> tuple[Tensor, Tensor | None]:
        """``n`` completions [P·n, T] of each prompt and their sampler log-probs [P·n, T] (:meth:`_sample`)."""
        return self._sample(encodings, n, greedy, keys)

    def completion_mask(self, completion_ids: Tensor) -> Tensor:
        """1 up to and including the first EOS, 0 after it (:meth:`_completion_mask`). Shape: [n, T] → [n, T]."""
        return self._completion_mask(completion_ids)

    def decode(self, completion_ids: Tensor) -> list[str]:
        """The texts of completions [n, T] (:meth:`_decode`)."""
        return self._decode(completion_ids)

    def engine_prompts(self, rows: list[dict], encodings: list[dict[str, Tensor]]) -> list[EnginePrompt]:
        """The rollout engine's request of each row (:meth:`_engine_prompts`)."""
        return self._engine_prompts(rows, encodings)

    def engine_sample(
        self, requests: list[EnginePrompt], n: int, keys: noise.NoiseKeys | None, greedy: bool = False
    ) -> tuple[Tensor, Tensor]:
        """``n`` completions [len·n, T] of each request on the engine and its log-probs (:meth:`_engine_sample`)."""
        return self._engine_sample(requests, n, keys, greedy)


class SingleTurn:
    """One completion per sample: the token policy's rollout, greedy evaluation and warm-up loss without tools or an
    environment (the single-turn :class:`~..tokens.sampler.RolloutDriver`; :class:`~..tokens.turns.TurnRunner` is
    the multi-turn one). It reads the policy only through :class:`~..tokens.sampler.TokenSampler`."""

    def __init__(self, policy: TokenSampler):
        self.policy = policy

    def template_kwargs(self) -> dict[str, Any]:
        """No extra ``apply_chat_template`` arguments: the model's own template, no tools."""
        return {}

    def rollout(self, prompts: list[dict], group_size: int, keys: noise.NoiseKeys | None = None) -> Rollout:
        """B = P·G completions (group-major) of the P ``prompts``, sampled natively or on the rollout engine."""
        p = self.policy
        engine_logprobs = sampler_logprobs = None
        with p.media_scope():  # each prompt's media are decoded once for its G samples (and the engine's request)
            encodings = [p.encode_prompt(row) for row in prompts]
            columns = {k: v for encoder in p.encoders for k, v in encoder.columns(prompts).items()}
            if p.engine is not None:  # completions from vLLM; old log-probs from this model below (as TRL)
                requests = p.engine_prompts(prompts, encodings)
                completion_ids, engine_logprobs = p.engine_sample(requests, group_size, keys)
        if p.engine is None:
            completion_ids, sampler_logprobs = p.sample(encodings, group_size, False, keys)  # [B, T], group-major
        prompt_of = torch.arange(len(prompts)).repeat_interleave(group_size)  # [B]
        state = VLMState(completion_ids=completion_ids, prompt_of=prompt_of, cache=PromptCache(encodings))
        mask = p.completion_mask(completion_ids).float()  # [B, T]
        ended = torch.isin(completion_ids, p.eos_ids).any(dim=1)  # [B]
        rollout = sampled_rollout(
            p.decode(completion_ids), mask, ended, group_size, state, engine_logprobs, p.args.mask_truncated
        )
        mask = rollout.mask  # [B, T]
        if p.old_from_update and p.engine is None:  # μ = 1: the update's own log-probs, detached (no forward)
            rollout.old_logprobs = on_policy.deferred_like(mask)  # [B, T] NaN
        elif p.args.old_logprobs == "sampler" and sampler_logprobs is not None:
            rollout.old_logprobs = sampler_logprobs * mask  # [B, T], as drawn: no extra forward
        else:
            if p.args.old_logprobs == "sampler" and p.engine is None:
                prefix_sharing.warn_fallback_once("old_logprobs=sampler", "the KV-expanded sampler is not in use")
            rollout.old_logprobs = p.batched_logprobs(rollout, p.model) * mask  # [B, T]
        rollout.extras.update(reward_columns(p, prompts, encodings, columns, completion_ids, group_size))
        rollout.validate()
        return rollout

    @torch.no_grad()
    def evaluate(self, prompts: list[dict]) -> list[Answer]:
        """One greedy completion per prompt, with the reward columns a rollout gives it (:class:`Answer`)."""
        p = self.policy
        with p.media_scope():
            encodings = [p.encode_prompt(row) for row in prompts]
            columns = {k: v for encoder in p.encoders for k, v in encoder.columns(prompts).items()}
        completion_ids = p.sample(encodings, 1, greedy=True)[0]  # [P, T]
        extras = reward_columns(p, prompts, encodings, columns, completion_ids, 1)  # as a rollout's: scored the same
        return [Answer(text, {k: v[i] for k, v in extras.items()}) for i, text in enumerate(p.decode(completion_ids))]

    def supervised_loss(self, rows: list[dict]) -> Tensor:
        """Mean token cross-entropy of ``row['target']`` + the end token given the prompt (teacher forcing)."""
        p = self.policy
        with p.media_scope():
            encodings = [p.encode_prompt(row) for row in rows]
        eos = p.tokenizer.convert_ids_to_tokens(int(p.eos_ids[0]))
        targets = [p.tokenizer(row["target"] + eos, add_special_tokens=False)["input_ids"] for row in rows]
        return p.teacher_forced_loss(targets, PromptCache(encodings))


def reward_columns(
    p: TokenSampler, prompts: list[dict], encodings: list, columns: dict, completion_ids: Tensor, group_size: int
) -> dict[str, list]:
    """The B reward values of each column of P prompts' completions (``Rollout.extras``; a held-out
    :class:`Answer`'s ``columns``): the media ``columns`` of the prompts and their images', repeated G times, and
    ``completion_ids`` (each completion's tokens up to and including its end token). ``completion_ids``: [B, T]."""
    columns = {**columns, **p.image_columns(prompts, encodings, columns.get("image_size"))}
    out = {k: [v for v in col for _ in range(group_size)] for k, col in columns.items()}
    out["completion_ids"] = completion_id_lists(completion_ids, p.completion_mask(completion_ids))
    return out


def _pad_to_largest(values: list[Tensor]) -> list[Tensor]:
    """``values`` zero-padded at the end of every dimension past the first to the largest shape among them (the
    padding a processor applies when it batches images of different tile counts, LLaVA-NeXT's
    ``_pad_for_batching``); unchanged when their shapes agree past dim 0."""
    if len({v.shape[1:] for v in values}) <= 1:
        return values
    largest = [max(v.shape[d] for v in values) for d in range(1, values[0].dim())]
    out = []
    for v in values:
        pad = [p for d in reversed(range(1, v.dim())) for p in (0, largest[d - 1] - v.shape[d])]
        out.append(torch.nn.functional.pad(v, pad))
    return out


def _load(name_or_path: str, args: VLMArgs, dtype: torch.dtype, seed: int):
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText, AutoProcessor

    path = resolve_model_path(name_or_path, seed=seed)
    kwargs = dict(dtype=dtype, attn_implementation=args.attn_implementation, trust_remote_code=args.trust_remote_code)
    kwargs.update(args.extra)
    with _hf.loading(name_or_path):  # one line for a missing path, an offline hub id, a directory without a model
        config = AutoConfig.from_pretrained(path, trust_remote_code=args.trust_remote_code)
        is_vlm = hasattr(config, "vision_config")
        loader = AutoModelForImageTextToText if is_vlm else AutoModelForCausalLM
        model = loader.from_pretrained(path, **kwargs)
        processor = AutoProcessor.from_pretrained(path, trust_remote_code=args.trust_remote_code)
    return model, processor


def _load_vlm(a: VLMArgs, ctx: BuildContext) -> VLMAdapter:
    """The ``vlm`` family's loader (:class:`~mmgrpo.plugins.AdapterSpec`): the model (:func:`load_vlm_model`) and
    the adapter, with its multi-turn driver when ``ctx.rollout`` names tools or an environment."""
    model, processor, reference = load_vlm_model(a, ctx)
    return VLMAdapter(model, processor, a, reference, rollout=ctx.rollout)


def load_vlm_model(a: VLMArgs, ctx: BuildContext) -> tuple[torch.nn.Module, Any, torch.nn.Module | None]:
    """(policy, processor, frozen reference or None) of the token families built on this one: model and processor,
    frozen vision tower, checkpointing, then LoRA or the frozen reference."""
    if not 0 <= a.min_new_tokens <= a.max_new_tokens:
        raise ConfigError(
            f"model.args.min_new_tokens: must be in [0, max_new_tokens={a.max_new_tokens}], got {a.min_new_tokens}"
        )
    if a.compile_decode is True and not a.kv_expand_rollout:
        raise ConfigError("model.args.compile_decode compiles the KV-expanded sampler: set kv_expand_rollout: true")
    model, processor = _load(a.name_or_path, a, _hf.DTYPES[ctx.dtype], ctx.seed)
    if a.freeze_vision:
        for name, p in model.named_parameters():
            if "visual" in name or "vision" in name:
                p.requires_grad_(False)
    if a.gradient_checkpointing:
        prefix_sharing.enable_checkpointing(model)
    model, reference = _hf.lora_or_reference(model, ctx)
    return model, processor, reference


build_vlm_adapter = ADAPTERS.register("vlm")(
    AdapterSpec(
        args=VLMArgs,
        cls=VLMAdapter,
        load=_load_vlm,
        inputs=Inputs(media=("image",)),
        engine_model=serves(resolve_model_path),  # text + images
        # the name loads (built-in, a real model set up, a path, cached, or on a reachable hub): one line otherwise
        load_check=lambda a: (
            model_names.name_problem(a.name_or_path, "vlm", NAMES) or smolvlm.load_problem(a.name_or_path)
        ),
    )
)
