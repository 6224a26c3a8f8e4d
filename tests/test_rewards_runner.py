"""RewardRunner: TRL compatibility, weights, routing, NaN handling, errors and timeouts."""

import math
import threading
import time

import pytest
import torch

from mmgrpo.rewards import RewardError, RewardRunner

COMPLETIONS = ["<think>x</think><answer>4</answer>", "<answer>5</answer>", "no tags", "<answer>4</answer>"]
PROMPTS = ["2+2?", "2+2?", "2+2?", "2+2?"]


def trl_style_reward(completions, prompts=None, **kwargs):
    """A reward written for TRL's GRPOTrainer: reads a dataset column from kwargs."""
    return [1.0 if ans in c else 0.0 for c, ans in zip(completions, kwargs["answer"])]


def trl_full_signature(prompts, completions, completion_ids, trainer_state, log_metric, **kwargs):
    """TRL's full signature: prompts first, every extra argument without a default."""
    assert completion_ids is None and trainer_state is None
    log_metric("seen", len(completions))
    return [float(len(c)) for c in completions]


def test_trl_style_reward_runs_unchanged_and_weights():
    runner = RewardRunner([(trl_style_reward, 2.0, {}), ("format", 0.5, {}), (trl_full_signature, 1.0, {})])
    rewards, metrics = runner(COMPLETIONS, PROMPTS, {"answer": ["4", "4", "4", "4"]})
    assert runner.names == ["trl_style_reward", "format", "trl_full_signature"]
    assert runner.weights.dtype == torch.float32 and runner.weights.tolist() == [2.0, 0.5, 1.0]
    assert rewards.shape == (4, 3) and rewards.dtype == torch.float32
    assert rewards[:, 0].tolist() == [1.0, 0.0, 0.0, 1.0]
    assert rewards[:, 1].tolist() == [1.0, 0.0, 0.0, 0.0]
    assert rewards[:, 2].tolist() == [float(len(c)) for c in COMPLETIONS]
    assert metrics["reward/trl_style_reward"] == pytest.approx(0.5)
    assert metrics["reward/trl_full_signature/seen"] == 4.0
    assert metrics["reward/errors"] == 0.0


def test_function_without_kwargs_gets_only_its_columns_and_missing_column_is_named():
    def strict(completions, answer):
        return [float(c == a) for c, a in zip(completions, answer)]

    runner = RewardRunner([(strict, 1.0, {})])
    rewards, _ = runner(["a", "b"], ["p", "p"], {"answer": ["a", "x"], "image": [None, None]})
    assert rewards[:, 0].tolist() == [1.0, 0.0]
    with pytest.raises(RewardError, match=r"strict.*needs column\(s\) \['answer'\].*available: \['solution'\]"):
        runner(["a"], ["p"], {"solution": ["a"]})


def test_none_is_nan_and_metrics_ignore_it():
    def some_none(completions, **kw):
        return [None, 1.0, None, 0.0]

    rewards, metrics = RewardRunner([(some_none, 1.0, {})])(COMPLETIONS, PROMPTS, {})
    assert math.isnan(rewards[0, 0]) and math.isnan(rewards[2, 0])
    assert metrics["reward/some_none"] == pytest.approx(0.5)
    assert metrics["reward/some_none_nan_fraction"] == pytest.approx(0.5)


def test_all_nan_metric_is_nan():
    _rewards, metrics = RewardRunner([(lambda completions, **kw: [None] * len(completions), 1.0, {})])(["a"], ["p"], {})
    assert math.isnan(metrics["reward/<lambda>"]) and metrics["reward/<lambda>_nan_fraction"] == 1.0


def test_routing_calls_reward_on_routed_samples_only():
    seen = []

    def mcq_only(completions, *, prompts, reward_type, **kw):
        seen.append(list(reward_type))
        return [1.0] * len(completions)

    runner = RewardRunner([(mcq_only, 1.0, {}), ("format", 1.0, {})], reward_types=[["mcq"], None])
    rewards, metrics = runner(COMPLETIONS, PROMPTS, {"reward_type": ["mcq", "iou", None, "mcq"]})
    assert seen == [["mcq", "mcq"]]
    col = rewards[:, 0].tolist()
    assert col[0] == 1.0 and col[3] == 1.0 and math.isnan(col[1]) and math.isnan(col[2])
    assert metrics["reward/mcq_only_nan_fraction"] == 0.5
    assert not torch.isnan(rewards[:, 1]).any()


def test_routing_nothing_routed_and_missing_reward_type_column():
    runner = RewardRunner([("format", 1.0, {})], reward_types=[["ocr"]])
    rewards, _ = runner(COMPLETIONS, PROMPTS, {"reward_type": ["mcq"] * 4})
    assert torch.isnan(rewards).all()
    with pytest.raises(RewardError, match="no 'reward_type' column"):
        runner(COMPLETIONS, PROMPTS, {})


def test_raising_reward_names_reward_and_first_failing_sample():
    def fragile(completions, **kw):
        return [1.0 / len(c.split("<answer>")[1]) for c in completions]  # IndexError on "no tags"

    runner = RewardRunner([("format", 1.0, {}), (fragile, 1.0, {})])
    with pytest.raises(RewardError) as info:
        runner(COMPLETIONS, PROMPTS, {})
    msg = str(info.value)
    assert "reward 'fragile' raised IndexError" in msg
    assert "index 2" in msg and "'no tags'" in msg
    assert info.value.reward == "fragile" and info.value.index == 2
    assert isinstance(info.value.__cause__, IndexError)


def test_raising_reward_with_on_error_nan_scores_nan_and_counts(caplog):
    def boom(completions, **kw):
        raise ValueError("bad")

    runner = RewardRunner([("format", 1.0, {}), (boom, 1.0, {})], on_error="nan")
    rewards, metrics = runner(COMPLETIONS, PROMPTS, {})
    assert torch.isnan(rewards[:, 1]).all() and not torch.isnan(rewards[:, 0]).any()
    assert metrics["reward/errors"] == float(len(COMPLETIONS))  # one per (reward, sample) scored NaN
    assert "reward 'boom' raised ValueError: bad" in caplog.text


def test_wrong_length_and_non_numeric_are_reward_errors():
    def short(completions, **kw):
        return [1.0]

    def texty(completions, **kw):
        return [1.0, "good", 0.0, 0.0]

    with pytest.raises(RewardError, match=r"reward 'short' returned 1 values for 4 samples"):
        RewardRunner([(short, 1.0, {})])(COMPLETIONS, PROMPTS, {})
    with pytest.raises(RewardError, match=r"returned 'good' \(str\) at sample 1"):
        RewardRunner([(texty, 1.0, {})])(COMPLETIONS, PROMPTS, {})


def test_hanging_reward_times_out_quickly_with_clear_message():
    release = threading.Event()

    def hangs(completions, **kw):
        release.wait(30)  # "sleeps 30 s" (released at the end so the abandoned thread does not linger)
        return [0.0] * len(completions)

    runner = RewardRunner([("format", 1.0, {}), (hangs, 1.0, {})], timeout_s=0.5)
    t0 = time.monotonic()
    with pytest.raises(RewardError, match=r"reward 'hangs' timed out after 0.5s .*abandoned"):
        runner(COMPLETIONS, PROMPTS, {})
    assert time.monotonic() - t0 < 2.0

    runner_nan = RewardRunner([("format", 1.0, {}), (hangs, 1.0, {})], timeout_s=0.5, on_error="nan")
    t0 = time.monotonic()
    rewards, metrics = runner_nan(COMPLETIONS, PROMPTS, {})
    assert time.monotonic() - t0 < 2.0
    assert torch.isnan(rewards[:, 1]).all() and rewards[0, 0] == 1.0
    assert metrics["reward/errors"] == float(len(COMPLETIONS))  # the timed-out call's samples
    release.set()


def test_hanging_reward_thread_is_daemon():
    started = threading.Event()

    def hangs(completions, **kw):
        started.set()
        time.sleep(30)

    runner = RewardRunner([(hangs, 1.0, {})], timeout_s=0.2, on_error="nan")
    runner(["a"], ["p"], {})
    assert started.is_set()
    leftover = [t for t in threading.enumerate() if t.name == "mmgrpo-reward-hangs"]
    assert leftover and all(t.daemon for t in leftover)  # process exit does not wait for it


def test_rewards_run_in_parallel():
    barrier = threading.Barrier(2, timeout=5)

    def a(completions, **kw):
        barrier.wait()  # deadlocks unless b runs at the same time
        return [1.0] * len(completions)

    def b(completions, **kw):
        barrier.wait()
        return [2.0] * len(completions)

    rewards, _ = RewardRunner([(a, 1.0, {}), (b, 1.0, {})], max_workers=2, timeout_s=10)(["x"], ["p"], {})
    assert rewards.tolist() == [[1.0, 2.0]]


def test_async_reward_and_duplicate_names_and_kwargs_binding():
    async def async_reward(completions, **kw):
        return [0.25] * len(completions)

    runner = RewardRunner([(async_reward, 1.0, {}), ("format", 1.0, {}), ("format", 1.0, {"think": False})])
    rewards, metrics = runner(["<answer>a</answer>"], ["p"], {})
    assert runner.names == ["async_reward", "format", "format_2"]
    assert rewards.tolist() == [[0.25, 0.0, 1.0]]
    assert "reward/format_2" in metrics


def test_bad_arguments_and_column_lengths():
    with pytest.raises(ValueError, match="on_error"):
        RewardRunner([("format", 1.0, {})], on_error="ignore")
    with pytest.raises(ValueError, match="reward_types has 2 entries for 1 rewards"):
        RewardRunner([("format", 1.0, {})], reward_types=[None, None])
    with pytest.raises(TypeError, match=r"unknown argument\(s\) \['thnik'\]"):
        RewardRunner([("format", 1.0, {"thnik": False})])
    runner = RewardRunner([("format", 1.0, {})])
    with pytest.raises(RewardError, match="column 'answer' has 1 values for 2 completions"):
        runner(["a", "b"], ["p", "p"], {"answer": ["a"]})


def test_close_releases_model_rewards():
    class Model:
        closed = False

        def __call__(self, completions, *, prompts=None, **kw):
            return [0.0] * len(completions)

        def close(self):
            Model.closed = True

    with RewardRunner([(Model(), 1.0, {})]) as runner:
        runner(["a"], ["p"], {})
    assert Model.closed
    with pytest.raises(RuntimeError, match="closed"):
        runner(["a"], ["p"], {})


def test_image_completions_short_repr_in_errors():
    from PIL import Image

    def needs_text(completions, **kw):
        return [float(len(c)) for c in completions]

    with pytest.raises(RewardError, match=r"index 0 \(completion: <image RGB 8x4>\)"):
        RewardRunner([(needs_text, 1.0, {})])([Image.new("RGB", (8, 4))] * 2, ["p", "p"], {})


def test_columns_named_like_options_do_not_override_them(caplog):
    runner = RewardRunner([("format", 1.0, {"think": False}), ("accuracy", 1.0, {})])
    rewards, _ = runner(["<answer>a</answer>"], ["p"], {"think": [True], "which": ["first"], "answer": ["a"]})
    assert rewards.tolist() == [[1.0, 1.0]]
    assert "column(s) ['think']" in caplog.text and "column(s) ['which']" in caplog.text


# --- non-finite values, per-sample failures, worker processes, conversational prompts ---------------------


def _returns(values):
    def fixed(completions, **kw):
        return list(values)

    return fixed


@pytest.mark.parametrize("bad", [math.inf, -math.inf, math.nan, 1e38])
def test_non_finite_reward_raises_naming_reward_and_sample(bad):
    runner = RewardRunner([(_returns([1.0, bad, 0.0, 1.0]), 1.0, {})])
    with pytest.raises(RewardError, match=r"reward 'fixed' returned .* at sample 1; rewards must be finite") as e:
        runner(COMPLETIONS, PROMPTS, {})
    assert e.value.index == 1 and "\n" not in str(e.value)


def test_non_finite_reward_with_on_error_nan_scores_only_that_sample(caplog):
    runner = RewardRunner([(_returns([1.0, math.inf, 0.5, 1e38]), 1.0, {})], on_error="nan")
    rewards, metrics = runner(COMPLETIONS, PROMPTS, {})
    assert rewards[:, 0].tolist()[0] == 1.0 and rewards[2, 0] == 0.5
    assert torch.isnan(rewards[[1, 3], 0]).all()
    assert metrics["reward/errors"] == 2.0 and metrics["reward/fixed"] == pytest.approx(0.75)
    assert math.isfinite(metrics["reward/fixed"])


def test_raising_on_some_samples_with_on_error_nan_keeps_the_others():
    def picky(completions, **kw):
        return [float(len(c)) if "no tags" not in c else 1 / 0 for c in completions]

    runner = RewardRunner([(picky, 1.0, {})], on_error="nan")
    rewards, metrics = runner(COMPLETIONS, PROMPTS, {})
    assert torch.isnan(rewards[2, 0]) and not torch.isnan(rewards[[0, 1, 3], 0]).any()
    assert rewards[1, 0] == float(len(COMPLETIONS[1])) and metrics["reward/errors"] == 1.0


def test_all_nan_batch_warns(caplog):
    runner = RewardRunner([(_returns([None] * 4), 1.0, {})])
    rewards, _ = runner(COMPLETIONS, PROMPTS, {})
    assert torch.isnan(rewards).all()
    assert "every reward is NaN or None for all 4 samples" in caplog.text


def gil_holder(completions, **kw):
    """Catastrophic backtracking: the regex engine holds the GIL for minutes."""
    import re

    re.match(r"(a+)+$", "a" * 64 + "b")
    return [0.0] * len(completions)


def test_gil_holding_reward_is_killed_in_process_isolation():
    runner = RewardRunner(
        [("format", 1.0, {}), (gil_holder, 1.0, {})], timeout_s=1, on_error="nan", isolation="process"
    )
    assert runner.isolated == [True, True]
    t0 = time.monotonic()
    rewards, metrics = runner(COMPLETIONS, PROMPTS, {})
    elapsed = time.monotonic() - t0
    assert elapsed < 5.0, elapsed
    assert torch.isnan(rewards[:, 1]).all() and rewards[0, 0] == 1.0 and metrics["reward/errors"] == 4.0
    with pytest.raises(RewardError, match=r"reward 'gil_holder' timed out after 1s .*worker process was killed"):
        RewardRunner([(gil_holder, 1.0, {})], timeout_s=1, isolation="process")(COMPLETIONS, PROMPTS, {})


def test_process_isolation_returns_values_metrics_and_errors():
    def logs(completions, log_metric, **kw):
        log_metric("n", len(completions))
        return [float(len(c)) for c in completions]

    def boom(completions, **kw):
        raise ValueError("bad")

    runner = RewardRunner([(logs, 1.0, {}), ("format", 1.0, {})], isolation="process")
    rewards, metrics = runner(COMPLETIONS, PROMPTS, {})
    assert rewards[:, 0].tolist() == [float(len(c)) for c in COMPLETIONS] and metrics["reward/logs/n"] == 4.0
    with pytest.raises(RewardError, match=r"reward 'boom' raised ValueError: bad; first failing sample: index 0"):
        RewardRunner([(boom, 1.0, {})], isolation="process")(COMPLETIONS, PROMPTS, {})


def test_auto_isolation_uses_processes_for_import_paths_only():
    runner = RewardRunner(
        [("accuracy", 1.0, {}), ("mmgrpo.rewards.text:accuracy", 1.0, {}), (_returns([0.0]), 1.0, {})]
    )
    assert runner.isolated == [False, True, False]
    rewards, _ = runner(COMPLETIONS[:1], PROMPTS[:1], {"answer": ["4"]})
    assert rewards[0, :2].tolist() == [1.0, 1.0]


def test_conversational_prompts_get_chat_completions():
    seen = []

    def trl_like(completions, **kw):
        seen.extend(completions)
        return [float((c[0]["content"] if isinstance(c, list) else c) == "<answer>4</answer>") for c in completions]

    chat = [[{"role": "user", "content": "2+2?"}]] * 4
    runner = RewardRunner([(trl_like, 1.0, {}), ("accuracy", 1.0, {})])
    rewards, _ = runner(COMPLETIONS, chat, {"answer": ["4"] * 4})
    assert seen[1] == [{"role": "assistant", "content": "<answer>5</answer>"}]
    assert rewards[:, 0].tolist() == [0.0, 0.0, 0.0, 1.0] and rewards[:, 1].tolist() == [1.0, 0.0, 0.0, 1.0]
    runner(COMPLETIONS, PROMPTS, {"answer": ["4"] * 4})  # plain prompts: plain strings
    assert seen[-1] == COMPLETIONS[-1]


def test_a_task_metric_and_the_trainer_score_the_same_rows_the_same(tmp_path):
    """score_rows is the one path: a dataset task's eval_rewards and the trainer's held-out scoring (the run's
    rewards) give the same means for the same rows."""
    import json
    from types import SimpleNamespace

    from mmgrpo.tasks.dataset import build_dataset_task
    from mmgrpo.trainer import Trainer

    rows = [{"prompt": "a", "answer": "3"}, {"prompt": "b", "answer": "7"}, {"prompt": "c", "answer": "1"}]
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    task = build_dataset_task({"train": str(data), "eval": str(data), "eval_rewards": [{"name": "accuracy"}]})
    eval_rows = list(task.eval_rows())
    outputs = ["<answer>3</answer>", "<answer>4</answer>", "<answer>1</answer>"]
    trainer = SimpleNamespace(  # what Trainer._reward_scores reads
        adapter=None,
        rewards=RewardRunner([("accuracy", 1.0, {})]),
        state=SimpleNamespace(step=0),
        _trl_state=lambda step: None,
    )
    by_task = task.score(outputs, eval_rows)
    by_trainer = Trainer._reward_scores(trainer, outputs, eval_rows)
    assert by_task == {"accuracy": pytest.approx(2 / 3, abs=1e-7)}
    assert by_trainer["reward/accuracy"] == by_task["accuracy"] == by_trainer["reward"]
