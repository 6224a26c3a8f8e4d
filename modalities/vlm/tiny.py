"""Tiny Qwen2.5-VL of the real architecture, with a local tokenizer and processor (no download).

``build_tiny_qwen25_vl(directory)`` writes a complete Hugging Face model directory — config, randomly
initialised weights, a byte-level BPE tokenizer trained on a small fixed corpus, and a
``Qwen2_5_VLProcessor`` with a Qwen-style chat template — so the adapter loads it through exactly the
``from_pretrained`` path a real checkpoint takes. The architecture is ``Qwen2_5_VLForConditionalGeneration``
(window-attention ViT with 2×2 patch merging, mRoPE text decoder); only the sizes are small.

``resolve_model_path(name)`` maps the built-in name ``tiny-qwen2.5-vl`` to a cached directory (built on first
use, deterministic given the seed) and returns any other name unchanged (a hub id or a local path).

The other VLM architectures under the prompt-sharing tests (``tests/test_prefix_sharing.py``) and the adapter
contract are built here too, each the real model and processor classes with small sizes, a tiny random decoder and
this module's BPE with the family's image tokens (``tiny-smolvlm``: :func:`build_tiny_smolvlm` over
:func:`.smolvlm.assemble`):

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

Their chat template is ChatML (:func:`.smolvlm.chat_template`), an image part rendered as the family's placeholder
(``<image>``, InternVL's ``<IMG_CONTEXT>``, Gemma 3's ``<start_of_image>``) before the text, where LLaVA-OneVision's,
InternVL's and Gemma 3's templates put it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch

from .. import real_models
from .._hf import cached_build
from .._tiny import TinyDecoderSizes, init_model, qwen2_decoder_config, qwen_tokenizer, save
from . import smolvlm

TINY_NAME = "tiny-qwen2.5-vl"

SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
]
# Tags the tasks' answers use: single tokens, decoded verbatim (not special, so they survive decoding).
TAG_TOKENS = ["<think>", "</think>", "<answer>", "</answer>"]
# Tool-call tags of the tiny-qwen2.5-vl-tools model: single tokens, as in Qwen2.5's own tokenizer (ids 151657/151658
# there), so a call costs what it costs a real Qwen policy rather than ~80 byte-level tokens.
TOOL_TOKENS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]

# Qwen2-VL-style chat template: images/videos become <|vision_start|><|image_pad|><|vision_end|>.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' or 'image' in part %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif part['type'] == 'video' or 'video' in part %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in part %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# Text the BPE merges are learnt from: the synthetic tasks' vocabulary plus plain English, so common words
# are one or two tokens. Any other text still tokenizes (byte-level fallback).
_CORPUS = """
What colour is the shape? What shape is it? How many shapes are there? Which way does the object move?
Answer with one word inside answer tags. red green blue yellow purple orange white black grey cyan
circle square triangle one two three four five six left right up down start end seconds frame
The quick brown fox jumps over the lazy dog. A picture of an object on a plain background.
user assistant system You are a helpful assistant. Look at the image and answer the question.
0 1 2 3 4 5 6 7 8 9 10 ( ) [ ] , . : ; ? ! - the a an of in on is are with and or to from
"""


# What tool-using rollouts write and read (modalities/tokens/turns.py's template, mmgrpo.tools' crop): the BPE of
# the tiny-qwen2.5-vl-tools model also learns merges on it.
_TOOL_CORPUS = """
{"name": "crop", "arguments": {"bbox_2d": [0, 112, 224, 336]}} {"name": "zoom", "arguments": {"bbox_2d": [112, 224,
336, 448]}} {"name": "select_frames", "arguments": {"start": 0, "end": 1}} Zoomed in on the image to the region
# Tools You may call one or more functions to assist with the user query. function name arguments json object
"""


@dataclass
class TinySizes(TinyDecoderSizes):
    """Sizes of the tiny model (the architecture is the real Qwen2.5-VL): the decoder's, then the vision tower's."""

    vision_hidden: int = 32
    """Hidden size of the vision tower (window-attention ViT)."""
    vision_depth: int = 2
    """Vision blocks."""
    vision_heads: int = 2
    """Vision attention heads."""
    vision_intermediate: int = 64
    """Vision MLP width."""
    bpe_vocab: int = 512
    """Tokenizer vocabulary: byte-level BPE merges learnt on the fixed corpus."""
    tool_vocabulary: bool = False
    """The tokenizer also learns merges on tool-call text and has TOOL_TOKENS as single tokens (tiny-qwen2.5-vl-tools);
    false leaves the tokenizer (and so the model) exactly as before."""


def build_tokenizer(vocab_size: int = 512, tool_vocabulary: bool = False):
    """A byte-level BPE ``PreTrainedTokenizerFast`` with Qwen's special tokens, trained on a fixed corpus (with
    ``tool_vocabulary``: plus tool-call text, and the tool tags as single tokens)."""
    media_tokens = {
        "image_token": "<|image_pad|>",
        "video_token": "<|video_pad|>",
        "vision_bos_token": "<|vision_start|>",
        "vision_eos_token": "<|vision_end|>",
    }
    if tool_vocabulary:
        corpus, tags = _CORPUS + _TOOL_CORPUS, TAG_TOKENS + TOOL_TOKENS
        return qwen_tokenizer(corpus, vocab_size, SPECIAL_TOKENS, media_tokens, tags, CHAT_TEMPLATE)
    return qwen_tokenizer(_CORPUS, vocab_size, SPECIAL_TOKENS, media_tokens, TAG_TOKENS, CHAT_TEMPLATE)


def _mrope_section(s: TinySizes) -> list[int]:
    """Qwen2.5-VL's (t, h, w) rope sections, summing to head_dim / 2 in the real model's 2:3:3 proportion
    ([16, 24, 24] at head_dim 128): [2, 3, 3] at head_dim 16, [8, 12, 12] at head_dim 64."""
    half = s.text_hidden // s.text_heads // 2
    t = half // 4
    return [t, (half - t) // 2, half - t - (half - t) // 2]


def _vision_config(s: TinySizes, patch_size: int, **extra) -> dict:
    """The vision tower of a tiny Qwen-VL config (Qwen2.5-VL and Qwen3-VL share it but for the patch size and
    their own keys)."""
    return dict(
        depth=s.vision_depth,
        hidden_size=s.vision_hidden,
        intermediate_size=s.vision_intermediate,
        num_heads=s.vision_heads,
        out_hidden_size=s.text_hidden,
        patch_size=patch_size,
        spatial_merge_size=2,
        temporal_patch_size=2,
        **extra,
    )


def _media_token_ids(ids: dict[str, int]) -> dict[str, int]:
    """The config's media token ids, from the tokenizer's special tokens."""
    return dict(
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
    )


def build_tiny_qwen25_vl(directory: str | os.PathLike, seed: int = 0, sizes: TinySizes | None = None) -> Path:
    """Write a tiny Qwen2.5-VL (config, random weights, tokenizer, processor) to ``directory``.

    ``resolve_model_path`` builds it into the cache atomically (:func:`mmgrpo.modalities._hf.cached_build`).
    """
    from transformers import (
        Qwen2_5_VLConfig,
        Qwen2_5_VLForConditionalGeneration,
        Qwen2_5_VLProcessor,
        Qwen2VLImageProcessor,
        Qwen2VLVideoProcessor,
    )

    s = sizes or TinySizes()
    tokenizer = build_tokenizer(s.bpe_vocab, s.tool_vocabulary)
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    rope = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": _mrope_section(s)}
    config = Qwen2_5_VLConfig(
        text_config=qwen2_decoder_config(s, tokenizer, rope_parameters=rope),
        vision_config=_vision_config(
            s, 14, window_size=56, fullatt_block_indexes=[s.vision_depth - 1], tokens_per_second=2
        ),
        **_media_token_ids(ids),
        tie_word_embeddings=True,
    )
    image_processor = Qwen2VLImageProcessor(min_pixels=28 * 28, max_pixels=112 * 112, patch_size=14, merge_size=2)
    video_processor = Qwen2VLVideoProcessor(
        min_pixels=28 * 28, max_pixels=112 * 112, patch_size=14, merge_size=2, temporal_patch_size=2
    )
    processor = Qwen2_5_VLProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        video_processor=video_processor,
        chat_template=CHAT_TEMPLATE,
    )
    return save(directory, init_model(Qwen2_5_VLForConditionalGeneration, config, seed, tokenizer), processor)


ENGINE_NAME = "tiny-qwen2.5-vl-engine"
"""The tiny Qwen2.5-VL at a size vLLM's CPU attention takes (head_dim 64: vLLM refuses head_dim 16; the mRoPE
sections sum to head_dim / 2), for the rollout-engine tests and the vLLM quickstart (docs/scale.md)."""
ENGINE_SIZES = TinySizes(text_hidden=128, text_heads=2, text_kv_heads=1, text_intermediate=256)
TOOLS_NAME = "tiny-qwen2.5-vl-tools"
"""The tiny Qwen2.5-VL with a tokenizer that knows tool calls (``TinySizes.tool_vocabulary``), for the multi-turn
tasks (configs/zoom_tools.yaml): a crop call is ~20 tokens instead of ~80."""
BUILT_IN = {TINY_NAME: TinySizes(), ENGINE_NAME: ENGINE_SIZES, TOOLS_NAME: TinySizes(tool_vocabulary=True)}


def resolve_model_path(name: str, seed: int = 0) -> str:
    """The directory for built-in tiny model names (built on first use, atomically), the real models of
    :mod:`mmgrpo.modalities.real_models` (``smollm2-135m-instruct``), the SmolVLMs of :mod:`.smolvlm`
    (``smolvlm-smollm2-135m``; ``tiny-smolvlm`` here) and the other architectures built here (``tiny-llava``,
    ``tiny-llava-onevision``, ``tiny-internvl``, ``tiny-gemma3``); other names pass through."""
    if (real := real_models.resolve(name, "vlm")) is not None:
        return real
    if (smol := smolvlm.resolve(name, seed)) is not None:
        return smol
    if name == SMOLVLM_NAME:
        return str(cached_build(f"{name}-seed{seed}", "config.json", lambda d: build_tiny_smolvlm(d, seed)))
    if name in OTHER_BUILDERS:
        build = OTHER_BUILDERS[name]
        return str(cached_build(f"{name}-seed{seed}", "config.json", lambda d: build(d, seed)))
    if name not in BUILT_IN:
        return name
    sizes = BUILT_IN[name]
    return str(cached_build(f"{name}-seed{seed}", "config.json", lambda d: build_tiny_qwen25_vl(d, seed, sizes)))


def build_tiny_qwen3_vl(directory: str | os.PathLike, seed: int = 0, sizes: TinySizes | None = None) -> Path:
    """Write a tiny Qwen3-VL (``Qwen3VLForConditionalGeneration``: 16-pixel patches, interleaved mRoPE, DeepStack
    visual features added to the first decoder layer) with the tokenizer and chat template of the tiny Qwen2.5-VL.
    Not a built-in name: tests build it into a temporary directory."""
    from transformers import Qwen2VLImageProcessor, Qwen3VLConfig, Qwen3VLForConditionalGeneration, Qwen3VLProcessor
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor

    s = sizes or TinySizes()
    tokenizer = build_tokenizer(s.bpe_vocab)
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    head_dim = s.text_hidden // s.text_heads
    rope = {
        "rope_type": "default",
        "rope_theta": 10000.0,
        "mrope_section": [head_dim // 4, head_dim // 8, head_dim // 8],  # Qwen3-VL: [24, 20, 20] of 64
        "mrope_interleaved": True,
    }
    config = Qwen3VLConfig(
        text_config=qwen2_decoder_config(s, tokenizer, rope_parameters=rope, head_dim=head_dim),
        vision_config=_vision_config(s, 16, num_position_embeddings=64, deepstack_visual_indexes=[0]),
        **_media_token_ids(ids),
        tie_word_embeddings=True,
    )
    pixels = dict(min_pixels=32 * 32, max_pixels=128 * 128, patch_size=16, merge_size=2)
    processor = Qwen3VLProcessor(
        image_processor=Qwen2VLImageProcessor(**pixels),
        tokenizer=tokenizer,
        video_processor=Qwen3VLVideoProcessor(**pixels, temporal_patch_size=2),
        chat_template=CHAT_TEMPLATE,
    )
    return save(directory, init_model(Qwen3VLForConditionalGeneration, config, seed, tokenizer), processor)


def build_tiny_causal_lm(directory: str | os.PathLike, seed: int = 0, sizes: TinySizes | None = None) -> Path:
    """A tiny text-only ``Qwen2ForCausalLM`` with the same local tokenizer (for text-only GRPO and tests)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    s = sizes or TinySizes()
    tokenizer = build_tokenizer(s.bpe_vocab)
    config = Qwen2Config(**qwen2_decoder_config(s, tokenizer))
    return save(directory, init_model(Qwen2ForCausalLM, config, seed, tokenizer), tokenizer)


SMOLVLM_NAME = "tiny-smolvlm"
SMOLVLM_SIZES = smolvlm.VisionSizes(image_size=32, patch_size=8, hidden=32, depth=1, heads=2, intermediate=64)


def build_tiny_smolvlm(directory: str | os.PathLike, seed: int = 0) -> Path:
    """A tiny SmolVLM (:func:`.smolvlm.assemble`) over a randomly initialised tiny Llama decoder with the tiny
    Qwen2.5-VL's local tokenizer: the Idefics3 architecture for the adapter contract and prompt-sharing tests."""
    from transformers import LlamaConfig, LlamaForCausalLM

    s = TinySizes()
    tokenizer = build_tokenizer(s.bpe_vocab)
    text = init_model(LlamaForCausalLM, LlamaConfig(**qwen2_decoder_config(s, tokenizer)), seed, tokenizer)
    return save(directory, *smolvlm.assemble(text, tokenizer, seed, SMOLVLM_SIZES, smolvlm.chat_template(None)))


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


def _media_tokenizer(image_tokens: dict[str, str], image: str = "<image>"):
    """The tiny Qwen BPE (:func:`build_tokenizer`'s corpus and special tokens) with the family's image tokens as
    the processor's named special tokens (``image_token``, InternVL's ``context_image_token``...); its chat template
    renders an image part as ``image``."""
    names = [t for t in image_tokens.values() if t not in SPECIAL_TOKENS]
    template = smolvlm.chat_template(None, image=image)
    s = TinySizes()
    return qwen_tokenizer(_CORPUS, s.bpe_vocab, SPECIAL_TOKENS + names, image_tokens, TAG_TOKENS, template)


def build_tiny_llava(directory: str | os.PathLike, seed: int = 0, sizes: TinySizes | None = None) -> Path:
    """Write a tiny LLaVA (1.5 layout: CLIP at layer -2 without its CLS feature, MLP projector, Llama decoder)."""
    from transformers import (
        CLIPImageProcessor,
        CLIPVisionConfig,
        LlamaConfig,
        LlavaConfig,
        LlavaForConditionalGeneration,
        LlavaProcessor,
    )

    tokenizer = _media_tokenizer({"image_token": "<image>"})
    text = LlamaConfig(**qwen2_decoder_config(sizes or TinySizes(), tokenizer))
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


def build_tiny_llava_onevision(directory: str | os.PathLike, seed: int = 0, sizes: TinySizes | None = None) -> Path:
    """Write a tiny LLaVA-OneVision (SigLIP, anyres tiling with unpadding and newline features, Qwen2 decoder)."""
    from transformers import (
        LlavaOnevisionConfig,
        LlavaOnevisionForConditionalGeneration,
        LlavaOnevisionImageProcessor,
        LlavaOnevisionProcessor,
        LlavaOnevisionVideoProcessor,
        SiglipVisionConfig,
    )

    tokenizer = _media_tokenizer({"image_token": "<image>", "video_token": "<video>"})
    config = LlavaOnevisionConfig(
        text_config=qwen2_decoder_config(sizes or TinySizes(), tokenizer, model_type="qwen2"),
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


def build_tiny_internvl(directory: str | os.PathLike, seed: int = 0, sizes: TinySizes | None = None) -> Path:
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
    tokenizer = _media_tokenizer(media, image="<IMG_CONTEXT>")
    side = 2 * TILE  # 4 × 4 patches, pixel-shuffled to 2 × 2: 4 image tokens per tile
    config = InternVLConfig(
        text_config=qwen2_decoder_config(sizes or TinySizes(), tokenizer, model_type="qwen2"),
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


def build_tiny_gemma3(
    directory: str | os.PathLike, seed: int = 0, sizes: TinySizes | None = None, newline_tokens: bool = False
) -> Path:
    """Write a tiny Gemma 3 VLM (SigLIP, average pooling to ``mm_tokens_per_image`` soft tokens, a Gemma 3 decoder
    with sliding-window and global layers; the window, 4, shorter than every prompt).

    ``newline_tokens``: the tokenizer also has ``"\n"`` … ``"\n\n\n\n"`` as single tokens, as Gemma's own
    vocabulary has and vLLM's Gemma 3 processor requires (``vllm/model_executor/models/gemma3_mm.py``
    ``Gemma3MultiModalProcessor._apply_token_matches`` looks each up by its text: the byte-level BPE's ``Ċ`` is a
    ``KeyError``); the engine tests' variant."""
    from transformers import (
        Gemma3Config,
        Gemma3ForConditionalGeneration,
        Gemma3ImageProcessor,
        Gemma3Processor,
        Gemma3TextConfig,
        SiglipVisionConfig,
    )

    media = {"boi_token": "<start_of_image>", "eoi_token": "<end_of_image>", "image_token": "<image_soft_token>"}
    tokenizer = _media_tokenizer(media, image="<start_of_image>")
    if newline_tokens:
        from tokenizers import AddedToken

        tokenizer.add_tokens([AddedToken("\n" * n, normalized=False) for n in range(1, 5)])
    s = sizes or TinySizes()
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


OTHER_BUILDERS = {
    LLAVA: build_tiny_llava,
    ONEVISION: build_tiny_llava_onevision,
    INTERNVL: build_tiny_internvl,
    GEMMA3: build_tiny_gemma3,
}
NAMES = (*BUILT_IN, SMOLVLM_NAME, *OTHER_BUILDERS, smolvlm.NAME)
"""Every name :func:`resolve_model_path` builds (the real models aside), for the name check at load
(:func:`mmgrpo.modalities.model_names.name_problem`)."""
