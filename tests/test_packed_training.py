"""``model.args.packed_training``: the split-attention log-prob forward as one packed cache-free forward per minibatch
(modalities/tokens/prefix_sharing.py) equals the naive forward, and really runs packed; an attention kernel that takes
no custom mask keeps the cache layout with one warning."""

import logging

import pytest
import torch

from mmgrpo.modalities.tokens import prefix_sharing
from mmgrpo.modalities.vlm.adapter import build_vlm_adapter
from tests.test_prefix_sharing import _assert_same, _attention_calls, _logp_and_grads, _rows, _state


def _adapter(path: str, lora: bool, packed: bool):
    from mmgrpo.config import LoraConfig

    adapter = build_vlm_adapter(
        {"name_or_path": path, "max_new_tokens": 7, "packed_training": packed},
        lora=LoraConfig(enabled=True, r=4, alpha=8) if lora else None,
    )
    if lora:  # LoRA B starts at zero; make the adapter matter
        with torch.no_grad():
            for n, p in adapter._unwrapped().named_parameters():
                if "lora_B" in n:
                    p.normal_(0, 0.1)
    return adapter


@pytest.mark.parametrize("lora", [False, True])
def test_packed_training_equals_naive_and_runs_one_row_per_prompt(tiny_vlm_path, lora, caplog):
    adapter = _adapter(tiny_vlm_path, lora, packed=True)
    model = adapter._unwrapped()
    assert not prefix_sharing.checkpointing(model)  # packed by the option, not by checkpointing
    state = _state(adapter, _rows(), G=3, T=7)
    prefix_sharing._warned.clear()
    with caplog.at_level(logging.WARNING, logger=prefix_sharing.__name__):
        _assert_same(adapter, state, torch.arange(6))  # whole groups
        _assert_same(adapter, state, torch.tensor([5, 0, 3, 4]))  # across groups, unordered
    assert not [r for r in caplog.records if r.name == prefix_sharing.__name__]  # no fallback
    calls = _attention_calls(model)
    _logp_and_grads(adapter, state, torch.tensor([5, 0, 3, 4]), shared=True)
    assert calls == [2]  # one packed row per prompt, one forward
    calls.clear()
    adapter.args.packed_training = False
    _logp_and_grads(adapter, state, torch.tensor([5, 0, 3, 4]), shared=True)
    assert calls == [2, 4]  # the cache layout: the prompts' prefill, then the completions continuing it


def test_packed_training_equals_the_cache_layout(tiny_vlm_path):
    adapter = _adapter(tiny_vlm_path, lora=False, packed=True)
    state = _state(adapter, _rows(), G=3, T=7)
    index = torch.tensor([1, 4, 2, 5])
    packed, g_packed = _logp_and_grads(adapter, state, index, shared=True)
    adapter.args.packed_training = False
    cache, g_cache = _logp_and_grads(adapter, state, index, shared=True)
    torch.testing.assert_close(packed, cache, rtol=0, atol=1e-5)
    assert g_packed.keys() == g_cache.keys()
    for name in g_cache:
        scale = g_cache[name].abs().max().clamp_min(1e-12)
        assert (g_packed[name] - g_cache[name]).abs().max() / scale < 1e-4, name


def test_a_kernel_without_custom_masks_keeps_the_cache_layout_with_one_warning(tiny_vlm_path, caplog):
    adapter = _adapter(tiny_vlm_path, lora=False, packed=True)
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
