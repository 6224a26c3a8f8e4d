"""Issue 53: held-out evaluation scores through the training reward path, with the columns a rollout gives the rewards
(``mmgrpo/evaluation.py`` ``reward_scores``), and each reward runs once on a synthetic rollout of the run's kind at
load, before the model loads (``mmgrpo/reward_check.py``): a reward that returns None, strings, the wrong length, or
needs a column the data lacks stops the run in one line naming it; one that works starts training."""

import json
import math

import pytest

from mmgrpo.config import ConfigError
from mmgrpo.loader import load_config
from mmgrpo.reward_check import CHECK_GROUP, synthetic_rollout

REWARDS_MODULE = """
def returns_none(completions, **kwargs):
    return None

def returns_strings(completions, **kwargs):
    return ["1" for _ in completions]

def one_too_many(completions, **kwargs):
    return [1.0] * (len(completions) + 1)

def needs_difficulty(completions, difficulty, **kwargs):
    return [float(d) for d in difficulty]

def raises(completions, **kwargs):
    return [1.0 / 0 for _ in completions]

def length(completions, completion_ids, **kwargs):
    return [float(len(ids)) for ids in completion_ids]

def turns(completions, turn_rewards, tool_calls, num_turns, **kwargs):
    return [float(sum(r)) + c + n for r, c, n in zip(turn_rewards, tool_calls, num_turns)]
"""


@pytest.fixture
def data(tmp_path, monkeypatch):
    """A JSONL of four grid-world rows (prompt, seed, answer) and ``my_rewards.py`` next to it (the working
    directory, so ``my_rewards:...`` imports under the code policy)."""
    rows = [{"prompt": "Walk to the goal.", "seed": s, "answer": "1"} for s in range(4)]
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "my_rewards.py").write_text(REWARDS_MODULE)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    return path


def _cfg(tmp_path, data, rewards, *extra, environment=True):
    env = [
        "rollout.environment=gridworld",
        "rollout.environment_args={max_steps: 2, size: 5, min_distance: 1}",
        "rollout.max_turns=2",
        "rollout.max_total_tokens=300",
    ]
    return load_config(
        None,
        [
            f"output_dir={tmp_path / 'run'}",
            "steps=1",
            "model.args.name_or_path=tiny-qwen2.5-vl",
            "model.args.max_new_tokens=8",
            "task.name=dataset",
            f"task.args={{train: {data}, eval: {data}}}",
            f"rewards={rewards}",
            "algorithm.group_size=2",
            "algorithm.prompts_per_step=1",
            "algorithm.minibatch_size=2",
            "eval.before=false",
            "eval.after=true",
            "eval.max_rows=2",
            "logging.trackers=[]",
            "logging.progress=false",
            "checkpoint.save_final=false",
            *(env if environment else []),
            *extra,
        ],
    )


def test_a_dataset_run_with_env_return_evaluates_through_the_training_reward_path(tmp_path, data, mmgrpo_cache):
    """``task.name: dataset`` with ``env_return`` (and a user reward reading ``turn_rewards``, ``tool_calls``,
    ``num_turns``) trains a step and finishes with a held-out score: the greedy trajectories carry the columns a
    training rollout records, so the held-out mean is the mean of their summed turn rewards."""
    from mmgrpo.trainer import Trainer
    from mmgrpo.types import Transcript

    cfg = _cfg(tmp_path, data, "[{name: env_return}, {name: 'my_rewards:turns', weight: 0.0}]")
    trainer = Trainer(cfg)
    rows = [trainer.task.eval_rows()[i] for i in range(2)]
    outputs = trainer.adapter.evaluate(rows)
    assert all(isinstance(o, Transcript) for o in outputs)
    assert {"turn_rewards", "tool_calls", "num_turns", "completion_ids", "messages"} <= set(outputs[0].columns)
    scores = trainer._reward_scores(outputs, rows)
    want = sum(sum(o.turn_rewards) for o in outputs) / len(outputs)
    assert scores["reward/env_return"] == pytest.approx(want, abs=1e-6)
    summary = trainer.run()
    assert math.isfinite(summary["eval/after/reward/env_return"]) and math.isfinite(summary["eval/after/reward"])
    assert math.isfinite(summary["eval/after/reward/turns"])


def test_a_dataset_run_with_deepeyes_finishes_with_a_held_out_score(tmp_path, data, mmgrpo_cache):
    """deepeyes reads ``tool_calls``: with rollout.tools on a dataset task the held-out evaluation scores it (it
    crashed on the missing column before)."""
    from mmgrpo.trainer import train

    tools = ["rollout.tools=[crop]", "rollout.max_turns=2", "rollout.max_total_tokens=300"]
    summary = train(_cfg(tmp_path, data, "[{name: deepeyes}]", *tools, environment=False))
    assert math.isfinite(summary["eval/after/reward/deepeyes"])


@pytest.mark.parametrize(
    ("reward", "said"),
    [
        ("returns_none", "returned NoneType"),
        ("returns_strings", "returned '1' (str)"),
        ("one_too_many", f"returned {2 * CHECK_GROUP + 1} values for {2 * CHECK_GROUP} samples"),
        ("needs_difficulty", "needs column(s) ['difficulty']"),
        ("raises", "raised ZeroDivisionError"),
    ],
)
def test_a_reward_that_cannot_be_scored_fails_at_load_in_one_line(tmp_path, data, reward, said, monkeypatch):
    """Each failure is one ConfigError line naming the reward (its index and spec), what it returned and the fix,
    raised before the adapter (the model) is built."""
    from mmgrpo import plugins
    from mmgrpo.trainer import Trainer

    built = []
    monkeypatch.setattr(plugins.AdapterSpec, "__call__", lambda *a, **k: built.append(a))
    cfg = _cfg(tmp_path, data, f"[{{name: env_return}}, {{name: 'my_rewards:{reward}'}}]")
    with pytest.raises(ConfigError) as e:
        Trainer(cfg)
    message = str(e.value)
    assert "\n" not in message and not built
    assert message.startswith(f"rewards[1] (my_rewards:{reward}) cannot be scored: ") and said in message
    assert "synthetic multi-turn text (environment) samples" in message and "before the model loads" in message


def test_a_string_reward_fails_at_load_through_the_cli_in_one_line(tmp_path, data, capsys):
    """Through ``mmgrpo train``: exit 2, one stderr line, no traceback (docs promise an error for "1", not 1.0)."""
    from mmgrpo.cli import main

    config = tmp_path / "run.yaml"
    config.write_text(
        "model: {args: {name_or_path: tiny-qwen2.5-vl}}\n"
        f"task: {{name: dataset, args: {{train: {data}, eval: {data}}}}}\n"
        "rewards: [{name: 'my_rewards:returns_strings'}]\n"
        "logging: {trackers: []}\n"
    )
    rc = main(["train", str(config), f"output_dir={tmp_path / 'run'}"])
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err, err
    assert "returned '1' (str)" in err and "return float(...)" in err


def test_on_error_nan_warns_for_a_reward_that_raises_but_refuses_a_broken_one(tmp_path, data, caplog):
    """Under reward_runtime.on_error: nan a reward whose own code raises on the synthetic samples is a warning (training
    scores those samples NaN); one that breaks the contract (strings) is still refused."""
    from mmgrpo.reward_check import load_rewards

    nan = "reward_runtime.on_error=nan"
    cfg = _cfg(tmp_path, data, "[{name: 'my_rewards:raises'}]", nan)
    from mmgrpo.tasks.dataset import build_dataset_task

    task = build_dataset_task({"train": str(data), "eval": str(data)})
    with caplog.at_level("WARNING"):
        load_rewards(cfg, task.train_rows()).close()
    assert "raised ZeroDivisionError" in caplog.text
    with pytest.raises(ConfigError, match="returned '1'"):
        load_rewards(_cfg(tmp_path, data, "[{name: 'my_rewards:returns_strings'}]", nan), task.train_rows())
    off = "reward_runtime.load_check=false"  # opted out: the reward is imported, not called
    load_rewards(_cfg(tmp_path, data, "[{name: 'my_rewards:returns_strings'}]", off), task.train_rows()).close()


def test_working_rewards_of_every_kind_pass_the_load_check(tmp_path, data):
    """The built-ins and user rewards reading ``completion_ids`` / the trajectory columns pass, for single-turn text,
    multi-turn (environment, tools) and image runs."""
    from mmgrpo.reward_check import check_rewards, load_rewards
    from mmgrpo.rewards import RewardRunner
    from mmgrpo.tasks.dataset import build_dataset_task

    rows = build_dataset_task({"train": str(data), "eval": str(data)}).train_rows()
    single = "[{name: accuracy}, {name: 'my_rewards:length'}]"
    load_rewards(_cfg(tmp_path, data, single, environment=False), rows).close()
    multi = "[{name: env_return}, {name: 'my_rewards:turns'}, {name: 'my_rewards:length'}]"
    load_rewards(_cfg(tmp_path, data, multi), rows).close()
    tools = ["rollout.tools=[crop]", "rollout.max_turns=2"]
    load_rewards(
        _cfg(tmp_path, data, "[{name: deepeyes}, {name: 'my_rewards:turns'}]", *tools, environment=False), rows
    )
    image = _cfg(tmp_path, data, "[{name: 'my_rewards:length'}]", environment=False)
    with pytest.raises(ConfigError, match=r"raised TypeError.*<image RGB 64x64>"):  # images: completion_ids is None
        check_rewards(RewardRunner([("my_rewards:length", 1.0)]), image, list(rows), image_outputs=True)


def test_the_synthetic_rollout_has_the_columns_of_the_run_kind(tmp_path, data):
    """B = rows · G samples, group-major; text runs have completion_ids, multi-turn ones the trajectory columns a
    rollout records (``trajectory_extras``), audio rows a waveform and its rate."""
    rows = [{"prompt": "p", "answer": "3", "seed": 0}, {"prompt": "q", "answer": "4", "seed": 1}]
    completions, extras = synthetic_rollout(_cfg(tmp_path, data, "[{name: env_return}]"), rows)
    assert len(completions) == 2 * CHECK_GROUP and "<answer>3</answer>" in completions[0]
    assert "<answer>4</answer>" in completions[CHECK_GROUP]
    assert {"completion_ids", "tool_calls", "turn_rewards", "num_turns", "anchors", "messages"} <= set(extras)
    assert all(len(v) == len(completions) for v in extras.values())
    single = _cfg(tmp_path, data, "[{name: accuracy}]", environment=False)
    _, extras = synthetic_rollout(single, [{"prompt": "p", "audio": "a.wav"}])
    assert set(extras) == {"completion_ids", "audio_array", "sampling_rate"}


CALLS: list = []


def test_the_load_check_leaves_nothing_in_the_run_process(tmp_path, data, monkeypatch):
    """A reward function runs in a forked worker for the check, so a reward that records its calls has none after
    it (the training steps are its first calls); without the fork the list would hold the check's call."""
    from mmgrpo.reward_check import load_rewards
    from mmgrpo.rewards import REWARDS, register_reward
    from mmgrpo.tasks.dataset import build_dataset_task

    def recording(completions, **kwargs):
        """Records its calls. Source: this test (the registry asks every reward for a one-line description and a
        source, and test_rewards_registry checks them on whatever is registered in its process)."""
        CALLS.append(len(completions))
        return [0.0] * len(completions)

    if "test_recording_calls" not in REWARDS:
        register_reward("test_recording_calls")(recording)
    CALLS.clear()
    rows = build_dataset_task({"train": str(data), "eval": str(data)}).train_rows()
    runner = load_rewards(_cfg(tmp_path, data, "[{name: test_recording_calls}]", environment=False), rows)
    assert CALLS == []
    runner(["a", "b"], ["p", "q"], {})  # a training call runs in this process (a registered reward: a thread)
    assert CALLS == [2]


def test_held_out_answers_carry_their_columns_through_pickling_and_task_metrics():
    """Answer / Transcript keep their reward columns when gathered across processes (pickled), and a dataset task's
    eval_rewards score with them (the same columns as the trainer's held-out rewards)."""
    import pickle

    from mmgrpo.evaluation import output_columns
    from mmgrpo.tasks.eval_rewards import EvalRewards
    from mmgrpo.types import Answer, Transcript

    outputs = [
        Transcript(
            ["<action>up</action>", "<action>left</action>"],
            turn_rewards=(1, 10),
            columns={"turn_rewards": [1.0, 10.0]},
        ),
        Transcript(["<action>up</action>"], columns={"turn_rewards": [-1.0], "tool_calls": 0}),
    ]
    back = pickle.loads(pickle.dumps(outputs))
    assert back == outputs and [o.columns for o in back] == [o.columns for o in outputs]
    assert back[0].turns == outputs[0].turns and back[0].turn_rewards == (1.0, 10.0)
    assert output_columns(back) == {"turn_rewards": [[1.0, 10.0], [-1.0]], "tool_calls": [None, 0]}
    assert pickle.loads(pickle.dumps(Answer("x", {"completion_ids": [1, 2]}))).columns == {"completion_ids": [1, 2]}
    rows = [{"prompt": "a"}, {"prompt": "b"}]
    assert EvalRewards([{"name": "env_return"}], "task.args.eval_rewards").score(back, rows) == {"env_return": 5.0}


def test_video_answers_carry_the_rollout_columns_and_the_contrast_does_not_apply(mmgrpo_cache, tiny_vlm_path):
    """A held-out video answer carries what a video rollout gives the rewards (timestamps, fps, completion ids); with
    T-GRPO's contrast on it has no shuffled samples, so temporal_contrast is not applicable (NaN) at evaluation, where
    it raised on the missing column before, and the other rewards score."""
    from mmgrpo.evaluation import reward_scores
    from mmgrpo.modalities.video.adapter import build_video_adapter
    from mmgrpo.rewards import RewardRunner
    from mmgrpo.tasks.video_motion import VideoMotionArgs, VideoMotionTask

    rows = list(VideoMotionTask(VideoMotionArgs(questions=["direction"], train_size=2, eval_size=2)).eval_rows())[:2]
    video = {"fps": 3.0, "min_frames": 4, "max_frames": 8, "min_pixels": 3136, "max_pixels": 3136}
    adapter = build_video_adapter(
        {"name_or_path": tiny_vlm_path, "max_new_tokens": 4, "video": video, "temporal_contrast": {"enabled": True}}
    )
    outputs = adapter.evaluate(rows)
    rollout = adapter.rollout(rows[:1], group_size=2)
    assert set(rollout.extras) <= set(outputs[0].columns)  # every column training gives, at evaluation too
    assert outputs[0].columns["shuffled_completions"] is None
    assert outputs[0].columns["frame_timestamps"] == rollout.extras["frame_timestamps"][0]
    assert (
        outputs[0].columns["completion_ids"][-1] in adapter.eos_ids.tolist()
        or len(outputs[0].columns["completion_ids"]) == 4
    )
    runner = RewardRunner([("accuracy", 1.0, {}), ("temporal_contrast", 1.0, {})], isolation="thread")
    scores = reward_scores(runner, adapter, outputs, rows)
    assert math.isfinite(scores["reward/accuracy"]) and math.isnan(scores["reward/temporal_contrast"])


def test_the_demo_scores_answers_with_the_columns_their_rollout_records(tmp_path, data, tiny_vlm_path):
    """The demo's reward lines come from the same columns: a greedy game answer and its sampled ones are scored with
    their turn rewards, tool calls and turn counts (a reward reading all three is not n/a; the demo passed the turn
    rewards alone before)."""
    from types import SimpleNamespace

    from mmgrpo.config import RolloutConfig
    from mmgrpo.demo.answer import answer
    from mmgrpo.modalities.vlm.adapter import build_vlm_adapter
    from mmgrpo.rewards import RewardRunner

    env = {"distance_reward": 1.0, "max_steps": 2}
    settings = RolloutConfig(environment="gridworld", environment_args=env, max_turns=2, max_total_tokens=300)
    adapter = build_vlm_adapter({"name_or_path": tiny_vlm_path, "max_new_tokens": 8}, rollout=settings)
    runner = RewardRunner([("env_return", 1.0, {}), ("my_rewards:turns", 0.0, {})], isolation="thread")
    models = SimpleNamespace(get=lambda: (adapter, adapter, runner))
    result = answer(models, {"prompt": "Walk.", "seed": 3}, seed=0, group=2, with_ground_truth=True, out_dir=tmp_path)
    greedy = adapter.evaluate([{"prompt": "Walk.", "seed": 3}])[0]
    lines = result["trained"]["rewards"]
    assert len(lines) == 3 and not any("n/a" in line for line in lines), lines
    assert lines[0].startswith(f"reward {sum(greedy.turn_rewards):.3f}")
