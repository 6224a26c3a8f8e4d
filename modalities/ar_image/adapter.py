"""Autoregressive text-to-image policies: the action units are the T VQ image tokens of one image.

Covers transformers' ``JanusForConditionalGeneration`` (Janus-1.3B, Janus-Pro-1B/7B, the tiny built-in Janus).
Everything a model family decides — the prompt format, the unconditional prompt, the image-token embeddings and
head, the VQ decoder — sits in one small class (:class:`JanusFamily`); another VQ-token generator in transformers
is one more such class registered in ``FAMILIES``. The sampling loop, the CFG log-probs and the prompt sharing
are the family's-agnostic rest of this file.

**Classifier-free guidance.** Each prompt runs as two rows: the conditional prompt and the unconditional one
(Janus: every token but BOS and ``<begin_of_image>`` replaced by the pad token, as in transformers'
``JanusForConditionalGeneration.generate``). With ℓ_c, ℓ_u the image-head logits of the two rows, guidance
scale s and temperature τ, tokens are drawn from

    π(x_t | x_<t) = softmax( (ℓ_u + s·(ℓ_c − ℓ_u)) / τ )        (optionally top-k truncated)

``cfg_logprob: guided`` (default) trains on exactly that log-probability (fp32), the gradient reaching both
branches through one batched forward of the 2n rows; the ratio is then that of the policy that sampled (Flow-GRPO
makes the same choice for diffusion CFG, Liu et al. 2025 §4.1, ``flow_grpo`` commit a482878). ``cfg_logprob:
cond`` is the reference implementations' shortcut — log softmax(ℓ_c / τ), the conditional branch only (AR-GRPO
``Kwai-Klear/AR-GRPO`` ``modeling.py::forward``; T2I-R1 ``CaraJ7/T2I-R1`` ``grpo_trainer.py::_get_per_token_logps``)
— kept for comparison; its ratio is not that of the sampler unless s = 1. ``cfg_logprob: scaled`` is
Janus-Pro-R1's log softmax((ℓ_u + s(ℓ_c − ℓ_u)) / s) (``wendell0218/Janus-Pro-R1`` ``grpo_trainer_t2iv3.py``).
The identities the tests check: guided == cond at s = 1 (ℓ_u cancels) and guided == log softmax(ℓ_u/τ) at s = 0.
top-k shapes the sampler but not the log-probs (as in the VLM adapter): keep it 0 for an exact ratio.
With an fp32 head the training forward never builds the [n, T, V] logits: the head's last layer is affine, so the
guided logits are that layer applied to the same combination of its input features, and the fused linear log-prob
(``modalities/tokens/logprobs.py``) scores that block by block (a bf16 head rounds each branch's logits before the
combination, so it keeps the logits path).

**Prompt sharing.** Sampling prefills each prompt's two rows once and expands the KV cache G ways along the
batch. The training forward encodes the U distinct prompts of a minibatch (both branches) once *with* autograd
and continues every row from its prompt's keys/values (``index_select``, so each prompt receives the summed
gradient of its G samples); ``prefix_sharing: false`` runs the naive [prompt ; image tokens] forward per row
instead, and a test checks the two agree, gradients included. Positions are computed from the attention mask
(left-padded prompts), the same way in both paths.

**Rewards** receive PIL images decoded by the model's VQ decoder (pixels in [−1, 1] mapped to [0, 255]).
LoRA via peft; the reference policy is the adapter disabled (or a frozen copy for full fine-tuning with β > 0).
Units: T = h·w tokens in raster order; the core's ``ratio_level: chunk`` with ``chunk_size = w`` takes one ratio
per row of the token grid.

Shape glossary: ``P`` prompts, ``G`` group size, ``B = P·G``, ``U`` distinct prompts in a minibatch, ``n`` rows,
``L`` padded prompt length, ``T`` image tokens, ``V`` image codebook size, ``D`` hidden size.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

import numpy as np
import torch
from PIL import Image
from torch import Tensor

from mmgrpo import noise, on_policy, sharding
from mmgrpo.compat import keep_generation_fields
from mmgrpo.config import ConfigError, Range
from mmgrpo.plugins import ADAPTERS, AdapterSpec, BuildContext, Inputs
from mmgrpo.types import Rollout

from .. import _hf, model_names
from ..tokens import compiled_decode, prefix_sharing
from ..tokens.decode import SamplingSpec, decode, reserve_cache
from ..tokens.logprobs import fusable_head, linear_token_logprobs, token_logprobs
from ..tokens.policy import TokenPolicy
from .compiled_step import StaticGuidedStepper
from .tiny import IMAGE_TOKENS, SHIPPED, TINY_NAMES, build_processor, resolve_model_path

FROZEN_PARTS = ("model.vqmodel.", "model.vision_model.", "model.aligner.")
"""Janus parts outside the image-generation policy (VQ auto-encoder, understanding tower) frozen by ``freeze_vq``."""


@dataclass
class ARImageArgs:
    """Options under ``model.args`` for ``model.adapter: ar_image``."""

    name_or_path: str = "tiny-janus-shapes"
    """Hub id or directory of a Janus checkpoint in the transformers format; ``tiny-janus`` (random) and
    ``tiny-janus-shapes`` (pre-trained on the flow_shapes images) are built in."""
    prompt_template: str = "{prompt}"
    """How a row's ``prompt`` becomes the text before ``<begin_of_image>``. Janus-Pro's chat format:
    ``"<|User|>: {prompt}\\n\\n<|Assistant|>:"``."""
    guidance_scale: float = 5.0
    """CFG scale s in ℓ_u + s·(ℓ_c − ℓ_u) (Janus-Pro / T2I-R1: 5). 1 = no guidance (the unconditional branch is
    then skipped)."""
    temperature: Annotated[float, Range(gt=0)] = 1.0
    """Sampling temperature τ; log-probs are of the guided logits / τ."""
    top_k: Annotated[int, Range(ge=0)] = 0
    """Top-k sampling (0 = off). Not reflected in log-probs: keep 0 for an exact ratio."""
    cfg_logprob: Literal["guided", "cond", "scaled"] = "guided"
    """Which distribution the log-probs are of: guided (the sampler's, exact) | cond (conditional branch only,
    AR-GRPO / T2I-R1) | scaled (guided logits / s, Janus-Pro-R1)."""
    prefix_sharing: bool = True
    """Encode each prompt once per minibatch (both branches) and continue its G samples from its KV cache."""
    gradient_checkpointing: bool = False
    """Recompute each decoder layer in the backward pass instead of keeping its activations (transformers'
    activation checkpointing, non-reentrant): less memory, one more forward. Checkpointed layers drop the KV cache,
    so training forwards then run the naive [prompt ; image tokens] row per sample (the prompt is short beside the
    T image tokens); sampling runs in eval mode with its cache."""
    forward_batch_size: int = 64
    """Rows per no-grad forward when computing old/reference log-probs."""
    attn_implementation: str = "sdpa"
    """Attention kernel passed to from_pretrained: sdpa | eager | flash_attention_2."""
    freeze_vq: bool = True
    """Keep the VQ auto-encoder and the understanding vision tower frozen (they are not part of the policy)."""
    compile_decode: bool | Literal["auto"] = "auto"
    """The sampler's per-token step (both CFG branches, the head and the guidance) runs compiled over a static KV
    cache sized for the group (torch.compile: inductor on CPU, CUDA graphs on CUDA; modalities/ar_image/
    compiled_step.py): the same keyed draws up to float rounding, one graph per (B, 64-token bucket of L + T). auto:
    on where the policy is on CUDA, off on the CPU (the vlm adapter's option; docs/benchmarks.md); true falls back to
    the eager loop with a warning without a C++ compiler or under FSDP."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Extra keyword arguments for from_pretrained."""


# ----------------------------------------------------------------------------------------- model family


class JanusFamily:
    """What is specific to Janus / Janus-Pro (transformers ``JanusForConditionalGeneration``).

    A new VQ-token family implements the same seven methods and the ``grid`` attribute.
    """

    def __init__(self, model: torch.nn.Module, tokenizer: Any):
        self.tokenizer = tokenizer
        gen = getattr(model.generation_config, "generation_kwargs", None) or {}
        self.boi_id = int(gen.get("boi_token_id", tokenizer.convert_tokens_to_ids("<begin_of_image>")))
        self.bos_id = tokenizer.bos_token_id
        self.pad_id = (
            tokenizer.pad_token_id if tokenizer.pad_token_id is not None else model.config.text_config.pad_token_id
        )
        side = model.model.vqmodel.quantize.quant_state_dims
        self.grid = (int(side[0]), int(side[1]))  # (h, w) image tokens

    def prompt_ids(self, text: str) -> list[int]:
        """Token ids of the conditional prompt, ending with ``<begin_of_image>``."""
        return self.tokenizer(text, add_special_tokens=True)["input_ids"] + [self.boi_id]

    def uncond_ids(self, ids: Tensor) -> Tensor:
        """The unconditional prompt: all tokens but BOS and ``<begin_of_image>`` set to pad (HF Janus generate)."""
        keep = (ids == self.bos_id) | (ids == self.boi_id)
        return torch.where(keep, ids, torch.full_like(ids, self.pad_id))

    def backbone(self, model: torch.nn.Module) -> torch.nn.Module:
        """The decoder-only transformer: inputs_embeds → last_hidden_state, with a KV cache."""
        return model.model.language_model

    def embed_text(self, model: torch.nn.Module, ids: Tensor) -> Tensor:
        return model.get_input_embeddings()(ids)  # [n, L, D]

    def embed_image(self, model: torch.nn.Module, tokens: Tensor) -> Tensor:
        return model.prepare_embeddings_for_image_generation(tokens)  # [n, T, D]

    def image_logits(self, model: torch.nn.Module, hidden: Tensor) -> Tensor:
        return model.model.generation_head(hidden)  # [..., V]

    def image_head(self, model: torch.nn.Module) -> torch.nn.Module:
        """The head's last layer (features → logits), for the fused log-prob; ``image_features`` feeds it."""
        return model.model.generation_head.vision_head

    def image_features(self, model: torch.nn.Module, hidden: Tensor) -> Tensor:
        head = model.model.generation_head
        return head.activation_fn(head.proj_out(hidden))  # [..., P], image_head(features) = image_logits

    @torch.no_grad()
    def decode(self, model: torch.nn.Module, tokens: Tensor) -> list[Image.Image]:
        # FSDP2 wraps the VQ quantizer as its own unit (a _no_split_module), whose codebook the decoder reads through
        # get_codebook_entry, not forward: run that method as the unit's forward (no-op when unsharded)
        sharding.as_forward(model.model.vqmodel.quantize, "get_codebook_entry")
        pixels = model.decode_image_tokens(tokens).float()  # [n, H, W, 3] in [-1, 1]
        arr = ((pixels.clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8).cpu().numpy()
        return [Image.fromarray(np.ascontiguousarray(a)) for a in arr]


FAMILIES = {"janus": JanusFamily}


# ------------------------------------------------------------------------------------------------ state


class PromptCache:
    """Per-prompt token ids (conditional prompt with ``<begin_of_image>``), shared by the G samples of a prompt."""

    def __init__(self, ids: list[list[int]]):
        self.ids = ids  # P lists


@dataclass
class ARImageState:
    """Shape:
    image_tokens: [B, T] sampled codebook indices (raster order)
    prompt_of: [B] row of ``cache.ids`` each sample continues
    """

    image_tokens: Tensor  # [B, T]
    prompt_of: Tensor  # [B]
    cache: PromptCache


def guided_logits(cond: Tensor, uncond: Tensor | None, scale: float) -> Tensor:
    """ℓ_u + s·(ℓ_c − ℓ_u); ``uncond`` None means no guidance. Shape: [..., V] each → [..., V]."""
    if uncond is None:
        return cond
    return uncond + scale * (cond - uncond)


def _select_cache(cache: Any, rows: Tensor) -> Any:
    """The KV cache with batch rows ``rows`` (differentiable ``index_select``; a new row per entry)."""
    cache.reorder_cache(rows)
    return cache


class ARImageAdapter(TokenPolicy):
    """Image-token policy with classifier-free guidance (see the module docstring)."""

    PIPELINE_TAG = "text-to-image"
    TINY_MODULE = "mmgrpo.modalities.ar_image.tiny"

    def __init__(self, model: torch.nn.Module, processor: Any, family: Any, args: ARImageArgs, reference=None):
        self.model = model
        self.processor = processor  # JanusProcessor: tokenizer + image processor (exported with the model)
        self.tokenizer = processor.tokenizer
        self.family = family
        self.args = args
        self.reference = reference
        self.T = family.grid[0] * family.grid[1]
        self.compiled = compiled_decode.CompiledDecoder()  # the compiled step and its static caches (compile_decode)

    def _base(self, model: torch.nn.Module) -> torch.nn.Module:
        """The ``JanusForConditionalGeneration`` under a peft wrapper (LoRA layers live inside it)."""
        return _hf.unwrap(model, peft=True)

    def _run(self, model: torch.nn.Module, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(base, *args)`` on the base model of ``model``, run as a forward of ``model``: every call here reaches
        sub-modules (embeddings, backbone, generation head, VQ decoder) directly, and under FSDP2 their root-owned
        weights exist only inside a forward of the root (:func:`mmgrpo.sharding.call_as_forward`)."""
        base = self._base(model)
        return sharding.call_as_forward(model, lambda *a: fn(base, *a), *args)

    @property
    def guided(self) -> bool:
        return self.args.guidance_scale != 1.0

    # ----------------------------------------------------------------------------------------- prompts

    def _encode(self, row: dict) -> list[int]:
        return self.family.prompt_ids(self.args.prompt_template.format(prompt=row["prompt"]))

    def _prompt_batch(self, ids: list[list[int]]) -> tuple[Tensor, Tensor]:
        """Left-padded [2U, L] ids (conditional rows, then unconditional rows) and their attention mask."""
        L = max(len(i) for i in ids)
        pad = self.family.pad_id
        cond = torch.tensor([[pad] * (L - len(i)) + i for i in ids])  # [U, L]
        mask = torch.tensor([[0] * (L - len(i)) + [1] * len(i) for i in ids])  # [U, L]
        if self.guided:
            cond = torch.cat([cond, self.family.uncond_ids(cond)])  # [2U, L]
            mask = torch.cat([mask, mask])
        return cond.to(self.device), mask.to(self.device)

    def _branch_rows(self, prompt_rows: Tensor, U: int) -> Tensor:
        """Rows of the [2U] prompt batch for n samples: conditional rows then unconditional ones. [n] → [2n]."""
        return torch.cat([prompt_rows, prompt_rows + U]) if self.guided else prompt_rows

    def _split(self, logits: Tensor) -> tuple[Tensor, Tensor | None]:
        if not self.guided:
            return logits, None
        n = logits.shape[0] // 2
        return logits[:n], logits[n:]

    # ---------------------------------------------------------------------------------------- forwards

    def _prefill(self, model: torch.nn.Module, ids: Tensor, mask: Tensor) -> tuple[Any, Tensor]:
        """KV cache of the prompt rows and the hidden state at their last position. [m, L] → cache, [m, D]."""

        def run(base: torch.nn.Module) -> tuple[Any, Tensor]:
            positions = (mask.cumsum(1) - 1).clamp(min=0)  # [m, L]
            out = self.family.backbone(base)(
                inputs_embeds=self.family.embed_text(base, ids),
                attention_mask=mask,
                position_ids=positions,
                use_cache=True,
            )
            return _hf.returned_cache(out), out.last_hidden_state[:, -1]

        return self._run(model, run)

    def _continue(self, model, cache, mask: Tensor, tokens: Tensor, start: Tensor) -> Tensor:
        """Hidden states of image ``tokens`` [m, t] continuing ``cache``; ``mask`` [m, L + t]; ``start`` [m]."""

        def run(base: torch.nn.Module) -> Tensor:
            positions = start[:, None] + torch.arange(tokens.shape[1], device=tokens.device)  # [m, t]
            out = self.family.backbone(base)(
                inputs_embeds=self.family.embed_image(base, tokens),
                attention_mask=mask,
                position_ids=positions,
                use_cache=True,
                **_hf.kv_cache(cache),
            )
            return out.last_hidden_state  # [m, t, D]

        return self._run(model, run)

    def _unit_hidden(self, model: torch.nn.Module, state: ARImageState, index: Tensor) -> Tensor:
        """Last hidden states predicting every unit of rows ``index``: conditional rows, then unconditional ones
        when guided. [2n or n, T, D]"""
        tokens = state.image_tokens[index].to(self.device)  # [n, T]
        prompts = state.prompt_of[index]  # [n]
        fam = self.family
        if self.args.prefix_sharing and not prefix_sharing.checkpointing(model):  # checkpointing drops the cache
            unique, rows = torch.unique(prompts, return_inverse=True)  # U prompts; rows [n]
            ids, mask = self._prompt_batch([state.cache.ids[p] for p in unique.tolist()])  # [2U, L]
            cache, last = self._prefill(model, ids, mask)  # last [2U, D]
            sel = self._branch_rows(rows.to(self.device), len(unique))  # [2n]
            cache = _select_cache(cache, sel)
            m = mask[sel]  # [2n, L]
            both = torch.cat([tokens, tokens]) if self.guided else tokens  # [2n, T]
            full_mask = torch.cat([m, m.new_ones(m.shape[0], self.T - 1)], 1)  # [2n, L + T - 1]
            hidden = self._continue(model, cache, full_mask, both[:, :-1], m.sum(1))  # [2n, T-1, D]
            hidden = torch.cat([last[sel][:, None], hidden], 1)  # [2n, T, D]
        else:
            ids, mask = self._prompt_batch([state.cache.ids[p] for p in prompts.tolist()])  # [2n, L]
            both = torch.cat([tokens, tokens]) if self.guided else tokens  # [2n, T]
            full_mask = torch.cat([mask, mask.new_ones(mask.shape[0], self.T - 1)], 1)

            def run(base: torch.nn.Module) -> Tensor:
                embeds = torch.cat([fam.embed_text(base, ids), fam.embed_image(base, both[:, :-1])], 1)  # [2n, L+T-1]
                positions = (full_mask.cumsum(1) - 1).clamp(min=0)
                out = fam.backbone(base)(
                    inputs_embeds=embeds, attention_mask=full_mask, position_ids=positions, use_cache=False
                )
                return out.last_hidden_state[:, ids.shape[1] - 1 :]  # [2n, T, D]

            hidden = self._run(model, run)
        return hidden

    def _unit_logits(self, model: torch.nn.Module, state: ARImageState, index: Tensor) -> tuple[Tensor, Tensor | None]:
        """Conditional and unconditional image-head logits of every unit of rows ``index``, fp32. [n, T, V] each."""
        return self._split(self._run(model, self.family.image_logits, self._unit_hidden(model, state, index)).float())

    def _distribution(self, cond: Tensor, uncond: Tensor | None) -> tuple[Tensor, float]:
        """The logits x and divisor τ' with log softmax(x / τ') the trained log-prob, per ``cfg_logprob``.
        The head's last layer is affine, so the same combination of its input features gives its input for x
        (the bias b enters as b_u + s·(b_c − b_u) = b). [..., V or P] each → [..., V or P], float."""
        s, tau = self.args.guidance_scale, self.args.temperature
        if self.args.cfg_logprob == "cond":
            return cond, tau
        guided = guided_logits(cond, uncond, s)
        return guided, (s if self.args.cfg_logprob == "scaled" else tau)

    def _token_logprobs(self, model: torch.nn.Module, state: ARImageState, index: Tensor) -> Tensor:
        base, fam = self._base(model), self.family
        tokens = state.image_tokens[index].to(self.device)  # [n, T]
        hidden = self._unit_hidden(model, state, index)  # [2n or n, T, D]
        head = fusable_head(model, fam.image_head(base))  # the fused log-prob through the head's last linear layer
        if head is not None and head.weight.dtype != torch.float32:
            head = None  # a bf16 head rounds each branch's logits before guidance: keep those numerics
        if head is None:
            x, div = self._distribution(*self._split(self._run(model, fam.image_logits, hidden).float()))  # [n, T, V]
            return token_logprobs(x, tokens, temperature=div)  # [n, T], log softmax(x / div)
        x, div = self._distribution(*self._split(self._run(model, fam.image_features, hidden).float()))  # [n, T, P]
        return linear_token_logprobs(x, head.weight, tokens, bias=head.bias, temperature=div)  # [n, T] fp32

    # ---------------------------------------------------------------------------------------- sampling

    @torch.no_grad()
    def _sample(
        self,
        ids: list[list[int]],
        group_size: int,
        greedy: bool,
        generator: torch.Generator | None = None,
        keys: noise.NoiseKeys | None = None,
    ) -> tuple[Tensor, Tensor]:
        """Image tokens [P·G, T] (group-major) and their log-probs under the sampling distribution [P·G, T], from
        the one decode loop (:func:`mmgrpo.modalities.tokens.decode.decode`; fixed length T, no end token)."""
        model = self._unwrapped()
        spec = SamplingSpec(
            max_new_tokens=self.T,
            eos_ids=[],
            pad_id=0,
            temperature=self.args.temperature,
            top_k=self.args.top_k,
            greedy=greedy,
            synced=sharding.is_sharded(model),
        )
        was_training = model.training
        model.eval()
        try:
            tokens, logprobs = decode(self._stepper(model, ids, spec), group_size, spec, keys, generator)
        finally:
            model.train(was_training)
        return tokens.cpu(), logprobs.cpu()

    def _stepper(self, model: torch.nn.Module, ids: list[list[int]], spec: SamplingSpec) -> Any:
        """The compiled static-cache stepper with ``compile_decode`` where it runs (``compiled_step.py``), else the
        eager one (a one-time warning says why)."""
        eager = _GuidedStepper(self, model, ids, reserve=spec.max_new_tokens)
        if compiled_decode.use_compiled(self.args.compile_decode, model, spec.synced):
            return StaticGuidedStepper(eager, self.compiled)
        return eager

    def rollout(self, prompts: list[dict], group_size: int, keys: noise.NoiseKeys | None = None) -> Rollout:
        ids = [self._encode(row) for row in prompts]  # once per prompt
        tokens, _ = self._sample(ids, group_size, greedy=False, keys=keys)  # [B, T]
        B = tokens.shape[0]
        prompt_of = torch.arange(len(prompts)).repeat_interleave(group_size)  # [B]
        state = ARImageState(image_tokens=tokens, prompt_of=prompt_of, cache=PromptCache(ids))
        mask = torch.ones(B, self.T)
        rollout = Rollout(
            outputs=self._run(self.model, self.family.decode, tokens.to(self.device)),
            old_logprobs=torch.zeros(B, self.T),
            mask=mask,
            group_size=group_size,
            prompt_index=prompt_of.clone(),
            truncated=torch.zeros(B, dtype=torch.bool),
            state=state,
        )
        if self.old_from_update:  # μ = 1: the update's own log-probs, detached (no forward)
            rollout.old_logprobs = on_policy.deferred_like(mask)  # [B, T] NaN
        else:
            rollout.old_logprobs = self._batched_no_grad(rollout, self.model)  # [B, T], the training forward's
        return rollout

    @torch.no_grad()
    def evaluate(self, prompts: list[dict]) -> list[Image.Image]:
        """One image per prompt, sampled with a generator seeded by the row's ``seed`` (default 0): the same rows
        give the same images, and distinct seeds give distinct samples of the policy (greedy decoding of a VQ
        generator collapses to a few images, so evaluation samples, as the reference implementations' GenEval numbers
        do)."""
        images = []
        for row in prompts:
            gen = torch.Generator(device=self.device).manual_seed(int(row.get("seed", 0)))
            tokens, _ = self._sample([self._encode(row)], 1, greedy=False, generator=gen)
            images += self._run(self.model, self.family.decode, tokens.to(self.device))
        return images

    # ------------------------------------------------------------------------------- training plumbing

    def save_pretrained(self, directory: str) -> None:
        """The model (or LoRA adapter, base named as in the config) and a ``JanusProcessor``, so that the export
        generates images with ``JanusForConditionalGeneration.generate(..., generation_mode="image")``.

        The generation config is saved standalone with ``generation_kwargs.boi_token_id`` (Janus's image
        ``generate`` reads it; a config marked ``_from_model_config`` loses it on load).
        """
        model = self._unwrapped()
        gen = self._base(model).generation_config
        gen.generation_kwargs = {**(getattr(gen, "generation_kwargs", None) or {}), "boi_token_id": self.family.boi_id}
        keep_generation_fields(gen)
        _hf.save_policy(model, directory, self.args.name_or_path)
        self.processor.save_pretrained(directory)  # tokenizer + image processor


class _GuidedStepper:
    """:class:`~mmgrpo.modalities.tokens.decode.Stepper` of a CFG image-token generator: the conditional and
    unconditional prompt rows prefilled once per prompt, both expanded G ways, one image token per row and step fed
    to both branches; the scores are the guided logits over the temperature (the sampling distribution)."""

    def __init__(self, adapter: ARImageAdapter, model: torch.nn.Module, ids: list[list[int]], reserve: int = 0):
        self.adapter, self.model, self.ids, self.reserve = adapter, model, ids, reserve

    def _logits(self, last: Tensor) -> Tensor:
        """Guided logits of the B rows from the hidden states of the [2B] branch rows. [2B, D] → [B, V] fp32."""
        a = self.adapter
        cond, uncond = a._split(a._run(self.model, a.family.image_logits, last).float())  # [B, V] each
        return guided_logits(cond, uncond, a.args.guidance_scale)

    def prefill(self, group_size: int) -> Tensor:
        a = self.adapter
        P = len(self.ids)
        prompt_ids, mask = a._prompt_batch(self.ids)  # [2P, L]
        cache, last = a._prefill(self.model, prompt_ids, mask)  # one prefill per prompt and branch
        if self.reserve:  # K/V written in place, room for the image tokens (decode.ReservedLayer)
            reserve_cache(cache, self.reserve)
        sel = a._branch_rows(torch.arange(P, device=a.device).repeat_interleave(group_size), P)  # [2B]
        self.cache = _select_cache(cache, sel)
        self.mask, last = mask[sel], last[sel]  # [2B, L], [2B, D]
        self.pos = self.mask.sum(1)  # [2B] position of the first image token
        return self._logits(last)  # [B, V]

    def scores(self, logits: Tensor, step: int, spec: SamplingSpec) -> Tensor:
        return logits / spec.temperature  # the distribution the training forward scores (also when greedy)

    def step(self, tokens: Tensor, step: int) -> Tensor:
        both = torch.cat([tokens, tokens]) if self.adapter.guided else tokens  # [2B]
        self.mask = torch.cat([self.mask, self.mask.new_ones(self.mask.shape[0], 1)], 1)
        last = self.adapter._continue(self.model, self.cache, self.mask, both[:, None], self.pos + step)[:, -1]
        return self._logits(last)  # [B, V]


def _load(args: ARImageArgs, dtype: torch.dtype, seed: int):
    from transformers import AutoConfig, AutoProcessor, AutoTokenizer, JanusForConditionalGeneration

    path = resolve_model_path(args.name_or_path, seed=seed)
    with _hf.loading(args.name_or_path):
        model_type = AutoConfig.from_pretrained(path).model_type
    if model_type not in FAMILIES:
        raise ConfigError(
            f"model.args.name_or_path: {args.name_or_path!r} is a {model_type!r} model; "
            f"ar_image supports {sorted(FAMILIES)}"
        )
    kwargs = dict(dtype=dtype, attn_implementation=args.attn_implementation, **args.extra)
    with _hf.loading(args.name_or_path):
        model = JanusForConditionalGeneration.from_pretrained(path, **kwargs)
        try:
            processor = AutoProcessor.from_pretrained(path)
        except (OSError, ValueError, TypeError):
            processor = None
        if getattr(processor, "image_processor", None) is None:  # saved without one (the shipped tiny model)
            tokenizer = AutoTokenizer.from_pretrained(path, extra_special_tokens=IMAGE_TOKENS)
            processor = build_processor(tokenizer, model.config)
    return model, processor, FAMILIES[model_type]


def _load_ar_image(a: ARImageArgs, ctx: BuildContext) -> ARImageAdapter:
    """The ``ar_image`` family's loader (:class:`~mmgrpo.plugins.AdapterSpec`)."""
    if a.cfg_logprob == "scaled" and a.guidance_scale <= 0:
        raise ConfigError("model.args.cfg_logprob: scaled divides by guidance_scale; set guidance_scale > 0")
    compiled_decode.check_args(a.compile_decode)
    model, processor, family_cls = _load(a, _hf.DTYPES[ctx.dtype], ctx.seed)
    family = family_cls(model, processor.tokenizer)
    if a.freeze_vq:
        for name, p in model.named_parameters():
            if any(k in name for k in FROZEN_PARTS):
                p.requires_grad_(False)
    model.lm_head.requires_grad_(False)  # text head: unused for image tokens (tied to the input embeddings)
    if a.gradient_checkpointing:
        prefix_sharing.enable_checkpointing(model)
    model, reference = _hf.lora_or_reference(model, ctx)
    if a.freeze_vq and reference is None:  # LoRA names like q_proj also match the understanding tower, never run
        for name, p in model.named_parameters():
            if "lora_" in name and any(k in name for k in FROZEN_PARTS):
                p.requires_grad_(False)
    return ARImageAdapter(model, processor, family, a, reference)


build_ar_image_adapter = ADAPTERS.register("ar_image")(
    AdapterSpec(
        args=ARImageArgs,
        cls=ARImageAdapter,
        load=_load_ar_image,
        inputs=Inputs(outputs="image"),
        load_check=lambda a: model_names.name_problem(a.name_or_path, "ar_image", (*TINY_NAMES, *SHIPPED)),
    )
)
