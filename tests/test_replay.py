"""Replay of past completions into the group (mmgrpo/replay.py; RePO arXiv 2506.09340, AVATAR arXiv 2508.03100):
the selection rules and the replayed group worked by hand, the refusals at load, and an exact resume."""

import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file

from mmgrpo import advantages as adv_lib
from mmgrpo import replay
from mmgrpo.config import ConfigError
from mmgrpo.importance import engine_is_weights
from mmgrpo.loader import load_config
from mmgrpo.rollout_steps import RolloutBatch
from mmgrpo.types import Rollout

ROOT = Path(__file__).resolve().parents[1]
QUICK = ROOT / "configs/quickstart.yaml"


def test_the_selection_rules_by_hand():
    rewards = [0.0, 1.0, 0.2, 1.0, 0.0]  # a row's buffer, oldest first
    assert replay.choose(rewards, 2, "recent") == [3, 4]
    assert replay.choose(rewards, 2, "highest") == [1, 3]
    # every pair {0, 1} has population variance ((1 - 0) / 2)^2 = 0.25, the largest, and sum 1: the first, (0, 1)
    assert replay.choose(rewards, 2, "reward_diverse") == [0, 1]
    # {0, 1, 1}: mean 2/3, variance (4/9 + 1/9 + 1/9) / 3 = 2/9, as {0, 0, 1}, but its sum 2 is larger: (0, 1, 3)
    assert replay.choose(rewards, 3, "reward_diverse") == [0, 1, 3]
    assert replay.choose(rewards[:1], 2, "reward_diverse") == [0]  # fewer entries than slots: all of them


def test_the_buffer_is_bounded_in_size_and_age():
    o = replay.ReplayOptions(buffer_size=3, max_staleness=2, num_replays=1)
    entries = [{"step": s} for s in (0, 1, 2)]
    assert replay.eligible(entries, 3, 2) == [{"step": 1}, {"step": 2}]  # step 0 is 3 steps old
    assert replay.eligible(entries, 2, 2) == [{"step": 0}, {"step": 1}]  # this step's own are not replayed
    kept = replay.remember(entries, [{"step": 3}, {"step": 3}], 3, o)
    assert kept == [{"step": 2}, {"step": 3}, {"step": 3}]  # step 1 would be 3 old at step 4; size 3
    with pytest.raises(ConfigError, match=r"^algorithm\.rollout_steps\.replay\.num_replays=4 exceeds buffer_size=2"):
        replay.ReplayOptions(buffer_size=2, num_replays=4)


class _Words:
    """A stand-in token adapter: one unit per word plus EOS; teacher forcing gives every unit log-prob −0.5."""

    def tokenizer(self, texts, add_special_tokens=False):
        return {"input_ids": [[1] * len(t.split()) for t in texts]}

    def merge_states(self, parts):
        ((_, samples, _),) = parts
        return samples.tolist()

    def inject(self, rollout, index, texts):
        for b, text in zip(index.tolist(), texts, strict=True):
            n = len(text.split()) + 1
            rollout.mask[b] = (torch.arange(rollout.mask.shape[1]) < n).float()
            rollout.old_logprobs[b] = -0.5 * rollout.mask[b]
            rollout.outputs[b] = text
            rollout.truncated[b] = False


def _batch(outputs, units, logprobs, scores, index=7):
    """One group of len(outputs) samples, T = 4."""
    G, T = len(outputs), 4
    mask = (torch.arange(T)[None, :] < torch.tensor(units)[:, None]).float()  # [G, T]
    old = torch.tensor(logprobs) * mask  # [G, T]
    rollout = Rollout(
        list(outputs), old, mask, G, torch.zeros(G, dtype=torch.long), torch.zeros(G, dtype=torch.bool), None
    )
    return RolloutBatch([{}], rollout, torch.tensor(scores)[:, None], [index])


@pytest.mark.parametrize("correction", ["clip", "truncate"])
def test_a_zero_variance_group_gains_signal_from_its_replayed_samples(correction):
    """RePO, mixed normalisation: G = 2 fresh samples (rewards 0, 0) + R = 2 replayed (1, 0) form one group of 4."""
    o = replay.ReplayOptions(buffer_size=4, max_staleness=3, num_replays=2, select="recent", correction=correction)
    memory: dict = {}
    ctx = SimpleNamespace(step=0, weights=torch.ones(1), adapter=_Words(), acc=SimpleNamespace(num_processes=1))
    mu = [[-1.0, -2.0, -3.0, 0.0], [-1.5, -0.25, 0.0, 0.0]]  # μ: the sampling policy's log-probs at step 0
    first = replay.apply(ctx, _batch(["a b", "a"], [3, 2], mu, [1.0, 0.0]), o, memory)
    assert first.rollout.group_size == 4 and first.metrics["replay/replayed_fraction"] == 0.0
    assert first.rollout.mask[2:].sum() == 0 and torch.isnan(first.scores[2:]).all()  # empty slots: no loss, no stat
    assert [e["step"] for e in memory["buffer"]["7"]] == [0, 0]

    ctx = SimpleNamespace(step=1, weights=torch.ones(1), adapter=_Words(), acc=SimpleNamespace(num_processes=1))
    second = replay.apply(ctx, _batch(["c", "c"], [2, 2], [[-0.1] * 4] * 2, [0.0, 0.0]), o, memory)
    r = second.rollout
    assert r.outputs == ["c", "c", "a b", "a"] and second.metrics["replay/replayed_fraction"] == 1.0
    assert second.scores[:, 0].tolist() == [0.0, 0.0, 1.0, 0.0]
    assert second.metrics["replay/mean_age"] == 1.0
    # the group of 4: mean 1/4, population std sqrt(1/4 · 3/4) = sqrt(3)/4, so A = (r − 1/4) / (sqrt(3)/4)
    A = adv_lib.ESTIMATORS.get("grpo")(second.scores.view(1, 4), scale="group", unbiased=False, eps=0.0)
    torch.testing.assert_close(A[0], torch.tensor([-1, -1, 3, -1]) / math.sqrt(3), atol=1e-6, rtol=0)
    if correction == "clip":  # ratio π_θ / μ: the stored μ are the old log-probs
        torch.testing.assert_close(r.old_logprobs[2:], torch.tensor(mu), atol=0, rtol=0)
        assert r.engine_logprobs is None
    else:  # ratio π_θ / π_old (teacher-forced, −0.5) times min(π_old / μ, 3)
        torch.testing.assert_close(r.old_logprobs[2], torch.tensor([-0.5, -0.5, -0.5, 0.0]), atol=0, rtol=0)
        w, _ = engine_is_weights(r.old_logprobs, r.engine_logprobs, r.mask, mode="token_truncate", clip_max=3.0)
        torch.testing.assert_close(w[:2], r.mask[:2], atol=0, rtol=0)  # fresh samples: weight 1
        e = math.exp  # unit weights exp(−0.5 − μ), capped at 3: e^0.5, e^1.5 → 3, e^2.5 → 3; e^1, e^−0.25
        torch.testing.assert_close(w[2], torch.tensor([e(0.5), 3.0, 3.0, 0.0]), atol=1e-6, rtol=0)
        torch.testing.assert_close(w[3], torch.tensor([e(1.0), e(-0.25), 0.0, 0.0]), atol=1e-6, rtol=0)


def test_unsupported_combinations_are_refused_at_load():
    on = ["algorithm.rollout_steps={replay: {}}"]
    for config in ("flow_grpo.yaml", "speech_whisper_asr.yaml", "ar_image_grpo.yaml"):
        with pytest.raises(ConfigError, match=r"^algorithm\.rollout_steps\.replay needs an adapter with inject\(\)"):
            load_config(ROOT / "configs" / config, on)
    with pytest.raises(ConfigError, match=r"^algorithm\.rollout_steps\.replay is not supported with rollout\.tools"):
        load_config(ROOT / "configs/zoom_tools.yaml", on)
    with pytest.raises(ConfigError, match=r"^algorithm\.rollout_steps\.replay: surrogate 'reg_grpo' reads groups"):
        load_config(QUICK, [*on, "algorithm.surrogate=reg_grpo", "algorithm.surrogate_args={}"])
    with pytest.raises(ConfigError, match=r"replay\.select"):
        load_config(QUICK, ["algorithm.rollout_steps={replay: {select: oldest}}"])


SMALL = [
    "steps=5",
    "warmup.steps=12",
    "warmup.batch_size=8",
    "eval.before=false",
    "eval.after=false",
    "eval.every=0",
    "algorithm.prompts_per_step=2",
    "algorithm.group_size=4",
    "algorithm.minibatch_size=12",
    "model.args.max_new_tokens=8",
    "task.args.train_size=4",
    "task.args.eval_size=2",
    "logging.trackers=[]",
    "logging.progress=false",
    "algorithm.rollout_steps={replay: {num_replays: 2, select: reward_diverse, max_staleness: 3}}",
    "rewards=[{name: 'tests.test_variants:length_reward'}]",  # contrast in most groups from the start
]


@pytest.mark.slow
def test_replay_resumes_exactly(tmp_path, mmgrpo_cache):
    """Stop after step 2 (its checkpoint holds the buffers), resume to step 5 == an uninterrupted 5-step run."""
    from mmgrpo.trainer import train

    full, parts = tmp_path / "full", tmp_path / "parts"
    train(load_config(QUICK, [*SMALL, f"output_dir={full}"]))
    train(load_config(QUICK, [*SMALL, f"output_dir={parts}", "stop_after=2"]))
    saved = json.loads((parts / "checkpoints/step-000002/state/trainer.json").read_text())["trainer"]
    assert saved["rollout_steps"]["replay"][0]["buffer"], "the buffers are not in the checkpoint"
    train(load_config(QUICK, [*SMALL, f"output_dir={parts}", "resume=latest"]))
    records = [json.loads(x) for x in (full / "metrics.jsonl").read_text().splitlines()]
    assert any(r.get("replay/replayed_fraction", 0) > 0 for r in records if r.get("step", 0) > 2)  # replay after it
    a = load_file(str(full / "checkpoints/final/model/model.safetensors"))
    b = load_file(str(parts / "checkpoints/final/model/model.safetensors"))
    for k in a:  # equal by construction: the buffers, weights, optimizer and RNG are restored
        torch.testing.assert_close(a[k], b[k], atol=0, rtol=0, msg=k)
    assert any(r["loss/policy"] != 0 for r in records if r.get("step", 0) > 2)  # the replayed groups train
    resumed = [json.loads(x) for x in (parts / "metrics.jsonl").read_text().splitlines()]
    keys = ("replay/replayed_fraction", "replay/reward_mean", "replay/mean_age")
    after = lambda rs: [[r.get(k) for k in keys] for r in rs if r.get("step", 0) > 2]
    assert after(resumed) == after(records)


@pytest.mark.parametrize("family", ["vlm", "video", "audio_llm"])
def test_every_token_family_takes_replayed_samples_into_its_groups(family, mmgrpo_cache):
    """The grown group (G = 2 fresh + R = 1 replayed, teacher-forced) of each token family: the fresh samples keep
    their units and log-probs, the replayed one gets its text, and every ratio is 1 before an update."""
    from tests.adapter_cases import CASES, build

    adapter = build(family, lora=False)
    rows = CASES[family].rows()
    rollout = adapter.rollout(rows, 2)
    grown = replay.expand(adapter, rollout, 1)  # [P·3]
    assert grown.group_size == 3 and grown.batch_size == 3 * len(rows)
    fresh = torch.tensor([p * 3 + g for p in range(len(rows)) for g in range(2)])
    torch.testing.assert_close(grown.old_logprobs[fresh], rollout.old_logprobs, atol=0, rtol=0)
    slots = torch.tensor([p * 3 + 2 for p in range(len(rows))])
    adapter.inject(grown, slots, ["red"] * len(rows))
    assert [grown.outputs[i] for i in slots.tolist()] == ["red"] * len(rows)
    with torch.no_grad():
        now = adapter.logprobs(grown, torch.arange(grown.batch_size))  # [B, T]
    torch.testing.assert_close(now * grown.mask, grown.old_logprobs, atol=1e-4, rtol=0)
