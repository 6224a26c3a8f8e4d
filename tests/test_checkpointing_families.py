"""``model.args.gradient_checkpointing`` for the audio-LLM, Whisper and AR-image adapters: the checkpointed
training forward gives the log-probs and gradients of the plain one, and really recomputes its layers.

Tolerances (fp32): within the model's rounding budget (tests/numerics.py: its longest reduction and depth, from its
config), as in the prompt-sharing tests, because the checkpointed path of the audio-LLM (the packed forward) and of
the AR-image adapter (the naive per-row forward) sums in another order than the cached split-attention path it is
compared with; log-probs on the log-prob scale, gradients (the backward's budget) relative to each tensor's largest
entry, times the guidance scale s where ℓ_u + s·(ℓ_c − ℓ_u) scales the branches' rounding.
"""

import shutil

import pytest
import torch

from mmgrpo.config import LoraConfig
from tests.numerics import logprob_scale, model_reductions


def _first_decoder_attention(model):
    """The self-attention of the first decoder layer: a hook on it runs again when its checkpointed layer is
    recomputed (transformers checkpoints the layer's ``forward``, so hooks on the layer itself run once)."""
    return next(m for m in model.modules() if type(m).__name__.endswith("DecoderLayer")).self_attn


def _logp_and_grads(adapter, state, index):
    named = [(n, p) for n, p in adapter.model.named_parameters() if p.requires_grad]
    calls = []
    handle = _first_decoder_attention(adapter.model).register_forward_hook(lambda *a: calls.append(1))
    try:
        logp = adapter._token_logprobs(adapter.model, state, index)  # [n, T]
        forward_calls = len(calls)
        w = torch.linspace(-1, 1, logp.numel()).view_as(logp)
        grads = torch.autograd.grad((logp * w).sum(), [p for _, p in named], allow_unused=True)
    finally:
        handle.remove()
    return logp.detach(), dict(zip([n for n, _ in named], grads)), forward_calls, len(calls) - forward_calls


def _assert_same(build, state_of, index, factor=1.0):
    plain, ckpt = build(False), build(True)
    ckpt._unwrapped().load_state_dict(plain._unwrapped().state_dict())  # LoRA A draws from the global RNG
    state = state_of(plain)
    lp, g, _, recomputed_plain = _logp_and_grads(plain, state, index)
    lp_c, g_c, forwards, recomputed = _logp_and_grads(ckpt, state, index)
    assert recomputed_plain == 0 and recomputed == forwards > 0  # each checkpointed call runs again in backward
    budget = model_reductions(plain._unwrapped())
    torch.testing.assert_close(lp_c, lp, atol=factor * budget.tol(logprob_scale(lp)), rtol=0)
    assert g.keys() == g_c.keys() and sum(v is not None for v in g.values()) > len(g) // 2
    for name, want in g.items():
        assert (g_c[name] is None) == (want is None), name
        if want is not None:
            atol = factor * budget.backward().tol(float(want.abs().max()))
            torch.testing.assert_close(g_c[name], want, atol=atol, rtol=0, msg=name)


def _speech_rows(**kw):
    if shutil.which("espeak-ng") is None:
        pytest.skip("espeak-ng is not installed (apt-get install -y espeak-ng): no speech to synthesise")
    from mmgrpo.tasks.spoken_digits import SpokenDigitsArgs, SpokenDigitsTask

    return SpokenDigitsTask(SpokenDigitsArgs(train_size=2, eval_size=1, **kw)).train_rows()


@pytest.mark.parametrize("lora", [False, True])
def test_audio_llm_checkpointing_keeps_prompt_sharing_exact(lora, mmgrpo_cache):
    from mmgrpo.modalities.speech.audio_llm import build_audio_llm_adapter
    from mmgrpo.modalities.speech.tiny import resolve_model_path
    from mmgrpo.modalities.tokens import prefix_sharing

    rows = _speech_rows(question="second_word")
    path = resolve_model_path("tiny-qwen2-audio")

    def build(ckpt):
        args = {"name_or_path": path, "max_new_tokens": 5, "temperature": 0.8, "gradient_checkpointing": ckpt}
        adapter = build_audio_llm_adapter(args, lora=LoraConfig(enabled=True, r=4, alpha=8) if lora else None)
        assert prefix_sharing.checkpointing(adapter.model) == ckpt
        with torch.no_grad():  # LoRA B starts at zero: make the adapter matter
            for n, p in adapter._unwrapped().named_parameters():
                if "lora_B" in n:
                    p.normal_(0, 0.1)
        return adapter

    def state_of(adapter):
        torch.manual_seed(0)
        return adapter.rollout(rows, group_size=3).state

    _assert_same(build, state_of, torch.tensor([5, 0, 3, 4]))


def test_whisper_checkpointing_is_exact(mmgrpo_cache):
    from mmgrpo.modalities.speech.adapter import build_whisper_adapter
    from mmgrpo.modalities.speech.tiny import resolve_model_path

    rows = _speech_rows(warmup_size=2)
    path = resolve_model_path("tiny-whisper")

    def build(ckpt):
        return build_whisper_adapter({"name_or_path": path, "temperature": 0.8, "gradient_checkpointing": ckpt})

    def state_of(adapter):
        torch.manual_seed(0)
        return adapter.rollout(rows, group_size=3).state

    _assert_same(build, state_of, torch.arange(6))


def test_ar_image_checkpointing_is_exact(mmgrpo_cache):
    from mmgrpo.modalities.ar_image.adapter import build_ar_image_adapter
    from tests.test_ar_image_adapter import _sampled_state

    def build(ckpt):
        args = {"name_or_path": "tiny-janus", "guidance_scale": 3.0, "gradient_checkpointing": ckpt}
        return build_ar_image_adapter(args, seed=0)

    _assert_same(build, lambda adapter: _sampled_state(adapter)[0], torch.tensor([4, 0, 1]), factor=3.0)
