"""``task.name: dataset``: the published formats train from YAML alone, rows are lazy, bad data is one line."""

import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest
import torch
from PIL import Image

from mmgrpo.cli import main
from mmgrpo.config import ConfigError
from mmgrpo.tasks.dataset import build_dataset_task
from mmgrpo.types import DataError

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"


def _examples():
    spec = importlib.util.spec_from_file_location(
        "make_example_datasets", ROOT / "examples" / "make_example_datasets.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("make_example_datasets", module)
    spec.loader.exec_module(module)
    return module


EX = _examples()

TOKEN_SMALL = [
    "steps=2",
    "algorithm.group_size=2",
    "algorithm.prompts_per_step=2",
    "algorithm.minibatch_size=4",
    "model.args.max_new_tokens=4",
    "eval.max_rows=2",
    "eval.batch_size=2",
    "logging.progress=false",
    "logging.plot=false",
    "logging.trackers=[]",
    "checkpoint.save_final=false",
]
FLOW_SMALL = [
    "steps=2",
    "algorithm.group_size=2",
    "algorithm.prompts_per_step=2",
    "algorithm.minibatch_size=4",
    "model.args.num_steps=4",
    "model.args.eval_num_steps=2",
    "eval.max_rows=2",
    "logging.plot=false",
    "checkpoint.save_final=false",
]


def _run(config: str, tmp_path: Path, overrides: list[str]) -> tuple[dict, list[dict]]:
    out = tmp_path / "run"
    assert main(["train", str(CONFIGS / config), f"output_dir={out}", *overrides]) == 0
    summary = json.loads((out / "summary.json").read_text())
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return summary, metrics


def _steps(metrics: list[dict]) -> list[dict]:
    return [m for m in metrics if "loss/policy" in m]


def test_vlm_r1_rec_jsonl_trains_with_iou_reward(tmp_path, mmgrpo_cache):
    train = EX.write_vlm_r1_rec(tmp_path / "rec", n=8)
    summary, metrics = _run(
        "dataset_vlm_r1_rec.yaml",
        tmp_path,
        [
            *TOKEN_SMALL,
            f"task.args.train={train}",
            f"task.args.media_root={train.parent}",
        ],
    )
    steps = _steps(metrics)
    assert len(steps) == 2 and all(math.isfinite(s["loss/policy"]) for s in steps)
    assert all("reward/iou" in s and s["data/skipped_rows"] == 0 for s in steps)
    # held-out scored by the configured rewards: each reward's mean and the combined reward, before and after
    for stage in ("before", "after"):
        assert 0 <= summary[f"eval/{stage}/reward/iou"] <= 1 and 0 <= summary[f"eval/{stage}/reward/format"] <= 1
        assert summary[f"eval/{stage}/reward"] == pytest.approx(
            summary[f"eval/{stage}/reward/iou"] + 0.5 * summary[f"eval/{stage}/reward/format"], abs=1e-6
        )


def test_video_r1_json_with_mp4_paths_trains(tmp_path, mmgrpo_cache):
    train = EX.write_video_r1(tmp_path / "vr1", n=4)
    summary, metrics = _run(
        "dataset_video_r1.yaml",
        tmp_path,
        [
            *TOKEN_SMALL,
            f"task.args.train={train}",
            f"task.args.media_root={train.parent}",
            "task.args.eval_fraction=0.4",
            "model.args.video.max_frames=4",
        ],
    )
    steps = _steps(metrics)
    assert len(steps) == 2 and all(math.isfinite(s["loss/policy"]) for s in steps)
    assert 0 <= summary["eval/after/reward/multiple_choice"] <= 1
    samples = json.loads((tmp_path / "run" / "samples_after.json").read_text())
    assert samples and all("Options:\nA. " in s["prompt"] for s in samples)  # the Video-R1 template was applied


def test_trl_conversational_save_to_disk_trains(tmp_path, mmgrpo_cache):
    path = EX.write_trl_conversational(tmp_path / "trl", n=8)
    summary, metrics = _run("dataset_trl_conversational.yaml", tmp_path, [*TOKEN_SMALL, f"task.args.train={path}"])
    assert len(_steps(metrics)) == 2
    assert 0 <= summary["eval/after/reward/accuracy"] <= 1 and "eval/after/reward" in summary


def test_flow_grpo_prompt_txt_trains(tmp_path, mmgrpo_cache):
    train, test = EX.write_flow_grpo_prompts(tmp_path / "flow")
    summary, metrics = _run(
        "dataset_flow_prompts.yaml",
        tmp_path,
        [
            *FLOW_SMALL,
            f"task.args.train={train}",
            f"task.args.eval={test}",
        ],
    )
    assert len(_steps(metrics)) == 2
    assert 0 <= summary["eval/after/reward/flow_shape_match"] <= 1


# ----------------------------------------------------------------------------------------- bad data


def _png(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (28, 28), (200, 30, 30)).save(path)
    return path


def _jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def _one_line_error(args: dict) -> str:
    with pytest.raises(DataError) as info:
        build_dataset_task(args)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_dry_run_reports_a_missing_image_with_file_row_and_column(tmp_path, capsys):
    _png(tmp_path / "images" / "a.png")
    data = _jsonl(
        tmp_path / "train.jsonl",
        [
            {"question": "q1", "img": "images/a.png"},
            {"question": "q2", "img": "images/missing.png"},
        ],
    )
    rc = main(
        [
            "train",
            str(CONFIGS / "dataset_trl_conversational.yaml"),
            f"task.args.train={data}",
            "task.args.columns={prompt: question, image: img}",
            "task.args.eval_fraction=0",
            "--dry-run",
        ]
    )
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1
    assert str(data) in err and "line 2" in err and "column 'image'" in err and "missing.png" in err


def test_bad_data_cases_are_one_line_with_the_row(tmp_path):
    images = tmp_path / "images"
    _png(images / "ok.png")
    (images / "empty.png").write_bytes(b"")
    full = (images / "ok.png").read_bytes()
    (images / "truncated.png").write_bytes(full[: len(full) // 2])
    (images / "garbage.png").write_bytes(b"this is not an image" * 10)
    (tmp_path / "corrupt.mp4").write_bytes(b"\x00\x00\x00\x18ftypmp42" + b"garbage" * 50)

    def case(row_or_line, columns=None) -> str:
        first = {"prompt": "fine", "question": "fine", "solution": "s", "image": "images/ok.png"}
        data = _jsonl(tmp_path / "d.jsonl", [first, row_or_line])
        return _one_line_error({"train": str(data), "columns": columns or {}})

    where = f"{tmp_path / 'd.jsonl'}: line 2"
    msg = case({"question": "x"}, {"prompt": "question", "answer": "solution"})
    assert where in msg and "column 'solution'" in msg and "missing" in msg
    msg = case({"prompt": "x", "image": "images/nope.png"})
    assert where in msg and "column 'image'" in msg and "does not exist" in msg
    msg = case({"prompt": "x", "image": "images/empty.png"})
    assert where in msg and "empty (0 bytes)" in msg
    msg = case({"prompt": "x", "image": "images/truncated.png"})
    assert where in msg and "truncated.png" in msg and "cannot be read" in msg
    msg = case({"prompt": "x", "image": ["images/ok.png", "images/garbage.png"]})  # multi-image row
    assert where in msg and "garbage.png" in msg
    msg = case({"prompt": "x", "video": "corrupt.mp4"})
    assert where in msg and "column 'video'" in msg and "cannot be decoded" in msg
    msg = case('{"prompt": "x", "image": ')  # a bad JSON line
    assert where in msg and "not valid JSON" in msg
    msg = case({"prompt": "x", "audio": "speech/nope.wav"})
    assert where in msg and "column 'audio'" in msg and "does not exist" in msg
    msg = case({"no_prompt": "x"})
    assert where in msg and "column 'prompt' is missing" in msg


def test_corrupt_mp4_in_the_video_encoder_is_one_line(tmp_path):
    from mmgrpo.modalities.tokens.video import VideoSampling, decode_clip

    bad = tmp_path / "corrupt.mp4"
    bad.write_bytes(b"\x00\x00\x00\x18ftypmp42" + b"garbage" * 50)
    with pytest.raises(DataError) as info:
        decode_clip(str(bad), VideoSampling())
    assert "corrupt.mp4" in str(info.value) and "cannot be decoded" in str(info.value)
    assert "\n" not in str(info.value) and "read_video" not in str(info.value)


def test_an_unreadable_row_is_skipped_and_counted_at_train_time(tmp_path, mmgrpo_cache):
    _png(tmp_path / "images" / "ok.png")
    rows = [{"prompt": f"q{i}", "image": "images/ok.png", "answer": "red"} for i in range(4)]
    rows[3]["image"] = "images/deleted.png"  # past the start-up check (check_rows=2)
    data = _jsonl(tmp_path / "train.jsonl", rows)
    out = tmp_path / "run"
    assert (
        main(
            [
                "train",
                str(CONFIGS / "dataset_trl_conversational.yaml"),
                *TOKEN_SMALL,
                f"output_dir={out}",
                f"task.args.train={data}",
                "task.args.check_rows=2",
                "task.args.eval_fraction=0",
                "algorithm.prompts_per_step=4",
                "eval.before=false",
                "eval.after=false",
            ]
        )
        == 0
    )
    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps[0]["data/skipped_rows"] >= 1  # 4 prompts per step over 4 rows: the bad one was drawn
    assert steps[-1]["data/skipped_rows"] >= steps[0]["data/skipped_rows"]


# ----------------------------------------------------------------------------------------- lazy rows


def test_100k_row_jsonl_starts_training_without_opening_every_image(tmp_path, mmgrpo_cache, monkeypatch):
    import mmgrpo.media as media

    for k in range(4):
        _png(tmp_path / "images" / f"{k}.png")
    with open(tmp_path / "big.jsonl", "w") as f:
        for i in range(100_000):
            f.write(
                json.dumps({"prompt": f"What colour is shape {i}?", "image": f"images/{i % 4}.png", "answer": "red"})
                + "\n"
            )
    opened = []
    original = media.Image.open
    monkeypatch.setattr(media.Image, "open", lambda fp, *a, **k: opened.append(fp) or original(fp, *a, **k))
    out = tmp_path / "run"
    assert (
        main(
            [
                "train",
                str(CONFIGS / "dataset_trl_conversational.yaml"),
                *TOKEN_SMALL,
                "steps=1",
                f"output_dir={out}",
                f"task.args.train={tmp_path / 'big.jsonl'}",
                "task.args.eval_fraction=0.0001",
                "eval.before=false",
            ]
        )
        == 0
    )
    # start-up check (8 train + 8 held-out rows) + 2 sampled rows + 2 evaluated: a few dozen at most, not 100k
    assert 0 < len(opened) <= 40, len(opened)
    assert len(json.loads((out / "summary.json").read_text())) > 0


# ----------------------------------------------------------------------------------- prompts & splits


def test_columns_templates_system_prompt_and_conversations(tmp_path):
    _png(tmp_path / "a.png")
    _png(tmp_path / "b.png")
    data = _jsonl(
        tmp_path / "d.jsonl",
        [
            {"problem": "Which is red?", "pics": ["a.png", "b.png"], "solution": "A", "boxes": [[1, 2, 3, 4]]},
            {
                "id": 7,
                "image": "a.png",
                "conversations": [
                    {"from": "human", "value": "<image>Where is it?"},
                    {"from": "gpt", "value": "[1, 2, 3, 4]"},
                ],
            },
        ],
    )
    task = build_dataset_task(
        {
            "train": str(data),
            "columns": {"prompt": "problem", "image": "pics", "answer": "solution"},
            "prompt_template": "{prompt} Output the thinking process in <think></think>.",
            "system_prompt": "You are a helpful assistant.",
            "check_rows": 1,
        }
    )
    row = task.train_rows()[0]
    assert row["boxes"] == [[1, 2, 3, 4]] and row["answer"] == "A"  # other columns reach the rewards unchanged
    assert [img.size for img in row["image"]] == [(28, 28), (28, 28)]  # multi-image, opened from media_root
    system, user = row["prompt"]
    assert system == {"role": "system", "content": "You are a helpful assistant."}
    assert user["content"] == [
        {"type": "image"},
        {"type": "image"},
        {"type": "text", "text": "Which is red? Output the thinking process in <think></think>."},
    ]
    with pytest.raises(DataError, match="column 'problem'"):
        task.train_rows()[1]
    plain = build_dataset_task({"train": str(data), "check_rows": 0}).train_rows()[1]
    assert plain["prompt"] == "Where is it?" and plain["answer"] == "[1, 2, 3, 4]" and plain["id"] == 7


def test_eval_fraction_is_a_seeded_disjoint_split_and_formats_agree(tmp_path):
    rows = [{"prompt": f"p{i}", "answer": str(i)} for i in range(20)]
    jsonl = _jsonl(tmp_path / "d.jsonl", rows)
    (tmp_path / "d.json").write_text(json.dumps(rows))
    (tmp_path / "d.csv").write_text("prompt,answer\n" + "".join(f"p{i},{i}\n" for i in range(20)))
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "d.parquet")
    prompts = {}
    for ext in ("jsonl", "json", "csv", "parquet"):
        task = build_dataset_task({"train": str(tmp_path / f"d.{ext}"), "eval_fraction": 0.25, "seed": 3})
        train = [r["prompt"] for r in task.train_rows()]
        held = [r["prompt"] for r in task.eval_rows()]
        assert len(held) == 5 and len(train) == 15 and not set(train) & set(held)
        prompts[ext] = (train, held)
    assert len({str(v) for v in prompts.values()}) == 1
    assert len(build_dataset_task({"train": str(jsonl), "max_rows": 6}).train_rows()) == 6


def test_config_mistakes_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match=r"task.args.train: data file .* does not exist"):
        build_dataset_task({"train": str(tmp_path / "nope.jsonl")})
    with pytest.raises(ConfigError, match=r"unknown field 'task.args.colums'"):
        build_dataset_task({"train": "x.jsonl", "colums": {}})
    with pytest.raises(ConfigError, match="eval_fraction: must be in"):
        build_dataset_task({"train": "x.jsonl", "eval_fraction": 1.5})


# ------------------------------------------------------------------------------ adapter prompt checks


def test_overlong_prompt_is_an_error_or_truncated(tiny_vlm_path):
    from mmgrpo.modalities.vlm.adapter import build_vlm_adapter

    adapter = build_vlm_adapter({"name_or_path": tiny_vlm_path, "max_new_tokens": 4})
    adapter.context_length = 64  # the tiny model's 4096 would need a very long test prompt
    long_row = {"prompt": "red green blue " * 40}
    with pytest.raises(DataError, match=r"prompt tokens \+ max_new_tokens 4 exceed the model's context of 64"):
        adapter._encode_prompt(long_row)
    adapter.args.overlong_prompts = "truncate"
    enc = adapter._encode_prompt(long_row)
    assert enc["input_ids"].shape[1] == 60 and enc["attention_mask"].shape[1] == 60
    assert adapter.truncated_prompts == 1
    with pytest.raises(DataError, match="would cut media tokens"):  # the image tokens come first
        adapter._encode_prompt({**long_row, "image": Image.new("RGB", (56, 56))})


def test_missing_local_model_path_is_one_line(tmp_path):
    from mmgrpo.modalities.vlm.adapter import build_vlm_adapter

    with pytest.raises(ConfigError, match=r"does not exist \(a local path\); check the path") as info:
        build_vlm_adapter({"name_or_path": str(tmp_path / "no" / "such" / "model")})
    assert "\n" not in str(info.value) and "Repo id must be in the form" not in str(info.value).split("(")[0]


def test_hub_ids_go_through_load_dataset(monkeypatch):
    import datasets

    calls = []

    def fake_load_dataset(path, split=None):
        calls.append((path, split))
        return datasets.Dataset.from_dict({"prompt": ["a", "b", "c", "d"], "answer": ["1", "2", "3", "4"]})

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    task = build_dataset_task({"train": "org/vqa", "split": "train", "eval": "org/vqa", "eval_split": "test"})
    assert calls == [("org/vqa", "train"), ("org/vqa", "test")]
    assert task.train_rows()[3] == {"prompt": "d", "answer": "4"}

    def offline(path, split=None):
        raise ConnectionError("Couldn't reach 'org/vqa' on the Hub (LocalEntryNotFoundError)\nmore detail")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(
        ConfigError, match="'org/vqa' is neither a local file/directory nor loadable from the hub"
    ) as info:
        build_dataset_task({"train": "org/vqa"})
    assert "\n" not in str(info.value)


def test_multi_image_prompts_and_part_count_check(tiny_vlm_path):
    from mmgrpo.modalities.vlm.adapter import build_vlm_adapter

    adapter = build_vlm_adapter({"name_or_path": tiny_vlm_path, "max_new_tokens": 4})
    images = [Image.new("RGB", (56, 56), (200, 0, 0)), Image.new("RGB", (56, 56), (0, 0, 200))]
    enc = adapter._encode_prompt({"prompt": "Which is red?", "image": images})
    assert enc["image_grid_thw"].shape == (2, 3)  # two images, one grid each
    chat = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Which is red?"}]}]
    with pytest.raises(DataError, match=r"messages hold 1 \{'type': 'image'\} part\(s\) but the row has 2 image"):
        adapter._encode_prompt({"prompt": chat, "image": images})
    two = [{"role": "user", "content": [{"type": "image"}, {"type": "image"}, {"type": "text", "text": "Which?"}]}]
    assert torch.equal(adapter._encode_prompt({"prompt": two, "image": images})["pixel_values"], enc["pixel_values"])
