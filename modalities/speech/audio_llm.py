"""Audio-language policies: audio + text → text with ``Qwen2AudioForConditionalGeneration``; the units are tokens.

Qwen2-Audio (Chu et al. 2024, arXiv 2407.10759) is a decoder-only Qwen2 LM whose prompt holds ``<|AUDIO|>``
slots filled by a Whisper-style audio encoder. The token policy is the VLM adapter's, composed with one media
encoder: :class:`AudioLLMAdapter` is a :class:`~mmgrpo.modalities.vlm.adapter.VLMAdapter` whose ``encoders``
list is ``[AudioEncoder]`` (:mod:`mmgrpo.modalities.speech.audio`: decode + resample the row's audio once,
``Qwen2AudioProcessor(text=, audio=, sampling_rate=)`` as R1-AQA calls it — xiaomi-research/r1-aqa
``src/trainer/grpo_trainer.py``), so it samples, scores, references and saves exactly as for images.

Prompt sharing (``modalities/tokens/prefix_sharing.py``, 1-D RoPE path): sampling prefills each prompt once —
the audio encoder included — and expands its KV cache G ways; log-prob forwards encode each distinct prompt of a
minibatch once and let its completions attend to it. It is required here, not optional: Qwen2-Audio's forward
ignores ``logits_to_keep``, so the VLM adapter's naive fallback would mis-slice the logits; the builder refuses
a model the sharing does not cover (e.g. gradient checkpointing with flash attention) with a one-line error.
Under gradient checkpointing the log-prob forward packs each prompt and its completions into one row with a 4-D
attention mask (``prefix_sharing.packed_completion_logits``).

Log-probs are those of the sampling distribution (logits / temperature, fp32), with ``<|AUDIO|>``,
``<|audio_bos|>`` and ``<|audio_eos|>`` banned from sampling and masked out of the log-softmax (a sampled audio
slot would make the training forward see more slots than audio features).

With ``rollout.engine: vllm`` the rollouts are sampled by the vLLM server, which gets the decoded waveform at the
processor's rate (the token policy's ``_engine_sample``; docs/scale.md: 30-second windows only).

Rows: ``prompt`` (the question text, or a conversation whose user turn holds one ``{"type": "audio"}`` part) and
``audio`` (path, array or ``{"array", "sampling_rate"}``; ``audio.py``). Reward columns added to
``Rollout.extras``: ``audio_array`` (the decoded waveform, one shared object per prompt) and ``sampling_rate``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

import torch

from mmgrpo.config import ConfigError, Range, RolloutConfig, from_dict
from mmgrpo.plugins import ADAPTERS, AdapterSpec, BuildContext, Inputs, serves

from .. import _hf, model_names
from ..tokens import prefix_sharing
from ..vlm.adapter import VLMAdapter, VLMArgs
from .audio import AudioEncoder
from .tiny import NAMES, resolve_model_path

AUDIO_SPECIAL_TOKENS = ("<|AUDIO|>", "<|audio_bos|>", "<|audio_eos|>")


@dataclass
class AudioLLMArgs:
    """Options under ``model.args`` for ``model.adapter: audio_llm``."""

    name_or_path: str = "tiny-qwen2-audio"
    """Hub id or local directory (e.g. Qwen/Qwen2-Audio-7B-Instruct); ``tiny-qwen2-audio`` builds the built-in one."""
    max_new_tokens: int = 16
    """Completion budget T (tokens)."""
    temperature: Annotated[float, Range(gt=0)] = 1.0
    """Sampling temperature; log-probs are of logits / temperature."""
    top_p: float = 1.0
    """Nucleus sampling (1.0 = off). Not reflected in log-probs: keep 1.0 for an exact ratio."""
    top_k: int = 0
    """Top-k sampling (0 = off). Not reflected in log-probs: keep 0 for an exact ratio."""
    min_new_tokens: int = 0
    """End-of-turn is banned for the first N completion tokens (also in the log-probs)."""
    mask_truncated: bool = False
    """Exclude completions that hit max_new_tokens without end-of-turn from the loss."""
    system_prompt: str | None = None
    """Optional system message put before every prompt."""
    freeze_audio_encoder: bool = False
    """Do not train the audio tower (its parameters keep requires_grad=False)."""
    silence_threshold: float = 1e-4
    """Audio whose peak amplitude is at most this is rejected as silent."""
    forward_batch_size: int = 64
    """Rows per no-grad forward when computing old/reference log-probs."""
    old_logprobs: Literal["recompute", "sampler"] = "recompute"
    """recompute (a no-grad forward after sampling) | sampler (the sampling loop's own log-probs; ratio 1 up to
    float rounding). At μ = 1 the trainer uses neither: the update's own log-probs, detached (mmgrpo/on_policy.py)."""
    attn_implementation: str = "sdpa"
    """Attention kernel passed to from_pretrained: sdpa | eager | flash_attention_2."""
    gradient_checkpointing: bool = False
    """Recompute each decoder and audio-encoder layer in the backward pass instead of keeping its activations
    (transformers' activation checkpointing, non-reentrant): less memory, one more forward. Prompt sharing keeps
    working through one packed forward per minibatch (needs sdpa or eager attention)."""
    compile_decode: bool | Literal["auto"] = "auto"
    """The sampler's per-token step compiled over a static KV cache (the vlm adapter's option of that name)."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Extra keyword arguments for from_pretrained."""

    def token_args(self) -> dict[str, Any]:
        """The options of the token policy (``vlm`` adapter), with prompt sharing on."""
        keep = (
            "name_or_path",  # as the config named it: recorded by the export (save_pretrained, model card)
            "max_new_tokens",
            "temperature",
            "top_p",
            "top_k",
            "min_new_tokens",
            "mask_truncated",
            "system_prompt",
            "forward_batch_size",
            "old_logprobs",
            "attn_implementation",
            "compile_decode",
            "extra",
        )
        return {k: getattr(self, k) for k in keep} | {"prefix_sharing": True, "kv_expand_rollout": True}


class AudioLLMAdapter(VLMAdapter):
    """The token policy of :class:`VLMAdapter` with one media encoder, audio (see the module docstring).

    Nothing of the token policy is overridden: the constructor only chooses the encoder (a required
    :class:`AudioEncoder`) and bans the audio special tokens.
    """

    PIPELINE_TAG = "audio-text-to-text"
    TINY_MODULE = "mmgrpo.modalities.speech.tiny"

    def __init__(
        self,
        model: torch.nn.Module,
        processor: Any,
        args: AudioLLMArgs,
        reference: torch.nn.Module | None,
        rollout: RolloutConfig | None = None,
    ):
        token_args: VLMArgs = from_dict(VLMArgs, args.token_args(), "model.args")
        sampling_rate = int(processor.feature_extractor.sampling_rate)
        audio = AudioEncoder(sampling_rate, args.silence_threshold, required=True)
        super().__init__(model, processor, token_args, reference, encoders=[audio], rollout=rollout)
        self.audio_args = args
        self.sampling_rate = sampling_rate
        vocab = self.tokenizer.get_vocab()
        self.suppress_ids = sorted(set(self.suppress_ids) | {vocab[t] for t in AUDIO_SPECIAL_TOKENS if t in vocab})


def _load_audio_llm(a: AudioLLMArgs, ctx: BuildContext) -> AudioLLMAdapter:
    """The ``audio_llm`` family's loader (:class:`~mmgrpo.plugins.AdapterSpec`)."""

    from transformers import AutoProcessor, Qwen2AudioForConditionalGeneration

    if a.max_new_tokens < 1 or not 0 <= a.min_new_tokens <= a.max_new_tokens:
        raise ConfigError(
            f"model.args.max_new_tokens/min_new_tokens: need 0 <= min <= max, max >= 1; got "
            f"{a.min_new_tokens}, {a.max_new_tokens}"
        )
    path = resolve_model_path(a.name_or_path, seed=ctx.seed)
    with _hf.loading(a.name_or_path):  # one line for a missing path or an offline / unknown hub id
        model = Qwen2AudioForConditionalGeneration.from_pretrained(
            path, dtype=_hf.DTYPES[ctx.dtype], attn_implementation=a.attn_implementation, **a.extra
        )
        processor = AutoProcessor.from_pretrained(path)
    if not hasattr(processor, "feature_extractor"):
        raise ConfigError(f"model.args.name_or_path {a.name_or_path!r}: its processor has no feature_extractor (audio)")
    if a.freeze_audio_encoder:
        model.model.audio_tower.requires_grad_(False)
    if a.gradient_checkpointing:
        prefix_sharing.enable_checkpointing(model)
    model, reference = _hf.lora_or_reference(model, ctx)
    reason = prefix_sharing.unsupported_reason(model)
    if reason is not None:
        raise ConfigError(
            f"model.args.name_or_path {a.name_or_path!r}: the audio_llm adapter needs prompt sharing, "
            f"which does not cover it: {reason}"
        )
    return AudioLLMAdapter(model, processor, a, reference, rollout=ctx.rollout)


build_audio_llm_adapter = ADAPTERS.register("audio_llm")(
    AdapterSpec(
        args=AudioLLMArgs,
        cls=AudioLLMAdapter,
        load=_load_audio_llm,
        inputs=Inputs(media=("audio",), media_required=True),
        engine_model=serves(resolve_model_path, max_audios=1),
        load_check=lambda a: model_names.name_problem(a.name_or_path, "whisper", NAMES),  # resolve_model_path's
    )
)
