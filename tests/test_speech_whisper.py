"""Whisper adapter on the tiny real architecture and real espeak-ng speech: exact ratio, encoder once per prompt,
shared == naive (log-probs and gradients), the model's decoder prompt, and the adapter contract.

Tolerances (fp32): within the model's rounding budget (tests/numerics.py: its longest reduction and depth, from its
config); log-probs on the log-prob scale, gradients (the backward's budget) relative to each tensor's largest entry.
"""

import shutil

import pytest
import torch

from mmgrpo.config import LoraConfig
from mmgrpo.modalities.speech.adapter import WhisperArgs, build_whisper_adapter
from tests.numerics import model_reductions


@pytest.fixture(scope="session")
def tiny_whisper_path(mmgrpo_cache):
    from mmgrpo.modalities.speech.tiny import resolve_model_path

    return resolve_model_path("tiny-whisper")


@pytest.fixture(scope="session")
def speech_rows(mmgrpo_cache):
    if shutil.which("espeak-ng") is None:
        pytest.skip("espeak-ng is not installed (apt-get install -y espeak-ng): no speech to synthesise")
    from mmgrpo.tasks.spoken_digits import SpokenDigitsArgs, SpokenDigitsTask

    return SpokenDigitsTask(SpokenDigitsArgs(train_size=6, eval_size=3, warmup_size=6)).train_rows()


def _adapter(path, lora=False, **kw):
    args = {"name_or_path": path, "max_new_tokens": 6, "temperature": 0.8, **kw}
    adapter = build_whisper_adapter(args, lora=LoraConfig(enabled=True, r=4, alpha=8) if lora else None)
    if lora:  # LoRA B starts at zero: make the adapter matter
        with torch.no_grad():
            for n, p in adapter._unwrapped().named_parameters():
                if "lora_B" in n:
                    p.normal_(0, 0.1)
    return adapter


@pytest.mark.parametrize("lora", [False, True])
def test_ratio_is_one_before_update(tiny_whisper_path, speech_rows, lora):
    adapter = _adapter(tiny_whisper_path, lora=lora)
    torch.manual_seed(0)
    rollout = adapter.rollout(speech_rows[:3], group_size=4)
    assert rollout.batch_size == 12 and rollout.old_logprobs.shape == rollout.mask.shape == (12, 6)
    assert torch.equal(rollout.prompt_index, torch.arange(3).repeat_interleave(4))  # group-major
    logp = adapter.logprobs(rollout, torch.arange(12))
    m = rollout.mask.bool()
    assert m.sum() > 12
    model_reductions(adapter._unwrapped()).assert_logprobs_close(logp[m].detach(), rollout.old_logprobs[m])
    assert logp.requires_grad


def test_encoder_runs_once_per_prompt(tiny_whisper_path, speech_rows):
    adapter = _adapter(tiny_whisper_path)
    batches = []
    adapter._unwrapped().get_encoder().register_forward_hook(lambda m, a, out: batches.append(a[0].shape[0]))
    rollout = adapter.rollout(speech_rows[:3], group_size=4)
    assert batches == [3]  # sampling: one encoder pass over the 3 prompts, not 12 samples
    batches.clear()
    adapter.logprobs(rollout, torch.arange(12))
    assert batches == [3]  # training forward: once per distinct prompt
    batches.clear()
    adapter.logprobs(rollout, torch.tensor([0, 1, 4]))
    assert batches == [2]  # a minibatch cutting across groups: its 2 distinct prompts
    batches.clear()
    adapter.args.share_encoder = False
    adapter.logprobs(rollout, torch.arange(12))
    assert batches == [12]  # the naive path encodes every sample


def _logp_and_grads(adapter, rollout, index, shared):
    adapter.args.share_encoder = shared
    model = adapter._unwrapped()
    model.zero_grad(set_to_none=True)
    logp = adapter.logprobs(rollout, index)
    weights = torch.randn(logp.shape, generator=torch.Generator().manual_seed(1))
    (logp * weights).sum().backward()
    return logp.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("lora", [False, True])
def test_shared_encoder_equals_naive_logprobs_and_gradients(tiny_whisper_path, speech_rows, lora):
    adapter = _adapter(tiny_whisper_path, lora=lora)
    rollout = adapter.rollout(speech_rows[:2], group_size=3)
    for index in (torch.arange(6), torch.tensor([5, 0, 3, 4])):
        logp_n, g_n = _logp_and_grads(adapter, rollout, index, shared=False)
        logp_s, g_s = _logp_and_grads(adapter, rollout, index, shared=True)
        budget = model_reductions(adapter._unwrapped())
        budget.assert_logprobs_close(logp_s, logp_n)
        assert g_n.keys() == g_s.keys() and any("encoder" in n for n in g_n)
        for name in g_n:
            budget.backward().assert_close(g_s[name], g_n[name], msg=name)


def test_decoder_prompt_is_the_models(tiny_whisper_path):
    adapter = _adapter(tiny_whisper_path)
    tok = adapter.tokenizer
    assert tok.convert_ids_to_tokens(adapter.prefix.tolist()) == [
        "<|startoftranscript|>",
        "<|en|>",
        "<|transcribe|>",
        "<|notimestamps|>",
    ]
    timestamp = tok.convert_tokens_to_ids("<|0.02|>")
    assert timestamp in adapter.suppress_ids  # no timestamps unless asked
    assert adapter.eos_id not in adapter.suppress_ids and adapter.eos_id in adapter.begin_suppress_ids
    ts = _adapter(tiny_whisper_path, timestamps=True, task="translate", language="german")
    assert tok.convert_ids_to_tokens(ts.prefix.tolist()) == ["<|startoftranscript|>", "<|de|>", "<|translate|>"]
    assert timestamp not in ts.suppress_ids


def test_special_tokens_are_never_sampled_and_outputs_are_text(tiny_whisper_path, speech_rows):
    adapter = _adapter(tiny_whisper_path, temperature=2.0, max_new_tokens=12)
    torch.manual_seed(0)
    rollout = adapter.rollout(speech_rows[:2], group_size=8)
    ids = rollout.state.completion_ids[rollout.mask.bool()]
    assert not torch.isin(ids, torch.tensor(adapter.suppress_ids)).any()
    assert not torch.isin(rollout.state.completion_ids[:, 0], torch.tensor(adapter.begin_suppress_ids)).any()
    assert all(isinstance(o, str) and "<|" not in o for o in rollout.outputs)
    assert len(rollout.extras["audio_array"]) == 16 and rollout.extras["sampling_rate"][0] == 16000
    assert rollout.extras["audio_array"][0] is rollout.extras["audio_array"][7]  # one decoded waveform per prompt


def test_reference_is_policy_at_lora_init_and_a_step_changes_parameters(tiny_whisper_path, speech_rows):
    adapter = build_whisper_adapter(
        {"name_or_path": tiny_whisper_path, "max_new_tokens": 6},
        lora=LoraConfig(enabled=True, r=4, alpha=8, target_modules=["q_proj", "v_proj"]),
    )
    rollout = adapter.rollout(speech_rows[:2], group_size=3)
    idx = torch.arange(6)
    ref_before = adapter.ref_logprobs(rollout, idx)
    torch.testing.assert_close(ref_before, adapter.logprobs(rollout, idx).detach(), atol=0, rtol=0)
    params = adapter.trainable_parameters()
    assert params and all("lora" in n for n, p in adapter._unwrapped().named_parameters() if p.requires_grad)
    before = [p.detach().clone() for p in params]
    opt = torch.optim.AdamW(params, lr=1e-2)
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5, 1.0, -1.0])[:, None]
    loss = -(adapter.logprobs(rollout, idx) * adv).sum() / rollout.mask.sum()
    assert torch.isfinite(loss)
    loss.backward()
    opt.step()
    assert any(not torch.equal(b, p) for b, p in zip(before, params))
    ref_after = adapter.ref_logprobs(rollout, idx)
    torch.testing.assert_close(ref_after, ref_before, atol=0, rtol=0)
    assert not torch.allclose(
        adapter.logprobs(rollout, idx).detach(), ref_after
    )  # the policy moved, the reference did not


def test_deterministic_eval_and_save_pretrained_round_trip(tiny_whisper_path, speech_rows, tmp_path):
    adapter = _adapter(tiny_whisper_path)
    with torch.no_grad():  # move off the random init so the round trip is not trivially the cached model
        for p in adapter.trainable_parameters():
            p.add_(0.01 * torch.randn_like(p))
    out = adapter.evaluate(speech_rows[:3])
    assert out == adapter.evaluate(speech_rows[:3]) and len(out) == 3
    adapter.save_pretrained(str(tmp_path / "saved"))
    reloaded = build_whisper_adapter({"name_or_path": str(tmp_path / "saved"), "max_new_tokens": 6})
    assert reloaded.evaluate(speech_rows[:3]) == out
    assert torch.equal(reloaded.prefix, adapter.prefix)


def test_supervised_loss_teaches_the_transcript(tiny_whisper_path, speech_rows):
    adapter = _adapter(tiny_whisper_path)
    rows = [dict(r, target=r["answer"]) for r in speech_rows[:2]]
    opt = torch.optim.AdamW(adapter.trainable_parameters(), lr=3e-3)
    first = adapter.supervised_loss(rows)
    for _ in range(30):
        loss = adapter.supervised_loss(rows)
        loss.backward()
        opt.step()
        opt.zero_grad()
    assert loss.item() < 0.5 * first.item()


def test_whisper_args_are_validated(tiny_whisper_path):
    from mmgrpo.config import ConfigError

    with pytest.raises(ConfigError, match=r"model.args.task"):
        build_whisper_adapter({"name_or_path": tiny_whisper_path, "task": "summarise"})
    with pytest.raises(ConfigError, match=r"model.args.temperature"):
        build_whisper_adapter({"name_or_path": tiny_whisper_path, "temperature": 0})
    with pytest.raises(ConfigError, match="language"):
        build_whisper_adapter({"name_or_path": tiny_whisper_path, "language": "klingon"})
    assert WhisperArgs().name_or_path == "tiny-whisper"
