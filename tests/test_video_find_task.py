"""The video_find task (mmgrpo/tasks/video_find.py): the flash is absent from the frames the policy's prompt samples
and present in what select_frames returns for the prompt's span; the warm-up targets teach that call; the rows are
deterministic."""

import numpy as np
import pytest

from mmgrpo.config import ConfigError
from mmgrpo.tasks.shapes import COLOURS
from mmgrpo.tasks.video_find import VideoFindArgs, VideoFindTask, prompt_indices, select_call
from mmgrpo.tools import ToolContext, get_tool, parse_tool_calls

SAMPLING = {"nframes": 4, "min_pixels": 3136, "max_pixels": 3136}  # configs/video_tools.yaml's model.args.video


def _shows(frame: np.ndarray, colour: str) -> bool:
    """A quarter of the frame within 40 of the colour (the flash square is at least a quarter of the frame)."""
    close = (np.abs(frame.astype(int) - np.array(COLOURS[colour])) < 40).all(-1)
    return close.mean() > 0.2


@pytest.fixture(scope="module")
def task(mmgrpo_cache):
    return VideoFindTask(VideoFindArgs(train_size=24, eval_size=4))


def test_the_prompt_misses_the_flash_and_select_frames_shows_it(task, tiny_vlm_path):
    from transformers import AutoProcessor

    from mmgrpo.modalities.tokens.video import VideoEncoder, VideoSampling, decode_clip

    encoder = VideoEncoder(AutoProcessor.from_pretrained(tiny_vlm_path), VideoSampling(**SAMPLING))
    tool = get_tool("select_frames")
    assert prompt_indices(32, 4) == [0, 10, 21, 31]
    for row in task.train_rows():
        assert f"between {row['span'][0]}s and {row['span'][1]}s" in row["prompt"]
        assert row["span"][0] <= row["flash"][0] < row["flash"][1] <= row["span"][1] + 1 / 8
        clip = decode_clip(row["video"], VideoSampling(**SAMPLING))
        assert list(clip.frame_indices) == [0, 10, 21, 31]
        prompt_frames = clip.frames.permute(0, 2, 3, 1).numpy()  # what the policy sees
        assert not any(_shows(f, c) for f in prompt_frames for c in task.args.colours)
        start, end = row["span"]
        ctx = ToolContext(video_duration=clip.duration)
        ctx.load_frames = lambda s, e, n, row=row: encoder.span_frames(row, s, e, n)
        obs = tool({"start": start, "end": end}, ctx)
        assert obs.error is None and all(start <= t <= end for t in obs.frame_times)
        seen = [c for f in obs.frames for c in task.args.colours if _shows(np.asarray(f), c)]
        assert seen and set(seen) == {row["answer"]}, (row, obs.frame_times)
        encoder.reset()


def test_warmup_targets_teach_the_call_then_a_random_answer(task):
    rows = task.warmup_rows(seed=0)
    for row in rows:
        call, answer = row["target"]
        (parsed,), errors = parse_tool_calls(call)
        assert not errors and parsed.name == "select_frames"
        assert [parsed.arguments["start"], parsed.arguments["end"]] == row["span"]
        assert answer.startswith("<answer>") and answer.endswith("</answer>")
    assert sum(r["target"][1] == f"<answer>{r['answer']}</answer>" for r in rows) < 14  # random, chance 1/4 of 24
    plain = VideoFindTask(VideoFindArgs(tools=False, train_size=24, eval_size=4))
    assert all(isinstance(r["target"], str) and "select_frames" not in r["prompt"] for r in plain.warmup_rows(0))
    assert [r["video"] for r in plain.train_rows()] == [r["video"] for r in task.train_rows()]  # the same files


def test_rows_are_deterministic(task, mmgrpo_cache):
    again = VideoFindTask(VideoFindArgs(train_size=24, eval_size=4))
    assert task.train_rows() + task.eval_rows() == again.train_rows() + again.eval_rows()
    assert {r["span"][0] for r in task.train_rows()} == {0.5, 1.5, 2.5, 3.5}
    assert task.train_rows()[0]["video"] != task.eval_rows()[0]["video"]


def test_score_and_bad_spans(task):
    rows = task.eval_rows()[:2]
    hit = select_call(rows[0]["span"]) + f"\n<answer>{rows[0]['answer']}</answer>"
    assert task.score([hit, "<answer>x</answer>"], rows) == {
        "accuracy": 0.5,
        "tool_call_rate": 0.5,
        "call_hits_span": 0.5,
        "chance": 0.25,
    }
    with pytest.raises(ConfigError, match=r"task\.args\.spans"):
        VideoFindTask(VideoFindArgs(spans=[[1.25, 1.25]], train_size=1, eval_size=1))


@pytest.mark.slow
def test_grpo_steps_with_select_frames_through_the_trainer(tmp_path, mmgrpo_cache):
    """configs/video_tools.yaml, cut small: a short warm-up teaches the call, and three GRPO steps then run multi-turn
    rollouts whose select_frames calls return frames (a second turn follows), scored and logged."""
    import json

    from mmgrpo.loader import load_config
    from mmgrpo.trainer import train

    out = tmp_path / "video_tools"
    small = [
        f"output_dir={out}",
        "steps=3",
        "warmup.steps=120",
        "warmup.batch_size=16",
        "eval.before=false",
        "eval.every=0",
        "eval.max_rows=8",
        "task.args.train_size=64",
        "task.args.eval_size=8",
        "algorithm.prompts_per_step=4",
        "algorithm.group_size=4",
        "algorithm.minibatch_size=16",
        "logging.progress=false",
        "logging.trackers=[]",
        "logging.plot=false",
    ]
    s = train(load_config("configs/video_tools.yaml", small))
    assert s["train/steps"] == 3 and "eval/after/call_hits_span" in s, s
    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [h for h in steps if "reward/mean" in h]
    assert len(steps) == 3
    # most trajectories call select_frames (0.8-0.9 a step here) and get frames back: a second turn follows
    assert all(h["tools/calls_mean"] > 0.25 and h["turns/mean"] > 1 for h in steps), steps
