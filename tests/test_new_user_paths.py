"""Issue 53, what a new user hits with own paths, own rewards and TRL habits (each row of the issue's table that is
covered here: one line before the model loads, or the case works):

- a relative ``train:`` path resolves against the config's folder (as reward modules do), from any working directory;
  the working directory still works with a one-line note; the saved config holds absolute paths;
- ``mmgrpo demo`` of a run whose config names ``my_rewards:fn`` from another folder starts with registered rewards
  only and says so in one line; its example dropdown shows the prompts' text;
- a typo of a TRL name gets "did you mean" by edit distance.
"""

import json
import logging
from pathlib import Path

import pytest
import yaml

from mmgrpo.cli import main
from mmgrpo.config import dump_config
from mmgrpo.loader import load_config

ROOT = Path(__file__).resolve().parents[1]
ROWS = [{"prompt": f"What is {i} plus {i}?", "answer": str(2 * i)} for i in range(6)]


def _project(tmp_path: Path, train: str = "data/train.jsonl", rewards=None) -> Path:
    """``tmp_path/project/``: ``run.yaml`` (tiny text VLM, the dataset task reading ``train``) and its data in
    ``project/data/``; returns the config's path."""
    project = tmp_path / "project"
    (project / "data").mkdir(parents=True)
    (project / "data" / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    config = {
        "model": {"adapter": "vlm", "args": {"name_or_path": "tiny-qwen2.5-vl", "max_new_tokens": 4}},
        "task": {"name": "dataset", "args": {"train": train, "eval_fraction": 0.34, "check_rows": 2}},
        "rewards": rewards or [{"name": "accuracy"}],
        "algorithm": {"group_size": 2, "prompts_per_step": 2},
    }
    (project / "run.yaml").write_text(yaml.safe_dump(config))
    return project / "run.yaml"


def _dry_run(config: Path, tmp_path: Path, *overrides: str) -> tuple[int, str]:
    return main(["train", str(config), "--dry-run", f"output_dir={tmp_path / 'runs' / 'a'}", *overrides])


def test_a_relative_data_path_resolves_against_the_configs_folder_from_anywhere(tmp_path, monkeypatch, capsys):
    config = _project(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert _dry_run(config, tmp_path) == 0, capsys.readouterr().err
    cfg = load_config(config)
    train = cfg.task.args["train"]
    assert Path(train).is_absolute() and Path(train) == (config.parent / "data" / "train.jsonl").resolve()
    saved = yaml.safe_load(dump_config(cfg))  # what the run directory's config.yaml holds
    assert saved["task"]["args"]["train"] == train


def test_the_working_directory_still_works_with_a_one_line_note(tmp_path, monkeypatch, caplog):
    config = _project(tmp_path, train="project/data/train.jsonl")  # relative to tmp_path, not to project/
    monkeypatch.chdir(tmp_path)
    with caplog.at_level(logging.WARNING, logger="mmgrpo.config_paths"):
        cfg = load_config(config)
    assert Path(cfg.task.args["train"]) == (tmp_path / "project" / "data" / "train.jsonl").resolve()
    notes = [r.getMessage() for r in caplog.records if r.name == "mmgrpo.config_paths"]
    assert len(notes) == 1 and "\n" not in notes[0] and "config's folder" in notes[0] and "task.args.train" in notes[0]


def test_a_path_given_on_the_command_line_is_read_from_the_working_directory(tmp_path, monkeypatch):
    config = _project(tmp_path)
    monkeypatch.chdir(config.parent / "data")
    cfg = load_config(config, ["task.args.train=train.jsonl"])
    assert Path(cfg.task.args["train"]) == (config.parent / "data" / "train.jsonl").resolve()


def test_a_missing_data_file_is_still_one_line(tmp_path, monkeypatch, capsys):
    config = _project(tmp_path, train="data/nope.jsonl")
    monkeypatch.chdir(tmp_path)
    assert _dry_run(config, tmp_path) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "nope.jsonl" in err and "does not exist" in err


# ------------------------------------------------------------------------------------------------------ demo


def _run_dir(tmp_path: Path) -> Path:
    """A run directory as ``mmgrpo train`` leaves its config: the config names ``my_rewards:fn`` from the project's
    folder, which is not on this process's path when the demo reads it."""
    (tmp_path / "project").mkdir(parents=True, exist_ok=True)
    (tmp_path / "project" / "my_rewards.py").write_text(
        "def fn(completions, **kw):\n    return [1.0 for _ in completions]\n"
    )
    config = _project(tmp_path, rewards=[{"name": "my_rewards:fn"}, {"name": "format"}])
    cfg = load_config(config)
    run = tmp_path / "runs" / "a_full"
    run.mkdir(parents=True)
    (run / "config.yaml").write_text(dump_config(cfg))
    return run


def test_the_demo_of_a_run_naming_its_own_reward_module_starts_with_registered_rewards_only(
    tmp_path, monkeypatch, caplog
):
    pytest.importorskip("gradio", reason="the demo needs the demo extra: pip install -e '.[demo]'")
    import sys

    from mmgrpo.demo import Models, build_app, load_run_config

    run = _run_dir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if Path(p or ".").resolve() != tmp_path / "project"])
    sys.modules.pop("my_rewards", None)
    other = tmp_path / "other"
    other.mkdir()
    monkeypatch.chdir(other)
    cfg = load_run_config(run)  # untrusted: the module is neither imported nor looked for
    assert [r.name for r in cfg.rewards] == ["my_rewards:fn", "format"] and "my_rewards" not in sys.modules
    models = Models(cfg, None)
    assert models.skipped_rewards == ["my_rewards:fn"]
    with caplog.at_level(logging.WARNING, logger="mmgrpo.demo"):
        runner = models._rewards()
    assert runner is not None and "my_rewards" not in sys.modules
    lines = [r.getMessage() for r in caplog.records if "my_rewards:fn" in r.getMessage()]
    assert len(lines) == 1 and "\n" not in lines[0] and "--trust-run-config" in lines[0]
    app = build_app(run, models, cfg)  # the held-out rows come from the absolute data path, from another folder
    dropdown = next(b for b in app.blocks.values() if getattr(b, "elem_id", None) == "example")
    labels = [c[0] if isinstance(c, (list, tuple)) else c for c in dropdown.choices]
    assert labels and all(": What is " in label for label in labels), labels


def test_example_labels_show_the_prompts_text():
    from mmgrpo.demo.model_tab import example_label

    chat = [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "How many\nsquares?"}]},
    ]
    assert example_label(0, {"prompt": chat}) == "0: How many squares?"
    assert example_label(4, {"prompt": [{"role": "user", "content": "2 + 2?"}]}) == "4: 2 + 2?"
    assert example_label(1, {"prompt": "x" * 80}) == "1: " + "x" * 70 + "…"


# ------------------------------------------------------------------------------------------- TRL name typos


@pytest.mark.parametrize(
    "override,expected",
    [
        ("num_generation=4", "did you mean TRL's 'num_generations'? mmgrpo's is algorithm.group_size"),
        ("algorithm.num_generation=4", "did you mean TRL's 'num_generations'? mmgrpo's is algorithm.group_size"),
        ("max_completion_len=8", "did you mean TRL's 'max_completion_length'? mmgrpo's is model.args.max_new_tokens"),
        ("group_size=4", "did you mean 'algorithm.group_size'?"),
        ("algorithm.lr=0.1", "did you mean 'optim.lr'?"),
        ("algorithm.estimater=grpo", "did you mean 'estimator'?"),
    ],
)
def test_a_typo_of_a_trl_name_or_a_field_of_another_section_gets_did_you_mean(override, expected, capsys):
    assert main(["train", str(ROOT / "configs" / "quickstart.yaml"), "--dry-run", override]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and expected in err, err


def test_edit_distance():
    from mmgrpo.suggest import edit_distance

    assert edit_distance("num_generation", "num_generations") == 1
    assert edit_distance("kitten", "sitting") == 3 and edit_distance("", "abc") == 3


# ------------------------------------------------------------------------------------------- smaller ones


def _dataset(tmp_path: Path, rows: list[dict], *extra: str, name: str = "train.jsonl") -> list[str]:
    path = tmp_path / name
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return [
        "task.name=dataset",
        f"task.args={{train: {path}, check_rows: 2}}",
        f"output_dir={tmp_path / 'runs' / 'a'}",
        "warmup.steps=0",
        *extra,
    ]


def test_max_turns_one_with_tools_or_an_environment_is_refused_at_load(capsys):
    for config, what in [("zoom_tools.yaml", "rollout.tools"), ("gridworld_grpo.yaml", "rollout.environment")]:
        assert main(["train", str(ROOT / "configs" / config), "--dry-run", "rollout.max_turns=1"]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "rollout.max_turns: 1" in err and what in err, err


def test_an_environment_task_with_chat_prompts_is_refused_before_the_model_loads(tmp_path, capsys):
    rows = [{"prompt": [{"role": "user", "content": "Play."}]} for _ in range(3)]
    config = str(ROOT / "configs" / "gridworld_grpo.yaml")
    no_warmup = "checkpoint.after_warmup=false"
    assert main(["train", config, "--dry-run", *_dataset(tmp_path, rows, no_warmup)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "train.jsonl: line 1" in err and "plain-string prompts" in err, err
    rows = [{"prompt": "Play."} for _ in range(3)]  # the same rows as text pass
    assert main(["train", config, "--dry-run", *_dataset(tmp_path, rows, no_warmup)]) == 0, capsys.readouterr().err


def test_trl_data_with_solution_works_with_the_built_in_accuracy(tmp_path, capsys):
    rows = [{"prompt": f"{i} + {i}?", "solution": str(2 * i)} for i in range(4)]
    args = _dataset(tmp_path, rows, "rewards=[{name: accuracy}]")
    assert main(["train", str(ROOT / "configs" / "quickstart.yaml"), "--dry-run", *args]) == 0, capsys.readouterr()
    from mmgrpo.tasks.dataset import build_dataset_task

    row = build_dataset_task({"train": str(tmp_path / "train.jsonl")}).train_rows()[0]
    assert row["answer"] == row["solution"] == "0"
    from mmgrpo.rewards import RewardRunner
    from mmgrpo.rewards.runner import score_rows

    runner = RewardRunner([("accuracy", 1.0, {})], timeout_s=10)
    rewards, _ = score_rows(runner, ["<answer>0</answer>", "<answer>5</answer>"], [row], 2)
    assert rewards.reshape(-1).tolist() == [1.0, 0.0]


def test_whisper_csv_without_a_mapping_names_the_audio_column(tmp_path, capsys):
    import numpy as np
    import soundfile

    soundfile.write(tmp_path / "a.wav", np.zeros(1600, dtype=np.float32), 16000)
    (tmp_path / "train.csv").write_text("file,text\na.wav,hello\na.wav,hello\n")
    args = [
        "task.name=dataset",
        f"task.args={{train: {tmp_path / 'train.csv'}}}",
        f"output_dir={tmp_path / 'r'}",
        "warmup.steps=0",
    ]
    assert main(["train", str(ROOT / "configs" / "speech_whisper_asr.yaml"), "--dry-run", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "task.args.columns: {audio: file}" in err and "no prompt" in err, err
    args[1] = f"task.args={{train: {tmp_path / 'train.csv'}, columns: {{audio: file, answer: text}}}}"
    assert main(["train", str(ROOT / "configs" / "speech_whisper_asr.yaml"), "--dry-run", *args]) == 0, (
        capsys.readouterr()
    )


def test_a_reward_returning_strings_is_an_error_not_coerced():
    from mmgrpo.rewards import RewardRunner
    from mmgrpo.rewards.runner import RewardError, score_rows

    def says_one(completions, **kwargs):
        return ["1" for _ in completions]

    runner = RewardRunner([(says_one, 1.0, {})], timeout_s=10)
    with pytest.raises(RewardError, match=r"returned '1' \(str\) at sample 0; expected a float or None"):
        score_rows(runner, ["a", "b"], [{"prompt": "p"}], 2)
