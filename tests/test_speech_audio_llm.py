"""Qwen2-Audio adapter (VLM token policy + audio encoder) on the tiny real architecture and real espeak-ng speech:
exact ratio, audio encoder once per prompt, shared prompt == naive per-sample forward (log-probs and gradients),
and the adapter contract.

The naive reference is computed here, sample by sample, unpadded: the model's own forward on [prompt ; completion]
with the audio features, logits at positions L-1 .. L+T-2. Tolerances (fp32): within the model's rounding budget
(tests/numerics.py: its longest reduction and depth, from its config); log-probs on the log-prob scale, gradients (the
backward's budget) relative to each tensor's largest entry.
"""

import shutil

import pytest
import torch

from mmgrpo.config import ConfigError, LoraConfig
from mmgrpo.modalities.speech.audio import AudioError
from mmgrpo.modalities.speech.audio_llm import build_audio_llm_adapter
from tests.numerics import model_reductions


@pytest.fixture(scope="session")
def tiny_audio_llm_path(mmgrpo_cache):
    from mmgrpo.modalities.speech.tiny import resolve_model_path

    return resolve_model_path("tiny-qwen2-audio")


@pytest.fixture(scope="session")
def qa_rows(mmgrpo_cache):
    if shutil.which("espeak-ng") is None:
        pytest.skip("espeak-ng is not installed (apt-get install -y espeak-ng): no speech to synthesise")
    from mmgrpo.tasks.spoken_digits import SpokenDigitsArgs, SpokenDigitsTask

    rows = SpokenDigitsTask(SpokenDigitsArgs(question="second_word", train_size=6, eval_size=3)).train_rows()
    return [rows[0], dict(rows[1], prompt="Listen to the audio and answer the question. " + rows[1]["prompt"]), rows[2]]


def _adapter(path, lora=False, **kw):
    args = {"name_or_path": path, "max_new_tokens": 5, "temperature": 0.8, **kw}
    adapter = build_audio_llm_adapter(args, lora=LoraConfig(enabled=True, r=4, alpha=8) if lora else None)
    if lora:  # LoRA B starts at zero: make the adapter matter
        with torch.no_grad():
            for n, p in adapter._unwrapped().named_parameters():
                if "lora_B" in n:
                    p.normal_(0, 0.1)
    return adapter


@pytest.mark.parametrize("old", ["recompute", "sampler"])
def test_ratio_is_one_before_update(tiny_audio_llm_path, qa_rows, old):
    adapter = _adapter(tiny_audio_llm_path, lora=True, old_logprobs=old)
    torch.manual_seed(0)
    rollout = adapter.rollout(qa_rows[:2], group_size=4)
    assert rollout.old_logprobs.shape == (8, 5) and torch.equal(
        rollout.prompt_index, torch.arange(2).repeat_interleave(4)
    )
    logp = adapter.logprobs(rollout, torch.arange(8))
    m = rollout.mask.bool()
    assert m.sum() > 8 and logp.requires_grad
    model_reductions(adapter._unwrapped()).assert_logprobs_close(logp[m].detach(), rollout.old_logprobs[m])


def test_audio_encoder_runs_once_per_prompt(tiny_audio_llm_path, qa_rows):
    adapter = _adapter(tiny_audio_llm_path, old_logprobs="sampler")
    batches = []
    adapter.model.model.audio_tower.register_forward_hook(lambda m, a, out: batches.append(a[0].shape[0]))
    rollout = adapter.rollout(qa_rows, group_size=4)
    assert batches == [3]  # one prefill over the 3 prompts (audio encoder included), KV expanded 4 ways
    batches.clear()
    adapter.logprobs(rollout, torch.arange(12))
    assert batches == [3]  # training forward: once per distinct prompt, not per sample
    batches.clear()
    adapter.logprobs(rollout, torch.tensor([0, 5, 6]))
    assert batches == [2]  # samples of prompts 0, 1, 1: two distinct prompts


def _naive_logprobs(adapter, rollout, index):
    """Per-sample, unpadded [prompt ; completion] forward of the model itself (the path TRL takes)."""
    t = adapter
    model = t._unwrapped()
    out = []
    for b in index.tolist():
        enc = rollout.state.cache.encodings[int(rollout.state.prompt_of[b])]
        comp = rollout.state.completion_ids[b : b + 1]  # [1, T]
        L, T = enc["input_ids"].shape[1], comp.shape[1]
        ids = torch.cat([enc["input_ids"], comp], dim=1)
        logits = (
            model(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                input_features=enc["input_features"],
                feature_attention_mask=enc["feature_attention_mask"],
            )
            .logits[:, L - 1 : L + T - 1]
            .float()
        )
        logits[..., t.suppress_ids] = float("-inf")
        logp = torch.log_softmax(logits / t.args.temperature, dim=-1).gather(-1, comp[..., None]).squeeze(-1)
        out.append(logp)
    return torch.cat(out) * rollout.mask[index]  # [n, T]


def _grads(model, logp, weights):
    model.zero_grad(set_to_none=True)
    (logp * weights).sum().backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("lora", [False, True])
def test_shared_prompt_equals_naive_logprobs_and_gradients(tiny_audio_llm_path, qa_rows, lora):
    adapter = _adapter(tiny_audio_llm_path, lora=lora)
    rollout = adapter.rollout(qa_rows[:2], group_size=3)  # two prompts of different lengths: a padded batch
    model = adapter._unwrapped()
    for index in (torch.arange(6), torch.tensor([5, 0, 3, 4])):
        weights = torch.randn((len(index), 5), generator=torch.Generator().manual_seed(1))
        naive = _naive_logprobs(adapter, rollout, index)
        g_naive = _grads(model, naive, weights)
        shared = adapter.logprobs(rollout, index)
        g_shared = _grads(model, shared, weights)
        budget = model_reductions(model)
        budget.assert_logprobs_close(shared.detach(), naive.detach())
        assert g_naive.keys() == g_shared.keys() and any("audio_tower" in n for n in g_naive)
        for name in g_naive:
            budget.backward().assert_close(g_shared[name], g_naive[name], msg=name)


def test_audio_tokens_are_never_sampled(tiny_audio_llm_path, qa_rows):
    adapter = _adapter(tiny_audio_llm_path, temperature=2.0, max_new_tokens=10)
    audio_ids = adapter.tokenizer.convert_tokens_to_ids(["<|AUDIO|>", "<|audio_bos|>", "<|audio_eos|>"])
    assert set(audio_ids) <= set(adapter.suppress_ids)
    torch.manual_seed(0)
    rollout = adapter.rollout(qa_rows[:2], group_size=8)
    assert not torch.isin(rollout.state.completion_ids, torch.tensor(audio_ids)).any()
    assert rollout.extras["audio_array"][0] is rollout.extras["audio_array"][7]


def test_reference_is_policy_at_lora_init_and_a_step_changes_parameters(tiny_audio_llm_path, qa_rows):
    adapter = build_audio_llm_adapter(
        {"name_or_path": tiny_audio_llm_path, "max_new_tokens": 5}, lora=LoraConfig(enabled=True, r=4, alpha=8)
    )
    rollout = adapter.rollout(qa_rows[:2], group_size=3)
    idx = torch.arange(6)
    ref_before = adapter.ref_logprobs(rollout, idx)
    torch.testing.assert_close(ref_before, adapter.logprobs(rollout, idx).detach(), atol=0, rtol=0)
    params = adapter.trainable_parameters()
    before = [p.detach().clone() for p in params]
    opt = torch.optim.AdamW(params, lr=1e-2)
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5, 1.0, -1.0])[:, None]
    loss = -(adapter.logprobs(rollout, idx) * adv).sum() / rollout.mask.sum()
    assert torch.isfinite(loss)
    loss.backward()
    opt.step()
    assert any(not torch.equal(b, p) for b, p in zip(before, params))
    torch.testing.assert_close(adapter.ref_logprobs(rollout, idx), ref_before, atol=0, rtol=0)


def test_deterministic_eval_and_save_pretrained_round_trip(tiny_audio_llm_path, qa_rows, tmp_path):
    adapter = _adapter(tiny_audio_llm_path)
    with torch.no_grad():
        for p in adapter.trainable_parameters():
            p.add_(0.01 * torch.randn_like(p))
    out = adapter.evaluate(qa_rows)
    assert out == adapter.evaluate(qa_rows) and len(out) == 3
    adapter.save_pretrained(str(tmp_path / "saved"))
    reloaded = build_audio_llm_adapter({"name_or_path": str(tmp_path / "saved"), "max_new_tokens": 5})
    assert reloaded.evaluate(qa_rows) == out


def test_supervised_loss_and_bad_audio(tiny_audio_llm_path, qa_rows):
    adapter = _adapter(tiny_audio_llm_path)
    rows = [dict(r, target=f"<answer>{r['answer']}</answer>") for r in qa_rows[:2]]
    opt = torch.optim.AdamW(adapter.trainable_parameters(), lr=3e-3)
    first = adapter.supervised_loss(rows).item()
    for _ in range(20):
        loss = adapter.supervised_loss(rows)
        loss.backward()
        opt.step()
        opt.zero_grad()
    assert loss.item() < 0.5 * first
    with pytest.raises(AudioError, match=r"^row 'audio': no audio file at '/missing.wav'"):
        adapter.rollout([qa_rows[0], dict(qa_rows[0], audio="/missing.wav")], group_size=2)


def test_args_are_validated(tiny_audio_llm_path):
    with pytest.raises(ConfigError, match=r"model.args.old_logprobs"):
        build_audio_llm_adapter({"name_or_path": tiny_audio_llm_path, "old_logprobs": "cached"})
    with pytest.raises(ConfigError, match=r"model.args.temperature"):
        build_audio_llm_adapter({"name_or_path": tiny_audio_llm_path, "temperature": 0.0})
