"""Whisper policies: speech → text with ``WhisperForConditionalGeneration`` (seq2seq); the units are decoder tokens.

What this adapter guarantees (the adapter contract in ``docs/architecture.md``):
- Audio is decoded (``audio.py``: soundfile, resampled by soxr) and turned into log-mel features once per prompt
  per rollout, and the **encoder runs once per prompt**: when sampling, the P prompts are encoded once, the decoder
  prompt is prefilled once per prompt (self- and cross-attention K/V), and that cache is expanded G ways; in the
  log-prob forwards the U distinct prompts of a minibatch are encoded once *with* autograd and their encoder
  states are indexed out to the n completions, so each prompt's encoder receives the summed gradient of its
  completions — the gradient of the naive path that encodes every sample (``share_encoder=False``).
- The decoder prompt is the one the model defines: the tokenizer's ``prefix_tokens`` for ``language``/``task``/
  ``timestamps`` — ``<|startoftranscript|><|en|><|transcribe|><|notimestamps|>`` (Radford et al. 2022, "Robust
  Speech Recognition via Large-Scale Weak Supervision", §2.3 multitask format; ``WhisperTokenizer.prefix_tokens``).
  An English-only model (``generation_config.is_multilingual`` false, e.g. ``whisper-tiny.en``) was trained
  without the language and task tokens: its prompt is ``<|startoftranscript|><|notimestamps|>`` (openai/whisper
  ``whisper/tokenizer.py``, ``get_tokenizer(multilingual=False)``), and ``language`` must be en.
- ``old_logprobs`` and ``logprobs`` are log-probabilities of the *sampling* distribution: the model's
  ``generation_config.suppress_tokens`` at every step and ``begin_suppress_tokens`` at the first step are
  banned, as are Whisper's special tokens other than end-of-text (and the timestamp tokens unless
  ``timestamps``), then logits / temperature, log-softmax in fp32 (in the training forward without an [n, T, V]
  log-softmax, and without the [n, T, V] logits: the fused linear log-prob through ``proj_out``,
  ``modalities/tokens/logprobs.py``). The same masks are applied in the training
  forward, so the first ratio is 1. Departure: with ``timestamps`` the timestamp tokens are allowed freely
  (HF's ``WhisperTimeStampLogitsProcessor`` pairing rules are not applied), so the ratio stays exact.
- A completion ends at the first ``<|endoftext|>`` (included in the loss); the rest is masked.
- LoRA through peft; the reference policy is the adapter disabled, or a frozen copy when training the full model
  with ``beta > 0``.
- With ``rollout.engine: vllm`` the completions come from the vLLM server (the token families' engine path,
  :class:`~mmgrpo.modalities.tokens.engine.EngineSampling`): one encoder-decoder request per prompt — the decoded
  waveform as the encoder's audio, the forced decoder prefix as the decoder prompt's token ids — with the same bans
  (``suppress_ids`` as a logit bias of −100, ``begin_suppress_tokens`` at the first step); ``old_logprobs`` are then
  recomputed by this model, as for the other families (docs/scale.md: 30-second windows only).

Reward columns added to ``Rollout.extras`` (B values each): ``audio_array`` (the decoded mono waveform the model
heard, float32 at the model's rate, one shared object per prompt) and ``sampling_rate``. The row's own ``audio``
column reaches the rewards as given.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

import numpy as np
import torch
from torch import Tensor

from mmgrpo import noise, sharding
from mmgrpo.config import ConfigError, Range
from mmgrpo.plugins import ADAPTERS, AdapterSpec, BuildContext, Inputs, serves
from mmgrpo.types import Answer, Rollout

from .. import _hf, model_names
from ..tokens import compiled_decode, prefix_sharing
from ..tokens.decode import SamplingSpec, decode, reserve_cache
from ..tokens.engine import EnginePrompt, EngineSampling
from ..tokens.logprobs import (
    completion_id_lists,
    head_outputs_hidden,
)
from ..tokens.policy import CompletionState, TokenPolicy, sampled_rollout
from .audio import load_audio
from .compiled_step import StaticWhisperStepper
from .tiny import NAMES, resolve_model_path


@dataclass
class WhisperArgs:
    """Options under ``model.args`` for ``model.adapter: whisper``."""

    name_or_path: str = "tiny-whisper"
    """Hub id or local directory of the model and its processor; ``tiny-whisper`` builds the built-in one."""
    language: str | None = "en"
    """Language token of the decoder prompt (code or name, e.g. en / english); None leaves it out."""
    task: Literal["transcribe", "translate"] = "transcribe"
    """transcribe | translate (Whisper's task token)."""
    timestamps: bool = False
    """Predict timestamp tokens (no <|notimestamps|> in the prompt); they are sampled freely (module docstring)."""
    max_new_tokens: Annotated[int, Range(ge=1)] = 24
    """Completion budget T (tokens)."""
    temperature: Annotated[float, Range(gt=0)] = 1.0
    """Sampling temperature; log-probs are of logits / temperature."""
    top_p: float = 1.0
    """Nucleus sampling (1.0 = off). Not reflected in log-probs: keep 1.0 for an exact ratio."""
    top_k: int = 0
    """Top-k sampling (0 = off). Not reflected in log-probs: keep 0 for an exact ratio."""
    mask_truncated: bool = False
    """Exclude completions that hit max_new_tokens without end-of-text from the loss."""
    freeze_encoder: bool = False
    """Do not train the audio encoder (its parameters keep requires_grad=False)."""
    share_encoder: bool = True
    """Log-prob forwards encode each prompt's audio once for its completions (False: once per sample, naive)."""
    gradient_checkpointing: bool = False
    """Recompute each encoder and decoder layer in the backward pass instead of keeping its activations
    (transformers' activation checkpointing, non-reentrant): less memory, one more forward. Sampling runs in eval
    mode with its KV cache; the training forward has no cache, so nothing else changes."""
    silence_threshold: float = 1e-4
    """Audio whose peak amplitude is at most this is rejected as silent."""
    forward_batch_size: int = 64
    """Rows per no-grad forward when computing old/reference log-probs."""
    attn_implementation: str = "sdpa"
    """Attention kernel passed to from_pretrained: sdpa | eager | flash_attention_2."""
    compile_decode: bool | Literal["auto"] = "auto"
    """The sampler's per-token decoder step runs compiled over static self- and cross-attention caches sized for the
    group (torch.compile: inductor on CPU, CUDA graphs on CUDA; modalities/speech/compiled_step.py): the same keyed
    draws up to float rounding, one graph per (B, 64-token bucket of prefix + T). auto: on where the policy is on
    CUDA, off on the CPU (the vlm adapter's option; docs/benchmarks.md); true falls back to the eager loop with a
    warning without a C++ compiler or under FSDP."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Extra keyword arguments for from_pretrained."""


class AudioCache:
    """Per-prompt audio features and waveforms, shared by the G samples (not indexed by sample).

    Shape:
        features: [P, M, F] log-mel input features (M mel bins, F frames)
    """

    def __init__(self, features: Tensor, waveforms: list[np.ndarray]):
        self.features = features  # [P, M, F]
        self.waveforms = waveforms  # P arrays [N_p]


SpeechState = CompletionState  # cache: AudioCache


class WhisperAdapter(EngineSampling, TokenPolicy):
    """Token-level policy over a Whisper seq2seq model (see the module docstring)."""

    PIPELINE_TAG = "automatic-speech-recognition"
    TINY_MODULE = "mmgrpo.modalities.speech.tiny"

    def __init__(self, model: torch.nn.Module, processor: Any, args: WhisperArgs, reference: torch.nn.Module | None):
        self.model = model
        self.processor = processor
        self.tokenizer = processor.tokenizer
        self.feature_extractor = processor.feature_extractor
        self.sampling_rate = int(self.feature_extractor.sampling_rate)
        self.args = args
        self.reference = reference
        language, task = args.language, args.task
        if getattr(self._unwrapped().generation_config, "is_multilingual", True) is False:  # e.g. whisper-tiny.en
            if task != "transcribe" or (language or "en").lower() not in ("en", "english"):
                raise ConfigError(
                    f"model.args.language/task: {args.name_or_path!r} is English-only (its generation config says "
                    f"is_multilingual: false); set language: en and task: transcribe, got {language}/{task}"
                )
            language, task = None, None  # its decoder prompt has no language or task token (module docstring)
        try:
            self.tokenizer.set_prefix_tokens(language=language, task=task, predict_timestamps=args.timestamps)
            prefix = self.tokenizer.prefix_tokens
        except (ValueError, KeyError) as e:
            raise ConfigError(f"model.args.language/task: {e}") from None
        self.prefix = torch.tensor(prefix)  # [Lp] decoder prompt
        self.eos_id = int(self.tokenizer.eos_token_id)
        self.pad_id = self.eos_id
        self.suppress_ids, self.begin_suppress_ids = self._banned_tokens()
        self.compiled = compiled_decode.CompiledDecoder()  # the compiled step and its static caches (compile_decode)

    def _banned_tokens(self) -> tuple[list[int], list[int]]:
        """Tokens never sampled (specials but end-of-text, timestamps unless enabled, the model's
        ``suppress_tokens``) and those banned at the first step only (``begin_suppress_tokens``)."""
        gen = self._unwrapped().generation_config
        banned = set(getattr(gen, "suppress_tokens", None) or [])
        banned |= {i for i in self.tokenizer.all_special_ids if i != self.eos_id}
        no_ts = self.tokenizer.convert_tokens_to_ids("<|notimestamps|>")
        vocab = self.tokenizer.get_vocab()
        timestamp_ids = {i for t, i in vocab.items() if t.startswith("<|") and t.endswith("|>") and _is_number(t[2:-2])}
        if not self.args.timestamps:
            banned |= timestamp_ids
        banned.add(no_ts)
        V = self._unwrapped().config.vocab_size
        begin = set(getattr(gen, "begin_suppress_tokens", None) or [])
        return sorted(i for i in banned if i < V), sorted(i for i in begin if i < V)

    # ------------------------------------------------------------------ prompts: audio processed once per prompt

    def _audio_cache(self, rows: list[dict]) -> AudioCache:
        waves = []
        for i, row in enumerate(rows):
            where = f"row {i} 'audio'" + (f" (id {row['id']})" if "id" in row else "")
            waves.append(
                load_audio(
                    row.get("audio"), self.sampling_rate, where=where, silence_threshold=self.args.silence_threshold
                )
            )
        feats = self.feature_extractor(waves, sampling_rate=self.sampling_rate, return_tensors="pt").input_features
        return AudioCache(feats, waves)  # [P, M, F]

    def _encode(self, model: torch.nn.Module, features: Tensor) -> Tensor:
        """Encoder hidden states of ``features`` [U, M, F] → [U, S, d] (with grad when enabled)."""
        encoder = _hf.unwrap(model, peft=True).get_encoder()

        def run(x: Tensor) -> Tensor:
            return encoder(x.to(self.device, dtype=next(encoder.parameters()).dtype)).last_hidden_state

        return sharding.call_as_forward(model, run, features)  # FSDP: the encoder's root weights gathered

    # ---------------------------------------------------------------------------------------- sampling

    def _scores(self, logits: Tensor, first_step: Tensor | bool, greedy: bool = False) -> Tensor:
        """fp32 scores of the sampling distribution (before top-k/top-p). logits [..., V]; ``first_step`` is a
        bool or a [..., 1] mask of the positions that are the completion's first token."""
        scores = logits.float()
        if self.suppress_ids:
            scores[..., self.suppress_ids] = float("-inf")
        if self.begin_suppress_ids:
            begin = torch.zeros(scores.shape[-1], dtype=torch.bool, device=scores.device)
            begin[self.begin_suppress_ids] = True
            scores = scores.masked_fill(torch.as_tensor(first_step, device=scores.device) & begin, float("-inf"))
        if not greedy and self.args.temperature != 1.0:
            scores = scores / self.args.temperature
        return scores

    @torch.no_grad()
    def _sample(
        self, cache: AudioCache, group_size: int, greedy: bool, keys: noise.NoiseKeys | None = None
    ) -> tuple[Tensor, Tensor]:
        """Completion ids [B, T] (pad after end-of-text) and their sampling log-probs [B, T], group-major.

        One encoder pass and one decoder-prompt prefill per prompt; the cache is expanded G ways; the tokens come
        from the one decode loop (:func:`mmgrpo.modalities.tokens.decode.decode`).
        """
        model = self._unwrapped()
        spec = self._sampling_spec(greedy, synced=sharding.is_sharded(model))  # FSDP: as many forwards as the longest
        was_training = model.training
        model.eval()
        try:
            ids, logprobs = decode(self._stepper(model, cache, spec), group_size, spec, keys)
        finally:
            model.train(was_training)
        return ids.cpu(), logprobs.cpu()

    def _stepper(self, model: torch.nn.Module, cache: AudioCache, spec: SamplingSpec) -> Any:
        """The compiled static-cache stepper with ``compile_decode`` where it runs (``compiled_step.py``), else the
        eager one (a one-time warning says why)."""
        if compiled_decode.use_compiled(self.args.compile_decode, model, spec.synced):
            return StaticWhisperStepper(self, model, cache, spec.max_new_tokens, self.compiled)
        return _WhisperStepper(self, model, cache, spec.max_new_tokens)

    def _sampling_spec(self, greedy: bool = False, synced: bool = False) -> SamplingSpec:
        """The sampling distribution of ``model.args`` (both engines draw from it): ``suppress_ids`` banned at every
        step, and ``begin_suppress_ids`` at the first (``_early_bans``; the native stepper applies both in
        ``_scores``)."""
        a = self.args
        return SamplingSpec(
            a.max_new_tokens,
            [self.eos_id],
            self.pad_id,
            a.temperature,
            a.top_k,
            a.top_p,
            suppress_ids=tuple(self.suppress_ids),
            greedy=greedy,
            synced=synced,
        )

    def _engine_prompts(self, cache: AudioCache) -> list[EnginePrompt]:
        """The engine's request of each prompt (:class:`~mmgrpo.modalities.tokens.engine.EngineSampling`): an
        encoder-decoder request whose encoder prompt is the decoded waveform at the feature extractor's rate (vLLM
        computes the same log-mel features from it) and whose decoder prompt is the forced prefix, sent as ids."""
        prefix = self.prefix.tolist()
        return [EnginePrompt("", {"audio": [w]}, prefix, encoder_decoder=True) for w in cache.waveforms]

    def _completion_mask(self, completion_ids: Tensor) -> Tensor:
        """1 up to and including the first end-of-text, 0 after it. Shape: [n, T] -> [n, T]."""
        is_eos = completion_ids == self.eos_id  # [n, T]
        return (~((is_eos.cumsum(dim=1) - is_eos.long()) > 0)).long()

    def _decode(self, completion_ids: Tensor) -> list[str]:
        mask = self._completion_mask(completion_ids).bool()
        rows = [ids[m & (ids != self.eos_id)].tolist() for ids, m in zip(completion_ids, mask)]
        return [t.strip() for t in self.tokenizer.batch_decode(rows, skip_special_tokens=True)]

    def rollout(self, prompts: list[dict], group_size: int, keys: noise.NoiseKeys | None = None) -> Rollout:
        cache = self._audio_cache(prompts)  # once per prompt
        engine_logprobs = sampler_logprobs = None
        if self.engine is not None:  # completions from vLLM; old log-probs from this model below (as TRL)
            completion_ids, engine_logprobs = self._engine_sample(self._engine_prompts(cache), group_size, keys)
        else:
            completion_ids, sampler_logprobs = self._sample(cache, group_size, False, keys)  # [B, T]
        prompt_of = torch.arange(len(prompts)).repeat_interleave(group_size)  # [B]
        ended = (completion_ids == self.eos_id).any(dim=1)  # [B]
        state = SpeechState(completion_ids=completion_ids, prompt_of=prompt_of, cache=cache)
        to_end = self._completion_mask(completion_ids)  # [B, T] 1 up to and including the end token
        outputs = self._decode(completion_ids)
        rollout = sampled_rollout(
            outputs, to_end.float(), ended, group_size, state, engine_logprobs, self.args.mask_truncated
        )
        mask = rollout.mask  # [B, T]
        rollout.extras = self._reward_columns(cache, completion_ids, group_size)
        if engine_logprobs is None:  # as drawn (== the training forward: tests/test_speech_whisper.py)
            rollout.old_logprobs = sampler_logprobs * mask  # [B, T]
        else:
            rollout.old_logprobs = self._batched_no_grad(rollout, self.model) * mask  # [B, T]
        return rollout

    @torch.no_grad()
    def evaluate(self, prompts: list[dict]) -> list[Answer]:
        """One greedy transcript per prompt, with the reward columns a rollout gives it (:class:`Answer`)."""
        cache = self._audio_cache(prompts)
        completion_ids = self._sample(cache, 1, greedy=True)[0]  # [P, T]
        extras = self._reward_columns(cache, completion_ids, 1)  # as a rollout's: scored the same way
        return [Answer(t, {k: v[i] for k, v in extras.items()}) for i, t in enumerate(self._decode(completion_ids))]

    def _reward_columns(self, cache, completion_ids: Tensor, group_size: int) -> dict[str, list]:
        """The B reward values of each column (``Rollout.extras``, module docstring; a held-out :class:`Answer`'s
        ``columns``) of completions ``[B, T]`` of the P prompts of ``cache``, G per prompt."""
        return {
            "audio_array": [w for w in cache.waveforms for _ in range(group_size)],
            "sampling_rate": [self.sampling_rate] * completion_ids.shape[0],
            "completion_ids": completion_id_lists(completion_ids, self._completion_mask(completion_ids)),
        }

    # --------------------------------------------------------------------------------------- log-probs

    def _completion_logits(
        self, model: torch.nn.Module, state: SpeechState, index: Tensor, head: torch.nn.Linear | None = None
    ) -> tuple[Tensor, Tensor]:
        comp = state.completion_ids[index].to(self.device)  # [n, T]
        prompts = state.prompt_of[index]  # [n]
        n, T = comp.shape
        if self.args.share_encoder:
            unique, rows = torch.unique(prompts, return_inverse=True)  # U prompts, each encoded once; rows [n]
            enc = self._encode(model, state.cache.features[unique])[rows.to(self.device)]  # [n, S, d]
        else:
            enc = self._encode(model, state.cache.features[prompts])  # [n, S, d], one encoder pass per sample
        Lp = self.prefix.shape[0]
        dec_in = torch.cat([self.prefix.to(self.device).expand(n, -1), comp[:, : T - 1]], dim=1)  # [n, Lp+T-1]
        # head given (proj_out, tied to the token embedding): the forward returns decoder hidden states [.., d]
        with head_outputs_hidden(head):
            out = model(encoder_outputs=(enc,), decoder_input_ids=dec_in, use_cache=False).logits
        return comp, out[:, Lp - 1 :]  # [n, T, V] logits or [n, T, d] hidden states

    def _early_bans(self) -> tuple[list[int], int]:
        return self.begin_suppress_ids, 1  # the begin-suppressed tokens at the first token (``_scores``)

    def save_pretrained(self, directory: str) -> None:
        """The model (or LoRA adapter, base named as in the config) and its processor, in Hugging Face format."""
        _hf.save_policy(self._unwrapped(), directory, self.args.name_or_path)
        self.processor.save_pretrained(directory)

    def supervised_loss(self, rows: list[dict]) -> Tensor:
        """Mean token cross-entropy of ``row['target']`` (the transcript) + end-of-text given the audio."""
        cache = self._audio_cache(rows)
        targets = [
            self.tokenizer(" " + str(r["target"]).strip(), add_special_tokens=False)["input_ids"] + [self.eos_id]
            for r in rows
        ]
        return self._teacher_forced_loss(targets, cache)


def _is_number(s: str) -> bool:
    try:
        float(s)
        return True
    except ValueError:
        return False


def _load_whisper(a: WhisperArgs, ctx: BuildContext) -> WhisperAdapter:
    """The ``whisper`` family's loader (:class:`~mmgrpo.plugins.AdapterSpec`)."""
    from transformers import AutoProcessor, WhisperForConditionalGeneration

    compiled_decode.check_args(a.compile_decode)
    path = resolve_model_path(a.name_or_path, seed=ctx.seed)
    with _hf.loading(a.name_or_path):  # one line for a missing path or an offline / unknown hub id
        model = WhisperForConditionalGeneration.from_pretrained(
            path, dtype=_hf.DTYPES[ctx.dtype], attn_implementation=a.attn_implementation, **a.extra
        )
        processor = AutoProcessor.from_pretrained(path)
    if a.freeze_encoder:
        model.get_encoder().requires_grad_(False)
    if a.gradient_checkpointing:
        prefix_sharing.enable_checkpointing(model)
    model, reference = _hf.lora_or_reference(model, ctx)
    return WhisperAdapter(model, processor, a, reference)


build_whisper_adapter = ADAPTERS.register("whisper")(
    AdapterSpec(
        args=WhisperArgs,
        cls=WhisperAdapter,
        load=_load_whisper,
        inputs=Inputs(media=("audio",), media_required=True, prompt=False),  # the decoder prompt is the model's
        engine_model=serves(resolve_model_path, max_audios=1),
        load_check=lambda a: model_names.name_problem(a.name_or_path, "whisper", NAMES),
    )
)


class _WhisperStepper:
    """:class:`~mmgrpo.modalities.tokens.decode.Stepper` of Whisper: one encoder pass and one decoder-prompt
    prefill per prompt, the self- and cross-attention cache expanded G ways."""

    def __init__(self, adapter: WhisperAdapter, model: torch.nn.Module, cache: AudioCache, reserve: int = 0):
        self.adapter, self.model, self.cache, self.reserve = adapter, model, cache, reserve

    def prefill(self, group_size: int) -> Tensor:
        a = self.adapter
        enc = a._encode(self.model, self.cache.features)  # [P, S, d]
        P = enc.shape[0]
        prefix = a.prefix.to(a.device).expand(P, -1)  # [P, Lp]
        out = self.model(encoder_outputs=(enc,), decoder_input_ids=prefix, use_cache=True)
        rows = torch.arange(P, device=a.device).repeat_interleave(group_size)  # [B]
        self.kv = _hf.returned_cache(out)
        if self.reserve:  # self-attention K/V written in place, room for the completion (decode.ReservedLayer)
            reserve_cache(self.kv, self.reserve)
        self.kv.reorder_cache(rows)  # self- and cross-attention K/V, G ways
        # Cross-attention reads the expanded cache from here on; the encoder states only give the call its shape,
        # so a stride-0 view of one row stands in for the B rows (no G-fold copy).
        self.enc = enc[:1].expand(rows.shape[0], -1, -1)  # [B, S, d] view
        return out.logits[:, -1][rows]  # [B, V]

    def scores(self, logits: Tensor, step: int, spec: SamplingSpec) -> Tensor:
        return self.adapter._scores(logits, step == 0, spec.greedy)

    def step(self, tokens: Tensor, step: int) -> Tensor:
        out = self.model(
            encoder_outputs=(self.enc,), decoder_input_ids=tokens[:, None], use_cache=True, **_hf.kv_cache(self.kv)
        )
        self.kv = _hf.returned_cache(out)
        return out.logits[:, -1]  # [B, V]
