"""Tiny Whisper and tiny Qwen2-Audio of the real architectures, with local tokenizers and feature extractors.

``build_tiny_whisper(directory)`` writes a complete Hugging Face directory — ``WhisperConfig`` with small sizes,
random weights, a ``WhisperTokenizer`` whose byte-level BPE is trained on a small fixed corpus and whose special
tokens are laid out as Whisper's (``<|endoftext|>``, ``<|startoftranscript|>``, one ``<|xx|>`` per language of
``transformers.models.whisper.tokenization_whisper.LANGUAGES`` in that order, ``<|translate|>``,
``<|transcribe|>``, ``<|startoflm|>``, ``<|startofprev|>``, ``<|nospeech|>``, ``<|notimestamps|>``, then the
timestamp tokens ``<|0.00|>`` … in 0.02 s steps), so the tokenizer's ``prefix_tokens`` (start of transcript,
language, task, no-timestamps) are the real model's — and a ``WhisperFeatureExtractor`` (80 log-mel bins,
16 kHz, hop 160) whose window is ``chunk_length`` seconds instead of 30 (the encoder's ``max_source_positions``
is half the frame count, as in Whisper). The adapters load it through the same ``from_pretrained`` path a real
checkpoint takes.

``build_tiny_qwen2_audio(directory)`` does the same for ``Qwen2AudioForConditionalGeneration`` (Whisper-style
audio encoder, Qwen2 decoder) with a ``Qwen2AudioProcessor`` and a Qwen chat template.

``resolve_model_path(name)`` maps the built-in names (``tiny-whisper``, ``tiny-qwen2-audio`` and their engine-sized
``-engine`` variants for vLLM: head_dim 64, 30-second windows) to cached directories (built on first use,
deterministic given the seed); other names (hub ids, local paths) pass through.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from mmgrpo.compat import keep_generation_fields

from .. import real_models
from .._hf import cached_build
from .._tiny import TinyDecoderSizes, init_model, qwen2_decoder_config, qwen_tokenizer, save, train_byte_level_bpe

TINY_WHISPER = "tiny-whisper"
WHISPER_ENGINE = "tiny-whisper-engine"
"""The tiny Whisper at a size vLLM's CPU attention takes (head_dim 64) with Whisper's 30-second windows (3000 mel
frames), for the rollout-engine tests (docs/scale.md)."""
TINY_QWEN2_AUDIO = "tiny-qwen2-audio"
QWEN2_AUDIO_ENGINE = "tiny-qwen2-audio-engine"
"""The tiny Qwen2-Audio at a size vLLM's CPU attention takes (text head_dim 64, as ``tiny-qwen2.5-vl-engine``), for
the rollout-engine tests (docs/scale.md)."""

# Text the BPE merges are learnt from: the synthetic speech tasks' words plus plain English.
_CORPUS = """
zero one two three four five six seven eight nine oh ten
red green blue yellow cat dog sun moon yes no left right up down
Which word was said second? Which digit was said first? Which word was said last? Answer with one word.
Transcribe the audio. What did the speaker say? The quick brown fox jumps over the lazy dog.
user assistant system You are a helpful assistant. Listen to the audio and answer the question.
0 1 2 3 4 5 6 7 8 9 ( ) [ ] , . : ; ? ! - the a an of in on is are with and or to from
"""
TAG_TOKENS = ["<answer>", "</answer>"]


@dataclass
class TinyWhisperSizes:
    """Sizes of the tiny Whisper (the architecture is the real one)."""

    d_model: int = 64
    """Hidden size of the encoder and the decoder."""
    encoder_layers: int = 2
    """Audio encoder layers."""
    decoder_layers: int = 2
    """Text decoder layers."""
    heads: int = 4
    """Attention heads of both; head_dim = d_model / heads."""
    ffn: int = 128
    """MLP width of both."""
    num_mel_bins: int = 80
    """Mel bins of the log-mel input (Whisper's 80)."""
    chunk_length: int = 3
    """Seconds of audio per input window (Whisper: 30); the encoder sees chunk_length·100 mel frames."""
    max_target_positions: int = 64
    """Longest decoder sequence (prompt and transcript tokens)."""
    bpe_vocab: int = 400
    """Tokenizer vocabulary: byte-level BPE merges learnt on the fixed corpus."""


WHISPER_ENGINE_SIZES = TinyWhisperSizes(d_model=128, heads=2, ffn=256, chunk_length=30)
"""d_model 128 over 2 heads (head_dim 64); 30-second windows as the real Whisper's (vLLM's Whisper pads every clip to
the feature extractor's window and sizes its encoder by ``max_source_positions``)."""


def _train_bpe(vocab_size: int) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """Vocabulary and merges of a byte-level BPE trained on the fixed corpus."""
    import json

    model = json.loads(train_byte_level_bpe(_CORPUS, vocab_size).to_str())["model"]
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    return model["vocab"], merges


def whisper_special_tokens(chunk_length: int) -> tuple[list[str], list[str]]:
    """Whisper's special tokens in the real order, and the timestamp tokens ``<|0.00|>`` … ``<|chunk_length|>``."""
    from transformers.models.whisper.tokenization_whisper import LANGUAGES

    special = ["<|endoftext|>", "<|startoftranscript|>"] + [f"<|{code}|>" for code in LANGUAGES]
    special += [
        "<|translate|>",
        "<|transcribe|>",
        "<|startoflm|>",
        "<|startofprev|>",
        "<|nospeech|>",
        "<|notimestamps|>",
    ]
    timestamps = [f"<|{i * 0.02:.2f}|>" for i in range(chunk_length * 50 + 1)]
    return special, timestamps


def whisper_feature_extractor(num_mel_bins: int, chunk_length: int):
    """A ``WhisperFeatureExtractor`` (Whisper's and Qwen2-Audio's): ``num_mel_bins`` log-mel bins, 16 kHz, hop 160,
    ``chunk_length``-second windows."""
    from transformers import WhisperFeatureExtractor

    return WhisperFeatureExtractor(
        feature_size=num_mel_bins, sampling_rate=16000, hop_length=160, chunk_length=chunk_length
    )


def build_whisper_tokenizer(sizes: TinyWhisperSizes):
    """A ``WhisperTokenizer`` with a locally trained BPE and Whisper's special-token layout."""
    from transformers import AddedToken, WhisperTokenizer

    vocab, merges = _train_bpe(sizes.bpe_vocab)
    special, timestamps = whisper_special_tokens(sizes.chunk_length)
    tok = WhisperTokenizer(vocab=vocab, merges=merges)
    tok.add_tokens([AddedToken(t, special=True, normalized=False) for t in special[1:]], special_tokens=True)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in timestamps])
    return tok


def build_tiny_whisper(directory: str | os.PathLike, seed: int = 0, sizes: TinyWhisperSizes | None = None) -> Path:
    """Write a tiny ``WhisperForConditionalGeneration`` (config, random weights, processor) to ``directory``."""
    from transformers import WhisperConfig, WhisperForConditionalGeneration, WhisperProcessor
    from transformers.models.whisper.tokenization_whisper import LANGUAGES

    s = sizes or TinyWhisperSizes()
    tok = build_whisper_tokenizer(s)
    ids = lambda t: tok.convert_tokens_to_ids(t)
    eot, sot = ids("<|endoftext|>"), ids("<|startoftranscript|>")
    frames = s.chunk_length * 100  # hop 160 at 16 kHz
    config = WhisperConfig(
        vocab_size=len(tok),
        num_mel_bins=s.num_mel_bins,
        d_model=s.d_model,
        encoder_layers=s.encoder_layers,
        decoder_layers=s.decoder_layers,
        encoder_attention_heads=s.heads,
        decoder_attention_heads=s.heads,
        encoder_ffn_dim=s.ffn,
        decoder_ffn_dim=s.ffn,
        max_source_positions=frames // 2,
        max_target_positions=s.max_target_positions,
        pad_token_id=eot,
        bos_token_id=eot,
        eos_token_id=eot,
        decoder_start_token_id=sot,
        suppress_tokens=[],
        begin_suppress_tokens=[eot],
    )
    torch.manual_seed(seed)
    model = WhisperForConditionalGeneration(config)
    g = model.generation_config
    g.decoder_start_token_id, g.eos_token_id, g.pad_token_id = sot, eot, eot
    g.lang_to_id = {f"<|{c}|>": ids(f"<|{c}|>") for c in LANGUAGES}
    g.task_to_id = {"transcribe": ids("<|transcribe|>"), "translate": ids("<|translate|>")}
    g.no_timestamps_token_id = ids("<|notimestamps|>")
    g.is_multilingual = True
    g.max_initial_timestamp_index = 50
    g.begin_suppress_tokens = [eot]
    g.suppress_tokens = []
    keep_generation_fields(g)  # keep these fields when loading (else regenerated from the model config)
    fe = whisper_feature_extractor(s.num_mel_bins, s.chunk_length)
    processor = WhisperProcessor(feature_extractor=fe, tokenizer=tok)
    return save(directory, model, processor)


def resolve_model_path(name: str, seed: int = 0) -> str:
    """The directory for built-in tiny model names (built on first use) and the real Whisper models of
    :mod:`mmgrpo.modalities.real_models` (``whisper-tiny.en``, ``whisper-base``); other names pass through."""
    if (real := real_models.resolve(name, "whisper")) is not None:
        return real
    builders = {
        TINY_WHISPER: build_tiny_whisper,
        WHISPER_ENGINE: functools.partial(build_tiny_whisper, sizes=WHISPER_ENGINE_SIZES),
        TINY_QWEN2_AUDIO: build_tiny_qwen2_audio,
        QWEN2_AUDIO_ENGINE: functools.partial(build_tiny_qwen2_audio, sizes=QWEN2_AUDIO_ENGINE_SIZES),
    }
    if name not in builders:
        return name
    return str(cached_build(f"{name}-seed{seed}", "config.json", lambda d: builders[name](d, seed=seed)))


NAMES = (TINY_WHISPER, WHISPER_ENGINE, TINY_QWEN2_AUDIO, QWEN2_AUDIO_ENGINE)
"""Every name :func:`resolve_model_path` builds (the real models aside), for the name check at load."""

QWEN_SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|audio_bos|>", "<|AUDIO|>", "<|audio_eos|>"]

# Qwen2-Audio-Instruct's chat template shape: each audio becomes "Audio k: <|audio_bos|><|AUDIO|><|audio_eos|>".
QWEN_AUDIO_CHAT_TEMPLATE = (
    "{% set audio_count = namespace(value=0) %}"
    "{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'audio' or 'audio' in part or 'audio_url' in part %}"
    "{% set audio_count.value = audio_count.value + 1 %}"
    "Audio {{ audio_count.value }}: <|audio_bos|><|AUDIO|><|audio_eos|>\n"
    "{% elif 'text' in part %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@dataclass
class TinyQwen2AudioSizes(TinyDecoderSizes):
    """Sizes of the tiny Qwen2-Audio (the architecture is the real one): the decoder's, then the audio encoder's."""

    audio_d_model: int = 64
    """Hidden size of the audio encoder."""
    audio_layers: int = 2
    """Audio encoder layers."""
    audio_heads: int = 4
    """Audio encoder attention heads."""
    audio_ffn: int = 128
    """Audio encoder MLP width."""
    num_mel_bins: int = 80
    """Mel bins of the log-mel input."""
    chunk_length: int = 3
    """Seconds per audio window (Qwen2-Audio: 30); the audio encoder sees chunk_length·100 mel frames."""
    bpe_vocab: int = 400


def build_qwen_audio_tokenizer(vocab_size: int = 400):
    """A byte-level BPE ``PreTrainedTokenizerFast`` with Qwen2-Audio's special tokens, trained on a fixed corpus."""
    media_tokens = {"audio_token": "<|AUDIO|>", "audio_bos_token": "<|audio_bos|>", "audio_eos_token": "<|audio_eos|>"}
    return qwen_tokenizer(_CORPUS, vocab_size, QWEN_SPECIAL_TOKENS, media_tokens, TAG_TOKENS, QWEN_AUDIO_CHAT_TEMPLATE)


def build_tiny_qwen2_audio(
    directory: str | os.PathLike, seed: int = 0, sizes: TinyQwen2AudioSizes | None = None
) -> Path:
    """Write a tiny ``Qwen2AudioForConditionalGeneration`` (config, random weights, processor) to ``directory``."""
    from transformers import Qwen2AudioConfig, Qwen2AudioForConditionalGeneration, Qwen2AudioProcessor

    s = sizes or TinyQwen2AudioSizes()
    tok = build_qwen_audio_tokenizer(s.bpe_vocab)
    config = Qwen2AudioConfig(
        audio_config=dict(
            num_mel_bins=s.num_mel_bins,
            encoder_layers=s.audio_layers,
            encoder_attention_heads=s.audio_heads,
            encoder_ffn_dim=s.audio_ffn,
            d_model=s.audio_d_model,
            max_source_positions=s.chunk_length * 50,
        ),
        # untied, as transformers builds it (it reads tie_word_embeddings from the top-level config, unset here);
        # vLLM reads the text config's, which must say so too
        text_config={**qwen2_decoder_config(s, tok), "tie_word_embeddings": False},
        audio_token_index=tok.convert_tokens_to_ids("<|AUDIO|>"),
    )
    model = init_model(Qwen2AudioForConditionalGeneration, config, seed, tok)
    fe = whisper_feature_extractor(s.num_mel_bins, s.chunk_length)
    processor = Qwen2AudioProcessor(feature_extractor=fe, tokenizer=tok, chat_template=QWEN_AUDIO_CHAT_TEMPLATE)
    return save(directory, model, processor)


QWEN2_AUDIO_ENGINE_SIZES = TinyQwen2AudioSizes(
    text_hidden=128, text_heads=2, text_kv_heads=1, text_intermediate=256, chunk_length=30
)
"""Text head_dim 64; 30-second audio windows (3000 mel frames), the only length vLLM's Qwen2-Audio takes."""
