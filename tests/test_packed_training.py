"""``model.args.packed_training`` beside the cache layout (its equality with the naive forward is
tests/test_prefix_sharing.py's ``test_packed_forward_keeps_prompt_sharing_exact``): the same log-probs and gradients
as continuing the prompts' KV cache, an attention kernel that takes no custom mask keeps the cache layout with one
warning, and the default ``auto`` packs on CUDA only (said, not warned, where the kernel cannot)."""

import logging

import pytest
import torch

from mmgrpo.modalities.tokens import prefix_sharing
from mmgrpo.modalities.vlm.adapter import build_vlm_adapter
from tests.test_prefix_sharing import _attention_calls, _logp_and_grads, _rows, _state


def test_packed_training_equals_the_cache_layout(tiny_vlm_path):
    adapter = build_vlm_adapter({"name_or_path": tiny_vlm_path, "max_new_tokens": 7, "packed_training": True})
    state = _state(adapter, _rows(), G=3, T=7)
    index = torch.tensor([1, 4, 2, 5])
    packed, g_packed = _logp_and_grads(adapter, state, index, shared=True)
    adapter.args.packed_training = False
    calls = _attention_calls(adapter._unwrapped())
    cache, g_cache = _logp_and_grads(adapter, state, index, shared=True)
    assert calls == [2, 4]  # the cache layout: the prompts' prefill, then the completions continuing it
    torch.testing.assert_close(packed, cache, rtol=0, atol=1e-5)
    assert g_packed.keys() == g_cache.keys()
    for name in g_cache:
        scale = g_cache[name].abs().max().clamp_min(1e-12)
        assert (g_packed[name] - g_cache[name]).abs().max() / scale < 1e-4, name


def test_a_kernel_without_custom_masks_keeps_the_cache_layout_with_one_warning(tiny_vlm_path, caplog):
    adapter = build_vlm_adapter({"name_or_path": tiny_vlm_path, "max_new_tokens": 7, "packed_training": True})
    model = adapter._unwrapped()
    text = prefix_sharing.core_model(model).config.get_text_config()
    kernel = text._attn_implementation
    prefix_sharing._warned.clear()
    try:
        text._attn_implementation = "flash_attention_2"  # only what packs() reads: no forward runs with it
        with caplog.at_level(logging.WARNING, logger=prefix_sharing.__name__):
            assert not prefix_sharing.packs(model)
            assert not prefix_sharing.packs(model)
    finally:
        text._attn_implementation = kernel
    warnings = [r.getMessage() for r in caplog.records if r.name == prefix_sharing.__name__]
    assert len(warnings) == 1 and "packed_training" in warnings[0] and "flash_attention_2" in warnings[0]
    assert prefix_sharing.packs(model)  # sdpa / eager take the mask


def test_auto_packs_on_cuda_only_and_says_a_fallback_at_info(tiny_vlm_path, caplog):
    """``packed_training: auto`` (the default) keeps the cache layout on the CPU; where the kernel takes no mask it is
    said once at INFO level (no warning); true and false as asked."""
    adapter = build_vlm_adapter({"name_or_path": tiny_vlm_path, "max_new_tokens": 7})
    model = adapter._unwrapped()
    assert adapter.args.packed_training == "auto"
    assert not prefix_sharing.packs(model, "auto")  # the CPU
    assert prefix_sharing.packs(model, True) and not prefix_sharing.packs(model, False)
    calls = _attention_calls(model)
    _logp_and_grads(adapter, _state(adapter, _rows(), G=3, T=7), torch.tensor([1, 4, 2, 5]), shared=True)
    assert calls == [2, 4]  # the cache layout on the CPU
    text = prefix_sharing.core_model(model).config.get_text_config()
    kernel = text._attn_implementation
    prefix_sharing._told.clear()
    try:
        text._attn_implementation = "flash_attention_2"
        with pytest.MonkeyPatch.context() as patch, caplog.at_level(logging.INFO, logger=prefix_sharing.__name__):
            patch.setattr(torch.Tensor, "device", property(lambda self: torch.device("cuda")))  # only packs() reads it
            assert not prefix_sharing.packs(model, "auto") and not prefix_sharing.packs(model, "auto")
    finally:
        text._attn_implementation = kernel
    told = [r for r in caplog.records if r.name == prefix_sharing.__name__]
    assert len(told) == 1 and told[0].levelno == logging.INFO and "flash_attention_2" in told[0].getMessage()


@pytest.mark.cuda
def test_auto_packs_on_cuda(tiny_vlm_path):
    """On CUDA the default runs the one packed forward: the log-probs of the cache layout there."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    adapter = build_vlm_adapter({"name_or_path": tiny_vlm_path, "max_new_tokens": 7})
    model = adapter._unwrapped().cuda()
    state, index = _state(adapter, _rows(), G=3, T=7), torch.tensor([1, 4, 2, 5])
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        with torch.no_grad():
            calls = _attention_calls(model)
            packed = adapter._token_logprobs(model, state, index)
            assert calls == [2]  # one forward, one row per prompt
            adapter.args.packed_training = False
            cache = adapter._token_logprobs(model, state, index)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
    mask = adapter._completion_mask(state.completion_ids[index]).bool()
    assert float((packed - cache).abs().cpu()[mask].max()) < 1e-4
