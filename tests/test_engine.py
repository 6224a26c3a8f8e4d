"""The vLLM rollout engine (rollout.engine: vllm): importance-sampling correction, client errors, and — with
``.venv-vllm`` (``bash scripts/setup_vllm.sh``) — the real server on the tiny engine-sized Qwen2.5-VL."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from mmgrpo.importance import engine_is_weights
from tests.numerics import adapter_reductions

ROOT = Path(__file__).resolve().parents[1]
VLLM_PYTHON = Path(os.environ.get("MMGRPO_VLLM_PYTHON", ROOT / ".venv-vllm/bin/python"))


# ---------------------------------------------------------------------------------------------- IS weights


def test_token_truncate_weights_by_hand():
    old = torch.tensor([[-1.0, -2.0, -0.5]])  # [1, 3]
    eng = torch.tensor([[-1.5, -1.0, -2.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    w, m = engine_is_weights(old, eng, mask, mode="token_truncate", clip_max=1.5)
    # ratios e^{0.5} = 1.6487 → 1.5 (capped), e^{-1} = 0.3679; the masked unit gets 0
    torch.testing.assert_close(w, torch.tensor([[1.5, 0.36787944, 0.0]]))
    assert float(m["engine/capped_fraction"]) == pytest.approx(0.5)
    assert float(m["engine/logprob_abs_diff"]) == pytest.approx(0.75)  # (0.5 + 1.0) / 2 valid units


def test_token_mask_and_sequence_modes_by_hand():
    old = torch.tensor([[-1.0, -2.0], [-1.0, -1.0]])
    eng = torch.tensor([[-1.5, -1.0], [-1.2, -1.1]])
    mask = torch.ones(2, 2)
    w, _ = engine_is_weights(old, eng, mask, mode="token_mask", clip_max=1.5, clip_min=0.5)
    # token ratios: e^{.5}=1.6487 (>1.5: 0), e^{-1}=0.3679 (<0.5: 0), e^{.2}=1.2214, e^{.1}=1.1052
    torch.testing.assert_close(w, torch.tensor([[0.0, 0.0], [1.2214028, 1.1051709]]))
    w, m = engine_is_weights(old, eng, mask, mode="sequence_truncate", clip_max=1.3)
    # sequence ratios: e^{0.5-1} = 0.6065; e^{0.3} = 1.3499 → 1.3
    torch.testing.assert_close(w, torch.tensor([[0.60653066, 0.60653066], [1.3, 1.3]]))
    assert float(m["engine/capped_fraction"]) == pytest.approx(0.5)
    w, _ = engine_is_weights(old, eng, mask, mode="sequence_mask", clip_max=1.3)
    torch.testing.assert_close(w, torch.tensor([[0.60653066, 0.60653066], [0.0, 0.0]]))


def test_is_weights_carry_no_gradient_and_ignore_non_finite_engine_logprobs():
    old = torch.tensor([[-1.0, -1.0]], requires_grad=True)
    eng = torch.tensor([[float("nan"), -1.0]])
    w, _ = engine_is_weights(old, eng, torch.ones(1, 2))
    assert not w.requires_grad
    torch.testing.assert_close(w, torch.ones(1, 2))
    with pytest.raises(ValueError, match="token_truncate"):
        engine_is_weights(old, eng, torch.ones(1, 2), mode="tis")


# ---------------------------------------------------------------------------------------------- client


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_server_is_one_line():
    from mmgrpo.modalities.tokens.engine import EngineError, VLLMClient

    client = VLLMClient(f"http://127.0.0.1:{_free_port()}", timeout_s=5)
    with pytest.raises(EngineError, match=r"is not reachable .*mmgrpo rollout-server") as e:
        client.health()
    assert "\n" not in str(e.value)


def test_engine_needs_an_adapter_that_can_use_one():
    from mmgrpo.config import ConfigError
    from mmgrpo.loader import load_config

    load_config(ROOT / "configs/quickstart.yaml", ["rollout.engine=vllm"])  # vlm: accepted
    load_config(ROOT / "configs/video_motion.yaml", ["rollout.engine=vllm"])  # video: accepted
    load_config(ROOT / "configs/speech_qwen2audio_qa.yaml", ["rollout.engine=vllm"])  # audio_llm: accepted
    load_config(ROOT / "configs/speech_whisper_asr.yaml", ["rollout.engine=vllm"])  # whisper: accepted
    with pytest.raises(ConfigError, match=r"rollout\.engine: vllm needs an adapter with use_engine"):
        load_config(ROOT / "configs/ar_image_grpo.yaml", ["rollout.engine=vllm"])


@pytest.mark.parametrize(
    "config, setting",
    [("quickstart", "model.args.top_p=0.9"), ("quickstart", "model.args.top_k=20"),
     ("speech_whisper_asr", "model.args.top_p=0.95"), ("speech_qwen2audio_qa", "model.args.top_k=5")],
)  # fmt: skip
def test_truncated_sampling_with_the_engine_is_refused_at_load(config, setting):
    """vLLM's log-probs are of the top-k / top-p truncated distribution, the trainer's of the full one: the
    importance weights would carry log(kept mass) on every token. Refused in one line; each alone is accepted."""
    from mmgrpo.config import ConfigError
    from mmgrpo.loader import load_config

    key = re.escape(setting.split("=")[0])
    with pytest.raises(ConfigError, match=rf"^{key}: .* with rollout\.engine: vllm: .*biased") as e:
        load_config(ROOT / f"configs/{config}.yaml", ["rollout.engine=vllm", setting])
    assert "\n" not in str(e.value)
    load_config(ROOT / f"configs/{config}.yaml", [setting])  # the native engine scores what it samples from
    load_config(ROOT / f"configs/{config}.yaml", ["rollout.engine=vllm"])


# ---------------------------------------------------------------------------------------------- real server

needs_vllm = pytest.mark.skipif(
    not VLLM_PYTHON.is_file(), reason="no .venv-vllm: run `bash scripts/setup_vllm.sh` (CI does) for the engine tests"
)


@pytest.fixture(scope="module")
def server(tmp_path_factory, mmgrpo_cache):
    """``mmgrpo rollout-server`` on the tiny engine-sized Qwen2.5-VL, up until the module's tests end. Served for
    the video adapter (configs/video_motion.yaml: one video per prompt allowed), so image and video tests share it."""
    yield from _serve(tmp_path_factory, "configs/video_motion.yaml", "tiny-qwen2.5-vl-engine")


def _serve(tmp_path_factory, config: str, model: str):
    """Start ``mmgrpo rollout-server CONFIG`` on ``model``, yield (url, process) once it answers, stop it after."""
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    log = tmp_path_factory.mktemp("vllm") / "server.log"
    cmd = [
        sys.executable, "-m", "mmgrpo", "rollout-server", str(ROOT / config),
        f"model.args.name_or_path={model}", f"rollout.url={url}",
    ]  # fmt: skip
    env = dict(os.environ, OMP_NUM_THREADS="2")
    with log.open("w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    from mmgrpo.modalities.tokens.engine import EngineError, VLLMClient

    client = VLLMClient(url, timeout_s=10)
    deadline = time.monotonic() + 600
    while True:
        try:
            client.health()
            break
        except EngineError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                pytest.fail(f"the vLLM server did not start:\n{log.read_text()[-3000:]}")
            time.sleep(2)
    yield url, proc
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)


def _adapter(url: str, rollout=None):
    from mmgrpo.modalities.vlm.adapter import build_vlm_adapter

    adapter = build_vlm_adapter(
        {"name_or_path": "tiny-qwen2.5-vl-engine", "max_new_tokens": 8, "temperature": 1.0}, seed=0, rollout=rollout
    )
    return _connect(adapter, url)


def _connect(adapter, url: str):
    from mmgrpo.modalities.tokens.engine import VLLMClient

    adapter.use_engine(VLLMClient(url, timeout_s=300))
    adapter.engine.version = adapter.engine.health()["version"]  # read what the server holds now
    return adapter


def _rows(n: int) -> list[dict]:
    from mmgrpo.tasks.shapes import ShapesArgs, ShapesTask

    return ShapesTask(ShapesArgs(train_size=n, eval_size=1)).train_rows()[:n]


def _greedy(adapter, rows, engine: bool) -> torch.Tensor:
    """Greedy completions [P, T] of the native decode loop or of the engine."""
    with adapter._media_scope():
        encodings = [adapter._encode_prompt(r) for r in rows]
    if not engine:
        return adapter._sample(encodings, 1, greedy=True)[0]
    requests = adapter._engine_prompts(rows, encodings)
    spec = adapter._sampling_spec(greedy=True)
    ids, _, prompt_ids = adapter.engine.generate(requests, 1, spec, [0] * len(rows), adapter._engine_processor_kwargs())
    assert prompt_ids == [e["input_ids"][0].tolist() for e in encodings]  # same media tokens: same frames and sizes
    mask = adapter._completion_mask(ids)
    return torch.where(mask.bool(), ids, torch.full_like(ids, adapter.pad_id))


@torch.no_grad()
def _perturb_and_push(adapter, seed: int, version: int, scale: float = 0.2) -> None:
    """Move the policy away from the checkpoint the server loaded (N(0, scale²) on every trainable parameter), then
    push it."""
    g = torch.Generator().manual_seed(seed)
    for p in adapter.model.parameters():
        if p.requires_grad:  # what an optimizer step can move
            p.add_(torch.randn(p.shape, generator=g) * scale)
    adapter.push_engine_weights(version=version)


@pytest.mark.slow
@needs_vllm
def test_engine_greedy_equals_native_after_a_weight_push_and_the_push_changes_outputs(server):
    url, _ = server
    adapter = _adapter(url)
    rows = _rows(4)
    before = _greedy(adapter, rows, engine=True)
    _perturb_and_push(adapter, seed=1, version=1)
    native = _greedy(adapter, rows, engine=False)
    engine = _greedy(adapter, rows, engine=True)
    assert len({tuple(r) for r in native.tolist()}) > 1  # the completions depend on the image: images reach both
    assert torch.equal(native, engine), (native, engine)  # same prompts and images, same weights: same tokens
    assert not torch.equal(before, engine)  # the push changed what the engine samples


@pytest.mark.slow
@needs_vllm
def test_engine_resizes_images_with_the_adapters_pixel_bounds(server):
    """``max_pixels`` below the images' size (112×112 shapes, 3136 = 56² pixels at most): the trainer's processor
    shrinks them, and so must the engine's (the request's ``images_kwargs``), else its image tokens differ (the
    prompt token ids, checked in ``_greedy``); greedy completions then equal the native loop's."""
    from mmgrpo.modalities.vlm.adapter import build_vlm_adapter
    from mmgrpo.tasks.shapes import ShapesArgs, ShapesTask

    adapter = build_vlm_adapter(
        {"name_or_path": "tiny-qwen2.5-vl-engine", "max_new_tokens": 8, "max_pixels": 3136}, seed=0
    )
    adapter = _connect(adapter, server[0])
    rows = ShapesTask(ShapesArgs(train_size=4, eval_size=1, image_size=112)).train_rows()[:4]
    with adapter._media_scope():
        grid = adapter._encode_prompt(rows[0])["image_grid_thw"]
    assert grid.tolist() == [[1, 4, 4]]  # 56×56 after resizing (112×112 would be [1, 8, 8])
    _assert_engine_matches_native(adapter, rows, seed=5, version=adapter.engine.version + 1)


@pytest.mark.slow
@needs_vllm
def test_partial_pushes_after_the_first_and_the_whole_model_to_a_restarted_engine(server):
    """With a frozen vision tower: the first push is the whole model, the next only the trainable tensors on top of
    it (the engine's greedy completions still equal the native loop's). When the engine holds another version (here
    another client's push, as after a restart), it refuses the part and the adapter sends the whole model."""
    from mmgrpo.modalities.tokens.engine import VLLMClient, engine_weights
    from mmgrpo.modalities.vlm.adapter import build_vlm_adapter

    url, _ = server
    adapter = _connect(
        build_vlm_adapter({"name_or_path": "tiny-qwen2.5-vl-engine", "max_new_tokens": 8, "freeze_vision": True}),
        url,
    )
    pushes = []
    push = adapter.engine.push

    def recording(tensors, version, base=None):
        taken = push(tensors, version, base)
        pushes.append((len(tensors), base, taken))
        return taken

    adapter.engine.push = recording
    whole = len(engine_weights(adapter.model))
    v = adapter.engine.version
    rows = _rows(4)
    _assert_engine_matches_native(adapter, rows, seed=7, version=v + 1)
    _assert_engine_matches_native(adapter, rows, seed=8, version=v + 2)
    assert pushes[0] == (whole, None, True) and pushes[1][1:] == (v + 1, True) and pushes[1][0] < whole
    VLLMClient(url).push(engine_weights(adapter.model), 99)  # another client: the engine now holds version 99
    _assert_engine_matches_native(adapter, rows, seed=9, version=100)
    assert pushes[2] == (pushes[1][0], v + 2, False) and pushes[3] == (whole, None, True)


@pytest.mark.slow
@needs_vllm
def test_a_push_in_many_buckets_serves_exactly_what_a_one_bucket_push_serves(server):
    """Issue 35: the whole model pushed in 64 kB buckets (whole layers, each loaded by vLLM as it arrives) after other
    weights were pushed in one: the engine's greedy completions and their log-probs equal, bit for bit, those it
    served after a one-bucket push of the same weights, and the native loop's completions."""
    from mmgrpo.modalities.tokens import weight_buckets as wb
    from mmgrpo.modalities.tokens import weight_sync
    from mmgrpo.modalities.tokens.engine import engine_weights

    url, _ = server
    adapter = _adapter(url)
    rows = _rows(3)
    first = {k: v.clone() for k, v in adapter.model.state_dict().items()}
    v = adapter.engine.version
    _perturb_and_push(adapter, seed=11, version=v + 1)  # one bucket: the default 256 MiB holds the tiny model
    one = _greedy_logprobs(adapter, rows)
    weights = {k: t.clone() for k, t in adapter.model.state_dict().items()}
    adapter.model.load_state_dict(first)
    adapter.engine.push(engine_weights(adapter.model), v + 2)  # other weights in between
    assert not torch.equal(_greedy_logprobs(adapter, rows)[1], one[1])
    adapter.model.load_state_dict(weights)
    calls = []
    call = adapter.engine._call
    adapter.engine._call = lambda path, *a: (calls.append(path), call(path, *a))[1]
    adapter.engine.bucket_bytes = 64 << 10
    adapter.engine.push(engine_weights(adapter.model), v + 3)
    planned = wb.plan(weight_sync.lazy(engine_weights(adapter.model)), 64 << 10)  # whole layers: 9 buckets
    assert calls.count("/update_weights") == len(planned) > 5, len(calls)
    many = _greedy_logprobs(adapter, rows)
    assert torch.equal(many[0], one[0]) and torch.equal(many[1], one[1])  # bit-exact: the same weights served
    assert torch.equal(many[0], _greedy(adapter, rows, engine=False))


def _greedy_logprobs(adapter, rows) -> tuple[torch.Tensor, torch.Tensor]:
    """The engine's greedy completions [P, T] and their log-probs [P, T]."""
    with adapter._media_scope():
        encodings = [adapter._encode_prompt(r) for r in rows]
    requests = adapter._engine_prompts(rows, encodings)
    spec = adapter._sampling_spec(greedy=True)
    ids, logprobs, _ = adapter.engine.generate(requests, 1, spec, [0] * len(rows), adapter._engine_processor_kwargs())
    mask = adapter._completion_mask(ids)
    return torch.where(mask.bool(), ids, torch.full_like(ids, adapter.pad_id)), logprobs * mask


@pytest.mark.slow
@needs_vllm
def test_engine_sampled_logprobs_agree_with_the_trainers(server):
    """The engine's log-probs of its own samples vs the trainer's recomputation (fp32 both): the mismatch TIS
    corrects is small on the same weights: within the model's rounding budget (tests/numerics.py). Measured on CPU:
    mean 3.4e-7, max 1.4e-6."""
    from mmgrpo import noise

    url, _ = server
    adapter = _adapter(url)
    adapter.push_engine_weights(version=adapter.engine.version + 1)  # versions only move forward
    rollout = adapter.rollout(_rows(2), 4, noise.NoiseKeys(0, 0, (0, 1), 4))
    m = rollout.mask.bool()
    assert rollout.engine_logprobs is not None and m.any()
    adapter_reductions(adapter).assert_logprobs_close(rollout.engine_logprobs[m], rollout.old_logprobs[m])
    again = adapter.rollout(_rows(2), 4, noise.NoiseKeys(0, 0, (0, 1), 4))
    assert again.outputs == rollout.outputs  # keyed seeds: the same samples from the same engine


@pytest.mark.slow
@needs_vllm
def test_engine_two_turn_image_trajectory_equals_native_after_a_weight_push(server):
    """Multi-turn (rollout.tools): turn 0 crops (scripted), turn 1 is the policy's. The engine gets each trajectory
    token-in — one pad per image, the prompt's image and the crop — expands it to the trainer's very ids (checked in
    _engine_sample) and answers greedily with the native loop's tokens; its sampled log-probs agree with the
    trainer's recomputation over both images."""
    from mmgrpo.config import RolloutConfig
    from mmgrpo.tasks.shapes import ShapesArgs, ShapesTask
    from tests.test_turns import CROP

    url, _ = server
    adapter = _adapter(url, rollout=RolloutConfig(tools=["crop"], max_turns=2, max_total_tokens=300))
    rows = ShapesTask(ShapesArgs(train_size=3, eval_size=1, image_size=112)).train_rows()
    _assert_two_turns_on_the_engine_equal_native(adapter, rows, CROP, seed=11)


def _assert_two_turns_on_the_engine_equal_native(adapter, rows: list[dict], call: str, seed: int):
    """After a push of perturbed weights: turn 0 is ``call`` (scripted), turn 1 the policy's, greedy. Both turns on
    the engine give the native loop's tokens (the engine's expanded prompt ids checked equal in _engine_sample), and
    the engine's sampled log-probs of turn 1 agree with the trainer's recomputation. Returns the engine's state."""
    from mmgrpo import noise
    from mmgrpo.modalities.tokens.turns import TurnState
    from tests.test_turns import script

    _perturb_and_push(adapter, seed=seed, version=adapter.engine.version + 1)
    calls = script(adapter, {b: [call] for b in range(2 * len(rows))}, real_after=1)

    def greedy() -> TurnState:
        with adapter._media_scope():
            encodings = [adapter._encode_prompt(r) for r in rows]
            state, _ = adapter.driver.trajectories(rows, encodings, 1, None, [None] * len(rows), greedy=True)
        return state

    engine_state = greedy()
    assert calls[-1] == (list(range(len(rows))), 1)  # turn 1 ran for every trajectory
    engine, adapter.engine = adapter.engine, None
    native_state = greedy()
    adapter.engine = engine
    assert (native_state.turn_of_token == 1).any(dim=1).all()
    assert torch.equal(native_state.completion_ids, engine_state.completion_ids)
    rollout = adapter.rollout(rows[:2], 2, noise.NoiseKeys(0, 0, (0, 1), 2))
    m = rollout.mask.bool() & (rollout.turn_of_token == 1)
    assert rollout.engine_logprobs is not None and m.any(dim=1).all()
    adapter_reductions(adapter).assert_logprobs_close(rollout.engine_logprobs[m], rollout.old_logprobs[m])
    return engine_state


def _video_adapter(url: str, side: int = 112, rollout=None):
    """The video adapter on the engine-sized model, video_motion's sampling (4 frames at 2 fps) with ``side``-pixel
    frames."""
    from mmgrpo.modalities.video.adapter import build_video_adapter

    video = {"fps": 2.0, "min_frames": 4, "max_frames": 8, "min_pixels": side * side, "max_pixels": side * side}
    adapter = build_video_adapter(
        {"name_or_path": "tiny-qwen2.5-vl-engine", "max_new_tokens": 8, "temperature": 1.0, "video": video},
        seed=0,
        rollout=rollout,
    )
    return _connect(adapter, url)


def _video_rows(n: int) -> list[dict]:
    from mmgrpo.tasks.video_motion import VideoMotionArgs, VideoMotionTask

    return VideoMotionTask(VideoMotionArgs(questions=["direction"], train_size=n, eval_size=1)).train_rows()[:n]


@pytest.mark.slow
@needs_vllm
def test_engine_video_greedy_equals_native_after_a_weight_push(server):
    """Video prompts reach vLLM as the frames the video encoder sampled (mp4 clips of video_motion, 4 frames at 2 fps
    of 16 at 8 fps), with their sampling metadata: the engine's prompt token ids equal the trainer's (checked in
    ``_greedy``) and its greedy completions equal the native decode loop's on the pushed weights."""
    url, _ = server
    adapter = _video_adapter(url)
    rows = _video_rows(4)
    _assert_engine_matches_native(adapter, rows, seed=3, version=adapter.engine.version + 1)


@pytest.mark.slow
@needs_vllm
def test_engine_two_turn_video_trajectory_equals_native_after_a_weight_push(server):
    """Multi-turn video (rollout.tools: select_frames): turn 0 selects two frames (scripted), turn 1 is the policy's.
    The engine gets each trajectory token-in — one pad for the prompt's video and one per selected frame, the clip's
    sampled frames and the two frames as images — expands it to the trainer's very ids (mRoPE over the video, the
    frames and the text; checked in _engine_sample) and answers greedily with the native loop's tokens; its sampled
    log-probs agree with the trainer's recomputation."""
    from mmgrpo.config import RolloutConfig

    url, _ = server
    settings = RolloutConfig(tools=["select_frames"], tool_limits={"max_frames": 2}, max_total_tokens=300)
    adapter = _video_adapter(url, rollout=settings)
    call = '<tool_call>{"name": "select_frames", "arguments": {"start": 0, "end": 1, "num_frames": 2}}</tool_call>'
    state = _assert_two_turns_on_the_engine_equal_native(adapter, _video_rows(3), call, seed=13)
    assert all(m["image_grid_thw"].shape[0] == 2 for m in state.media)  # the two frames, as images


def _assert_engine_matches_native(adapter, rows: list[dict], seed: int, version: int, scale: float = 0.2) -> None:
    """After a push of perturbed weights (N(0, scale²)): the engine's prompt token ids equal the trainer's (in
    ``_greedy``), its greedy completions equal the native decode loop's and depend on the prompt and media (not all
    equal: they reach both), and its log-probs of its own samples equal the trainer's recomputation."""
    _perturb_and_push(adapter, seed=seed, version=version, scale=scale)
    native = _greedy(adapter, rows, engine=False)
    engine = _greedy(adapter, rows, engine=True)
    assert len({tuple(r) for r in native.tolist()}) > 1
    assert torch.equal(native, engine), (native, engine)
    _assert_engine_logprobs_agree(adapter, rows[:2])


def _assert_engine_logprobs_agree(adapter, rows: list[dict]) -> None:
    """A rollout through the adapter's own engine path (G = 2): the engine's log-probs of its samples equal the
    trainer's recomputation within the model's rounding budget (fp32 both; tests/numerics.py)."""
    from mmgrpo import noise

    rollout = adapter.rollout(rows, 2, noise.NoiseKeys(0, 0, tuple(range(len(rows))), 2))
    m = rollout.mask.bool()
    assert rollout.engine_logprobs is not None and m.any()
    adapter_reductions(adapter).assert_logprobs_close(rollout.engine_logprobs[m], rollout.old_logprobs[m])


@pytest.mark.slow
@needs_vllm
def test_engine_refuses_a_video_whose_positions_would_differ(server):
    """56-pixel frames (a 2x2 token grid) with 2 temporal steps 1 s apart (tokens_per_second 2): the last temporal
    position 2 reaches the grid's side, where transformers and vLLM place the following text differently."""
    from mmgrpo.modalities.tokens.engine import EngineError

    url, _ = server
    adapter = _video_adapter(url, side=56)
    with pytest.raises(EngineError, match=r"prompt 0: a video of 2 temporal steps on a 2x2 token grid"):
        adapter.rollout(_video_rows(1), 2)


@pytest.mark.slow
@needs_vllm
def test_the_server_refuses_pushes_it_cannot_trust_and_keeps_serving(server):
    """Issue 37 on the real server: a push without the trainer's secret, one that moves the version back, and
    tensors of a wrong shape, dtype or name are refused with one line each, before vLLM sees them (a wrong shape or
    name used to kill its engine core while ``/health`` still answered ok); the engine then serves as before."""
    from mmgrpo.modalities.tokens.engine import EngineError, VLLMClient, engine_weights

    url, _ = server
    adapter = _adapter(url)
    rows = _rows(2)
    v = adapter.engine.version
    before = _greedy(adapter, rows, engine=True)
    whole = engine_weights(adapter.model)
    name = next(k for k in whole if k.endswith("mlp.down_proj.weight"))
    t = whole[name]
    with pytest.raises(EngineError, match="no or wrong push secret"):
        VLLMClient(url, secret="w" * 43).push({name: torch.zeros_like(t)}, v + 1)
    client = VLLMClient(url)  # the key file `mmgrpo rollout-server` wrote for this user
    for tensors, message in (
        ({name: t[:, :-1].contiguous()}, f"'{name}' has shape"),
        ({name: t.long()}, f"'{name}' has dtype I64"),
        ({"model.foo.weight": t}, "'model.foo.weight' is not a tensor of the served model"),
    ):
        with pytest.raises(EngineError, match=message):
            client.push(tensors, v + 1)
    with pytest.raises(EngineError, match=f"weights version {v} is not newer than version {v}"):
        client.push(whole, v)
    health = client.health()
    assert health["ok"] and health["version"] == v and health["authorized"]
    assert torch.equal(_greedy(adapter, rows, engine=True), before)  # the engine lives, on the same weights


@pytest.fixture(scope="module")
def audio_server(tmp_path_factory, mmgrpo_cache):
    """``mmgrpo rollout-server`` on the tiny engine-sized Qwen2-Audio (configs/speech_qwen2audio_qa.yaml)."""
    yield from _serve(tmp_path_factory, "configs/speech_qwen2audio_qa.yaml", "tiny-qwen2-audio-engine")


@pytest.mark.slow
@needs_vllm
def test_engine_audio_greedy_equals_native_after_a_weight_push(audio_server):
    """Audio-LLM prompts reach vLLM as the waveform the audio encoder decoded (spoken_digits, espeak-ng speech at
    16 kHz): the engine's prompt token ids equal the trainer's and its greedy completions equal the native decode
    loop's on the pushed weights."""
    url, _ = audio_server
    _assert_engine_matches_native(_audio_adapter(url, max_new_tokens=8), _audio_rows(4), seed=4, version=1)


def _audio_adapter(url: str, max_new_tokens: int, rollout=None):
    """The audio-LLM adapter on the engine-sized Qwen2-Audio, connected to ``url`` (skips without espeak-ng)."""
    if shutil.which("espeak-ng") is None:
        pytest.skip("espeak-ng is not installed: no speech to synthesise")
    from mmgrpo.modalities.speech.audio_llm import build_audio_llm_adapter

    adapter = build_audio_llm_adapter(
        {"name_or_path": "tiny-qwen2-audio-engine", "max_new_tokens": max_new_tokens, "temperature": 1.0},
        seed=0,
        rollout=rollout,
    )
    return _connect(adapter, url)


def _audio_rows(n: int) -> list[dict]:
    """``n`` spoken_digits rows (espeak-ng speech at 16 kHz)."""
    from mmgrpo.tasks.spoken_digits import SpokenDigitsArgs, SpokenDigitsTask

    return SpokenDigitsTask(SpokenDigitsArgs(question="second_word", train_size=n, eval_size=1)).train_rows()[:n]


@pytest.mark.slow
@needs_vllm
def test_engine_two_turn_audio_trajectory_equals_native_after_a_weight_push(audio_server):
    """Multi-turn audio LLM (rollout.tools: a plain Python function, TRL's tools=): turn 0 calls it (scripted),
    turn 1 is the policy's. The engine gets each trajectory token-in — one audio pad for the clip, the tool's text
    message — expands it to the trainer's very ids and answers greedily with the native loop's tokens; its sampled
    log-probs agree with the trainer's recomputation."""
    from mmgrpo.config import RolloutConfig

    url, _ = audio_server
    settings = RolloutConfig(tools=["tests.test_turns:lookup"], max_total_tokens=300)
    adapter = _audio_adapter(url, max_new_tokens=6, rollout=settings)
    call = '<tool_call>{"name": "lookup", "arguments": {"word": "seven"}}</tool_call>'
    _assert_two_turns_on_the_engine_equal_native(adapter, _audio_rows(3), call, seed=17)


@pytest.mark.slow
@needs_vllm
def test_a_killed_server_is_one_error_not_a_hang(server):
    import psutil

    from mmgrpo.modalities.tokens.engine import EngineError

    url, proc = server
    adapter = _adapter(url)
    (vllm,) = psutil.Process(proc.pid).children()  # the server, in its own process group with its engine
    engine = [p.pid for p in vllm.children(recursive=True)]
    assert engine, "vLLM runs its engine in processes of its own"
    proc.kill()  # SIGKILL to `mmgrpo rollout-server`: nothing can be forwarded
    proc.wait(timeout=60)
    assert all(_gone(pid, 30) for pid in [vllm.pid, *engine]), "vLLM outlived a SIGKILLed rollout-server"
    t = time.monotonic()
    with pytest.raises(EngineError, match="not reachable"):
        adapter.rollout(_rows(1), 2)
    assert time.monotonic() - t < 30


def stand_in_server(tmp_path: Path, **run_server_kwargs) -> tuple[subprocess.Popen, int, int]:
    """``run_server`` (as ``mmgrpo rollout-server`` calls it) on a stand-in server that starts a child (as vLLM's
    engine processes are) and sleeps; returns the runner process, the server's pid and its child's."""
    pids = tmp_path / "pids"
    server = (
        "import os, subprocess, sys, time; "
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)']); "
        f"open({str(pids)!r}, 'w').write(f'{{os.getpid()}} {{p.pid}}'); time.sleep(120)"
    )
    runner = (
        "import sys; from mmgrpo.modalities.tokens.engine import run_server; "
        f"sys.exit(run_server([sys.executable, '-c', {server!r}], **{run_server_kwargs!r}))"
    )
    proc = subprocess.Popen([sys.executable, "-c", runner])
    deadline = time.monotonic() + 60
    while not (pids.exists() and len(pids.read_text().split()) == 2) and time.monotonic() < deadline:
        time.sleep(0.1)
    server_pid, child_pid = map(int, pids.read_text().split())
    return proc, server_pid, child_pid


def test_stopping_the_rollout_server_stops_its_whole_process_group(tmp_path):
    """``mmgrpo rollout-server`` forwards SIGTERM to the server's process group: a grandchild (as vLLM's engine
    processes are) does not outlive it. Checked with a stand-in server that spawns a child and sleeps."""
    proc, _, grandchild = stand_in_server(tmp_path, grace_s=5)
    os.kill(proc.pid, signal.SIGTERM)
    assert proc.wait(timeout=30) == 128 + signal.SIGTERM
    if not _gone(grandchild, 10):
        os.kill(grandchild, signal.SIGKILL)
        raise AssertionError("the server's child outlived `mmgrpo rollout-server`")


def _gone(pid: int, within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


def test_a_sigkilled_rollout_server_command_takes_its_server_along(tmp_path):
    """SIGKILL cannot be forwarded; the server still dies with ``mmgrpo rollout-server`` (parent-death signal), so
    a crashed or OOM-killed command never leaves an engine answering on the port."""
    pidfile = tmp_path / "server.pid"
    server = f"import os, time; open({str(pidfile)!r}, 'w').write(str(os.getpid())); time.sleep(120)"
    runner = (
        "import sys; from mmgrpo.modalities.tokens.engine import run_server; "
        f"sys.exit(run_server([sys.executable, '-c', {server!r}]))"
    )
    proc = subprocess.Popen([sys.executable, "-c", runner])
    deadline = time.monotonic() + 60
    while not (pidfile.exists() and pidfile.read_text()) and time.monotonic() < deadline:
        time.sleep(0.1)
    server_pid = int(pidfile.read_text())
    proc.kill()
    proc.wait(timeout=30)
    if not _gone(server_pid, 10):
        os.kill(server_pid, signal.SIGKILL)
        raise AssertionError("the server outlived a SIGKILLed `mmgrpo rollout-server`")


def test_dry_run_checks_the_rollout_server_before_any_model_loads(tmp_path):
    """`--dry-run` (the trainer's first check) refuses an unreachable vLLM server in one line, with the command
    that starts it, without loading a model."""
    out = subprocess.run(
        [sys.executable, "-m", "mmgrpo", "train", "configs/quickstart.yaml", f"output_dir={tmp_path / 'run'}",
         "rollout.engine=vllm", f"rollout.url=http://127.0.0.1:{_free_port()}", "--dry-run"],
        cwd=Path(__file__).resolve().parents[1], capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 2, out.stderr
    lines = [line for line in out.stderr.splitlines() if line.startswith("mmgrpo:")]
    assert len(lines) == 1 and "is not reachable" in lines[0] and "mmgrpo rollout-server" in lines[0], out.stderr
    assert "Loading weights" not in out.stderr and not (tmp_path / "run").exists()


# ---------------------------------------------------------------------------------------------- Whisper


@pytest.fixture(scope="module")
def whisper_server(tmp_path_factory, mmgrpo_cache):
    """``mmgrpo rollout-server`` on the tiny engine-sized Whisper (configs/speech_whisper_asr.yaml)."""
    yield from _serve(tmp_path_factory, "configs/speech_whisper_asr.yaml", "tiny-whisper-engine")


def _whisper(url: str | None = None):
    """The Whisper adapter on the engine-sized tiny Whisper (decoder prompt <|startoftranscript|><|en|><|transcribe|>
    <|notimestamps|>), connected to ``url`` when given."""
    from mmgrpo.modalities.speech.adapter import build_whisper_adapter

    adapter = build_whisper_adapter({"name_or_path": "tiny-whisper-engine", "max_new_tokens": 8}, seed=0)
    return _connect(adapter, url) if url else adapter


def _speech_rows(n: int) -> list[dict]:
    """``n`` clips of spoken_digits' transcription task (espeak-ng speech at 16 kHz, 1-3 digits)."""
    if shutil.which("espeak-ng") is None:
        pytest.skip("espeak-ng is not installed: no speech to synthesise")
    from mmgrpo.tasks.spoken_digits import SpokenDigitsArgs, SpokenDigitsTask

    return SpokenDigitsTask(SpokenDigitsArgs(question="transcribe", train_size=n, eval_size=1)).train_rows()[:n]


def _whisper_greedy(adapter, rows: list[dict], engine: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy completions [P, T] and their log-probs [P, T] (0 after the end) of the native decode loop or of the
    engine; the engine's decoder prompt token ids must equal the adapter's forced prefix."""
    cache = adapter._audio_cache(rows)
    if not engine:
        ids, logprobs = adapter._sample(cache, 1, greedy=True)
        return ids, logprobs * adapter._completion_mask(ids)
    requests = adapter._engine_prompts(cache)
    spec = adapter._sampling_spec(greedy=True)
    ids, logprobs, prompt_ids = adapter.engine.generate(requests, 1, spec, [0] * len(rows), {}, adapter._early_bans())
    assert prompt_ids == [adapter.prefix.tolist()] * len(rows)  # the decoder prompt vLLM decoded from, by id
    mask = adapter._completion_mask(ids)
    return torch.where(mask.bool(), ids, torch.full_like(ids, adapter.pad_id)), logprobs * mask


def test_whisper_engine_requests_are_the_waveform_and_the_forced_decoder_prefix(mmgrpo_cache):
    """What the Whisper adapter sends the engine (no server needed): per prompt, an encoder-decoder request whose
    encoder prompt is the decoded waveform at the feature extractor's rate and whose decoder prompt is the forced
    prefix by id; the begin-suppressed tokens are banned at the first step only, the others at every step."""
    import numpy as np

    from mmgrpo.modalities.tokens.engine import _wire

    adapter = _whisper()
    tone = np.sin(np.arange(8000) / 16000 * 2 * np.pi * 440).astype(np.float32) * 0.3  # 0.5 s at 16 kHz
    rows = [{"audio": {"array": tone, "sampling_rate": 16000}}, {"audio": {"array": tone[::2], "sampling_rate": 8000}}]
    cache = adapter._audio_cache(rows)
    requests = adapter._engine_prompts(cache)
    tok = adapter.tokenizer
    prefix = tok.convert_tokens_to_ids(["<|startoftranscript|>", "<|en|>", "<|transcribe|>", "<|notimestamps|>"])
    assert [r.token_ids for r in requests] == [prefix, prefix] and all(r.encoder_decoder for r in requests)
    assert [r.text for r in requests] == ["", ""] and [len(r.media["audio"]) for r in requests] == [1, 1]
    for r, wave in zip(requests, cache.waveforms):
        assert r.media["audio"][0] is wave and wave.dtype == np.float32
        assert _wire("audio", wave)["shape"] == [len(wave)]
    assert len(cache.waveforms[1]) == 8000  # the 8 kHz clip was resampled to the processor's 16 kHz
    spec = adapter._sampling_spec()
    eot = tok.convert_tokens_to_ids("<|endoftext|>")
    assert spec.eos_ids == [eot] and set(spec.suppress_ids) == set(adapter.suppress_ids)
    assert tok.convert_tokens_to_ids("<|notimestamps|>") in spec.suppress_ids and eot not in spec.suppress_ids
    assert adapter._early_bans() == ([eot], 1)  # generation_config.begin_suppress_tokens, first step only


def test_rollout_server_serves_whisper_with_one_audio_clip_per_prompt(mmgrpo_cache):
    """``mmgrpo rollout-server`` on a Whisper config: the built-in name resolves to the trainer's cached directory, and
    the server allows one audio clip per prompt (vLLM's Whisper takes exactly one); a family without an engine path is
    one config error."""
    from mmgrpo.config import ConfigError
    from mmgrpo.loader import load_config
    from mmgrpo.modalities.speech.tiny import resolve_model_path
    from mmgrpo.modalities.tokens.engine import server_command

    cfg = load_config(ROOT / "configs/speech_whisper_asr.yaml", ["model.args.name_or_path=tiny-whisper-engine"])
    cmd = server_command(cfg, python=sys.executable)
    options = dict(zip(cmd[2::2], cmd[3::2]))
    assert options["--model"] == resolve_model_path("tiny-whisper-engine")
    assert options["--max-audios"] == "1" and options["--max-videos"] == "0"
    with pytest.raises(ConfigError, match="has no vLLM rollout engine yet"):
        server_command(load_config(ROOT / "configs/ar_image_grpo.yaml"), python=sys.executable)


@pytest.mark.slow
@needs_vllm
def test_engine_whisper_greedy_equals_native_after_a_weight_push(whisper_server):
    """Whisper on the engine: encoder-decoder requests (the decoded waveform as the encoder's audio, the forced
    decoder prefix as token ids) on spoken_digits clips. After a push of perturbed weights the engine's decoder
    prompt ids equal the adapter's prefix, its greedy completions equal the native decode loop's and depend on the
    audio, the push changed them, and the greedy log-probs agree; a sampled rollout's engine log-probs agree with the
    trainer's recomputation (fp32 both; vLLM 0.32 CPU). Measured: greedy |Δ log p| max 4.1e-6 (32 tokens); sampled
    (G = 4, 64 tokens) mean 1.4e-6, max 6.3e-6; asserted: within the model's rounding budget (tests/numerics.py).
    Then the first-step ban must decide a token."""
    from mmgrpo import noise

    url, _ = whisper_server
    adapter = _whisper(url)
    rows = _speech_rows(4)
    before, _ = _whisper_greedy(adapter, rows, engine=True)
    _perturb_and_push(adapter, seed=5, version=1)
    native, native_lp = _whisper_greedy(adapter, rows, engine=False)
    engine, engine_lp = _whisper_greedy(adapter, rows, engine=True)
    assert len({tuple(r) for r in native.tolist()}) > 1  # the completions depend on the audio: it reaches both
    assert torch.equal(native, engine), (native, engine)
    assert not torch.equal(before, engine)  # the push changed what the engine samples
    budget = adapter_reductions(adapter)
    budget.assert_logprobs_close(engine_lp, native_lp)
    rollout = adapter.rollout(rows[:2], 4, noise.NoiseKeys(0, 0, (0, 1), 4))
    m = rollout.mask.bool()
    assert rollout.engine_logprobs is not None and m.any()
    budget.assert_logprobs_close(rollout.engine_logprobs[m], rollout.old_logprobs[m])
    _assert_first_step_ban_applies(adapter, rows[:2], version=2)


@pytest.mark.slow
@needs_vllm
def test_a_dead_engine_fails_health_and_stops_its_server_with_every_engine_process(whisper_server):
    """vLLM's engine core SIGKILLed under a live server (as the out-of-memory killer would): ``/health`` stops
    answering ok, the server exits non-zero (3: the engine died) and none of its engine processes is left. Runs
    after the other Whisper engine tests (it ends their server)."""
    import psutil

    from mmgrpo.modalities.tokens.engine import EngineError, VLLMClient

    url, proc = whisper_server
    (vllm,) = psutil.Process(proc.pid).children()
    engine = vllm.children(recursive=True)
    core = next(p for p in vllm.children() if "EngineCor" in p.name() + " ".join(p.cmdline()))
    core.kill()
    deadline = time.monotonic() + 30
    while True:
        try:
            VLLMClient(url, timeout_s=5).health()
        except EngineError:
            break
        assert time.monotonic() < deadline, "/health still answers ok 30 s after the engine core died"
        time.sleep(0.5)
    assert proc.wait(timeout=60) == 3  # `mmgrpo rollout-server` returns the server's code: the engine died
    assert all(_gone(p.pid, 30) for p in [vllm, *engine]), "an engine process outlived its server"


@torch.no_grad()
def _assert_first_step_ban_applies(adapter, rows: list[dict], version: int) -> None:
    """Make end-of-text (Whisper's begin-suppressed token) the argmax at every step — the decoder's final layer-norm
    bias moved along its output embedding, raising its logit by 50 — and push: greedy, both engines must still emit
    another token first (the ban applies at the first step, in vLLM through the server's ``EarlyBans``), then end."""
    eot = adapter.eos_id
    decoder = adapter._unwrapped().model.decoder
    w = decoder.embed_tokens.weight[eot]  # tied to proj_out: the row of eot's logit
    decoder.layer_norm.bias.add_(50 * w / w.dot(w))
    adapter.push_engine_weights(version=version)
    native, _ = _whisper_greedy(adapter, rows, engine=False)
    engine, _ = _whisper_greedy(adapter, rows, engine=True)
    assert torch.equal(native, engine), (native, engine)
    assert (native[:, 0] != eot).all() and (native[:, 1] == eot).all(), native


def test_later_pushes_send_only_what_training_changes(mmgrpo_cache):
    """``engine_weights(trainable_only=True)``: full fine-tuning with a frozen vision tower sends the trainable
    parameters (no ``visual.*``, no buffers) under the checkpoint's names, a subset of the whole push; LoRA sends the
    merged adapted layers only."""
    from mmgrpo.modalities.tokens.engine import engine_weights
    from tests.adapter_cases import build

    frozen = build("vlm", lora=False, freeze_vision=True)
    whole, part = engine_weights(frozen.model), engine_weights(frozen.model, trainable_only=True)
    trainable = sum(p.requires_grad for p in frozen.model.parameters())
    assert set(part) < set(whole) and any("visual" in k for k in whole) and not any("visual" in k for k in part)
    assert len(part) >= trainable  # every trainable tensor (a tied lm_head under its own name too)
    for name, tensor in part.items():
        assert torch.equal(tensor, whole[name])
    lora = build("vlm", lora=True)
    merged = engine_weights(lora.model, trainable_only=True)
    layers = [n for n, m in lora.model.named_modules() if hasattr(m, "lora_A") and len(m.lora_A)]
    assert len(merged) == len(layers) > 0 and set(merged) < set(engine_weights(lora.model))
    assert all(k.endswith(".weight") and "lora_" not in k and "base_layer" not in k for k in merged)


# ---------------------------------------------------------------------------------------------- vLLM versions


def test_vllm_versions_outside_the_tested_series_are_refused_in_one_line():
    from mmgrpo.modalities.tokens.engine_http import vllm_version_problem

    for ok in ("0.32.0", "0.32.0+cpu", "0.32.1", "0.32.0.post2"):
        assert vllm_version_problem(ok) is None, ok
    for bad in ("0.33.0", "0.31.0", "0.11.2.post2", "1.0.0", "nightly"):
        problem = vllm_version_problem(bad)
        assert problem is not None and "\n" not in problem, bad
        assert f"vLLM {bad} is outside" in problem and "scripts/setup_vllm.sh" in problem
        assert "MMGRPO_VLLM_ANY_VERSION=1" in problem


@needs_vllm
def test_the_engine_environment_holds_a_supported_vllm():
    """What scripts/setup_vllm.sh installed is in SUPPORTED_VLLM: the server starts (it checks the same)."""
    from mmgrpo.modalities.tokens.engine_http import vllm_version_problem

    out = subprocess.run(
        [str(VLLM_PYTHON), "-c", "import vllm; print(vllm.__version__)"], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert vllm_version_problem(out.stdout.strip().splitlines()[-1]) is None
