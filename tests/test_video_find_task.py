"""The video_find task (mmgrpo/tasks/video_find.py): no flash is in the frames the policy's prompt samples; what
select_frames returns for each span shows that span's colour and no other; the warm-up targets answer the colour of
the span their call selects; the rows are deterministic."""

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
        assert sorted(row["span_colours"]) == sorted(task.args.colours)  # a different colour in every span
        assert row["answer"] == row["span_colours"][task.args.spans.index(row["span"])]
        clip = decode_clip(row["video"], VideoSampling(**SAMPLING))
        assert list(clip.frame_indices) == [0, 10, 21, 31]
        prompt_frames = clip.frames.permute(0, 2, 3, 1).numpy()  # what the policy sees
        assert not any(_shows(f, c) for f in prompt_frames for c in task.args.colours)
        ctx = ToolContext(video_duration=clip.duration)
        ctx.load_frames = lambda s, e, n, row=row: encoder.span_frames(row, s, e, n)
        for (start, end), colour, flash in zip(task.args.spans, row["span_colours"], row["flashes"]):
            assert start <= flash[0] < flash[1] <= end + 1 / 8
            obs = tool({"start": start, "end": end}, ctx)
            assert obs.error is None and all(start <= t <= end for t in obs.frame_times)
            seen = [c for f in obs.frames for c in task.args.colours if _shows(np.asarray(f), c)]
            assert seen and set(seen) == {colour}, (row, start, obs.frame_times)
        encoder.reset()


def test_warmup_targets_call_a_random_span_and_answer_its_colour(task):
    rows = task.warmup_rows(seed=0)
    hits = 0
    for row in rows:
        call, answer = row["target"]
        (parsed,), errors = parse_tool_calls(call)
        assert not errors and parsed.name == "select_frames"
        picked = [parsed.arguments["start"], parsed.arguments["end"]]
        assert picked in task.args.spans
        assert answer == f"<answer>{row['span_colours'][task.args.spans.index(picked)]}</answer>"
        hits += picked == row["span"]
    assert 0 < hits < 14  # uniform over 4 spans, not the prompt's: about 6 of 24
    always = VideoFindTask(VideoFindArgs(train_size=24, eval_size=4, warmup_call_hit_rate=1.0))
    assert all(r["target"][0] == select_call(r["span"]) for r in always.warmup_rows(0))
    assert [r["video"] for r in always.train_rows()] == [r["video"] for r in task.train_rows()]  # the same files
    plain = VideoFindTask(VideoFindArgs(tools=False, train_size=24, eval_size=4))
    plain_rows = plain.warmup_rows(0)
    assert all(r["target"] == f"<answer>{r['answer']}</answer>" for r in plain_rows)  # the true colour
    assert all("select_frames" not in r["prompt"] for r in plain_rows)
    assert [r["video"] for r in plain.train_rows()] == [r["video"] for r in task.train_rows()]  # the same files


def test_rows_are_deterministic(task, mmgrpo_cache):
    again = VideoFindTask(VideoFindArgs(train_size=24, eval_size=4))
    assert task.train_rows() + task.eval_rows() == again.train_rows() + again.eval_rows()
    assert {r["span"][0] for r in task.train_rows()} == {0.5, 1.5, 2.5, 3.5}
    assert task.train_rows()[0]["video"] != task.eval_rows()[0]["video"]


def test_score_and_bad_spans(task):
    rows = task.eval_rows()[:3]
    other = next(sp for sp in task.args.spans if sp != rows[1]["span"])
    other_colour = rows[1]["span_colours"][task.args.spans.index(other)]
    hit = select_call(rows[0]["span"]) + f"\n<answer>{rows[0]['answer']}</answer>"
    miss = select_call(other) + f"\n<answer>{other_colour}</answer>"  # read right, but the wrong span
    assert task.score([hit, miss, "<answer>x</answer>"], rows) == {
        "accuracy": pytest.approx(1 / 3),
        "tool_call_rate": pytest.approx(2 / 3),
        "call_hits_span": pytest.approx(1 / 3),
        "reads_selected": pytest.approx(2 / 3),
        "chance": 0.25,
    }
    with pytest.raises(ConfigError, match=r"task\.args\.spans"):
        VideoFindTask(VideoFindArgs(spans=[[1.25, 1.25]], train_size=1, eval_size=1))
    with pytest.raises(ConfigError, match=r"task\.args\.colours"):  # fewer colours than spans
        VideoFindTask(VideoFindArgs(colours=["red", "green", "blue"], train_size=1, eval_size=1))


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
