"""The shared-prefix decode (modalities/tokens/shared_attention.py, ``model.args.shared_prefix_attention``): the
kernel against softmax attention over [prompt ; own] keys on hand-made tensors (Hydragen's merge, arXiv 2402.05099
§3.1), keyed rollouts against the expanded cache for every VLM-built family, the kernel switch restored, and the
fallbacks in one warning."""

import logging

import pytest
import torch

from mmgrpo import compat, noise
from mmgrpo.modalities.tokens import prefix_sharing, shared_attention
from mmgrpo.modalities.tokens.shared_attention import SharedPrefixLayer, shared_prefix_attention
from tests import adapter_cases
from tests.numerics import gradient_scales, model_reductions
from tests.test_prefix_sharing import TEXT_ARCHITECTURES, TEXT_ROWS, _logp_and_grads, _rows, _state, _text_adapter


class _Attn(torch.nn.Module):
    layer_idx = 0


class _Cache:
    def __init__(self, layer):
        self.layers = [layer]


def _reference(q, prompt_k, prompt_v, prompt_mask, own_k, own_v, group):
    """Softmax attention of each row over its own copy of its prompt and its own keys, written out: [B, t, H, d]."""
    B, H, t, d = q.shape
    g = H // prompt_k.shape[1]
    rows = torch.arange(B) // group
    k = torch.cat([prompt_k[rows], own_k], dim=2).repeat_interleave(g, dim=1)  # [B, H, L + n, d]
    v = torch.cat([prompt_v[rows], own_v], dim=2).repeat_interleave(g, dim=1)
    n, L = own_k.shape[2], prompt_k.shape[2]
    own_seen = torch.arange(n) <= torch.arange(n - t, n)[:, None]  # [t, n]: query i sits at own position n - t + i
    seen = torch.cat([prompt_mask[rows][:, None, :].expand(B, t, L).bool(), own_seen.expand(B, t, n)], dim=2)
    scores = (q @ k.transpose(-1, -2)) * d**-0.5  # [B, H, t, L + n]
    scores = scores.masked_fill(~seen[:, None], float("-inf"))
    return (scores.softmax(-1) @ v).transpose(1, 2)


@pytest.mark.parametrize("t", [1, 3])
def test_kernel_is_softmax_attention_over_prompt_and_own_keys(t):
    """P = 2 left-padded prompts, G = 3 rows each, 6 query heads over 2 K/V heads, n = 4 own positions: the merged
    kernel equals attention over the concatenated keys (padding masked, causal over the t new tokens)."""
    torch.manual_seed(0)
    P, G, Hkv, g, L, n, d = 2, 3, 2, 3, 5, 4, 8
    prompt_k, prompt_v = torch.randn(P, Hkv, L, d), torch.randn(P, Hkv, L, d)
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])  # prompt 0 is left-padded by two
    bias = torch.zeros(P, L).masked_fill(mask == 0, float("-inf"))[:, None, None]  # [P, 1, 1, L]
    layer = SharedPrefixLayer(prompt_k, prompt_v, bias, G, n)
    own_k, own_v = torch.randn(P * G, Hkv, n, d), torch.randn(P * G, Hkv, n, d)
    k, v = layer.update(own_k, own_v)
    q = torch.randn(P * G, Hkv * g, t, d)
    out, _ = shared_prefix_attention(_Attn(), q, k, v, None, scaling=d**-0.5, shared_prefix=_Cache(layer))
    torch.testing.assert_close(out, _reference(q, prompt_k, prompt_v, mask, own_k, own_v, G), atol=1e-6, rtol=1e-5)
    assert layer.get_seq_length() == L + n


def test_layer_writes_in_place_and_grows_past_its_room():
    layer = SharedPrefixLayer(torch.zeros(1, 1, 2, 4), torch.zeros(1, 1, 2, 4), torch.zeros(1, 1, 1, 2), 2, 2)
    room = layer._k
    for step in range(3):
        k, _ = layer.update(torch.full((2, 1, 1, 4), float(step)), torch.full((2, 1, 1, 4), float(step)))
    assert k.shape == (1, 1, 2, 3, 4) and k[0, 0, :, :, 0].tolist() == [[0.0, 1.0, 2.0]] * 2  # [P, H_kv, G, n, d]
    assert layer._k is not room  # the third position is past the reserved room: grown by concatenation


def test_kernel_outside_the_decode_step_fails_in_one_line():
    x = torch.zeros(1, 1, 1, 2)
    with pytest.raises(RuntimeError, match="only inside the shared-prefix decode step"):
        shared_prefix_attention(_Attn(), x, x, x, None)


def _expanded_and_shared(adapter, rows, G, keys, shares=True):
    """Keyed rollouts of ``rows`` over the G-expanded cache and over the shared one, with the sampler's log-probs;
    checks that the second took the shared stepper (``shares``) or fell back."""
    adapter.args.old_logprobs = "sampler"
    adapter.args.shared_prefix_attention = False
    expanded = adapter.rollout(rows, G, keys)
    adapter.args.shared_prefix_attention = True
    steps = []
    step = shared_attention.SharedPrefixStepper.step
    with pytest.MonkeyPatch.context() as patch:
        counted = lambda self, *a: steps.append(1) or step(self, *a)
        patch.setattr(shared_attention.SharedPrefixStepper, "step", counted)
        shared = adapter.rollout(rows, G, keys)
    assert bool(steps) == shares
    return expanded, shared


def _assert_same_draws(adapter, expanded, shared):
    assert torch.equal(shared.state.completion_ids, expanded.state.completion_ids)
    assert shared.outputs == expanded.outputs
    model_reductions(adapter._unwrapped()).assert_logprobs_close(shared.old_logprobs, expanded.old_logprobs)


@pytest.mark.parametrize("model_type", ["llama", "qwen2", "qwen3", "phi3", "gemma", "olmo2", "granite", "smollm3"])
def test_shared_decode_draws_the_expanded_tokens_text(model_type):
    """Text decoders (grouped-query heads, left-padded prompts of two lengths): the expanded cache's keyed tokens."""
    adapter = _text_adapter(model_type, **TEXT_ARCHITECTURES[model_type])
    adapter.args.min_new_tokens, adapter.args.temperature, adapter.args.max_new_tokens = 3, 0.9, 6
    assert shared_attention.unsupported_reason(adapter.model) is None
    expanded, shared = _expanded_and_shared(adapter, TEXT_ROWS, 3, noise.NoiseKeys(0, 2, (0, 1), 3))
    _assert_same_draws(adapter, expanded, shared)


@pytest.mark.parametrize("case", ["vlm", "video", "audio_llm", "vlm_idefics3", "vlm_llava", "vlm_internvl"])
def test_shared_decode_draws_the_expanded_tokens_every_vlm_family(case):
    """Images (mRoPE positions continued), video, audio, SmolVLM tiles, LLaVA, InternVL: the same keyed draws."""
    adapter = adapter_cases.build(case, lora=False, temperature=0.9)
    rows = adapter_cases.CASES[case].rows()[:2]
    assert shared_attention.unsupported_reason(adapter._unwrapped()) is None
    expanded, shared = _expanded_and_shared(adapter, rows, 3, noise.NoiseKeys(0, 4, tuple(range(len(rows))), 3))
    _assert_same_draws(adapter, expanded, shared)


def test_lora_policy_and_greedy_evaluation():
    """A LoRA-wrapped policy samples through the shared cache too, and greedy evaluation gives the same answers."""
    adapter = adapter_cases.build("vlm", lora=True, temperature=0.9)
    rows = adapter_cases.CASES["vlm"].rows()[:2]
    expanded, shared = _expanded_and_shared(adapter, rows, 2, noise.NoiseKeys(0, 1, (0, 1), 2))
    _assert_same_draws(adapter, expanded, shared)
    greedy_shared = adapter.evaluate(rows)
    adapter.args.shared_prefix_attention = False
    assert adapter.evaluate(rows) == greedy_shared


def test_kernel_switch_is_restored_even_when_the_step_fails():
    adapter = _text_adapter("llama")
    configs = shared_attention.text_attention_configs(adapter.model)
    inside = []

    def fail_inside():
        with shared_attention.kernel(configs):
            inside.extend(compat.attn_implementation(c) for c in configs)
            raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        fail_inside()
    assert set(inside) == {shared_attention.KERNEL}
    assert {compat.attn_implementation(c) for c in configs} == {"sdpa"}


def test_sliding_windows_and_soft_capping_fall_back_saying_why_once(caplog):
    """Sliding-window layers (Gemma 3) and Gemma 2's soft-capping keep the expanded cache, said once at INFO level
    (the option is on by default: no warning); the tokens are the expanded cache's."""
    gemma3 = _text_adapter("gemma3_text", **TEXT_ARCHITECTURES["gemma3_text"])
    assert "sliding" in shared_attention.unsupported_reason(gemma3.model)
    gemma2 = _text_adapter("gemma2", **TEXT_ARCHITECTURES["gemma2"])
    assert shared_attention.unsupported_reason(gemma2.model) is not None
    prefix_sharing._told.clear()
    with caplog.at_level(logging.INFO):
        expanded, shared = _expanded_and_shared(gemma3, TEXT_ROWS, 2, noise.NoiseKeys(0, 0, (0, 1), 2), shares=False)
    assert torch.equal(expanded.state.completion_ids, shared.state.completion_ids)
    told = [r for r in caplog.records if r.name == shared_attention.__name__]
    assert len(told) == 1 and told[0].levelno == logging.INFO and "sliding" in told[0].getMessage()


@pytest.mark.parametrize("case", ["llama", "qwen3", "vlm"])
def test_log_prob_forward_through_the_kernel_keeps_log_probs_and_gradients(case):
    """The training forward over group-major completions (the kernel, no G-fold copy of the prompt's keys/values)
    against the index-selected cache layout: the same log-probs and every parameter's gradient within the rounding
    budget; a minibatch out of group order takes the cache layout."""
    if case == "vlm":
        adapter, rows = adapter_cases.build("vlm", lora=False), _rows()  # images of two sizes, prompts of two lengths
    else:
        adapter, rows = _text_adapter(case, **TEXT_ARCHITECTURES[case]), TEXT_ROWS
    state = _state(adapter, rows, G=3, T=5)
    calls, kernel_forward = [], shared_attention.completion_logits

    def logp_and_grads(on: bool, index: torch.Tensor):
        adapter.args.shared_prefix_attention = on
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(shared_attention, "completion_logits", lambda *a: calls.append(on) or kernel_forward(*a))
            return _logp_and_grads(adapter, state, index, shared=True)

    shared, cache = logp_and_grads(True, torch.arange(6)), logp_and_grads(False, torch.arange(6))
    assert calls == [True]
    budget = model_reductions(adapter._unwrapped())
    budget.assert_logprobs_close(shared[0], cache[0])
    assert shared[1].keys() == cache[1].keys() and shared[1]
    scales = gradient_scales(cache[1])
    for name in cache[1]:
        budget.backward().assert_close(shared[1][name], cache[1][name], scale=scales[name], msg=name)
    logp_and_grads(True, torch.tensor([5, 0, 3]))  # prompts 1, 0, 1: not group-major
    assert calls == [True]


def test_completions_longer_than_half_the_prompt_keep_the_index_selected_layout():
    """The training forward takes the kernel only while T ≤ TRAINING_MAX_RATIO·L (past that, SDPA over the
    index-selected prompt is faster: the constant's docstring); the log-probs are the same either way."""
    adapter = _text_adapter("llama", **TEXT_ARCHITECTURES["llama"])
    L = adapter.collate([adapter._encode_prompt(r) for r in TEXT_ROWS])["input_ids"].shape[1]
    calls, kernel_forward = [], shared_attention.completion_logits
    logp = {}
    for T in (int(shared_attention.TRAINING_MAX_RATIO * L), int(shared_attention.TRAINING_MAX_RATIO * L) + 1):
        state = _state(adapter, TEXT_ROWS, G=2, T=T)
        for on in (True, False):
            adapter.args.shared_prefix_attention = on
            with pytest.MonkeyPatch.context() as patch:
                patch.setattr(
                    shared_attention, "completion_logits", lambda *a, T=T: calls.append(T) or kernel_forward(*a)
                )
                logp[T, on] = _logp_and_grads(adapter, state, torch.arange(4), shared=True)[0]
        model_reductions(adapter._unwrapped()).assert_logprobs_close(logp[T, True], logp[T, False])
    assert calls == [int(shared_attention.TRAINING_MAX_RATIO * L)], (calls, L)  # the longer T: not the kernel


@pytest.mark.cuda
def test_shared_attention_on_cuda_draws_the_expanded_tokens():
    """On CUDA: the shared kernel's keyed draws and log-probs equal the expanded cache's on a tiny text decoder."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    adapter = _text_adapter("llama")
    adapter.model.cuda()
    adapter.args.compile_decode = False  # on CUDA `auto` would take the compiled static-cache step instead
    expanded, shared = _expanded_and_shared(adapter, TEXT_ROWS, 4, noise.NoiseKeys(0, 2, (0, 1), 4))
    _assert_same_draws(adapter, expanded, shared)


LAYOUTS = {
    "kernel": {"shared_prefix_attention": True, "packed_training": False},
    "cache": {"shared_prefix_attention": False, "packed_training": False},
    "packed": {"shared_prefix_attention": False, "packed_training": True},
    "naive": {"prefix_sharing": False},
}
"""The training forward's layouts: the shared kernel (T ≤ TRAINING_MAX_RATIO·L), the index-selected cache, the packed
cache-free forward, the plain [prompt ; completion] forward."""


@pytest.mark.cuda
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_each_log_prob_layout_on_cuda_gives_the_cpu_log_probs(layout):
    """The training forward of every layout runs on CUDA (the policy's inputs follow it there: a CPU completion mask
    once stopped the cache layout) and gives the CPU's log-probs with fp32 matmuls on both."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    adapter = _text_adapter("llama", **TEXT_ARCHITECTURES["llama"])
    for name, value in LAYOUTS[layout].items():
        setattr(adapter.args, name, value)
    state, index = _state(adapter, TEXT_ROWS, G=2, T=3), torch.arange(4)
    calls, kernel_forward = [], shared_attention.completion_logits
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(shared_attention, "completion_logits", lambda *a: calls.append(1) or kernel_forward(*a))
            with torch.no_grad():
                on_cpu = adapter._token_logprobs(adapter._unwrapped(), state, index)  # [n, T]
                adapter._unwrapped().cuda()
                on_cuda = adapter._token_logprobs(adapter._unwrapped(), state, index)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
    assert on_cuda.device.type == "cuda"
    assert len(calls) == (2 if layout == "kernel" else 0), calls  # the layout asked for ran on both devices
    mask = adapter._completion_mask(state.completion_ids[index]).bool()
    assert float((on_cpu - on_cuda.cpu()).abs()[mask].max()) < 1e-3
