"""The video adapter on the tiny Qwen2.5-VL: sampled fps plumbing, decode-once, T-GRPO shuffled rollouts."""

import pytest
import torch

from mmgrpo import losses
from mmgrpo.config import ConfigError
from mmgrpo.modalities.tokens import video as video_mod
from mmgrpo.modalities.video.adapter import Clip, VideoSampling, build_video_adapter, decode_clip, shuffle_frames
from mmgrpo.tasks.video_motion import VideoMotionArgs, VideoMotionTask
from mmgrpo.types import DataError
from tests.numerics import adapter_reductions

# 16 frames at 8 fps sampled at 3 fps: n = 16/8·3 = 6 frames, sample_fps = 6/16·8 = 3, second_per_grid_ts = 2/3
# (neither the 2 fps nor the processor's 24 fps default, so a dropped or default rate shows).
SAMPLING = {"fps": 3.0, "min_frames": 4, "max_frames": 8, "min_pixels": 3136, "max_pixels": 3136}


@pytest.fixture(scope="module")
def task(mmgrpo_cache):
    return VideoMotionTask(VideoMotionArgs(questions=["direction", "when"], train_size=6, eval_size=2))


def _adapter(path, **kw):
    args = {"name_or_path": path, "max_new_tokens": 4, "video": dict(SAMPLING)}
    args.update(kw)
    return build_video_adapter(args)


class _ForwardSpy:
    """Records, for every model forward that carries video pixels, its kwargs and whether grad was enabled."""

    def __init__(self, model):
        self.calls = []
        self.handle = model.register_forward_pre_hook(self._hook, with_kwargs=True)

    def _hook(self, module, args, kwargs):
        if kwargs.get("pixel_values_videos") is not None:
            self.calls.append(
                {
                    "grad": torch.is_grad_enabled(),
                    "second_per_grid_ts": kwargs["second_per_grid_ts"].detach().clone(),
                    "video_grid_thw": kwargs["video_grid_thw"].detach().clone(),
                    "pixels": kwargs["pixel_values_videos"].detach().clone(),
                }
            )


def test_decode_clip_sampling_matches_qwen_vl_utils(task):
    clip = decode_clip(task.train_rows()[0]["video"], VideoSampling(**SAMPLING))
    assert clip.frames.shape == (6, 3, 56, 56) and clip.frames.dtype == torch.uint8  # lossless, 4x smaller
    assert clip.frame_indices == (0, 3, 6, 9, 12, 15)  # linspace(0, 15, 6).round()
    assert clip.total_frames == 16 and clip.video_fps == 8.0
    assert clip.sample_fps == pytest.approx(3.0)
    assert clip.timestamps == pytest.approx([0, 0.375, 0.75, 1.125, 1.5, 1.875])
    assert clip.duration == pytest.approx(2.0)
    nframes = decode_clip(task.train_rows()[0]["video"], VideoSampling(nframes=4, min_pixels=3136, max_pixels=3136))
    assert nframes.frame_indices == (0, 5, 10, 15) and nframes.sample_fps == pytest.approx(2.0)


def test_sampled_fps_reaches_the_processor_and_both_forwards(task, tiny_vlm_path, monkeypatch):
    adapter = _adapter(tiny_vlm_path)
    seen = []
    original = type(adapter.processor).__call__

    def spy(self, *args, **kwargs):
        seen.append(kwargs.get("video_metadata"))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(type(adapter.processor), "__call__", spy)
    spy_fwd = _ForwardSpy(adapter._unwrapped())
    rows = task.train_rows()[:2]
    rollout = adapter.rollout(rows, group_size=2)

    assert len(seen) == 2 and all(m is not None and len(m) == 1 for m in seen)
    for meta in seen:
        assert meta[0].sampled_fps == pytest.approx(3.0)  # the rate the frames were really sampled at
        assert meta[0].frames_indices == [0, 3, 6, 9, 12, 15]
    for enc in rollout.state.cache.encodings:
        torch.testing.assert_close(enc["second_per_grid_ts"], torch.tensor([2 / 3]))
    gen_calls = list(spy_fwd.calls)
    assert gen_calls, "generate never passed the video to the model"
    adapter.logprobs(rollout, torch.arange(rollout.batch_size))
    train_calls = spy_fwd.calls[len(gen_calls) :]
    assert train_calls
    for call in spy_fwd.calls:  # generation prefill, old log-probs, training forward: the same time axis
        torch.testing.assert_close(call["second_per_grid_ts"], torch.full_like(call["second_per_grid_ts"], 2 / 3))
        assert call["video_grid_thw"].tolist()[0] == [3, 4, 4]
    first = rollout.state.cache.encodings[0]["pixel_values_videos"]  # [patches, D] of prompt 0, encoded once
    for call in spy_fwd.calls:  # every forward reads that one cached encoding
        assert torch.equal(call["pixels"][: first.shape[0]], first)
    assert rollout.extras["sample_fps"] == [pytest.approx(3.0)] * 4
    assert rollout.extras["frame_timestamps"][0] == pytest.approx([0, 0.375, 0.75, 1.125, 1.5, 1.875])
    assert rollout.extras["group_id"] == [0, 0, 1, 1]


def test_uint8_frames_encode_like_float_frames(task, tiny_vlm_path):
    adapter = _adapter(tiny_vlm_path)
    row = task.train_rows()[0]
    a = adapter._encode_prompt(row)
    clip = adapter.video.clip(row)
    b = adapter._encode_prompt(row, media={"video": [video_mod.VideoEncoder.with_frames(clip, clip.frames.float())]})
    torch.testing.assert_close(a["pixel_values_videos"], b["pixel_values_videos"], atol=0, rtol=0)


def test_second_per_grid_ts_moves_the_logits(task, tiny_vlm_path):
    """The time axis is live in the model, so a dropped or defaulted second_per_grid_ts would change log-probs."""
    adapter = _adapter(tiny_vlm_path)
    batch = adapter.collate([adapter._encode_prompt(task.train_rows()[0])])
    model = adapter._unwrapped().eval()
    with torch.no_grad():
        a = model(**batch).logits[:, -1]
        b = model(**{**batch, "second_per_grid_ts": batch["second_per_grid_ts"] * 0.125}).logits[:, -1]
    assert (a - b).abs().max() > 1e-5


def test_ratio_is_one_before_update_and_loss_changes_parameters(task, tiny_vlm_path):
    adapter = _adapter(tiny_vlm_path)
    rollout = adapter.rollout(task.train_rows()[:2], group_size=3)
    B, T = rollout.old_logprobs.shape
    assert (B, T) == (6, 4) and rollout.mask.sum() > 0
    logp = adapter.logprobs(rollout, torch.arange(B))
    m = rollout.mask.bool()
    adapter_reductions(adapter).assert_logprobs_close(logp[m].detach(), rollout.old_logprobs[m])  # ratio 1
    adv = torch.randn(B, 1).expand(B, T) * rollout.mask
    per_unit, _ = losses.SURROGATES.get("ppo_clip")(
        logp - rollout.old_logprobs,
        adv,
        rollout.mask,
        losses.PPOClipOptions(clip_low=0.2, clip_high=0.2),
    )
    loss = losses.AGGREGATIONS.get("token_mean")(per_unit, rollout.mask, max_units=T)
    assert torch.isfinite(loss)
    params = adapter.trainable_parameters()
    before = [p.detach().clone() for p in params]
    loss.backward()
    torch.optim.SGD(params, lr=1.0).step()
    changed = sum(not torch.equal(b, p) for b, p in zip(before, params))
    assert changed > len(params) // 2


def test_clip_is_decoded_once_and_serves_all_group_samples(task, tiny_vlm_path, monkeypatch):
    calls = []
    original = video_mod.fetch_video
    monkeypatch.setattr(video_mod, "fetch_video", lambda ele, ps: calls.append(ele["video"]) or original(ele, ps))
    adapter = _adapter(tiny_vlm_path, decode_cache_mb=0)  # no cross-step cache: once per prompt per rollout
    rows = task.train_rows()[:3]
    rollout = adapter.rollout(rows, group_size=4)
    assert sorted(calls) == sorted(r["video"] for r in rows)  # 3 decodes for 12 samples (and their log-probs)
    assert len(rollout.state.cache.encodings) == 3 and rollout.batch_size == 12
    adapter.logprobs(rollout, torch.arange(12))
    assert len(calls) == 3  # the training forward reuses the cached encoding
    adapter.rollout(rows, group_size=4)
    assert len(calls) == 6

    calls.clear()
    cached = _adapter(tiny_vlm_path)  # default LRU: decoded once across steps
    cached.rollout(rows, group_size=2)
    cached.rollout(rows, group_size=2)
    cached.evaluate(rows)
    assert len(calls) == 3 and cached.video.decode_count == 3

    clip_mb = 6 * 3 * 56 * 56 / 2**20  # one uint8 clip
    small = _adapter(tiny_vlm_path, decode_cache_mb=clip_mb * 2.5)  # room for two clips: LRU evicts the third
    small.rollout(rows, group_size=2)
    assert [k[0] for k in small.video.lru] == [r["video"] for r in rows[1:]]
    assert small.video.lru_bytes == 2 * 6 * 3 * 56 * 56


def test_shuffle_frames_is_a_non_identity_permutation():
    frames = torch.arange(6.0).view(6, 1, 1, 1).expand(6, 3, 2, 2)
    gen = torch.Generator().manual_seed(0)
    for _ in range(50):
        out, order = shuffle_frames(frames, gen)
        assert sorted(order.tolist()) == list(range(6)) and order.tolist() != list(range(6))
        torch.testing.assert_close(out, frames[order])
    two = torch.arange(2.0).view(2, 1, 1, 1)
    assert shuffle_frames(two, gen)[1].tolist() == [1, 0]


def test_shuffled_frame_rollouts_never_receive_gradient(task, tiny_vlm_path):
    rows = task.train_rows()[:2]
    plain = _adapter(tiny_vlm_path)
    contrast = _adapter(tiny_vlm_path, temporal_contrast={"enabled": True, "num_shuffled": 3})
    spy = _ForwardSpy(contrast._unwrapped())
    torch.manual_seed(0)
    r_plain = plain.rollout(rows, group_size=4)
    torch.manual_seed(0)
    r_con = contrast.rollout(rows, group_size=4)

    # the shuffled samples are not rows of the rollout: same B, same sampled tokens, same old log-probs
    assert r_con.batch_size == r_plain.batch_size == 8
    assert torch.equal(r_con.state.completion_ids, r_plain.state.completion_ids)
    torch.testing.assert_close(r_con.old_logprobs, r_plain.old_logprobs, atol=0, rtol=0)
    shuffled = r_con.extras["shuffled_completions"]
    assert len(shuffled) == 8 and all(isinstance(s, list) and len(s) == 3 for s in shuffled)
    assert shuffled[0] == shuffled[3] and all(isinstance(t, str) for t in shuffled[0])
    assert "shuffled_completions" not in r_plain.extras
    # every rollout forward (ordered and shuffled) ran without autograd
    assert spy.calls and not any(c["grad"] for c in spy.calls)
    shuffled_pixels = [
        c
        for c in spy.calls
        if c["pixels"].shape == spy.calls[0]["pixels"].shape and not torch.equal(c["pixels"], spy.calls[0]["pixels"])
    ]
    assert shuffled_pixels, "no forward saw the frame-shuffled clip"

    # the loss gradient is exactly the one without the contrast rollouts
    def grads(adapter, rollout):
        adapter.model.zero_grad(set_to_none=True)
        logp = adapter.logprobs(rollout, torch.arange(rollout.batch_size))
        adv = torch.linspace(-1, 1, rollout.batch_size)[:, None] * rollout.mask
        (-(logp * adv).sum()).backward()
        return [p.grad.clone() for p in adapter.trainable_parameters() if p.grad is not None]

    for a, b in zip(grads(plain, r_plain), grads(contrast, r_con), strict=True):
        torch.testing.assert_close(a, b, atol=0, rtol=0)


def test_num_shuffled_defaults_to_half_the_group(task, tiny_vlm_path):
    adapter = _adapter(tiny_vlm_path, temporal_contrast={"enabled": True})
    rollout = adapter.rollout(task.train_rows()[:1], group_size=4)
    assert [len(s) for s in rollout.extras["shuffled_completions"]] == [2] * 4


def test_rows_without_video_and_frame_lists(tiny_vlm_path):
    from PIL import Image

    adapter = _adapter(tiny_vlm_path, temporal_contrast={"enabled": True})
    frames = [Image.new("RGB", (56, 56), (40 * i, 0, 0)) for i in range(3)]  # odd count: padded to 4
    rows = [
        {"prompt": "What colour is the shape?", "image": Image.new("RGB", (56, 56))},
        {"prompt": "Which way does the object move?", "video": frames, "video_fps": 4.0},
    ]
    rollout = adapter.rollout(rows, group_size=2)
    assert rollout.extras["shuffled_completions"][:2] == [None, None]
    assert rollout.extras["sample_fps"] == [None, None, 4.0, 4.0]
    assert rollout.extras["frame_timestamps"][2] == pytest.approx([0, 0.25, 0.5, 0.75])
    torch.testing.assert_close(rollout.state.cache.encodings[1]["second_per_grid_ts"], torch.tensor([0.5]))


def test_video_args_are_validated(tiny_vlm_path):
    with pytest.raises(ConfigError, match=r"unknown field 'model.args.video.fpz'; allowed: fps"):
        build_video_adapter({"name_or_path": tiny_vlm_path, "video": {"fpz": 2}})
    with pytest.raises(ConfigError, match=r"model.args.video.nframes: must be >= 2"):
        build_video_adapter({"name_or_path": tiny_vlm_path, "video": {"nframes": 1}})
    with pytest.raises(ConfigError, match="num_shuffled: must be >= 1"):
        build_video_adapter({"name_or_path": tiny_vlm_path, "temporal_contrast": {"num_shuffled": 0}})


def test_missing_video_file_names_the_row_field(tiny_vlm_path, tmp_path):
    adapter = _adapter(tiny_vlm_path)
    with pytest.raises(DataError, match="row 'video': no video file"):
        adapter.evaluate([{"prompt": "x", "video": str(tmp_path / "missing.mp4")}])


def test_clip_metadata_round_trip():
    clip = Clip(torch.zeros(4, 3, 28, 28), 30.0, (0, 10, 20, 29), 30)
    meta = clip.metadata()
    assert meta.sampled_fps == pytest.approx(clip.sample_fps) == pytest.approx(4.0)
    assert meta.timestamps == pytest.approx(clip.timestamps)
