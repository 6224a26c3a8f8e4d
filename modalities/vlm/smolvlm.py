"""SmolVLM (transformers' Idefics3) whose language model is the real SmolLM2-135M-Instruct.

No vision-language weights ship in a package registry (docs/real_models.md), but the language model of
HuggingFaceTB's SmolVLM-256M/500M is SmolLM2, and the SmolLM2-135M-Instruct weights do ship
(``smollm2-135m-instruct``, :mod:`mmgrpo.modalities.real_models`). ``smolvlm-smollm2-135m`` is the SmolVLM
architecture (Marafioti et al. 2025, "SmolVLM: Redefining small and efficient multimodal models", arXiv 2504.05299,
§2: a SigLIP vision encoder, pixel shuffle, a linear connector into a SmolLM2 decoder;
``Idefics3ForConditionalGeneration`` in transformers) with:

- the **real** SmolLM2-135M-Instruct decoder, embeddings and head, copied exactly (the text-only logits are
  bit-equal, tests/test_real_models.py). Three image tokens are added to its tokenizer — ``<fake_token_around_image>``,
  ``<image>``, ``<global-img>`` — and their embedding rows are drawn by transformers' ``resize_token_embeddings``
  (a normal with the old rows' mean and covariance);
- a **fresh** SigLIP-style vision tower and connector, initialised from the run's seed and far smaller than SmolVLM's
  (:class:`VisionSizes`): no trained vision weights exist here, and a 2-core CPU trains this one in minutes. A
  supervised warm-up of the tower and connector alone (``warmup.trainable``, LLaVA's first stage) teaches it the task
  before GRPO (``configs/real_smolvlm_shapes.yaml``).

Images are not split into tiles (``do_image_splitting=False``): each image is resized to ``image_size`` pixels and
becomes ``<fake_token_around_image><global-img>`` + ``image_seq_len`` × ``<image>`` + ``<fake_token_around_image>``.
The chat template is SmolLM2-Instruct's own ChatML (with its default system message), where an image part renders as
``<image>`` before the text, as SmolVLM's template places it.

``resolve`` builds the directory once per seed into the model cache (``MMGRPO_CACHE``), atomically; it needs
``bash scripts/setup_real_models.sh smollm2-135m-instruct`` first and says so in one line otherwise. ``tiny-smolvlm``
(``vlm/tiny.build_tiny_smolvlm``) is the same assembly over a tiny random Llama decoder, for the adapter contract and
the prompt-sharing tests.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch

from .. import real_models
from .._hf import cached_build
from .._tiny import save

NAME = "smolvlm-smollm2-135m"
TEXT_MODEL = "smollm2-135m-instruct"
IMAGE_TOKENS = ["<fake_token_around_image>", "<image>", "<global-img>"]


@dataclass(frozen=True)
class VisionSizes:
    """The fresh vision tower (SigLIP, ``Idefics3VisionTransformer``) and the image grid; SmolVLM-256M's encoder is
    SigLIP-B/16 at 512 px (93M parameters), this one is about 0.4M."""

    image_size: int = 64
    patch_size: int = 8
    hidden: int = 128
    depth: int = 2
    heads: int = 4
    intermediate: int = 256
    scale_factor: int = 2  # pixel shuffle: (64 / 8)² = 64 patches → 64 / 2² = 16 image tokens

    @property
    def image_seq_len(self) -> int:
        return (self.image_size // self.patch_size) ** 2 // self.scale_factor**2


SIZES = VisionSizes()

SYSTEM_PROMPT = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
"""SmolLM2-Instruct's default system message (its chat template adds it when a chat has none)."""


def chat_template(default_system: str | None, image: str = "<image>") -> str:
    """ChatML as SmolLM2-Instruct's template writes it (with its default system message, when given); list content
    renders an image part as ``image`` (``<image>``) and a text part as its text, in order (SmolVLM's placement)."""
    system = (
        "{% if loop.first and messages[0]['role'] != 'system' %}"
        f"{{{{ '<|im_start|>system\\n{default_system}<|im_end|>\\n' }}}}"
        "{% endif %}"
        if default_system
        else ""
    )
    return (
        "{% for message in messages %}" + system + "{{ '<|im_start|>' + message['role'] + '\\n' }}"
        "{% if message['content'] is string %}{{ message['content'] }}"
        "{% else %}{% for part in message['content'] %}"
        "{% if part['type'] == 'image' %}{{ '"
        + image
        + "' }}{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
        "{% endfor %}{% endif %}"
        "{{ '<|im_end|>\\n' }}"
        "{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
    )


def assemble(text, tokenizer, seed: int, sizes: VisionSizes, template: str):
    """(``Idefics3ForConditionalGeneration``, ``Idefics3Processor``): the causal LM ``text`` (Llama architecture) as
    the language model, exactly, under a fresh vision tower and connector initialised from ``seed``. ``tokenizer``
    gets the image tokens; ``text``'s embeddings are resized for them."""
    from transformers import Idefics3Config, Idefics3ForConditionalGeneration, Idefics3ImageProcessor, Idefics3Processor

    tokenizer.add_special_tokens({"additional_special_tokens": IMAGE_TOKENS})
    text.resize_token_embeddings(len(tokenizer))
    vision = dict(
        hidden_size=sizes.hidden,
        intermediate_size=sizes.intermediate,
        num_hidden_layers=sizes.depth,
        num_attention_heads=sizes.heads,
        image_size=sizes.image_size,
        patch_size=sizes.patch_size,
    )
    config = Idefics3Config(
        text_config=text.config.to_dict(),
        vision_config=vision,
        scale_factor=sizes.scale_factor,
        image_token_id=tokenizer.convert_tokens_to_ids("<image>"),
        tie_word_embeddings=text.config.tie_word_embeddings,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    model = Idefics3ForConditionalGeneration(config)
    model.model.text_model.load_state_dict(text.model.state_dict(), strict=True)  # every weight, exactly
    with torch.no_grad():
        model.lm_head.weight.copy_(text.lm_head.weight)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    edge = {"longest_edge": sizes.image_size}
    processor = Idefics3Processor(
        image_processor=Idefics3ImageProcessor(do_image_splitting=False, size=edge, max_image_size=edge),
        tokenizer=tokenizer,
        image_seq_len=sizes.image_seq_len,
        chat_template=template,
    )
    return model, processor


def build_smolvlm(
    directory: str | os.PathLike, text_dir: str | os.PathLike, seed: int = 0, sizes: VisionSizes = SIZES
) -> Path:
    """Write the SmolVLM directory: the SmolLM2 causal LM of ``text_dir`` (with its tokenizer) under a fresh vision
    tower and connector initialised from ``seed``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    text = AutoModelForCausalLM.from_pretrained(text_dir, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(text_dir)
    return save(directory, *assemble(text, tokenizer, seed, sizes, chat_template(SYSTEM_PROMPT)))


def resolve(name: str, seed: int = 0) -> str | None:
    """The built directory of ``smolvlm-smollm2-135m`` for ``seed`` (built on first use, into the model cache); None
    for other names."""
    if name != NAME:
        return None
    text_dir = real_models.resolve(TEXT_MODEL, "vlm")  # the one-line setup error when SmolLM2 is not converted
    marker = "model.safetensors"
    return str(
        cached_build(f"{NAME}-f{real_models.FORMAT}-seed{seed}", marker, lambda d: build_smolvlm(d, text_dir, seed))
    )


def load_problem(name: object) -> str | None:
    """What :func:`resolve` would raise for ``name`` before any model loads (the adapter's ``load_check``): the
    SmolVLM needs the converted SmolLM2; None otherwise."""
    return real_models.load_problem(TEXT_MODEL, "vlm") if name == NAME else None
