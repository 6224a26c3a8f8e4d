"""Audio-language policies: audio + text → text with ``Qwen2AudioForConditionalGeneration``; the units are tokens.

Qwen2-Audio (Chu et al. 2024, arXiv 2407.10759) is a decoder-only Qwen2 LM whose prompt holds ``<|AUDIO|>``
slots filled by a Whisper-style audio encoder. The token policy is the VLM adapter's, by composition:
:class:`AudioLLMAdapter` turns each row into the processor outputs of its prompt through an
:class:`~mmgrpo.modalities.speech.audio.AudioEncoder` (a media encoder: decode + resample the row's audio once,
``Qwen2AudioProcessor(text=, audio=, sampling_rate=)`` as R1-AQA calls it — xiaomi-research/r1-aqa
``src/trainer/grpo_trainer.py``) and hands those encodings to a :class:`~mmgrpo.modalities.vlm.adapter.VLMAdapter`,
which samples, scores, references and saves exactly as for images. Nothing of the VLM adapter is overridden; its
sampling and log-prob helpers are called on the audio encodings.

Prompt sharing (``modalities/tokens/prefix_sharing.py``, 1-D RoPE path): sampling prefills each prompt once —
the audio encoder included — and expands its KV cache G ways; log-prob forwards encode each distinct prompt of a
minibatch once and let its completions attend to it. It is required here, not optional: Qwen2-Audio's forward
ignores ``logits_to_keep``, so the VLM adapter's naive fallback would mis-slice the logits; the builder refuses
a model the sharing does not cover (e.g. gradient checkpointing) with a one-line error.

Log-probs are those of the sampling distribution (logits / temperature, fp32), with ``<|AUDIO|>``,
``<|audio_bos|>`` and ``<|audio_eos|>`` banned from sampling and masked out of the log-softmax (a sampled audio
slot would make the training forward see more slots than audio features).

Rows: ``prompt`` (the question text, or a conversation whose user turn holds one ``{"type": "audio"}`` part) and
``audio`` (path, array or ``{"array", "sampling_rate"}``; ``audio.py``). Reward columns added to
``Rollout.extras``: ``audio_array`` (the decoded waveform, one shared object per prompt) and ``sampling_rate``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from mmgrpo.config import ConfigError, LoraConfig, from_dict
from mmgrpo.plugins import ADAPTERS
from mmgrpo.types import Rollout

from ..tokens import prefix_sharing
from ..vlm.adapter import PromptCache, VLMAdapter, VLMArgs, VLMState
from .adapter import apply_lora
from .audio import AudioEncoder, AudioError
from .tiny import resolve_model_path

AUDIO_SPECIAL_TOKENS = ("<|AUDIO|>", "<|audio_bos|>", "<|audio_eos|>")


@dataclass
class AudioLLMArgs:
    """Options under ``model.args`` for ``model.adapter: audio_llm``."""

    name_or_path: str = "tiny-qwen2-audio"
    """Hub id or local directory (e.g. Qwen/Qwen2-Audio-7B-Instruct); ``tiny-qwen2-audio`` builds the built-in one."""
    max_new_tokens: int = 16
    """Completion budget T (tokens)."""
    temperature: float = 1.0
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
    old_logprobs: str = "recompute"
    """recompute (a no-grad forward after sampling) | sampler (the sampling loop's own log-probs; ratio 1 up to
    float rounding)."""
    attn_implementation: str = "sdpa"
    """Attention kernel passed to from_pretrained: sdpa | eager | flash_attention_2."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Extra keyword arguments for from_pretrained."""

    def token_args(self) -> dict[str, Any]:
        """The options of the token policy (``vlm`` adapter), with prompt sharing on."""
        keep = ("max_new_tokens", "temperature", "top_p", "top_k", "min_new_tokens", "mask_truncated",
                "system_prompt", "forward_batch_size", "old_logprobs", "attn_implementation", "extra")  # fmt: skip
        return {k: getattr(self, k) for k in keep} | {"prefix_sharing": True, "kv_expand_rollout": True}


class AudioLLMAdapter:
    """Token policy of :class:`VLMAdapter` over prompts that hold audio (see the module docstring)."""

    def __init__(self, tokens: VLMAdapter, args: AudioLLMArgs):
        self.tokens = tokens
        self.args = args
        self.processor = tokens.processor
        self.sampling_rate = int(self.processor.feature_extractor.sampling_rate)
        self.audio = AudioEncoder(self.sampling_rate, args.silence_threshold)  # the prompts' media encoder
        vocab = tokens.tokenizer.get_vocab()
        banned = {vocab[t] for t in AUDIO_SPECIAL_TOKENS if t in vocab}
        tokens.suppress_ids = sorted(set(tokens.suppress_ids) | banned)

    # The trainer reads and replaces ``model`` (accelerate-prepared) and checkpoints ``reference``.
    @property
    def model(self) -> torch.nn.Module:
        return self.tokens.model

    @model.setter
    def model(self, value: torch.nn.Module) -> None:
        self.tokens.model = value

    @property
    def reference(self) -> torch.nn.Module | None:
        return self.tokens.reference

    # ----------------------------------------------------------------------- the audio encoder: row → encoding

    def _messages(self, row: dict) -> list[dict]:
        prompt = row["prompt"]
        if isinstance(prompt, list):  # already conversational: it holds its own {"type": "audio"} part
            return prompt
        messages = [{"role": "user", "content": [{"type": "audio"}, {"type": "text", "text": str(prompt)}]}]
        if self.args.system_prompt:
            messages.insert(0, {"role": "system", "content": self.args.system_prompt})
        return messages

    def encode_prompt(self, row: dict, where: str = "row") -> dict[str, Tensor]:
        """Processor outputs of one row (``input_ids``/``attention_mask`` [1, L], ``input_features`` [1, M, F],
        ``feature_attention_mask`` [1, F]), its audio decoded by :attr:`audio` (pinned for the batch)."""
        if "prompt" not in row:
            raise KeyError(f"{where} has no 'prompt' key (keys: {sorted(row)}); the audio_llm adapter needs one")
        media = self.audio.load(row, where=where)
        if not media:
            raise AudioError(f"{where} 'audio': the row has no audio; every prompt of the audio_llm adapter needs one")
        text = self.processor.apply_chat_template(self._messages(row), add_generation_prompt=True, tokenize=False)
        enc = dict(self.processor(text=[text], return_tensors="pt", **self.audio.processor_kwargs(media)))
        self.audio.check(enc, media)
        return enc

    def _encode(self, rows: list[dict]) -> tuple[list[dict[str, Tensor]], dict[str, list[Any]]]:
        """Encodings of ``rows`` and their per-prompt reward columns; each audio is decoded once."""
        self.audio.reset()
        try:
            encodings = [self.encode_prompt(row, where=f"row {i}") for i, row in enumerate(rows)]
            return encodings, self.audio.columns(rows)
        finally:
            self.audio.reset()

    # ---------------------------------------------------------------------- the token policy (VLMAdapter)

    def rollout(self, prompts: list[dict], group_size: int) -> Rollout:
        t = self.tokens
        encodings, columns = self._encode(prompts)  # once per prompt
        completion_ids, sampler_logprobs = t._sample(encodings, group_size, greedy=False)  # [B, T], group-major
        prompt_of = torch.arange(len(prompts)).repeat_interleave(group_size)  # [B]
        mask = t._completion_mask(completion_ids).float()  # [B, T]
        truncated = ~torch.isin(completion_ids, t.eos_ids).any(dim=1)  # [B]
        if self.args.mask_truncated:
            mask = mask * (~truncated).float()[:, None]
        rollout = Rollout(
            outputs=t._decode(completion_ids),
            old_logprobs=torch.zeros_like(mask),
            mask=mask,
            group_size=group_size,
            prompt_index=prompt_of.clone(),
            truncated=truncated,
            state=VLMState(completion_ids=completion_ids, prompt_of=prompt_of, cache=PromptCache(encodings)),
            extras={k: [v for v in col for _ in range(group_size)] for k, col in columns.items()},
        )
        if self.args.old_logprobs == "sampler":
            rollout.old_logprobs = sampler_logprobs * mask  # [B, T]
        else:
            rollout.old_logprobs = t._batched_no_grad(rollout, t.model) * mask  # [B, T]
        return rollout

    @torch.no_grad()
    def evaluate(self, prompts: list[dict]) -> list[str]:
        encodings, _ = self._encode(prompts)
        return self.tokens._decode(self.tokens._generate(encodings, 1, greedy=True))

    def logprobs(self, rollout: Rollout, index: Tensor) -> Tensor:
        return self.tokens.logprobs(rollout, index)

    def ref_logprobs(self, rollout: Rollout, index: Tensor) -> Tensor:
        return self.tokens.ref_logprobs(rollout, index)

    def sync_reference(self) -> None:
        self.tokens.sync_reference()

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        return self.tokens.trainable_parameters()

    def save_pretrained(self, directory: str) -> None:
        self.tokens.save_pretrained(directory)

    def supervised_loss(self, rows: list[dict]) -> Tensor:
        """Mean token cross-entropy of ``row['target']`` + end-of-turn given the prompt and audio (warm-up)."""
        t = self.tokens
        encodings, _ = self._encode(rows)
        eos = t.tokenizer.convert_ids_to_tokens(int(t.eos_ids[0]))
        targets = [t.tokenizer(str(row["target"]) + eos, add_special_tokens=False)["input_ids"] for row in rows]
        T = max(len(x) for x in targets)
        comp = torch.full((len(rows), T), t.pad_id, dtype=torch.long)
        valid = torch.zeros((len(rows), T))
        for i, x in enumerate(targets):
            comp[i, : len(x)] = torch.tensor(x)
            valid[i, : len(x)] = 1
        state = VLMState(completion_ids=comp, prompt_of=torch.arange(len(rows)), cache=PromptCache(encodings))
        logp = t._token_logprobs(t.model, state, torch.arange(len(rows)))  # [n, T]
        valid = valid.to(logp.device)
        return -(logp * valid).sum() / valid.sum()


@ADAPTERS.register("audio_llm")
def build_audio_llm_adapter(
    args: dict, *, seed: int = 0, lora: LoraConfig | None = None, dtype: str = "float32", need_reference: bool = False
) -> AudioLLMAdapter:
    """Build the adapter from ``model.args`` (validated against :class:`AudioLLMArgs`)."""
    import copy

    from transformers import AutoProcessor, Qwen2AudioForConditionalGeneration

    a: AudioLLMArgs = from_dict(AudioLLMArgs, args, "model.args")
    token_args: VLMArgs = from_dict(VLMArgs, a.token_args(), "model.args")
    if a.temperature <= 0:
        raise ConfigError(f"model.args.temperature: must be > 0 for sampling, got {a.temperature}")
    if a.max_new_tokens < 1 or not 0 <= a.min_new_tokens <= a.max_new_tokens:
        raise ConfigError(f"model.args.max_new_tokens/min_new_tokens: need 0 <= min <= max, max >= 1; got "
                          f"{a.min_new_tokens}, {a.max_new_tokens}")  # fmt: skip
    if a.old_logprobs not in ("recompute", "sampler"):
        raise ConfigError(f"model.args.old_logprobs: {a.old_logprobs!r} not allowed; choose recompute | sampler")
    torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
    path = resolve_model_path(a.name_or_path, seed=seed)
    model = Qwen2AudioForConditionalGeneration.from_pretrained(
        path, dtype=torch_dtype, attn_implementation=a.attn_implementation, **a.extra
    )
    processor = AutoProcessor.from_pretrained(path)
    if not hasattr(processor, "feature_extractor"):
        raise ConfigError(f"model.args.name_or_path {a.name_or_path!r}: its processor has no feature_extractor (audio)")
    if a.freeze_audio_encoder:
        model.model.audio_tower.requires_grad_(False)
    reference = None
    if lora is not None and lora.enabled:
        model = apply_lora(model, lora)
    elif need_reference:
        reference = copy.deepcopy(model).eval().requires_grad_(False)
    model.train()
    reason = prefix_sharing.unsupported_reason(model)
    if reason is not None:
        raise ConfigError(f"model.args.name_or_path {a.name_or_path!r}: the audio_llm adapter needs prompt sharing, "
                          f"which does not cover it: {reason}")  # fmt: skip
    return AudioLLMAdapter(VLMAdapter(model, processor, token_args, reference), a)


build_audio_llm_adapter.args_class = AudioLLMArgs
