"""Tiny LLaVA, LLaVA-OneVision, InternVL and Gemma 3 of the real transformers architectures, local processors.

Four built-in names for the adapter contract and the prompt-sharing tests (``tests/test_prefix_sharing.py``), each
the real model class and processor class with small sizes, a tiny random decoder and the tiny byte-level BPE of
:mod:`.tiny` (plus the family's image tokens), built on first use into the model cache like ``tiny-qwen2.5-vl``:

- ``tiny-llava`` — ``LlavaForConditionalGeneration`` (Liu et al. 2023, "Improved Baselines with Visual Instruction
  Tuning", arXiv 2310.03744): a CLIP vision tower read at its second-to-last layer, its CLS feature dropped
  (``vision_feature_select_strategy: default``), a 2-layer MLP projector, a Llama decoder; ``LlavaProcessor``
  expands ``<image>`` into one token per patch.
- ``tiny-llava-onevision`` — ``LlavaOnevisionForConditionalGeneration`` (Li et al. 2024, "LLaVA-OneVision: Easy
  Visual Task Transfer", arXiv 2408.03326, §3: SigLIP, anyres tiling up to ``anyres_max_9``, a Qwen2 decoder): an
  image becomes a base tile plus the tiles of the best grid in ``image_grid_pinpoints`` (``image_sizes`` says which),
  their features unpadded to the image's aspect ratio with a learnt newline feature closing every row;
  ``pixel_values`` is ``[images, tiles, C, H, W]`` with a different tile count per image.
- ``tiny-internvl`` — ``InternVLForConditionalGeneration``, transformers' port of InternVL3 (Zhu et al. 2025,
  arXiv 2504.10479, §2.1: InternViT, pixel shuffle to a quarter of the tokens, an MLP projector, a Qwen2.5 decoder):
  dynamic tiling into up to ``max_patches`` tiles plus a thumbnail (``GotOcr2ImageProcessor(crop_to_patches=True)``),
  ``<img>`` + ``image_seq_length`` × ``<IMG_CONTEXT>`` per tile + ``</img>``.
- ``tiny-gemma3`` — ``Gemma3ForConditionalGeneration`` (Gemma Team 2025, "Gemma 3 Technical Report", arXiv
  2503.19786, §2: SigLIP, average pooling to ``mm_tokens_per_image`` soft tokens that attend to each other both
  ways, a decoder of sliding-window (local) and global layers): ``<start_of_image>`` becomes
  ``<start_of_image>`` + the soft tokens + ``<end_of_image>``, marked by ``token_type_ids``.

The chat template is ChatML (:func:`.smolvlm.chat_template`), an image part rendered as the family's placeholder
(``<image>``, InternVL's ``<IMG_CONTEXT>``, Gemma 3's ``<start_of_image>``) before the text, where LLaVA-OneVision's,
InternVL's and Gemma 3's templates put it.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from .._hf import cached_build
from .._tiny import init_model, qwen2_decoder_config, qwen_tokenizer, save
from . import smolvlm, tiny

LLAVA = "tiny-llava"
ONEVISION = "tiny-llava-onevision"
INTERNVL = "tiny-internvl"
GEMMA3 = "tiny-gemma3"

VISION = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2)
"""The tiny vision towers' sizes (CLIP, SigLIP, InternViT)."""
TILE = 28
"""Tile (vision-tower input) side in pixels, 14-pixel patches: 2 × 2 patches per tile."""
PINPOINTS = [[28, 28], [28, 56], [56, 28], [56, 56], [56, 84], [84, 56]]
"""LLaVA-OneVision's anyres grids (height, width), multiples of the tile as the real ones are of 384."""


def _tokenizer(image_tokens: dict[str, str], image: str = "<image>"):
    """The tiny Qwen BPE (:func:`.tiny.build_tokenizer`'s corpus and special tokens) with the family's image tokens as
    the processor's named special tokens (``image_token``, InternVL's ``context_image_token``...); its chat template
    renders an image part as ``image``."""
    names = [t for t in image_tokens.values() if t not in tiny.SPECIAL_TOKENS]
    template = smolvlm.chat_template(None, image=image)
    s = tiny.TinySizes()
    return qwen_tokenizer(
        tiny._CORPUS, s.bpe_vocab, tiny.SPECIAL_TOKENS + names, image_tokens, tiny.TAG_TOKENS, template
    )


def build_tiny_llava(directory: str | os.PathLike, seed: int = 0) -> Path:
    """Write a tiny LLaVA (1.5 layout: CLIP at layer -2 without its CLS feature, MLP projector, Llama decoder)."""
    from transformers import (
        CLIPImageProcessor,
        CLIPVisionConfig,
        LlamaConfig,
        LlavaConfig,
        LlavaForConditionalGeneration,
        LlavaProcessor,
    )

    tokenizer = _tokenizer({"image_token": "<image>"})
    text = LlamaConfig(**qwen2_decoder_config(tiny.TinySizes(), tokenizer))
    side = 2 * TILE  # 4 × 4 patches: 16 image tokens
    config = LlavaConfig(
        text_config=text,
        vision_config=CLIPVisionConfig(**VISION, image_size=side, patch_size=14),
        image_token_index=tokenizer.convert_tokens_to_ids("<image>"),
        vision_feature_layer=-2,
        vision_feature_select_strategy="default",
        tie_word_embeddings=True,
    )
    image_processor = CLIPImageProcessor(size={"shortest_edge": side}, crop_size={"height": side, "width": side})
    processor = LlavaProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        patch_size=14,
        vision_feature_select_strategy="default",
        num_additional_image_tokens=1,  # CLIP's CLS feature, dropped by the "default" strategy
        chat_template=tokenizer.chat_template,
    )
    return save(directory, init_model(LlavaForConditionalGeneration, config, seed, tokenizer), processor)


def build_tiny_llava_onevision(directory: str | os.PathLike, seed: int = 0) -> Path:
    """Write a tiny LLaVA-OneVision (SigLIP, anyres tiling with unpadding and newline features, Qwen2 decoder)."""
    from transformers import (
        LlavaOnevisionConfig,
        LlavaOnevisionForConditionalGeneration,
        LlavaOnevisionImageProcessor,
        LlavaOnevisionProcessor,
        LlavaOnevisionVideoProcessor,
        SiglipVisionConfig,
    )

    tokenizer = _tokenizer({"image_token": "<image>", "video_token": "<video>"})
    config = LlavaOnevisionConfig(
        text_config=qwen2_decoder_config(tiny.TinySizes(), tokenizer, model_type="qwen2"),
        vision_config=SiglipVisionConfig(**VISION, image_size=TILE, patch_size=14),
        image_token_index=tokenizer.convert_tokens_to_ids("<image>"),
        video_token_index=tokenizer.convert_tokens_to_ids("<video>"),
        image_grid_pinpoints=PINPOINTS,
        vision_feature_select_strategy="full",
        vision_feature_layer=-1,
        tie_word_embeddings=True,
    )
    tile = {"height": TILE, "width": TILE}
    processor = LlavaOnevisionProcessor(
        image_processor=LlavaOnevisionImageProcessor(size=tile, image_grid_pinpoints=PINPOINTS),
        tokenizer=tokenizer,
        video_processor=LlavaOnevisionVideoProcessor(size=tile),
        num_image_tokens=(TILE // 14) ** 2,
        vision_feature_select_strategy="full",
        chat_template=tokenizer.chat_template,
    )
    return save(directory, init_model(LlavaOnevisionForConditionalGeneration, config, seed, tokenizer), processor)


def build_tiny_internvl(directory: str | os.PathLike, seed: int = 0) -> Path:
    """Write a tiny InternVL (InternViT with its CLS feature dropped, pixel shuffle 0.5, MLP projector, Qwen2 decoder;
    up to 4 tiles plus a thumbnail per image)."""
    from transformers import (
        GotOcr2ImageProcessor,
        InternVLConfig,
        InternVLForConditionalGeneration,
        InternVLProcessor,
        InternVLVideoProcessor,
        InternVLVisionConfig,
    )

    media = {
        "start_image_token": "<img>",
        "end_image_token": "</img>",
        "context_image_token": "<IMG_CONTEXT>",
        "video_token": "<video>",
    }
    tokenizer = _tokenizer(media, image="<IMG_CONTEXT>")
    side = 2 * TILE  # 4 × 4 patches, pixel-shuffled to 2 × 2: 4 image tokens per tile
    config = InternVLConfig(
        text_config=qwen2_decoder_config(tiny.TinySizes(), tokenizer, model_type="qwen2"),
        vision_config=InternVLVisionConfig(**VISION, image_size=side, patch_size=14),
        image_token_id=tokenizer.convert_tokens_to_ids("<IMG_CONTEXT>"),
        image_seq_length=4,
        downsample_ratio=0.5,
        tie_word_embeddings=True,
    )
    size = {"height": side, "width": side}
    processor = InternVLProcessor(
        image_processor=GotOcr2ImageProcessor(size=size, crop_to_patches=True, max_patches=4),
        tokenizer=tokenizer,
        video_processor=InternVLVideoProcessor(size=size),
        image_seq_length=4,
        chat_template=tokenizer.chat_template,
    )
    return save(directory, init_model(InternVLForConditionalGeneration, config, seed, tokenizer), processor)


def build_tiny_gemma3(directory: str | os.PathLike, seed: int = 0) -> Path:
    """Write a tiny Gemma 3 VLM (SigLIP, average pooling to ``mm_tokens_per_image`` soft tokens, a Gemma 3 decoder
    with sliding-window and global layers; the window, 4, shorter than every prompt)."""
    from transformers import (
        Gemma3Config,
        Gemma3ForConditionalGeneration,
        Gemma3ImageProcessor,
        Gemma3Processor,
        Gemma3TextConfig,
        SiglipVisionConfig,
    )

    media = {"boi_token": "<start_of_image>", "eoi_token": "<end_of_image>", "image_token": "<image_soft_token>"}
    tokenizer = _tokenizer(media, image="<start_of_image>")
    s = tiny.TinySizes()
    text = qwen2_decoder_config(s, tokenizer, head_dim=s.text_hidden // s.text_heads, sliding_window=4)
    text["layer_types"] = ["sliding_attention", "full_attention"]
    side = 2 * TILE  # 4 × 4 patches, pooled to 2 × 2: 4 soft tokens per image
    ids = {name: tokenizer.convert_tokens_to_ids(token) for name, token in media.items()}
    config = Gemma3Config(
        text_config=Gemma3TextConfig(**text),
        vision_config=SiglipVisionConfig(**VISION, image_size=side, patch_size=14),
        mm_tokens_per_image=4,
        boi_token_index=ids["boi_token"],
        eoi_token_index=ids["eoi_token"],
        image_token_index=ids["image_token"],
        tie_word_embeddings=True,
    )
    processor = Gemma3Processor(
        image_processor=Gemma3ImageProcessor(size={"height": side, "width": side}),
        tokenizer=tokenizer,
        image_seq_length=4,
        chat_template=tokenizer.chat_template,
    )
    model = init_model(Gemma3ForConditionalGeneration, config, seed, tokenizer)
    with torch.no_grad():  # transformers initialises the projection to zeros, which would blank every image
        model.model.multi_modal_projector.mm_input_projection_weight.normal_(0, config.text_config.initializer_range)
    return save(directory, model, processor)


BUILDERS = {
    LLAVA: build_tiny_llava,
    ONEVISION: build_tiny_llava_onevision,
    INTERNVL: build_tiny_internvl,
    GEMMA3: build_tiny_gemma3,
}


def resolve(name: str, seed: int = 0) -> str | None:
    """The built directory of ``tiny-llava``, ``tiny-llava-onevision`` or ``tiny-internvl`` for ``seed`` (built on
    first use, into the model cache); None for other names."""
    build = BUILDERS.get(name)
    if build is None:
        return None
    return str(cached_build(f"{name}-seed{seed}", "config.json", lambda d: build(d, seed)))
