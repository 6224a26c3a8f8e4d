"""Prompt sharing (modalities/tokens/prefix_sharing.py) against the naive path, fp32, on tiny real architectures.

Tolerances (fp32): the two paths run the same layers on differently shaped batches, so they differ by float rounding
only: within the model's rounding budget (tests/numerics.py: its longest reduction and depth, from its config);
log-probs on the log-prob scale, parameter gradients (the backward's budget) relative to each tensor's largest entry.
"""

import logging

import pytest
import torch

from mmgrpo import noise
from mmgrpo.modalities.tokens import decode, prefix_sharing
from mmgrpo.modalities.vlm.adapter import PromptCache, VLMAdapter, VLMArgs, VLMState, build_vlm_adapter
from mmgrpo.tasks.shapes import ShapesArgs, ShapesTask
from tests.numerics import Reductions, gradient_scales, model_reductions


def _rows():
    """Two prompts of different lengths (a padded prompt batch) with different image sizes."""
    colour = ShapesTask(ShapesArgs(train_size=1, eval_size=1, image_size=56)).train_rows()[0]
    shape = ShapesTask(ShapesArgs(questions=["shape"], train_size=1, eval_size=1, image_size=84)).train_rows()[0]
    return [colour, dict(shape, prompt="Look at the image and answer the question. " + shape["prompt"])]


def _state(adapter, rows, G, T, seed=0, encodings=None):
    """Random completions with EOS at different positions (uneven lengths), pad after EOS, group-major."""
    encodings = encodings or [adapter._encode_prompt(r) for r in rows]
    assert len({e["input_ids"].shape[1] for e in encodings}) == len(encodings), "prompts should differ in length"
    P = len(encodings)
    g = torch.Generator().manual_seed(seed)
    comp = torch.randint(10, 300, (P * G, T), generator=g)
    eos = int(adapter.eos_ids[0])
    for b, pos in enumerate(torch.randint(0, T + 2, (P * G,), generator=g).tolist()):
        if pos < T:  # pos ≥ T: no EOS (truncated)
            comp[b, pos] = eos
    comp = torch.where(adapter._completion_mask(comp).bool(), comp, torch.full_like(comp, adapter.pad_id))
    prompt_of = torch.arange(P).repeat_interleave(G)
    return VLMState(completion_ids=comp, prompt_of=prompt_of, cache=PromptCache(encodings))


def _logp_and_grads(adapter, state, index, shared: bool):
    adapter.args.prefix_sharing = shared
    model = adapter._unwrapped()
    model.zero_grad(set_to_none=True)
    logp = adapter._token_logprobs(model, state, index)  # [n, T]
    mask = adapter._completion_mask(state.completion_ids[index]).float()
    weights = torch.randn(logp.shape, generator=torch.Generator().manual_seed(1))
    (logp * weights * mask).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return logp.detach() * mask, grads


def _assert_same(adapter, state, index):
    logp_naive, g_naive = _logp_and_grads(adapter, state, index, shared=False)
    logp_shared, g_shared = _logp_and_grads(adapter, state, index, shared=True)
    budget = model_reductions(adapter._unwrapped())
    budget.assert_logprobs_close(logp_shared, logp_naive)
    assert g_naive.keys() == g_shared.keys() and len(g_naive) > 0
    scales = gradient_scales(g_naive)  # a key bias's gradient is 0 up to rounding: its query bias's scale
    for name in g_naive:
        budget.backward().assert_close(g_shared[name], g_naive[name], scale=scales[name], msg=name)
    return logp_naive


@pytest.mark.parametrize("lora", [False, True])
def test_shared_forward_equals_naive_logprobs_and_gradients(tiny_vlm_path, lora):
    from mmgrpo.config import LoraConfig

    adapter = build_vlm_adapter(
        {"name_or_path": tiny_vlm_path, "max_new_tokens": 7, "temperature": 0.8},
        lora=LoraConfig(enabled=True, r=4, alpha=8) if lora else None,
    )
    if lora:  # LoRA B starts at zero; make the adapter matter
        with torch.no_grad():
            for n, p in adapter._unwrapped().named_parameters():
                if "lora_B" in n:
                    p.normal_(0, 0.1)
    assert prefix_sharing.unsupported_reason(adapter._unwrapped()) is None
    state = _state(adapter, _rows(), G=3, T=7)
    lengths = adapter._completion_mask(state.completion_ids).sum(1)
    assert len(set(lengths.tolist())) > 2, "completions should end at different positions"
    logp = _assert_same(adapter, state, torch.arange(6))  # whole groups
    assert logp.abs().sum() > 0
    _assert_same(adapter, state, torch.tensor([5, 0, 3, 4]))  # a minibatch cutting across groups, unordered


def test_shared_forward_runs_vision_encoder_once_per_prompt(tiny_vlm_path):
    adapter = build_vlm_adapter({"name_or_path": tiny_vlm_path, "max_new_tokens": 4})
    model = adapter._unwrapped()
    patches = []
    handle = model.model.visual.register_forward_hook(lambda m, args, out: patches.append(args[0].shape[0]))
    state = _state(adapter, _rows(), G=4, T=4)
    per_prompt = [e["pixel_values"].shape[0] for e in state.cache.encodings]
    adapter._token_logprobs(model, state, torch.arange(8))
    assert patches == [sum(per_prompt)]  # one encoder call over the 2 prompts' patches, not 8 samples'
    patches.clear()
    adapter.args.prefix_sharing = False
    adapter._token_logprobs(model, state, torch.arange(8))
    assert patches == [4 * sum(per_prompt)]
    handle.remove()


@pytest.mark.parametrize("sampling", [dict(temperature=0.7), dict(temperature=1.3, top_k=50, top_p=0.9)])
def test_kv_expanded_rollout_draws_the_same_tokens_as_generate(tiny_vlm_path, sampling):
    """Same seed → same tokens as generate(num_return_sequences=G); old log-probs equal the naive forward's."""
    rows, G = _rows(), 4
    args = {"name_or_path": tiny_vlm_path, "max_new_tokens": 6, "min_new_tokens": 2, **sampling}
    naive = build_vlm_adapter({**args, "kv_expand_rollout": False, "prefix_sharing": False})
    shared = build_vlm_adapter({**args, "old_logprobs": "sampler", "sample_draw": "multinomial"})
    patches = []
    shared._unwrapped().model.visual.register_forward_hook(lambda m, a, out: patches.append(a[0].shape[0]))
    torch.manual_seed(3)
    r_naive = naive.rollout(rows, G)
    torch.manual_seed(3)
    r_shared = shared.rollout(rows, G)
    assert patches == [sum(e["pixel_values"].shape[0] for e in r_shared.state.cache.encodings)]  # one prefill
    assert torch.equal(r_shared.state.completion_ids, r_naive.state.completion_ids)
    assert (r_shared.mask.sum(1) >= 2).all()  # min_new_tokens held
    assert r_shared.outputs == r_naive.outputs
    # The sampler's log-probs (old_logprobs="sampler") are those of the naive training forward.
    model_reductions(shared._unwrapped()).assert_logprobs_close(r_shared.old_logprobs, r_naive.old_logprobs)
    # ... and greedy evaluation agrees too.
    assert shared.evaluate(rows) == naive.evaluate(rows)


def test_ratio_is_one_with_sampler_logprobs(tiny_vlm_path):
    adapter = build_vlm_adapter({"name_or_path": tiny_vlm_path, "max_new_tokens": 5, "old_logprobs": "sampler"})
    rollout = adapter.rollout(_rows(), group_size=3)
    logp = adapter.logprobs(rollout, torch.arange(6))
    m = rollout.mask.bool()
    model_reductions(adapter._unwrapped()).assert_logprobs_close(logp[m].detach(), rollout.old_logprobs[m])


def text_model(model_type: str, **config_kwargs):
    """A tiny random text-only causal LM of ``model_type`` (fp32, train mode) and the tiny VLM's tokenizer;
    ``config_kwargs`` replace the sizes (the engine test's Llama: head_dim 64, as vLLM's CPU kernels take) and may
    name the attention kernel (``attn_implementation``, default sdpa)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from mmgrpo.modalities.vlm.tiny import build_tokenizer

    tok = build_tokenizer()
    sizes = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4)
    sizes["num_key_value_heads"] = 2
    attn = config_kwargs.pop("attn_implementation", "sdpa")
    config = AutoConfig.for_model(
        model_type,
        vocab_size=len(tok),
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
        **{**sizes, **config_kwargs},
    )
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, attn_implementation=attn).train(), tok


def _text_adapter(model_type: str, **config_kwargs):
    """:func:`text_model` behind the VLM adapter's text-only path (no processor)."""
    model, tok = text_model(model_type, **config_kwargs)
    return VLMAdapter(model, tok, VLMArgs(max_new_tokens=5), reference=None)


# The decoder architectures the shared path is tested on (docs/architecture.md, "Architectures and the fast path"):
# tiny random models of each built from config, each with its own transformers implementation. Mistral with
# sliding_window null, as Mistral-7B-v0.3 ships (a window keeps the naive path: test below). Gemma 2 and 3 with their
# sliding-window and global layers, the window (4 tokens) shorter than every prompt, so it hides prompt keys from
# the completions in the sliding layers; Gemma 2 with eager attention, the only kernel transformers gives it.
SLIDING_LAYERS = {"sliding_window": 4, "layer_types": ["sliding_attention", "full_attention"]}
TEXT_ARCHITECTURES = {
    "llama": {},  # SmolLM2, Llama 3.x
    "mistral": {"sliding_window": None},
    "qwen2": {},
    "qwen3": {},
    "phi3": {},
    "gemma": {},
    "olmo2": {},
    "granite": {"logits_scaling": 8.0},  # as Granite 3 ships: its head is not fused
    "smollm3": {},
    "gemma2": {**SLIDING_LAYERS, "attn_implementation": "eager"},  # final_logit_softcapping 30: not fused
    "gemma3_text": SLIDING_LAYERS,  # Gemma 3 (1B is text-only: Gemma3ForCausalLM)
}
SCALED_HEADS = {"granite", "gemma2"}  # a config rescales their logits after the head (logits_scaling, soft-capping)
TEXT_ROWS = [{"prompt": "What colour is the shape?"}, {"prompt": "The quick brown fox jumps over the lazy dog. Why?"}]


@pytest.mark.parametrize("checkpointed", [False, True], ids=["cache", "checkpointed"])
@pytest.mark.parametrize("model_type", list(TEXT_ARCHITECTURES))
def test_every_decoder_architecture_shares_the_prompt_exactly(model_type, checkpointed):
    """Log-probs and every parameter's gradient of the shared forward equal the naive per-row forward's (within
    the rounding budget), with the KV cache and under gradient checkpointing (the packed 4-D-mask forward)."""
    adapter = _text_adapter(model_type, **TEXT_ARCHITECTURES[model_type])
    if checkpointed:
        prefix_sharing.enable_checkpointing(adapter.model)
        assert prefix_sharing.checkpointing(adapter.model)
    assert prefix_sharing.unsupported_reason(adapter.model) is None
    _assert_same(adapter, _state(adapter, TEXT_ROWS, G=3, T=5), torch.arange(6))


@pytest.mark.parametrize("model_type", list(TEXT_ARCHITECTURES))
def test_every_decoder_architecture_samples_like_generate_and_keyed_is_batch_free(model_type):
    """The KV-expanded sampler draws generate's tokens for a seed (multinomial draws), its log-probs are the
    training forward's, and a keyed rollout of a prompt does not depend on the prompts batched with it."""
    adapter = _text_adapter(model_type, **TEXT_ARCHITECTURES[model_type])
    adapter.args.min_new_tokens, adapter.args.sample_draw, adapter.args.temperature = 2, "multinomial", 0.9
    G = 3
    adapter.args.kv_expand_rollout = adapter.args.prefix_sharing = False
    torch.manual_seed(5)
    naive = adapter.rollout(TEXT_ROWS, G)
    adapter.args.kv_expand_rollout = adapter.args.prefix_sharing = True
    adapter.args.old_logprobs = "sampler"
    torch.manual_seed(5)
    shared = adapter.rollout(TEXT_ROWS, G)
    assert torch.equal(shared.state.completion_ids, naive.state.completion_ids) and shared.outputs == naive.outputs
    model_reductions(adapter.model).assert_logprobs_close(shared.old_logprobs, naive.old_logprobs)
    whole = adapter.rollout(TEXT_ROWS, G, noise.NoiseKeys(0, 2, (0, 1), G))
    parts = [adapter.rollout(TEXT_ROWS[p : p + 1], G, noise.NoiseKeys(0, 2, (p,), G)) for p in (0, 1)]
    assert torch.equal(whole.state.completion_ids, torch.cat([p.state.completion_ids for p in parts]))
    other = adapter.rollout(TEXT_ROWS, G, noise.NoiseKeys(0, 3, (0, 1), G))
    assert not torch.equal(other.state.completion_ids, whole.state.completion_ids)


def test_a_sliding_window_keeps_the_naive_path_with_its_reason():
    """Mistral's one window over every layer, and sliding layers of a family other than Gemma 2/3 (Qwen2 with
    ``use_sliding_window``: layers from ``max_window_layers`` on slide), keep the naive path; Gemma 3's are covered."""
    assert "sliding-window attention (window 4096)" in prefix_sharing.unsupported_reason(
        _text_adapter("mistral", sliding_window=4096).model
    )
    qwen2 = _text_adapter("qwen2", use_sliding_window=True, sliding_window=4, max_window_layers=1).model
    assert qwen2.config.layer_types == ["full_attention", "sliding_attention"]
    assert prefix_sharing.unsupported_reason(qwen2) == (
        "sliding-window attention layers of model type 'qwen2' are not yet tested against the naive path "
        "(those of gemma2, gemma3_text are)"
    )
    assert prefix_sharing.unsupported_reason(_text_adapter("gemma3_text").model) is None  # its default layers
    bidirectional = _text_adapter("gemma3_text", use_bidirectional_attention=True).model  # EmbeddingGemma's
    assert prefix_sharing.unsupported_reason(bidirectional) == (
        "model type 'gemma3_text' attends bidirectionally (its prompt is not a causal prefix)"
    )


def test_text_only_qwen2_is_covered():
    adapter = _text_adapter("qwen2")
    assert prefix_sharing.unsupported_reason(adapter.model) is None
    rows = [{"prompt": "What colour is the shape?"}, {"prompt": "The quick brown fox jumps over the lazy dog. Why?"}]
    _assert_same(adapter, _state(adapter, rows, G=2, T=5), torch.arange(4))


def test_uncovered_family_falls_back_with_one_warning(caplog):
    adapter = _text_adapter("mistral", sliding_window=4096)  # one window over every layer
    assert "sliding-window" in prefix_sharing.unsupported_reason(adapter.model)
    rows = [{"prompt": "What colour is the shape?"}, {"prompt": "Which way does the object move?"}]
    prefix_sharing._warned.clear()
    with caplog.at_level(logging.WARNING, logger=prefix_sharing.__name__):
        torch.manual_seed(0)
        rollout = adapter.rollout(rows, group_size=2)  # sampling and log-prob forward both fall back
        adapter.logprobs(rollout, torch.arange(4))
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2 and all("naive path because sliding-window" in m for m in messages)
    assert rollout.old_logprobs.shape == (4, 5)


def test_video_prompt_continues_the_naive_rope_index(tiny_vlm_path):
    """A video whose temporal rope index outruns its spatial one (slow frame rate): the shared forward and the
    KV-expanded sampler place completion tokens where the naive full-sequence forward does."""
    adapter = build_vlm_adapter({"name_or_path": tiny_vlm_path, "max_new_tokens": 5, "old_logprobs": "sampler"})
    messages = [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "Which way does it move?"}]}]
    text = adapter.processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    g = torch.Generator().manual_seed(0)
    frames = torch.randint(0, 255, (8, 3, 56, 56), dtype=torch.uint8, generator=g)
    video = dict(adapter.processor(text=[text], videos=[frames], return_tensors="pt"))
    video["second_per_grid_ts"] = torch.tensor([4.0])  # temporal positions 0, 8, 16, 24 ≫ spatial extent 2
    image = adapter._encode_prompt(_rows()[0])
    state = _state(adapter, None, G=3, T=5, encodings=[video, image])
    _assert_same(adapter, state, torch.arange(6))
    # Sampling from the same encodings: the sampler's log-probs equal the naive forward's of the drawn tokens.
    completion, sampler_logp = adapter._sample(state.cache.encodings, 3, greedy=False)
    sampled = VLMState(completion_ids=completion, prompt_of=state.prompt_of, cache=state.cache)
    adapter.args.prefix_sharing = False
    naive = adapter._token_logprobs(adapter._unwrapped(), sampled, torch.arange(6)).detach()
    m = adapter._completion_mask(completion).bool()
    model_reductions(adapter._unwrapped()).assert_logprobs_close(sampler_logp[m], naive[m])


def test_qwen2_vl_is_covered(tiny_vlm_path):
    """Qwen2-VL (the other mRoPE family): a tiny random one with the tiny Qwen2.5-VL's processor and token ids."""
    import json
    from pathlib import Path

    from transformers import AutoProcessor, Qwen2VLConfig, Qwen2VLForConditionalGeneration

    c = json.loads((Path(tiny_vlm_path) / "config.json").read_text())
    t = c["text_config"]
    config = Qwen2VLConfig(
        text_config=dict(
            vocab_size=t["vocab_size"],
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            pad_token_id=t["pad_token_id"],
            bos_token_id=t["pad_token_id"],
            eos_token_id=t["eos_token_id"],
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]},
        ),
        vision_config=dict(
            depth=2,
            embed_dim=32,
            hidden_size=64,
            num_heads=2,
            mlp_ratio=2,
            patch_size=14,
            spatial_merge_size=2,
            temporal_patch_size=2,
        ),
        **{k: c[k] for k in ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id")},
    )
    torch.manual_seed(0)
    model = Qwen2VLForConditionalGeneration(config).train()
    args = VLMArgs(max_new_tokens=5, sample_draw="multinomial")  # generate's draws
    adapter = VLMAdapter(model, AutoProcessor.from_pretrained(tiny_vlm_path), args, None)
    assert prefix_sharing.unsupported_reason(model) is None
    _assert_same(adapter, _state(adapter, _rows(), G=2, T=5), torch.arange(4))
    ids = {}
    for kv in (True, False):
        adapter.args.kv_expand_rollout = kv
        torch.manual_seed(4)
        ids[kv] = adapter._sample([adapter._encode_prompt(r) for r in _rows()], 3, greedy=False)[0]
    assert torch.equal(ids[True], ids[False])


def _attention_calls(model) -> list[int]:
    """Batch sizes of every call of the first decoder layer's attention (recomputations included)."""
    decoder = prefix_sharing.core_model(model).model  # Qwen2Model, or Qwen2_5_VLModel holding language_model
    layers = getattr(decoder, "language_model", decoder).layers
    calls: list[int] = []
    layers[0].self_attn.register_forward_hook(lambda m, args, out: calls.append(out[0].shape[0]))
    return calls


PACKED_LAYOUTS = {  # option → the first layer's attention calls, shared then naive
    "gradient_checkpointing": ([2, 2], [4, 4]),  # forward, then the checkpoint's recompute in the backward
    "packed_training": ([2], [4]),  # one forward (the naive path keeps no cache: one row per completion)
}


@pytest.mark.parametrize("option", PACKED_LAYOUTS)
@pytest.mark.parametrize("lora", [False, True])
def test_packed_forward_keeps_prompt_sharing_exact(tiny_vlm_path, lora, option, caplog):
    """Checkpointed layers drop the KV cache (and ``packed_training`` asks for no cache), so the shared forward packs
    [prompt ; completion slots] into one forward with a 4-D mask; it equals the naive forward (also checkpointed
    under checkpointing) and really runs packed, one row per prompt (checkpointed: recomputing its layers)."""
    from mmgrpo.config import LoraConfig

    adapter = build_vlm_adapter(
        {"name_or_path": tiny_vlm_path, "max_new_tokens": 7, option: True},
        lora=LoraConfig(enabled=True, r=4, alpha=8) if lora else None,
    )
    model = adapter._unwrapped()
    if lora:
        with torch.no_grad():
            for n, p in model.named_parameters():
                if "lora_B" in n:
                    p.normal_(0, 0.1)
    assert prefix_sharing.checkpointing(model) == (option == "gradient_checkpointing")
    assert prefix_sharing.unsupported_reason(model) is None
    state = _state(adapter, _rows(), G=3, T=7)
    prefix_sharing._warned.clear()
    with caplog.at_level(logging.WARNING, logger=prefix_sharing.__name__):
        _assert_same(adapter, state, torch.arange(6))  # whole groups
        _assert_same(adapter, state, torch.tensor([5, 0, 3, 4]))  # across groups, unordered
    assert not [r for r in caplog.records if r.name == prefix_sharing.__name__]  # no fallback
    shared, naive = PACKED_LAYOUTS[option]
    calls = _attention_calls(model)
    _logp_and_grads(adapter, state, torch.tensor([5, 0, 3, 4]), shared=True)
    assert calls == shared  # one packed row per prompt
    calls.clear()
    _logp_and_grads(adapter, state, torch.tensor([5, 0, 3, 4]), shared=False)
    assert calls == naive  # the naive path: one row per completion


def test_gradient_checkpointing_text_only_qwen2():
    adapter = _text_adapter("qwen2")
    adapter.model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    assert prefix_sharing.checkpointing(adapter.model) and prefix_sharing.unsupported_reason(adapter.model) is None
    rows = [{"prompt": "What colour is the shape?"}, {"prompt": "The quick brown fox jumps over the lazy dog. Why?"}]
    state = _state(adapter, rows, G=3, T=5)
    _assert_same(adapter, state, torch.arange(6))
    calls = _attention_calls(adapter.model)
    _assert_same(adapter, state, torch.tensor([1, 4, 5]))  # one completion of prompt 0, two of prompt 1
    assert calls == [3, 3, 2, 2]  # naive (3 rows) then packed (2 rows), each forward + recompute


def test_gradient_checkpointing_rollout_keeps_the_kv_expanded_sampler(tiny_vlm_path):
    """Sampling runs in eval mode (the cache stays on); the checkpointed training forward scores its tokens."""
    adapter = build_vlm_adapter(
        {"name_or_path": tiny_vlm_path, "max_new_tokens": 5, "old_logprobs": "sampler", "gradient_checkpointing": True}
    )
    patches = []
    adapter._unwrapped().model.visual.register_forward_hook(lambda m, a, out: patches.append(a[0].shape[0]))
    rollout = adapter.rollout(_rows(), group_size=3)
    assert len(patches) == 1  # one prefill: the KV-expanded sampler ran
    logp = adapter.logprobs(rollout, torch.arange(6))
    assert len(patches) == 2 and prefix_sharing.checkpointing(adapter._unwrapped())  # one packed training forward
    m = rollout.mask.bool()
    model_reductions(adapter._unwrapped()).assert_logprobs_close(logp[m].detach(), rollout.old_logprobs[m])


@pytest.mark.parametrize("V", [5, 3000])
def test_inverse_cdf_draws_the_softmax_distribution(V):
    """Empirical frequencies of inversion draws match the weights; zero-weight columns (banned) are never drawn."""
    torch.manual_seed(0)
    weights = torch.rand(2, V) ** 4  # [2, V]
    weights[:, ::3] = 0.0
    weights[1, -1] = 0.0
    n = 20_000
    counts = torch.zeros(2, V)
    for _ in range(n // 500):
        u = torch.rand(500, dtype=torch.float64)  # [500]
        index, total = noise.draw_by_inversion(weights.repeat(250, 1), u, block=64)  # [500]
        counts.index_put_((torch.arange(500) % 2, index), torch.ones(500), accumulate=True)
        torch.testing.assert_close(total[:2], weights.double().sum(1), rtol=1e-6, atol=0)  # fp32 block sums
    assert counts[weights == 0].sum() == 0
    p = weights / weights.sum(1, keepdim=True)  # [2, V]
    expected = p * (n / 2)  # [2, V] draws per column
    sd = (expected * (1 - p)).sqrt()
    assert ((counts - expected).abs() <= 6 * sd + 2).all()  # binomial: every column within 6 sd (+2 for tiny ones)
    assert counts.sum() == n


def test_draw_token_logprobs_equal_log_softmax():
    """Both draws return log_softmax(scores)[token] (before top-k/top-p), without the [B, V] log-softmax."""
    torch.manual_seed(0)
    scores = torch.randn(6, 300) * 3
    scores[:, 7] = float("-inf")
    for draw in ("inverse_cdf", "multinomial"):
        for top in (dict(), dict(top_k=20, top_p=0.8)):
            spec = decode.SamplingSpec(max_new_tokens=1, eos_ids=[0], pad_id=0, draw=draw, **top)
            token, logp = decode.draw_token(scores.clone(), spec)
            assert (token != 7).all()
            ref = scores.log_softmax(-1).gather(1, token[:, None]).squeeze(1)
            Reductions(terms=300, depth=1).assert_logprobs_close(logp, ref)  # one normaliser over V = 300


@pytest.mark.parametrize("checkpointed", [False, True])
def test_qwen3_vl_shared_forward_equals_naive(tmp_path, checkpointed, caplog):
    """Qwen3-VL (interleaved mRoPE, DeepStack visual features in the first decoder layer): the shared forward and,
    under gradient checkpointing, the packed one give the naive forward's log-probs and gradients, without a
    fallback; sampling prefills once."""
    from mmgrpo.modalities.vlm.tiny import build_tiny_qwen3_vl

    path = str(build_tiny_qwen3_vl(tmp_path / "qwen3_vl"))
    adapter = build_vlm_adapter(
        {
            "name_or_path": path,
            "max_new_tokens": 6,
            "temperature": 0.8,
            "gradient_checkpointing": checkpointed,
            "old_logprobs": "sampler",
        }
    )
    model = adapter._unwrapped()
    assert model.config.model_type == "qwen3_vl" and prefix_sharing.unsupported_reason(model) is None
    assert prefix_sharing.checkpointing(model) == checkpointed
    state = _state(adapter, _rows(), G=3, T=6)
    prefix_sharing._warned.clear()
    with caplog.at_level(logging.WARNING, logger=prefix_sharing.__name__):
        _assert_same(adapter, state, torch.arange(6))
        _assert_same(adapter, state, torch.tensor([5, 0, 3]))
    assert not [r for r in caplog.records if r.name == prefix_sharing.__name__]  # no fallback
    calls = []
    model.model.visual.register_forward_hook(lambda m, a, out: calls.append(1))
    rollout = adapter.rollout(_rows(), group_size=3)
    assert len(calls) == 1  # one prefill for both prompts: the KV-expanded sampler ran
    logp = adapter.logprobs(rollout, torch.arange(6))
    m = rollout.mask.bool()
    model_reductions(adapter._unwrapped()).assert_logprobs_close(logp[m].detach(), rollout.old_logprobs[m])


# The media models with 1-D positions under the shared paths, built-in tiny models of the real architectures
# (modalities/vlm/tiny.py): name → (model type, the attribute of its vision tower).
MEDIA_MODELS = {
    "tiny-smolvlm": ("idefics3", "vision_model"),  # SigLIP, pixel shuffle, Llama decoder
    "tiny-llava": ("llava", "vision_tower"),  # CLIP at layer -2, MLP projector, Llama decoder
    "tiny-llava-onevision": ("llava_onevision", "vision_tower"),  # anyres tiles, unpadding, newline features, Qwen2
    "tiny-internvl": ("internvl", "vision_tower"),  # dynamic tiles + thumbnail, pixel shuffle, Qwen2
    "tiny-gemma3": ("gemma3", "vision_tower"),  # SigLIP, pooled soft tokens seen both ways, sliding + global layers
}


def _media_rows():
    """:func:`_rows` with the second image cut to 84 × 42 pixels: another aspect ratio, so the tiling models give the
    two prompts different tile counts (LLaVA-OneVision 5 and 7, InternVL 1 and 3 tiles)."""
    rows = _rows()
    image = rows[1]["image"]
    return [rows[0], dict(rows[1], image=image.crop((0, 0, image.size[0], image.size[1] // 2)))]


@pytest.mark.parametrize("checkpointed", [False, True], ids=["cache", "checkpointed"])
@pytest.mark.parametrize("name", list(MEDIA_MODELS))
def test_media_models_share_the_prompt_exactly(name, checkpointed, caplog):
    """SmolVLM (Idefics3), LLaVA, LLaVA-OneVision, InternVL and Gemma 3: the shared forward and, under gradient
    checkpointing, the packed one give the naive forward's log-probs and gradients without a fallback, on two prompts
    whose images differ in tile count (Gemma 3: its image tokens attend to each other both ways, and its sliding
    layers' window, 4, is shorter than the prompts), and the KV-expanded sampler (one prefill, one vision-tower call)
    gives the training forward's log-probs."""
    adapter = build_vlm_adapter(
        {
            "name_or_path": name,
            "max_new_tokens": 6,
            "temperature": 0.8,
            "gradient_checkpointing": checkpointed,
            "old_logprobs": "sampler",
        }
    )
    model = adapter._unwrapped()
    model_type, tower = MEDIA_MODELS[name]
    assert model.config.model_type == model_type and prefix_sharing.unsupported_reason(model) is None
    state = _state(adapter, _media_rows(), G=3, T=6)
    prefix_sharing._warned.clear()
    with caplog.at_level(logging.WARNING, logger=prefix_sharing.__name__):
        _assert_same(adapter, state, torch.arange(6))
        _assert_same(adapter, state, torch.tensor([5, 0, 3]))
        calls = []
        getattr(model.model, tower).register_forward_hook(lambda m, a, out: calls.append(1))
        rollout = adapter.rollout(_media_rows(), group_size=3)
    assert not [r for r in caplog.records if r.name == prefix_sharing.__name__]  # no fallback
    assert len(calls) == 1  # one prefill for both prompts: the KV-expanded sampler ran
    logp = adapter.logprobs(rollout, torch.arange(6))
    m = rollout.mask.bool()
    model_reductions(model).assert_logprobs_close(logp[m].detach(), rollout.old_logprobs[m])


def test_llava_onevision_batches_prompts_of_different_tile_counts():
    """LLaVA-OneVision's ``pixel_values`` [images, tiles, C, H, W]: the two prompts' images have 5 and 7 tiles, and
    their batch pads the first with zero tiles, which the model never reads (``image_sizes`` gives each count)."""
    adapter = build_vlm_adapter({"name_or_path": "tiny-llava-onevision", "max_new_tokens": 4})
    encodings = [adapter._encode_prompt(row) for row in _media_rows()]
    assert [e["pixel_values"].shape[1] for e in encodings] == [5, 7]
    pixels = adapter.collate(encodings)["pixel_values"]  # [2, 7, 3, 28, 28]
    assert pixels.shape == (2, 7, 3, 28, 28) and torch.equal(pixels[1], encodings[1]["pixel_values"][0])
    assert torch.equal(pixels[0, :5], encodings[0]["pixel_values"][0]) and not pixels[0, 5:].any()


@pytest.mark.parametrize("name", list(MEDIA_MODELS))
def test_media_models_kv_expanded_rollout_draws_the_same_tokens_as_generate(name):
    """Same seed → the KV-expanded sampler draws generate(num_return_sequences=G)'s tokens, with the naive forward's
    log-probs; greedy evaluation agrees."""
    rows, G = _media_rows(), 4
    args = {"name_or_path": name, "max_new_tokens": 6, "min_new_tokens": 2, "temperature": 0.7}
    naive = build_vlm_adapter({**args, "kv_expand_rollout": False, "prefix_sharing": False})
    shared = build_vlm_adapter({**args, "old_logprobs": "sampler", "sample_draw": "multinomial"})
    torch.manual_seed(3)
    r_naive = naive.rollout(rows, G)
    torch.manual_seed(3)
    r_shared = shared.rollout(rows, G)
    assert torch.equal(r_shared.state.completion_ids, r_naive.state.completion_ids)
    model_reductions(shared._unwrapped()).assert_logprobs_close(r_shared.old_logprobs, r_naive.old_logprobs)
    assert shared.evaluate(rows) == naive.evaluate(rows)


def test_reserved_cache_layer_equals_concatenation_and_writes_in_place():
    """ReservedLayer (decode's KV cache): the same keys/values as transformers' concatenating DynamicLayer, written
    into one buffer reserved for the completion (no reallocation while it fits), growing by concatenation past it."""
    from transformers.cache_utils import DynamicCache, DynamicLayer

    g = torch.Generator().manual_seed(0)
    k0, v0 = torch.randn(3, 2, 5, 4, generator=g), torch.randn(3, 2, 5, 4, generator=g)  # [B, H, L, d]
    plain, reserved = DynamicLayer(), DynamicLayer()
    plain.update(k0, v0)
    reserved.update(k0, v0)
    cache = DynamicCache()
    cache.layers = [reserved]
    decode.reserve_cache(cache, extra=2)
    layer = cache.layers[0]
    assert isinstance(layer, decode.ReservedLayer) and layer.get_seq_length() == 5
    rows = torch.tensor([0, 0, 1, 2, 2])  # the G-way expansion, after reserving: the room comes along
    plain.reorder_cache(rows)
    cache.reorder_cache(rows)
    assert torch.equal(layer.keys, plain.keys) and torch.equal(layer.values, plain.values)
    buffer = layer.keys.data_ptr()
    for t in range(4):  # 2 steps inside the reserved room, then 2 past it
        k, v = torch.randn(5, 2, 1, 4, generator=g), torch.randn(5, 2, 1, 4, generator=g)
        want_k, want_v = plain.update(k, v)
        got_k, got_v = layer.update(k, v)
        assert torch.equal(got_k, want_k) and torch.equal(got_v, want_v)
        assert layer.get_seq_length() == 6 + t
        if t < 2:
            assert got_k.data_ptr() == buffer  # a view of the reserved buffer: nothing copied but the new position


def test_kv_expanded_sampler_reserves_the_cache_and_keeps_its_draws(tiny_vlm_path, monkeypatch):
    """The KV-expanded sampler decodes on a reserved cache (every step's K/V written in place), with the same keyed
    tokens and log-probs as on transformers' concatenating cache (the expanded cache: shared_prefix_attention off)."""
    args = {"name_or_path": tiny_vlm_path, "max_new_tokens": 6, "old_logprobs": "sampler"}
    adapter = build_vlm_adapter({**args, "shared_prefix_attention": False})
    rows, G = _rows(), 3
    keys = noise.NoiseKeys(seed=0, step=0, positions=tuple(range(len(rows))), group_size=G)
    updates = []
    update = decode.ReservedLayer.update
    monkeypatch.setattr(
        decode.ReservedLayer, "update", lambda self, *a, **k: (updates.append(1), update(self, *a, **k))[1]
    )
    reserved = adapter.rollout(rows, G, keys=keys)
    assert updates  # the decode steps went through the reserved layers
    monkeypatch.setattr(prefix_sharing, "reserve_cache", lambda cache, extra: None)  # transformers' DynamicLayer
    plain = adapter.rollout(rows, G, keys=keys)
    assert torch.equal(reserved.state.completion_ids, plain.state.completion_ids)
    model_reductions(adapter._unwrapped()).assert_logprobs_close(reserved.old_logprobs, plain.old_logprobs)


def test_an_untested_media_model_keeps_the_naive_path_with_its_reason():
    """LLaVA-NeXT's positions are 1-D, but its image layout is not under these tests (LLaVA-OneVision's, from which
    it differs, is): naive path, one-line reason."""
    from transformers import CLIPVisionConfig, LlamaConfig, LlavaNextConfig, LlavaNextForConditionalGeneration

    text = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4)
    vision = CLIPVisionConfig(
        hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, image_size=28, patch_size=14
    )
    config = LlavaNextConfig(
        text_config=text, vision_config=vision, image_token_index=63, image_grid_pinpoints=[[28, 28], [28, 56]]
    )
    reason = prefix_sharing.unsupported_reason(LlavaNextForConditionalGeneration(config))
    assert reason == "multimodal model type 'llava_next' is not yet tested against the naive path (text decoders are)"


@pytest.mark.parametrize("model_type", list(TEXT_ARCHITECTURES))
def test_every_decoder_architecture_fuses_its_head_like_the_logits_path(model_type, monkeypatch):
    """The fused lm_head log-probs and gradients (shared forward) equal the logits path's; a head whose logits the
    config rescales (Granite's ``logits_scaling``, Gemma 2's soft-capping) is not fused."""
    import mmgrpo.modalities.tokens.policy as policy
    from mmgrpo.modalities.tokens.logprobs import fusable_head
    from tests.test_fused_logprobs import _parity

    adapter = _text_adapter(model_type, **TEXT_ARCHITECTURES[model_type])
    if model_type in SCALED_HEADS:
        assert fusable_head(adapter.model) is None
        return
    assert fusable_head(adapter.model) is not None
    _parity(monkeypatch, policy, adapter, _state(adapter, TEXT_ROWS, G=2, T=5), torch.arange(4))


@pytest.mark.parametrize("name", list(MEDIA_MODELS))
def test_media_models_fuse_their_head_like_the_logits_path(name, monkeypatch):
    """The media models' lm_head (a plain linear layer) is fused, with the logits path's log-probs and gradients."""
    import mmgrpo.modalities.tokens.policy as policy
    from mmgrpo.modalities.tokens.logprobs import fusable_head
    from tests.test_fused_logprobs import _parity

    adapter = build_vlm_adapter({"name_or_path": name, "max_new_tokens": 5})
    assert fusable_head(adapter.model) is not None
    _parity(monkeypatch, policy, adapter, _state(adapter, _media_rows(), G=2, T=5), torch.arange(4))
