"""Tiny text-to-image pipelines of the real diffusers/transformers classes, built from config (no download).

- ``tiny-sd3``:  ``StableDiffusion3Pipeline`` = ``SD3Transformer2DModel`` + ``AutoencoderKL`` +
  ``FlowMatchEulerDiscreteScheduler`` + two ``CLIPTextModelWithProjection`` + ``T5EncoderModel``.
- ``tiny-flux``: ``FluxPipeline`` = ``FluxTransformer2DModel`` (guidance-distilled, like FLUX.1-dev) + ``AutoencoderKL``
  + dynamic-shift ``FlowMatchEulerDiscreteScheduler`` + ``CLIPTextModel`` + ``T5EncoderModel``.
- ``tiny-unet``: ``StableDiffusionPipeline`` = ``UNet2DConditionModel`` + ``DDIMScheduler`` + ``CLIPTextModel``.

Tokenizers are word-level ``PreTrainedTokenizerFast`` objects built locally (CLIP-style
``<|startoftext|> … <|endoftext|>`` and T5-style ``… </s>``), with a short ``model_max_length`` so text
sequences stay tiny. Words outside the vocabulary map to ``[UNK]``; the vocabulary covers the synthetic task
(``flow_task``) and common filler words.

``resolve_pipeline(name)`` builds (and caches under ``MMGRPO_CACHE``) the tiny random pipelines, loads the
shipped pre-trained ``tiny-sd3-flow-shapes`` (the base model of the ``flow_shapes`` task), and passes any other
name to ``DiffusionPipeline.from_pretrained`` (a hub id or directory: SD3.5-M, FLUX.1-dev, SD1.x ...).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from mmgrpo.config import ConfigError

from .._hf import cached_build, loading

TINY_NAMES = ("tiny-sd3", "tiny-flux", "tiny-unet")

WORDS = [
    "a",
    "an",
    "the",
    "of",
    "on",
    "in",
    "at",
    "with",
    "and",
    "or",
    "to",
    "is",
    "are",
    "this",
    "that",
    "photo",
    "picture",
    "image",
    "drawing",
    "painting",
    "render",
    "red",
    "green",
    "blue",
    "yellow",
    "purple",
    "orange",
    "white",
    "black",
    "gray",
    "cyan",
    "magenta",
    "pink",
    "brown",
    "circle",
    "square",
    "triangle",
    "disk",
    "box",
    "dot",
    "shape",
    "shapes",
    "object",
    "ring",
    "star",
    "top",
    "bottom",
    "left",
    "right",
    "center",
    "middle",
    "upper",
    "lower",
    "corner",
    "side",
    "small",
    "large",
    "big",
    "tiny",
    "one",
    "two",
    "three",
    "four",
    "cat",
    "dog",
    "house",
    "tree",
    "car",
    "sky",
    "sea",
]

CLIP_SPECIAL = {"pad": "<|pad|>", "bos": "<|startoftext|>", "eos": "<|endoftext|>", "unk": "[UNK]"}
T5_SPECIAL = {"pad": "<pad>", "eos": "</s>", "unk": "<unk>"}


def build_word_tokenizer(style: str = "clip", max_length: int = 8):
    """A word-level ``PreTrainedTokenizerFast`` over :data:`WORDS` (lower-cased, punctuation split off).

    ``style="clip"`` wraps text as ``<|startoftext|> … <|endoftext|>`` (ids: pad 0, bos 1, eos 2, unk 3);
    ``style="t5"`` appends ``</s>`` (ids: pad 0, eos 1, unk 2), like the real tokenizers the pipelines expect.
    """
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    special = CLIP_SPECIAL if style == "clip" else T5_SPECIAL
    vocab = {tok: i for i, tok in enumerate(special.values())}
    for w in WORDS:
        vocab.setdefault(w, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=special["unk"]))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Whitespace(), pre_tokenizers.Punctuation()])
    if style == "clip":
        bos, eos = special["bos"], special["eos"]
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A {eos}", special_tokens=[(bos, vocab[bos]), (eos, vocab[eos])]
        )
    else:
        eos = special["eos"]
        tok.post_processor = processors.TemplateProcessing(single=f"$A {eos}", special_tokens=[(eos, vocab[eos])])
    kwargs = {f"{k}_token": v for k, v in special.items()}
    return PreTrainedTokenizerFast(tokenizer_object=tok, model_max_length=max_length, **kwargs)


@dataclass
class TinyFlowSizes:
    """Sizes of the tiny pipelines (the architectures are the real ones)."""

    resolution: int = 32
    """Image side in pixels."""
    vae_channels: tuple[int, ...] = (8, 16, 32)
    """AutoencoderKL block widths; the VAE downsamples by 2^(len−1)."""
    latent_channels: int = 4
    """VAE latent channels (FLUX packs 2×2 patches: its transformer sees 4× this)."""
    text_hidden: int = 32
    """CLIP hidden size (SD3 concatenates two CLIPs: pooled projection = 2× this)."""
    t5_hidden: int = 64
    """T5 d_model = joint_attention_dim of the denoiser."""
    text_max_length: int = 8
    """Tokenizer model_max_length (CLIP) and max_sequence_length (T5)."""
    heads: int = 2
    """Denoiser attention heads."""
    head_dim: int = 16
    """Denoiser attention head dim."""
    layers: int = 2
    """Denoiser joint-attention layers (FLUX: 1 double + 1 single block)."""
    patch_size: int = 2
    """SD3 patch size."""


def _clip_config(vocab: int, s: TinyFlowSizes):
    from transformers import CLIPTextConfig

    return CLIPTextConfig(
        vocab_size=vocab,
        hidden_size=s.text_hidden,
        intermediate_size=2 * s.text_hidden,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=s.text_max_length,
        projection_dim=s.text_hidden,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        hidden_act="gelu",
    )


def _t5(vocab: int, s: TinyFlowSizes):
    from transformers import T5Config, T5EncoderModel

    cfg = T5Config(
        vocab_size=vocab,
        d_model=s.t5_hidden,
        d_ff=2 * s.t5_hidden,
        d_kv=16,
        num_layers=1,
        num_heads=4,
        relative_attention_num_buckets=8,
        relative_attention_max_distance=16,
        pad_token_id=0,
        eos_token_id=1,
        decoder_start_token_id=0,
        feed_forward_proj="gated-gelu",
        is_encoder_decoder=False,
    )
    return T5EncoderModel(cfg)


def _vae(s: TinyFlowSizes, shift_factor: float, scaling_factor: float):
    from diffusers import AutoencoderKL

    n = len(s.vae_channels)
    return AutoencoderKL(
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D",) * n,
        up_block_types=("UpDecoderBlock2D",) * n,
        block_out_channels=tuple(s.vae_channels),
        layers_per_block=1,
        latent_channels=s.latent_channels,
        norm_num_groups=min(s.vae_channels),
        sample_size=s.resolution,
        shift_factor=shift_factor,
        scaling_factor=scaling_factor,
        use_quant_conv=False,
        use_post_quant_conv=False,
    )


def _joint_attention(s: TinyFlowSizes) -> dict:
    """The attention sizes the SD3 (MMDiT) and FLUX transformers share: heads of ``head_dim`` over the image
    tokens joined with the T5 text tokens."""
    return dict(attention_head_dim=s.head_dim, num_attention_heads=s.heads, joint_attention_dim=s.t5_hidden)


def build_tiny_sd3(seed: int = 0, sizes: TinyFlowSizes | None = None):
    """A ``StableDiffusion3Pipeline`` of tiny random components (SD3.5-M layout: 2 CLIPs + T5, shift 3)."""
    from diffusers import FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel, StableDiffusion3Pipeline
    from transformers import CLIPTextModelWithProjection

    s = sizes or TinyFlowSizes()
    torch.manual_seed(seed)
    tok, tok_t5 = build_word_tokenizer("clip", s.text_max_length), build_word_tokenizer("t5", s.text_max_length)
    latent = s.resolution // 2 ** (len(s.vae_channels) - 1)
    transformer = SD3Transformer2DModel(
        sample_size=latent,
        patch_size=s.patch_size,
        in_channels=s.latent_channels,
        out_channels=s.latent_channels,
        num_layers=s.layers,
        **_joint_attention(s),
        caption_projection_dim=s.heads * s.head_dim,
        pooled_projection_dim=2 * s.text_hidden,
        pos_embed_max_size=max(16, latent // s.patch_size),
    )
    return StableDiffusion3Pipeline(
        transformer=transformer,
        scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0),
        vae=_vae(s, shift_factor=0.0, scaling_factor=1.0),
        text_encoder=CLIPTextModelWithProjection(_clip_config(len(tok), s)),
        tokenizer=tok,
        text_encoder_2=CLIPTextModelWithProjection(_clip_config(len(tok), s)),
        tokenizer_2=build_word_tokenizer("clip", s.text_max_length),
        text_encoder_3=_t5(len(tok_t5), s),
        tokenizer_3=tok_t5,
    )


def build_tiny_flux(seed: int = 0, sizes: TinyFlowSizes | None = None):
    """A ``FluxPipeline`` of tiny random components (FLUX.1-dev layout: guidance embedding, dynamic shift)."""
    from diffusers import FlowMatchEulerDiscreteScheduler, FluxPipeline, FluxTransformer2DModel
    from transformers import CLIPTextModel

    s = sizes or TinyFlowSizes()
    torch.manual_seed(seed)
    tok, tok_t5 = build_word_tokenizer("clip", s.text_max_length), build_word_tokenizer("t5", s.text_max_length)
    transformer = FluxTransformer2DModel(
        patch_size=1,
        in_channels=4 * s.latent_channels,
        num_layers=max(1, s.layers // 2),
        num_single_layers=max(1, s.layers // 2),
        **_joint_attention(s),
        pooled_projection_dim=s.text_hidden,
        guidance_embeds=True,
        axes_dims_rope=(s.head_dim // 4, 3 * s.head_dim // 8, 3 * s.head_dim // 8),
    )
    scheduler = FlowMatchEulerDiscreteScheduler(
        shift=3.0,
        use_dynamic_shifting=True,
        base_shift=0.5,
        max_shift=1.15,
        base_image_seq_len=256,
        max_image_seq_len=4096,
    )
    return FluxPipeline(
        scheduler=scheduler,
        vae=_vae(s, shift_factor=0.0, scaling_factor=1.0),
        text_encoder=CLIPTextModel(_clip_config(len(tok), s)),
        tokenizer=tok,
        text_encoder_2=_t5(len(tok_t5), s),
        tokenizer_2=tok_t5,
        transformer=transformer,
    )


def build_tiny_unet(seed: int = 0, sizes: TinyFlowSizes | None = None, set_alpha_to_one: bool = True):
    """A ``StableDiffusionPipeline`` of tiny random components with a ``DDIMScheduler`` (DDPO's setting)."""
    from diffusers import DDIMScheduler, StableDiffusionPipeline, UNet2DConditionModel
    from transformers import CLIPTextModel

    s = sizes or TinyFlowSizes()
    torch.manual_seed(seed)
    tok = build_word_tokenizer("clip", s.text_max_length)
    latent = s.resolution // 2 ** (len(s.vae_channels) - 1)
    unet = UNet2DConditionModel(
        sample_size=latent,
        in_channels=s.latent_channels,
        out_channels=s.latent_channels,
        layers_per_block=1,
        block_out_channels=(16, 32),
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        cross_attention_dim=s.text_hidden,
        attention_head_dim=8,
        norm_num_groups=8,
    )
    scheduler = DDIMScheduler(
        beta_start=0.00085,
        beta_end=0.012,
        beta_schedule="scaled_linear",
        clip_sample=False,
        set_alpha_to_one=set_alpha_to_one,
        steps_offset=1,
    )
    return StableDiffusionPipeline(
        vae=_vae(s, shift_factor=0.0, scaling_factor=1.0),
        text_encoder=CLIPTextModel(_clip_config(len(tok), s)),
        tokenizer=tok,
        unet=unet,
        scheduler=scheduler,
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
    )


BUILDERS = {"tiny-sd3": build_tiny_sd3, "tiny-flux": build_tiny_flux, "tiny-unet": build_tiny_unet}

SHIPPED = {"tiny-sd3-flow-shapes": Path(__file__).parent / "assets" / "tiny-sd3-flow-shapes"}
"""Pre-trained tiny pipelines shipped with the package (made by ``examples/pretrain_tiny_flow.py``, ~1.5 MB)."""


def resolve_pipeline(name_or_path: str, seed: int = 0, torch_dtype: torch.dtype = torch.float32):
    """Load a diffusers pipeline: a tiny built-in name (built on first use) or a hub id / local directory."""
    from diffusers import DiffusionPipeline

    if name_or_path in SHIPPED:
        directory = SHIPPED[name_or_path]
        if not (directory / "model_index.json").is_file():
            raise ConfigError(
                f"model.args.name_or_path: {name_or_path}: {directory} is missing; make it with "
                "`python examples/pretrain_tiny_flow.py`"
            )
        name_or_path = str(directory)
    elif name_or_path in BUILDERS:
        build = BUILDERS[name_or_path]
        directory = cached_build(
            f"{name_or_path}-seed{seed}", "model_index.json", lambda d: build(seed=seed).save_pretrained(str(d))
        )
        name_or_path = str(directory)
    with loading(name_or_path):  # one line for a missing path or an offline / unknown hub id
        return DiffusionPipeline.from_pretrained(name_or_path, dtype=torch_dtype)


__all__ = [
    "BUILDERS",
    "SHIPPED",
    "TINY_NAMES",
    "TinyFlowSizes",
    "build_tiny_flux",
    "build_tiny_sd3",
    "build_tiny_unet",
    "build_word_tokenizer",
    "resolve_pipeline",
]
