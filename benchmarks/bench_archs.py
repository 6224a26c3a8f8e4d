"""The non-Qwen architectures of ``benchmarks/vs_trl.py --arch``: a Llama (text only) and SmolVLM (Idefics3).

Each benchmark model is the real transformers architecture at tiny widths, sized so that its per-token FLOP mix
(lm_head / decoder / vision, the shares ``benchmarks/cost_model.py`` defines for Qwen2.5-VL) is that of a real
checkpoint, as ``REAL_MIX_SIZES`` does for Qwen2.5-VL-3B:

- ``llama``: ``LlamaForCausalLM`` with SmolLM2-135M-Instruct's mix (HuggingFaceTB/SmolLM2-135M-Instruct
  config.json: hidden 576, 30 layers, 9 query / 3 KV heads, MLP 1536, vocabulary 49,152, tied): lm_head 21.1 %,
  decoder 78.9 %. The tiny model keeps the 3:1 query:KV heads and the MLP / hidden ratio (2.67) and sizes its
  vocabulary so the lm_head share is the same.
- ``idefics3``: ``Idefics3ForConditionalGeneration`` (SmolVLM) over that Llama, with SmolVLM-256M-Instruct's mix
  (its config.json: SigLIP-B/16 at 512 px, 12 layers of width 768, MLP 3072, pixel shuffle 4 → 64 tokens per
  512-px tile, the decoder SmolLM2-135M): vision 91 %, decoder 7 %, lm_head 2 %. The tiny tower keeps SigLIP's
  MLP ratio (4), the pixel shuffle of 4 (16 patches per image token) and the patches per tile over the width
  (1024 / 768 there, 256 / 192 here: the share of attention inside the tower); images are split into tiles plus
  a global image as SmolVLM's processor does (``do_image_splitting``), a 256-px image into 2 × 2 tiles of 128 px.

Both toolkits read the same rows (``write_rows``): a JSONL file of conversational prompts (the image as a
``{"type": "image"}`` part before the text, as SmolVLM's template places it) that mmgrpo loads through its
``dataset`` task and TRL through ``datasets``; the prompt token counts are checked equal in every run.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from cost_model import TextConfig as TextMix  # a Llama / Qwen decoder's matmul sizes (the same fields)


@dataclass(frozen=True)
class SiglipMix:
    """A SigLIP tower with SmolVLM's connector (pixel shuffle ``scale``, one linear to the text width)."""

    hidden: int
    depth: int
    intermediate: int
    heads: int
    patch: int
    scale: int
    tile: int  # tile side in pixels (the tower's image_size)


SMOLLM2_135M = TextMix(hidden=576, layers=30, intermediate=1536, heads=9, kv_heads=3, vocab=49_152)
SMOLVLM_256M_VISION = SiglipMix(hidden=768, depth=12, intermediate=3072, heads=12, patch=16, scale=4, tile=512)

BENCH_TEXT = TextMix(hidden=192, layers=4, intermediate=512, heads=6, kv_heads=2, vocab=2192)
BENCH_VISION = SiglipMix(hidden=192, depth=3, intermediate=768, heads=3, patch=8, scale=4, tile=128)
IMAGE_SIDE = 256  # resized longest edge: 2 × 2 tiles of BENCH_VISION.tile plus the global image
ARCHS = ("qwen2_5_vl", "llama", "idefics3", "smollm2")
REAL_LLAMA = "smollm2-135m-instruct"  # --arch smollm2: the real weights (scripts/setup_real_models.sh)
QUESTIONS = ("colour", "shape")  # as vs_trl.py asks them


def per_token_flops(text: TextMix, vision: SiglipMix | None = None) -> dict[str, float]:
    """Forward matmul FLOPs of one token (attention scores left out, as in ``cost_model.per_token_flops``):
    ``decoder`` per text position, ``lm_head`` per scored position, ``vision`` per image token (scale² patches
    through the tower and the patch embedding, then the connector's linear)."""
    h = text.hidden
    out = {"lm_head": 2.0 * h * text.vocab, "decoder": 2.0 * text.layers * text.layer_params}
    if vision is not None:
        v = vision
        per_patch = v.depth * (4 * v.hidden**2 + 2 * v.hidden * v.intermediate) + 3 * v.patch**2 * v.hidden
        out["vision"] = 2.0 * (v.scale**2 * per_patch + v.scale**2 * v.hidden * h)
    return out


def flop_mix(text: TextMix, vision: SiglipMix | None = None) -> dict[str, float]:
    """Shares of :func:`per_token_flops` (they sum to 1)."""
    f = per_token_flops(text, vision)
    total = sum(f.values())
    return {k: v / total for k, v in f.items()}


def flop_mixes(arch: str) -> dict[str, dict[str, float]]:
    """The benchmark model's mix beside the real checkpoint's it copies."""
    if arch == "smollm2":
        return {"SmolLM2-135M (the real model)": flop_mix(SMOLLM2_135M)}
    vision, real_vision = (BENCH_VISION, SMOLVLM_256M_VISION) if arch == "idefics3" else (None, None)
    real = "SmolVLM-256M" if arch == "idefics3" else "SmolLM2-135M"
    return {"benchmark model": flop_mix(BENCH_TEXT, vision), real: flop_mix(SMOLLM2_135M, real_vision)}


def build_model(directory: Path, arch: str, seed: int) -> Path:
    """The benchmark model of ``arch`` (built once into ``directory``): the tiny Llama of :data:`BENCH_TEXT` with
    the tiny local BPE tokenizer and SmolLM2's ChatML template; for ``idefics3`` under a SigLIP tower and SmolVLM
    connector of :data:`BENCH_VISION` (``smolvlm.assemble``), its processor splitting images into tiles."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from mmgrpo.modalities._tiny import init_model, qwen2_decoder_config
    from mmgrpo.modalities.vlm import smolvlm
    from mmgrpo.modalities.vlm.tiny import TinySizes, build_tokenizer

    if arch == "smollm2":
        from mmgrpo.modalities import real_models

        return Path(real_models.resolve(REAL_LLAMA, "vlm"))  # the one-line setup error when not converted
    if (directory / "config.json").is_file():
        return directory
    tmp = directory.with_name(directory.name + ".build")
    t = BENCH_TEXT
    s = TinySizes(
        text_hidden=t.hidden, text_layers=t.layers, text_heads=t.heads, text_kv_heads=t.kv_heads,
        text_intermediate=t.intermediate,
    )  # fmt: skip
    tokenizer = build_tokenizer(s.bpe_vocab)
    tokenizer.chat_template = smolvlm.chat_template(None)
    text = init_model(LlamaForCausalLM, LlamaConfig(**qwen2_decoder_config(s, tokenizer)), seed, tokenizer)
    if arch == "llama":
        torch.manual_seed(seed)
        text.resize_token_embeddings(t.vocab, mean_resizing=False)
        text.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
    elif arch == "idefics3":
        from transformers import Idefics3ImageProcessor

        v = BENCH_VISION
        # SmolVLM's tokenizer has its tile-position tokens as single added tokens (<row_1_col_1> ... <row_6_col_6>)
        tokenizer.add_tokens([f"<row_{i}_col_{j}>" for i in range(1, 7) for j in range(1, 7)], special_tokens=True)
        sizes = smolvlm.VisionSizes(
            image_size=v.tile, patch_size=v.patch, hidden=v.hidden, depth=v.depth, heads=v.heads,
            intermediate=v.intermediate, scale_factor=v.scale,
        )  # fmt: skip
        model, processor = smolvlm.assemble(text, tokenizer, seed, sizes, smolvlm.chat_template(None))
        torch.manual_seed(seed)
        model.resize_token_embeddings(t.vocab, mean_resizing=False)
        processor.image_processor = Idefics3ImageProcessor(
            do_image_splitting=True, size={"longest_edge": IMAGE_SIDE}, max_image_size={"longest_edge": v.tile}
        )
        model.save_pretrained(tmp)
        processor.save_pretrained(tmp)
    else:
        raise ValueError(f"bench_archs.build_model: unknown arch {arch!r} (one of llama, idefics3)")
    os.replace(tmp, directory)
    return directory


FILLER = "Read the whole request before you answer it. The answer is one word, and nothing else is needed after it. "


def _prompt(arch: str, question: str, filler_words: int) -> list[dict]:
    words = (FILLER * (1 + filler_words // 10)).split()[:filler_words]
    text = " ".join([*words, question]) if words else question
    if arch in ("llama", "smollm2"):
        return [{"role": "user", "content": text}]
    return [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": text}]}]


def prompt_length(model_dir: Path, arch: str, filler_words: int) -> int:
    """Tokens of the longest benchmark prompt with ``filler_words`` words before the question."""
    from transformers import AutoProcessor, AutoTokenizer

    from mmgrpo.tasks.shapes import QUESTIONS as TEXT
    from mmgrpo.tasks.shapes import ShapesArgs, ShapesTask

    lengths = []
    if arch in ("llama", "smollm2"):
        tok = AutoTokenizer.from_pretrained(model_dir)
        for q in (TEXT[k] for k in QUESTIONS):
            text = tok.apply_chat_template(_prompt(arch, q, filler_words), add_generation_prompt=True, tokenize=False)
            lengths.append(len(tok(text, add_special_tokens=False)["input_ids"]))
        return max(lengths)
    processor = AutoProcessor.from_pretrained(model_dir)
    row = ShapesTask(
        ShapesArgs(questions=list(QUESTIONS), image_size=IMAGE_SIDE, train_size=1, eval_size=1)
    ).train_rows()[0]
    for q in (TEXT[k] for k in QUESTIONS):
        text = processor.apply_chat_template(_prompt(arch, q, filler_words), add_generation_prompt=True, tokenize=False)
        lengths.append(processor(text=[text], images=[[row["image"]]], return_tensors="pt")["input_ids"].shape[1])
    return max(lengths)


def filler_for(model_dir: Path, arch: str, ratio: float, completion_tokens: int) -> tuple[int, int]:
    """Filler words whose longest prompt is closest to ``ratio · T`` tokens; (words, L)."""
    target, points = ratio * completion_tokens, [(0, prompt_length(model_dir, arch, 0))]
    while points[-1][1] < target and points[-1][0] < 400:
        n = points[-1][0] + 1
        points.append((n, prompt_length(model_dir, arch, n)))
    return min(points, key=lambda p: (abs(p[1] - target), p[0]))


def write_rows(directory: Path, arch: str, n: int, filler_words: int, seed: int) -> Path:
    """``n`` rows of the ``shapes`` questions as a JSONL file (images as PNG files beside it); its path."""
    from mmgrpo.tasks.shapes import QUESTIONS as TEXT
    from mmgrpo.tasks.shapes import ShapesArgs, ShapesTask

    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"rows_{arch}_{n}_{filler_words}_{seed}.jsonl"
    if path.is_file():
        return path
    task = ShapesTask(
        ShapesArgs(questions=list(QUESTIONS), image_size=IMAGE_SIDE, train_size=n, eval_size=1, seed=seed)
    )
    lines = []
    for i, r in enumerate(task.train_rows()):
        row = {"prompt": _prompt(arch, TEXT[r["question_type"]], filler_words), "answer": r["answer"]}
        if arch == "idefics3":
            name = f"img_{seed}_{i:04d}.png"
            r["image"].save(directory / name)
            row["image"] = name
        lines.append(json.dumps(row))
    tmp = path.with_suffix(".tmp")
    tmp.write_text("\n".join(lines) + "\n")
    os.replace(tmp, path)
    return path


def suppressed_ids(tokenizer) -> list[int]:
    """The media tokens mmgrpo's VLM adapter never samples (``VLMAdapter._media_token_ids``: SmolVLM's image
    tokens, and the Qwen media tokens the tiny tokenizer also holds), given to TRL's ``suppress_tokens`` too."""
    from mmgrpo.modalities.vlm.smolvlm import IMAGE_TOKENS

    vocab = tokenizer.get_vocab()
    names = [*IMAGE_TOKENS, "<|image_pad|>", "<|video_pad|>", "<|vision_start|>", "<|vision_end|>"]
    return sorted(vocab[t] for t in names if t in vocab)
