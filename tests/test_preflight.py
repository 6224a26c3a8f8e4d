"""The load-time check (``mmgrpo.preflight``) catches at ``--dry-run``, and at the start of ``train`` before the
model loads, what used to fail after it: a column a reward needs, an eval split, warm-up rows, media outside
``media_root``, a row without the media its file's rows carry. Each failure is one line naming the file, row
and option."""

import json
import os

import pytest
from PIL import Image

from mmgrpo.cli import main
from mmgrpo.config import ConfigError
from mmgrpo.loader import load_config
from mmgrpo.preflight import preflight
from mmgrpo.tasks.dataset import build_dataset_task
from mmgrpo.types import DataError

NO_MODEL = os.path.dirname(os.path.abspath(__file__))  # a folder without a model: never loaded (issue 53: the
# name is checked at load, so it must exist; the load-time checks under test come first)

BASE = [
    "model.adapter=vlm",
    f"model.args.name_or_path={NO_MODEL}",  # never loaded: the check comes first
    "task.name=dataset",
    "logging.trackers=[]",
    "logging.progress=false",
]


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _run(capsys, config, *args) -> tuple[int, str]:
    rc = main(["train", str(config), "--dry-run", *args])
    return rc, capsys.readouterr().err.strip()


@pytest.fixture
def empty(tmp_path):
    """A config file holding no values: the tests set everything by overrides."""
    (tmp_path / "empty.yaml").write_text("{}\n")
    return tmp_path / "empty.yaml"


def test_a_column_a_reward_needs_fails_the_dry_run_and_train_before_the_model(tmp_path, capsys, empty):
    data = _jsonl(tmp_path / "d.jsonl", [{"prompt": "Where is the cat?", "box": "[1, 2, 3, 4]"}] * 3)
    args = [*BASE, f"task.args.train={data}", f"output_dir={tmp_path / 'run'}", "rewards=[{name: iou}]"]
    rc, err = _run(capsys, empty, *args)
    assert rc == 2 and len(err.splitlines()) == 1
    assert f"{data}: line 1" in err and "reward 'iou' (rewards[0]) needs the column 'answer'" in err
    assert "task.args.columns.answer" in err and "rewards[0].kwargs.answer_key" in err
    assert main(["train", str(empty), *args]) == 2  # the same line from `train`, not the missing model's error
    assert capsys.readouterr().err.strip() == err
    assert _run(capsys, empty, *args, "rewards=[{name: iou, kwargs: {answer_key: box}}]")[0] == 0
    assert _run(capsys, empty, *args, "task.args.columns={answer: box}")[0] == 0
    # TRL's name for it, solution, is read as answer (issue 53; before, it was this column's case above)
    trl = _jsonl(tmp_path / "trl.jsonl", [{"prompt": "Where is the cat?", "solution": "[1, 2, 3, 4]"}] * 3)
    assert _run(capsys, empty, *args, f"task.args.train={trl}")[0] == 0


def test_rows_routed_away_from_a_reward_do_not_need_its_column(tmp_path, capsys, empty):
    rows = [{"prompt": "q", "reward_type": "text", "answer": "a"}, {"prompt": "q", "reward_type": "box"}]
    data = _jsonl(tmp_path / "d.jsonl", rows)
    routed = "rewards=[{name: accuracy, reward_types: [text]}, {name: format, reward_types: [box]}]"
    assert _run(capsys, empty, *BASE, f"task.args.train={data}", routed)[0] == 0
    rc, err = _run(capsys, empty, *BASE, f"task.args.train={data}", "rewards=[{name: accuracy}]")
    assert rc == 2 and f"{data}: line 2" in err and "needs the column 'answer'" in err


def test_eval_split_without_eval(tmp_path, capsys, empty):
    datasets = pytest.importorskip("datasets")
    data = _jsonl(tmp_path / "d.jsonl", [{"prompt": "q", "answer": "a"}] * 2)
    rc, err = _run(
        capsys, empty, *BASE, f"task.args.train={data}", "task.args.eval_split=test", "rewards=[{name: accuracy}]"
    )
    assert rc == 2 and "task.args.eval_split: 'test' names a split" in err and "task.args.eval" in err
    saved = tmp_path / "dd"
    datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_dict({"prompt": ["t1", "t2", "t3"], "answer": ["a", "b", "c"]}),
            "test": datasets.Dataset.from_dict({"prompt": ["e1"], "answer": ["z"]}),
        }
    ).save_to_disk(str(saved))
    task = build_dataset_task({"train": str(saved), "eval_split": "test"})  # evaluates the test split
    assert [r["prompt"] for r in task.eval_rows()] == ["e1"] and len(task.train_rows()) == 3
    with pytest.raises(ConfigError, match="either eval / eval_split"):
        build_dataset_task({"train": str(saved), "eval_split": "test", "eval_fraction": 0.5})


def test_warmup_on_a_dataset_needs_its_target_column(tmp_path, capsys, empty):
    data = _jsonl(tmp_path / "d.jsonl", [{"prompt": "q", "answer": "a"}] * 3)
    args = [*BASE, f"task.args.train={data}", "rewards=[{name: accuracy}]", "warmup.steps=5"]
    rc, err = _run(capsys, empty, *args)
    assert rc == 2 and "warmup.steps: 5 but task 'dataset' has no warm-up rows" in err and "warmup.target_column" in err
    rc, err = _run(capsys, empty, *args, "warmup.target_column=label")
    assert rc == 2 and f"{data}: line 1: warmup.target_column 'label' is missing" in err
    rc, err = _run(
        capsys, empty, *args, "warmup.target_column=answer", "warmup.target_template='<answer>{nope}</answer>'"
    )
    assert rc == 2 and "warmup.target_template" in err
    assert (
        _run(capsys, empty, *args, "warmup.target_column=answer", "warmup.target_template='<answer>{target}</answer>'")[
            0
        ]
        == 0
    )


def _png(path):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (28, 28), (200, 0, 0)).save(path)
    return path


@pytest.mark.parametrize("how", ["dotdot", "absolute", "symlink"])
def test_media_outside_media_root_is_refused_unless_allowed(tmp_path, how):
    outside = _png(tmp_path / "elsewhere" / "x.png")
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    value = {"dotdot": "../elsewhere/x.png", "absolute": str(outside), "symlink": "link.png"}[how]
    if how == "symlink":
        os.symlink(outside, data_dir / "link.png")
    _png(data_dir / "inside.png")
    data = _jsonl(data_dir / "d.jsonl", [{"prompt": "q", "image": "inside.png"}, {"prompt": "q", "image": value}])
    with pytest.raises(DataError) as info:
        build_dataset_task({"train": str(data)})
    msg = str(info.value)
    assert f"{data}: line 2: column 'image'" in msg and "outside the media root" in msg
    assert "task.args.allow_outside_media_root: true" in msg and "\n" not in msg
    task = build_dataset_task({"train": str(data), "allow_outside_media_root": True})
    assert task.train_rows()[1]["image"].size == (28, 28)


def test_a_row_without_the_media_its_file_carries_is_a_data_error(tmp_path):
    _png(tmp_path / "a.png")
    rows = [{"prompt": "q", "image": "a.png"}, {"prompt": "q"}, {"prompt": "q", "image": None}]
    data = _jsonl(tmp_path / "d.jsonl", rows)
    task = build_dataset_task({"train": str(data), "check_rows": 1})
    with pytest.raises(DataError, match=r"line 2: column 'image' is missing, but other rows of this file have it"):
        task.train_rows()[1]
    assert "image" not in task.train_rows()[2] or task.train_rows()[2]["image"] is None  # explicit null: text-only


def test_trl_conversational_text_dataset_and_flags_in_any_order(tmp_path, capsys, empty):
    rows = [{"prompt": [{"role": "user", "content": f"What is {i} + 1?"}], "solution": f"${i + 1}$"} for i in range(4)]
    data = _jsonl(tmp_path / "d.jsonl", rows)
    cfg = load_config(None, [*BASE, f"task.args.train={data}", "rewards=[{name: 'trl.rewards:accuracy_reward'}]"])
    task = preflight(cfg)
    assert task.train_rows()[2]["prompt"] == rows[2]["prompt"]  # no media: the chat is kept as written
    out = tmp_path / "run"
    args = [*BASE, f"task.args.train={data}", "rewards=[{name: 'trl.rewards:accuracy_reward'}]"]
    assert main(["train", str(empty), "--dry-run", *args, f"output_dir={out}", "overwrite=true", "--print-config"]) == 0
    assert "overwrite: true" in capsys.readouterr().out


def test_unknown_flags_are_still_refused(capsys):
    with pytest.raises(SystemExit):
        main(["train", "configs/quickstart.yaml", "--dry-run", "--bogus"])
    assert "unrecognized arguments: --bogus" in capsys.readouterr().err


def test_lora_target_modules_all_linear_reaches_peft(tiny_vlm_path):
    from mmgrpo.modalities.vlm.adapter import build_vlm_adapter

    cfg = load_config(
        None, ["model.lora.enabled=true", "model.lora.target_modules=all-linear", "rewards=[{name: format}]"]
    )
    assert cfg.model.lora.target_modules == "all-linear"
    adapter = build_vlm_adapter({"name_or_path": tiny_vlm_path, "max_new_tokens": 4}, lora=cfg.model.lora)
    peft_config = adapter.model.peft_config["default"]
    assert "q_proj" in peft_config.target_modules and "gate_proj" in peft_config.target_modules  # every linear
