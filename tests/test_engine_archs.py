"""The architectures of docs/architecture.md's table on the vLLM engine (issue 38): a tiny random model of each,
served by ``mmgrpo rollout-server`` (``.venv-vllm``, ``bash scripts/setup_vllm.sh``), whose prompt ids, greedy
completions after a weight push and sampled log-probs equal the native shared path's. Apart from tests/test_engine.py
so that the two test workers share the server starts (each about a minute on the 2-core machine)."""

from __future__ import annotations

import functools
import json
import shutil
from pathlib import Path

import pytest
import torch

from tests.test_engine import (
    _assert_engine_matches_native,
    _connect,
    _greedy,
    _perturb_and_push,
    _rows,
    _serve,
    needs_vllm,
)

# ------------------------------------------------------------------------------------------ text decoders on the engine


# The text decoders of issue 38's table on the engine: each a tiny random model of its own transformers class
# with head_dim 64 (vLLM's CPU attention kernels take 32, 64, 80, 96, 112, 128, 256: not the prefix-sharing tests'
# 8), served by vLLM's own implementation of the same architecture. Gemma 3 text keeps its sliding-window and global
# layers (a 4-token window, shorter than every prompt, as tests/test_prefix_sharing.py's rows); its embeddings are
# scaled by sqrt(hidden_size), and the others' N(0, 0.2²) push makes every prompt's greedy completion one repeated
# token there, so it is pushed N(0, 0.02²) (ENGINE_PUSH_SCALE).
ENGINE_PUSH_SCALE = {"gemma3_text": 0.02, "gemma3": 0.01}
ENGINE_TEXT_ARCHITECTURES = {
    "llama": {"tie_word_embeddings": True},  # SmolLM2's architecture (tied embeddings)
    "mistral": {"sliding_window": None},  # Mistral-7B-v0.3 ships no window
    "qwen3": {"head_dim": 64},
    "phi3": {},
    "gemma3_text": {"head_dim": 64, "sliding_window": 4, "layer_types": ["sliding_attention", "full_attention"]},
}


@pytest.fixture(scope="module", params=list(ENGINE_TEXT_ARCHITECTURES))
def text_server(request, tmp_path_factory, mmgrpo_cache):
    """``mmgrpo rollout-server`` on a tiny text decoder of ``request.param`` (the text-only vlm adapter)."""
    from tests.test_prefix_sharing import text_model

    model_type = request.param
    model, tokenizer = text_model(
        model_type,
        hidden_size=128,
        intermediate_size=256,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=512,
        **ENGINE_TEXT_ARCHITECTURES[model_type],
    )
    directory = tmp_path_factory.mktemp(f"tiny-{model_type}")
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    for served in _serve(tmp_path_factory, "configs/real_smollm2_arithmetic.yaml", str(directory)):
        yield (*served, directory, model_type)


@pytest.mark.slow
@needs_vllm
def test_engine_text_decoders_greedy_and_logprobs_equal_native_after_a_weight_push(text_server):
    """Llama, Mistral, Qwen3, Phi-3 and Gemma 3 text on the engine (issue 38's table): prompt ids, greedy completions
    after a push and the log-probs of the engine's own samples equal the native path's, which shares the prompt."""
    from mmgrpo.modalities.tokens import prefix_sharing
    from mmgrpo.modalities.vlm.adapter import build_vlm_adapter

    url, _, model, model_type = text_server
    adapter = build_vlm_adapter({"name_or_path": str(model), "max_new_tokens": 8, "temperature": 1.0}, seed=0)
    assert prefix_sharing.unsupported_reason(adapter.model) is None
    _connect(adapter, url)
    rows = [{"prompt": p} for p in ("What colour is the shape?", "Which way does the object move?", "Count them.")]
    _assert_engine_matches_native(adapter, rows, seed=1, version=1, scale=ENGINE_PUSH_SCALE.get(model_type, 0.2))


# ---------------------------------------------------------------------------------------------- SmolVLM on the engine


def _tiny_smolvlm(directory: Path) -> Path:
    """A tiny random SmolVLM (``Idefics3ForConditionalGeneration``: :func:`.smolvlm.assemble`, as ``tiny-smolvlm``)
    over :func:`_tiny_llama`'s decoder (head_dim 64, as vLLM's CPU attention takes; ``tiny-smolvlm``'s 16 it
    refuses), with the tiny tokenizer, SmolLM2's ChatML template and the tiny SigLIP tower."""
    from mmgrpo.modalities._tiny import save
    from mmgrpo.modalities.vlm import smolvlm
    from mmgrpo.modalities.vlm.tiny import SMOLVLM_SIZES
    from tests.test_prefix_sharing import text_model

    text, tokenizer = text_model(
        "llama",
        hidden_size=128,
        intermediate_size=256,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=512,
        tie_word_embeddings=True,
    )
    return save(directory, *smolvlm.assemble(text, tokenizer, 0, SMOLVLM_SIZES, smolvlm.chat_template(None)))


# ---------------------------------------------------------------------------------------------- more VLMs on the engine


def test_vllm_names_by_hand(tmp_path):
    """transformers 5 writes a LLaVA-style CLIP / SigLIP tower without its ``vision_model.`` level, which vLLM's
    loader takes only with it (modalities/tokens/vllm_names.py): the checkpoint is served from a copy under vLLM's
    names (only the header rewritten, the data byte for byte, other files linked), pushed names are mapped alike;
    hub names, other architectures and InternVL's tower stay as they are."""
    from safetensors.torch import load_file, save_file

    from mmgrpo.modalities.tokens.vllm_names import served_copy, to_vllm

    llava = "LlavaForConditionalGeneration"
    cases = {
        "vision_tower.embeddings.patch_embedding.weight": "vision_tower.vision_model.embeddings.patch_embedding.weight",
        "model.vision_tower.encoder.layers.0.mlp.fc1.bias": "model.vision_tower.vision_model.encoder.layers.0.mlp.fc1.bias",  # noqa: E501
        "vision_tower.vision_model.post_layernorm.weight": "vision_tower.vision_model.post_layernorm.weight",  # hub
        "language_model.model.embed_tokens.weight": "language_model.model.embed_tokens.weight",
        "multi_modal_projector.linear_1.weight": "multi_modal_projector.linear_1.weight",
    }  # fmt: skip
    for name, want in cases.items():
        assert to_vllm(llava, name) == want
        assert to_vllm("Gemma3ForConditionalGeneration", name) == want
    for arch in ("InternVLForConditionalGeneration", "Qwen2_5_VLForConditionalGeneration", None):
        assert to_vllm(arch, "vision_tower.embeddings.cls_token") == "vision_tower.embeddings.cls_token"

    src = tmp_path / "ckpt"
    src.mkdir()
    tensors = {"vision_tower.pre_layrnorm.bias": torch.arange(3.0), "lm_head.weight": torch.ones(2, 5).half()}
    save_file(tensors, src / "model.safetensors", metadata={"format": "pt"})
    (src / "config.json").write_text(json.dumps({"architectures": [llava]}))
    (src / "tokenizer.json").write_text("{}")
    copy = Path(served_copy(str(src)))
    try:
        got = load_file(copy / "model.safetensors")
        assert set(got) == {"vision_tower.vision_model.pre_layrnorm.bias", "lm_head.weight"}
        assert torch.equal(
            got["vision_tower.vision_model.pre_layrnorm.bias"], tensors["vision_tower.pre_layrnorm.bias"]
        )
        assert (
            torch.equal(got["lm_head.weight"], tensors["lm_head.weight"]) and got["lm_head.weight"].dtype == torch.half
        )
        assert (copy / "tokenizer.json").is_symlink() and (copy / "config.json").is_symlink()
        assert not (copy / "model.safetensors").is_symlink()
    finally:
        shutil.rmtree(copy)
    (src / "config.json").write_text(json.dumps({"architectures": ["InternVLForConditionalGeneration"]}))
    assert served_copy(str(src)) is None  # nothing to rename: vLLM loads the folder itself


# SmolVLM (_tiny_smolvlm), LLaVA, LLaVA-OneVision, InternVL and Gemma 3 (vision) of issue 38's table: tiny.py's
# builders with the engine's decoder sizes (head_dim 64, tiny.ENGINE_SIZES; their tiny-* names' 16 vLLM's CPU
# attention refuses), served by vLLM's implementation of each architecture. Gemma 3 is pushed N(0, 0.01²)
# (ENGINE_PUSH_SCALE): its embeddings are scaled by sqrt(hidden_size), and at 0.02 (its text model's scale) the three
# shapes prompts, which differ only in their images, got one and the same greedy completion from the native loop (the
# test needs them to differ); its tokenizer has Gemma's newline tokens, which vLLM's Gemma 3 processor looks up
# (tiny.build_tiny_gemma3).
ENGINE_VLMS = ("smolvlm", "llava", "llava_onevision", "internvl", "gemma3")


@pytest.fixture(scope="module", params=ENGINE_VLMS)
def vlm_server(request, tmp_path_factory, mmgrpo_cache):
    """``mmgrpo rollout-server`` on a tiny VLM of ``request.param`` (the vlm adapter with images)."""
    from mmgrpo.modalities.vlm import tiny

    build = {
        "smolvlm": lambda directory, seed, sizes: _tiny_smolvlm(directory),
        "llava": tiny.build_tiny_llava,
        "llava_onevision": tiny.build_tiny_llava_onevision,
        "internvl": tiny.build_tiny_internvl,
        "gemma3": functools.partial(tiny.build_tiny_gemma3, newline_tokens=True),  # as Gemma's vocabulary
    }[request.param]
    directory = build(tmp_path_factory.mktemp(f"tiny-{request.param}"), 0, tiny.ENGINE_SIZES)
    for served in _serve(tmp_path_factory, "configs/quickstart.yaml", str(directory)):
        yield (*served, directory, request.param)


@pytest.mark.slow
@needs_vllm
def test_engine_vlms_greedy_and_logprobs_equal_native_after_a_weight_push(vlm_server):
    """SmolVLM, LLaVA, LLaVA-OneVision, InternVL and Gemma 3 on the engine (issue 38's table), each checkpoint as
    transformers 5 writes it (the server maps its names, vllm_names): prompt ids with the image tokens as vLLM expands
    them, greedy completions after a push and the log-probs of the engine's own samples equal the native path's,
    which shares the prompt."""
    from mmgrpo.modalities.tokens import prefix_sharing
    from mmgrpo.modalities.vlm.adapter import build_vlm_adapter

    url, _, model, name = vlm_server
    if name == "gemma3" and not torch.cuda.is_available():
        pytest.skip(GEMMA3_ON_CPU)
    adapter = build_vlm_adapter({"name_or_path": str(model), "max_new_tokens": 8, "temperature": 1.0}, seed=0)
    assert prefix_sharing.unsupported_reason(adapter.model) is None
    _connect(adapter, url)
    _assert_engine_matches_native(adapter, _rows(3), seed=1, version=1, scale=ENGINE_PUSH_SCALE.get(name, 0.2))


GEMMA3_ON_CPU = (
    "vLLM 0.32's CPU attention (CPU_ATTN: supports_mm_prefix() is False, and the CPU platform picks it regardless) "
    "runs Gemma 3's image tokens causally, where transformers (and vLLM's FlashAttention backend, is_mm_prefix_lm) "
    "let them attend to each other both ways: test_engine_gemma3_on_cpu_differs_only_in_its_causal_image_attention"
)


@pytest.mark.slow
@needs_vllm
@pytest.mark.parametrize("vlm_server", ["gemma3"], indirect=True)
def test_engine_gemma3_on_cpu_differs_only_in_its_causal_image_attention(vlm_server):
    """Gemma 3 vision on vLLM's CPU build (GEMMA3_ON_CPU): the checkpoint loads under vLLM's names and takes a push
    (the prompt ids equal the trainer's), but the engine's greedy completions differ from the native loop's and equal
    transformers' with the image tokens' bidirectional attention off (``token_type_ids`` zero) — the one difference.
    Fails once vLLM's CPU attention takes Gemma 3's image-token attention: then the test above covers it on CPU."""
    url, _, model, _ = vlm_server
    if torch.cuda.is_available():
        pytest.skip("vLLM's CPU build only")
    from mmgrpo.modalities.vlm.adapter import build_vlm_adapter

    adapter = build_vlm_adapter({"name_or_path": str(model), "max_new_tokens": 8, "temperature": 1.0}, seed=0)
    _connect(adapter, url)
    _perturb_and_push(adapter, seed=1, version=1, scale=ENGINE_PUSH_SCALE["gemma3"])
    rows = _rows(3)
    native = _greedy(adapter, rows, engine=False)
    engine = _greedy(adapter, rows, engine=True)
    assert not torch.equal(native, engine), native
    with adapter._media_scope(), torch.no_grad():
        causal = []
        for enc in (adapter._encode_prompt(r) for r in rows):
            enc = dict(enc, token_type_ids=torch.zeros_like(enc["token_type_ids"]))
            out = adapter.model.generate(**enc, max_new_tokens=8, do_sample=False)[0, enc["input_ids"].shape[1] :]
            causal.append(torch.cat([out, torch.full((8 - len(out),), adapter.pad_id, dtype=out.dtype)]))
    causal = torch.stack(causal)
    causal = torch.where(adapter._completion_mask(causal).bool(), causal, torch.full_like(causal, adapter.pad_id))
    assert torch.equal(engine, causal), (engine, causal)
