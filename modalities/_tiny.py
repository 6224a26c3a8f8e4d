"""What the tiny-model builders (``modalities/*/tiny.py``) share: a byte-level BPE trained on a fixed corpus,
the Qwen-style fast tokenizer around it, the sizes and config of a tiny Qwen2 decoder, and seeding, initialising
and saving a model with its processor.

The built models must not change with this sharing (the shipped assets and the quickstart's learning depend on
them): every helper does exactly what each builder did inline, in the same order.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch


def train_byte_level_bpe(corpus: str, vocab_size: int, special_tokens: list[str] | tuple[str, ...] = ()):
    """A ``tokenizers.Tokenizer``: byte-level BPE (no prefix space) trained on ``corpus`` (four copies)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(special_tokens),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([corpus] * 4, trainer=trainer)
    return tok


def qwen_tokenizer(
    corpus: str,
    vocab_size: int,
    special_tokens: list[str],
    media_tokens: dict[str, str],
    tag_tokens: list[str],
    chat_template: str,
):
    """A Qwen-style ``PreTrainedTokenizerFast`` over :func:`train_byte_level_bpe`: EOS ``<|im_end|>``, pad
    ``<|endoftext|>`` on the left, the processor's media tokens (``{"image_token": "<|image_pad|>", ...}``),
    the tasks' tags as plain added tokens, and the chat template."""
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(
        tokenizer_object=train_byte_level_bpe(corpus, vocab_size, special_tokens),
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        padding_side="left",
        extra_special_tokens=media_tokens,
    )
    fast.add_tokens(tag_tokens)
    fast.chat_template = chat_template
    return fast


@dataclass
class TinyDecoderSizes:
    """Sizes of a tiny Qwen2 text decoder (the text half of the tiny VLM and audio LLM, or a causal LM)."""

    text_hidden: int = 64
    """Hidden size (tied input and output embeddings)."""
    text_layers: int = 2
    """Decoder layers."""
    text_heads: int = 4
    """Query heads; head_dim = text_hidden / text_heads."""
    text_kv_heads: int = 2
    """Key/value heads (grouped-query attention)."""
    text_intermediate: int = 128
    """MLP width."""


def qwen2_decoder_config(s: TinyDecoderSizes, tokenizer, **extra) -> dict:
    """Keyword arguments of a tiny ``Qwen2Config`` (or a VLM's ``text_config``) for ``tokenizer``: its vocabulary,
    BOS = pad = its pad token, EOS = its EOS token, tied embeddings; ``extra`` adds or overrides keys."""
    return dict(
        vocab_size=len(tokenizer),
        hidden_size=s.text_hidden,
        intermediate_size=s.text_intermediate,
        num_hidden_layers=s.text_layers,
        num_attention_heads=s.text_heads,
        num_key_value_heads=s.text_kv_heads,
        max_position_embeddings=4096,
        bos_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
        **extra,
    )


def init_model(model_class, config, seed: int, tokenizer):
    """``model_class(config)`` initialised from ``seed``, generating until the tokenizer's EOS and padding with
    its pad token."""
    torch.manual_seed(seed)
    model = model_class(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


def save(directory: str | os.PathLike, model, processor) -> Path:
    """``model`` and its ``processor`` (or tokenizer) saved into ``directory`` (created if missing)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory)
    processor.save_pretrained(directory)
    return directory
