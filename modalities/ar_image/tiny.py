"""A tiny ``JanusForConditionalGeneration`` of the real architecture, built from config with a local tokenizer.

``tiny-janus`` is random (built on first use under ``MMGRPO_CACHE``); ``tiny-janus-shapes`` is the shipped base
model of the ``flow_shapes`` task, pre-trained by ``examples/pretrain_tiny_janus.py`` (VQ auto-encoder, then the
language model on text → image tokens with 10% prompt dropout for classifier-free guidance). Any other name is a
hub id or directory passed to ``from_pretrained`` (Janus-1.3B, Janus-Pro-1B/7B in the transformers format,
e.g. ``deepseek-community/Janus-Pro-1B``).

Sizes: 16×16 RGB images (the 32×32 task renderings box-downsampled), a VQ with 2 down-samplings (a 4×4 grid of image
tokens, T = 16) and a codebook of 128
entries; a 2-layer Llama of width 64. The tokenizer is word level over the words of the synthetic tasks with
Janus's special tokens (``<begin_of_image>`` …); the unconditional prompt replaces every token but BOS and
``<begin_of_image>`` by the pad token, as ``JanusForConditionalGeneration.generate`` does.
"""

from __future__ import annotations

from pathlib import Path

import torch

from mmgrpo.compat import keep_generation_fields

from .. import _hf
from ..flow.tiny import WORDS as FLOW_WORDS

WORDS = FLOW_WORDS  # the prompt words of the flow_shapes task, shared with the tiny flow models' tokenizers

SPECIAL = ("<pad>", "<bos>", "<eos>", "<unk>", "<image_placeholder>", "<begin_of_image>", "<end_of_image>")
RESOLUTION = 16  # the VQ works at 16×16; rewards resize the decoded image to their own resolution
PATCH = 4  # pixels per image token side: a 4×4 token grid
CODEBOOK = 128

IMAGE_TOKENS = {"image_token": "<image_placeholder>", "boi_token": "<begin_of_image>", "eoi_token": "<end_of_image>"}
"""The named special tokens ``JanusProcessor`` reads from its tokenizer (``tokenizer.image_token`` ...)."""
TINY_NAMES = ("tiny-janus",)
SHIPPED = {"tiny-janus-shapes": Path(__file__).parent / "assets" / "tiny-janus-shapes"}
"""Pre-trained tiny Janus shipped with the package (made by ``examples/pretrain_tiny_janus.py``)."""


def build_tokenizer():
    """Word-level ``PreTrainedTokenizerFast``: lower-cased words, BOS prepended, Janus's image special tokens."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIAL)}
    for w in WORDS:
        vocab.setdefault(w, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Whitespace(), pre_tokenizers.Punctuation()])
    tok.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", vocab["<bos>"])])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<pad>",
        bos_token="<bos>",
        eos_token="<eos>",
        unk_token="<unk>",
        extra_special_tokens=IMAGE_TOKENS,
        model_max_length=32,
    )


def build_processor(tokenizer, config):
    """A ``JanusProcessor`` (tokenizer + ``JanusImageProcessor``) for a Janus model saved without one.

    The image processor works at the model's vision ``image_size`` and maps pixels to [-1, 1] (mean = std = 0.5,
    as Janus-Pro's ``preprocessor_config.json``), the range the VQ decodes to, so ``processor.postprocess`` turns
    ``model.decode_image_tokens`` into images as the adapter does. ``tokenizer`` needs the names of
    :data:`IMAGE_TOKENS` (``AutoTokenizer.from_pretrained(path, extra_special_tokens=IMAGE_TOKENS)``).
    """
    from transformers import JanusImageProcessor, JanusProcessor

    vision = config.vision_config
    image_processor = JanusImageProcessor(
        size={"height": vision.image_size, "width": vision.image_size}, image_mean=[0.5] * 3, image_std=[0.5] * 3
    )
    return JanusProcessor(
        image_processor=image_processor, tokenizer=tokenizer, num_image_tokens=vision.num_image_tokens
    )


def build_tiny_janus(seed: int = 0):
    """(model, tokenizer): a random ``JanusForConditionalGeneration`` of tiny sizes and its tokenizer."""
    from transformers import JanusConfig, JanusForConditionalGeneration, LlamaConfig
    from transformers.models.janus.configuration_janus import JanusVisionConfig, JanusVQVAEConfig

    torch.manual_seed(seed)
    tok = build_tokenizer()
    hidden = 64
    text = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=hidden,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        pad_token_id=tok.pad_token_id,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
    )
    grid = RESOLUTION // PATCH
    vision = JanusVisionConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        image_size=RESOLUTION,
        patch_size=PATCH,
        projection_dim=hidden,
        num_image_tokens=grid * grid,
        depth=1,
    )
    vq = JanusVQVAEConfig(
        embed_dim=8,
        num_embeddings=CODEBOOK,
        latent_channels=64,
        base_channels=32,
        channel_multiplier=[1, 1, 2],
        num_res_blocks=1,
        projection_dim=hidden,
        image_token_embed_dim=hidden,
        num_hidden_layers=2,
    )
    config = JanusConfig(
        text_config=text,
        vision_config=vision,
        vq_config=vq,
        image_token_id=tok.convert_tokens_to_ids("<image_placeholder>"),
    )
    model = JanusForConditionalGeneration(config)
    gc = model.generation_config
    gc.bos_token_id, gc.pad_token_id, gc.eos_token_id = tok.bos_token_id, tok.pad_token_id, tok.eos_token_id
    gc.generation_kwargs = {"boi_token_id": tok.convert_tokens_to_ids("<begin_of_image>")}
    # GenerationConfig drops attributes it has no default for (generation_kwargs, which Janus's image generate
    # reads) when the saved file says it came from the model config; saved as a standalone config, it keeps them.
    keep_generation_fields(gc)
    return model, tok


def resolve_model_path(name_or_path: str, seed: int = 0) -> str:
    """A directory or hub id for ``from_pretrained``: tiny names are built (once) or taken from the package."""
    if name_or_path in SHIPPED:
        directory = SHIPPED[name_or_path]
        if not (directory / "config.json").is_file():
            raise FileNotFoundError(
                f"{name_or_path}: {directory} is missing; make it with `python examples/pretrain_tiny_janus.py`"
            )
        return str(directory)
    if name_or_path in TINY_NAMES:

        def build(tmp: Path) -> None:
            model, tok = build_tiny_janus(seed)
            model.save_pretrained(str(tmp))
            build_processor(tok, model.config).save_pretrained(str(tmp))  # tokenizer + image processor

        return str(_hf.cached_build(f"{name_or_path}-seed{seed}", "config.json", build))
    return name_or_path


__all__ = [
    "IMAGE_TOKENS",
    "SHIPPED",
    "TINY_NAMES",
    "build_processor",
    "build_tiny_janus",
    "build_tokenizer",
    "resolve_model_path",
]
