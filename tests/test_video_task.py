"""The video_motion task: real mp4 files, order-only information, cached rendering, scoring by hand."""

import random

import numpy as np
import pytest

from mmgrpo.config import ConfigError, from_dict
from mmgrpo.tasks.video_motion import VideoMotionArgs, VideoMotionTask, direction_frames, when_frames


@pytest.fixture(scope="module")
def task(mmgrpo_cache):
    return VideoMotionTask(VideoMotionArgs(questions=["direction", "when"], train_size=8, eval_size=4))


def test_opposite_directions_are_the_same_frames_reversed():
    """The information is in the order only: left is right played backwards (same frame set)."""
    for a, b in [("left", "right"), ("up", "down")]:
        fa = direction_frames(random.Random(3), 56, 16, a)
        fb = direction_frames(random.Random(3), 56, 16, b)
        assert all(np.array_equal(x, y) for x, y in zip(fa, fb[::-1]))
        assert not np.array_equal(fa[0], fb[0])


def test_when_span_matches_the_visible_frames():
    for seed in range(10):
        frames, (start, end) = when_frames(random.Random(seed), 56, 16, 8.0)
        bg = frames[0] if start > 0 else frames[-1]
        visible = [t / 8.0 for t, f in enumerate(frames) if not np.array_equal(f, bg)]
        if start > 0 or end < 2.0:
            assert visible[0] == start and visible[-1] == end - 1 / 8.0
        assert start % 0.5 == 0 and end % 0.5 == 0 and 0 <= start < end <= 2.0


def test_files_are_real_videos_at_the_written_rate(task):
    import decord

    rows = task.train_rows()
    assert [r["question_type"] for r in rows[:2]] == ["direction", "when"]
    vr = decord.VideoReader(rows[0]["video"])
    assert len(vr) == 16 and vr.get_avg_fps() == pytest.approx(8.0)
    assert vr[0].asnumpy().shape == (56, 56, 3)
    assert str(task.video_dir).startswith(str(__import__("mmgrpo.cache", fromlist=["x"]).cache_dir()))


def test_eval_split_adds_order_destroyed_copies(task):
    import decord

    rows = task.eval_rows()
    shuffled = [r for r in rows if r["question_type"] == "direction_shuffled"]
    ordered = {r["video"].replace("_shuffled", ""): r for r in shuffled}
    assert len(shuffled) == 2 and all(
        r["answer"] == ordered[r["video"].replace("_shuffled", "")]["answer"] for r in shuffled
    )
    a = decord.VideoReader(shuffled[0]["video"]).get_batch(list(range(16))).asnumpy().astype(int)
    b = (
        decord.VideoReader(shuffled[0]["video"].replace("_shuffled", ""))
        .get_batch(list(range(16)))
        .asnumpy()
        .astype(int)
    )
    assert not np.array_equal(a, b)
    # same frames, other order (up to codec rounding): each shuffled frame matches some ordered frame
    assert all(min(np.abs(fa - fb).mean() for fb in b) < 2.0 for fa in a)


def test_rendering_is_cached_and_keyed_by_options(task, mmgrpo_cache):
    mtime = (task.video_dir / "complete.json").stat().st_mtime_ns
    again = VideoMotionTask(VideoMotionArgs(questions=["direction", "when"], train_size=8, eval_size=4))
    assert again.video_dir == task.video_dir and (task.video_dir / "complete.json").stat().st_mtime_ns == mtime
    other = VideoMotionTask(VideoMotionArgs(questions=["direction"], train_size=2, eval_size=1, eval_shuffled=False))
    assert other.video_dir != task.video_dir and len(other.eval_rows()) == 1


def test_a_cache_folder_published_by_another_process_is_kept_and_a_broken_one_replaced(tmp_path):
    """Two processes building one cache folder: the one that finishes second keeps the first one's folder (whose
    files a reader may already be opening) instead of deleting it to put its own in place; a folder left without
    its marker by an interrupted attempt is replaced. No sibling folder is left behind."""
    from mmgrpo.cache import publish_dir

    target = tmp_path / "videos"

    def theirs(folder):
        (folder / "clip.mp4").write_text("theirs")

    def ours_while_they_publish(folder):  # the other process publishes while this one is writing
        (folder / "clip.mp4").write_text("ours")
        publish_dir(target, theirs, {"by": "them"})
        assert (target / "clip.mp4").read_text() == "theirs"

    publish_dir(target, ours_while_they_publish, {"by": "us"})
    assert (target / "clip.mp4").read_text() == "theirs" and "them" in (target / "complete.json").read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["videos"]

    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "clip.mp4").write_text("half")  # no complete.json: an interrupted attempt
    publish_dir(broken, theirs, {"by": "them"})
    assert (broken / "clip.mp4").read_text() == "theirs" and (broken / "complete.json").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["broken", "videos"]


def test_warmup_targets_are_format_only(task):
    rows = task.warmup_rows(seed=0)
    assert len(rows) == len(task.train_rows())
    for r in rows:
        inner = r["target"].removeprefix("<answer>").removesuffix("</answer>")
        if r["question_type"] == "direction":
            assert inner in ("left", "right", "up", "down")
        else:
            s, _, e = inner.partition(" to ")
            assert float(s) < float(e)


def test_score_by_hand(task):
    rows = [
        {"prompt": "q", "question_type": "direction", "answer": "left"},
        {"prompt": "q", "question_type": "direction", "answer": "up"},
        {"prompt": "q", "question_type": "direction_shuffled", "answer": "up"},
        {"prompt": "q", "question_type": "when", "answer": [0.5, 1.5]},
    ]
    outputs = ["<answer>left</answer>", "<answer>down</answer>", "up", "<answer>1 to 1.5</answer>"]
    s = task.score(outputs, rows)
    assert s == {"format": 0.75, "accuracy": 0.5, "accuracy_shuffled": 0.0, "temporal_iou": 0.5, "chance": 0.25}


def test_bad_options_name_the_field(mmgrpo_cache):
    with pytest.raises(ConfigError, match=r"task.args.questions\[0\]: 'colour' is not allowed"):
        from_dict(VideoMotionArgs, {"questions": ["colour"]}, "task.args")
    with pytest.raises(ConfigError, match=r"task.args.directions\[0\]: 'sideways' is not allowed"):
        from_dict(VideoMotionArgs, {"directions": ["sideways"]}, "task.args")
    with pytest.raises(ConfigError, match=r"task.args.fps"):
        VideoMotionTask(VideoMotionArgs(fps=7.5))
