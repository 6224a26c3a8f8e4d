"""What the trackers and metrics.jsonl get: evaluation samples as TensorBoard / W&B media, strict JSON records.

Two tiny real runs (a Whisper run on spoken digits, the quickstart VLM run) log to TensorBoard and to W&B
offline; both are read back from the files the trackers wrote (TensorBoard's event reader, the W&B run file).
"""

from __future__ import annotations

import json
import math
import shutil
import struct
import time
from pathlib import Path

import pytest

from mmgrpo.loader import load_config
from mmgrpo.tracking import append_jsonl
from mmgrpo.trainer import train

ROOT = Path(__file__).resolve().parents[1]
QUIET = ["logging.progress=false", "logging.plot=false", "checkpoint.save_final=false", "warmup.steps=0"]
ONE_STEP = ["steps=1", "eval.before=false", "eval.every=0", "eval.after=true", "eval.batch_size=2"]


def _trackers() -> list[str]:
    try:
        import wandb  # noqa: F401
    except ImportError:
        return ["logging.trackers=[tensorboard]"]
    return ["logging.trackers=[tensorboard,wandb]"]


def _events(out: Path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    files = list((out / "logs").rglob("events.out.tfevents.*"))
    assert files, f"no TensorBoard event file under {out / 'logs'}"
    # size_guidance 0: keep every event (the default keeps a sample of images/audio)
    acc = EventAccumulator(str(files[0].parent), size_guidance={"images": 0, "audio": 0, "tensors": 0})
    return acc.Reload()


def _table_text(events, tag: str) -> str:
    """The markdown of an ``add_text`` summary (stored as a string tensor by the text plugin)."""
    return events.Tensors(tag)[-1].tensor_proto.string_val[0].decode()


def _wandb_records(path: Path) -> list:
    """The ``wandb_internal_pb2.Record`` protobufs of an offline W&B run file, a LevelDB-format log: a 7-byte
    header, 32 KiB blocks, each record split into typed chunks (FULL, or FIRST / MIDDLE / LAST)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    records, pos, block, buf = [], 7, 32768, b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # block trailer: padding
            pos += block - pos % block
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if pos + 7 + length > len(data):  # a chunk still being written
            break
        buf += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # FULL or LAST chunk: a whole record
            record = pb.Record()
            record.ParseFromString(buf)
            records.append(record)
            buf = b""
    return records


def _wandb_run(out: Path) -> tuple[dict[str, str], dict[str, dict[str, str]]]:
    """The offline W&B run read back: ``{key: value_json}`` of every history item, and ``{name: {path: local
    file}}`` of every ``run_table`` artifact (a table with media cells is stored as one; the run's own
    ``media/table/*.json`` holds only the cell types).

    W&B's service writes the run file after ``finish()`` returns: it is read once its ``exit`` record is there.
    """
    paths = list((out / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(paths) == 1, f"expected one offline W&B run under {out / 'wandb'}, found {paths}"
    deadline = time.monotonic() + 60
    records = _wandb_records(paths[0])
    while not any(r.WhichOneof("record_type") == "exit" for r in records):
        assert time.monotonic() < deadline, f"{paths[0]} has no exit record after 60 s"
        time.sleep(0.2)
        records = _wandb_records(paths[0])
    history: dict[str, str] = {}
    tables: dict[str, dict[str, str]] = {}
    for record in records:
        if record.WhichOneof("record_type") == "history":
            history.update({item.key or "/".join(item.nested_key): item.value_json for item in record.history.item})
        elif record.WhichOneof("record_type") == "artifact" and record.artifact.type == "run_table":
            tables[record.artifact.name] = {e.path: e.local_path for e in record.artifact.manifest.contents}
    return history, tables


def _check_wandb(out: Path, stage: str, media_kind: str, media_role: str) -> None:
    pytest.importorskip("wandb")
    history, tables = _wandb_run(out)
    assert json.loads(history[f"samples/{stage}/_type"]) == "table-file"
    assert json.loads(history[f"samples/{stage}/nrows"]) == 2
    (files,) = [f for name, f in tables.items() if f"-samples{stage}" in name]
    (table_file,) = [local for path, local in files.items() if path.endswith(".table.json")]
    table = json.loads(Path(table_file).read_text())
    assert table["columns"] == ["step", "prompt", "answer", "input", "output"]
    cells = [row[table["columns"].index(media_role)] for row in table["data"]]
    assert all(c["_type"] == f"{media_kind}-file" and Path(files[c["path"]]).is_file() for c in cells), cells
    panel = f"samples/{stage}/{media_role}_{media_kind}"  # the media as a list: a media panel
    assert {k for k in history if k.startswith(panel)}, sorted(history)
    assert f"eval/{stage}/wer" in history or f"eval/{stage}/accuracy" in history  # the scalars too


def _offline_wandb(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DATA_DIR", str(tmp_path / "wandb-data"))  # staged table artifacts: not in ~/.local


@pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="espeak-ng is not installed: no speech to synthesise")
def test_speech_run_logs_audio_and_a_sample_table(tmp_path, mmgrpo_cache, monkeypatch):
    _offline_wandb(monkeypatch, tmp_path)
    out = tmp_path / "speech"
    overrides = [
        f"output_dir={out}",
        "task.args.train_size=4",
        "task.args.eval_size=2",
        "algorithm.prompts_per_step=2",
        "algorithm.group_size=2",
        "model.args.max_new_tokens=4",
        *ONE_STEP,
        *QUIET,
        *_trackers(),
    ]
    train(load_config(ROOT / "configs/speech_whisper_asr.yaml", overrides))
    events = _events(out)
    assert {"samples/after/000/input", "samples/after/001/input"} <= set(events.Tags()["audio"])
    clip = events.Audio("samples/after/000/input")[-1]
    assert clip.sample_rate == 16000 and clip.length_frames > 1000  # the spoken digits, as heard by the model
    table = _table_text(events, "samples/after/table/text_summary")
    assert table.count("\n") == 4 and "| prompt | answer | input | output |" in table  # header, rule, 2 rows
    answers = [r["answer"] for r in json.loads((out / "samples_after.json").read_text())]
    assert all(a in table for a in answers)
    _check_wandb(out, "after", "audio", "input")


def test_vlm_run_logs_images_and_a_sample_table(tmp_path, mmgrpo_cache, monkeypatch):
    _offline_wandb(monkeypatch, tmp_path)
    out = tmp_path / "vlm"
    overrides = [
        f"output_dir={out}",
        "task.args.train_size=4",
        "task.args.eval_size=2",
        "algorithm.prompts_per_step=2",
        "algorithm.group_size=2",
        "algorithm.minibatch_size=4",
        "model.args.max_new_tokens=4",
        *ONE_STEP,
        *QUIET,
        *_trackers(),
    ]
    train(load_config(ROOT / "configs/quickstart.yaml", overrides))
    events = _events(out)
    assert {"samples/after/000/input", "samples/after/001/input"} <= set(events.Tags()["images"])
    image = events.Images("samples/after/000/input")[-1]
    assert image.width > 8 and image.height > 8 and image.encoded_image_string[:4] == b"\x89PNG"
    table = _table_text(events, "samples/after/table/text_summary")
    outputs = [r["output"] for r in json.loads((out / "samples_after.json").read_text())]
    assert table.count("\n") == 4 and all(o.replace("|", "\\|").replace("\n", "<br>") in table for o in outputs)
    _check_wandb(out, "after", "image", "input")


def test_video_samples_reach_tensorboard_as_an_animated_gif(tmp_path):
    from accelerate import Accelerator
    from accelerate.utils import ProjectConfiguration
    from PIL import Image

    from mmgrpo import samples as sample_files
    from mmgrpo.tracking import log_samples

    acc = Accelerator(
        log_with="tensorboard", project_config=ProjectConfiguration(str(tmp_path), logging_dir=str(tmp_path / "logs"))
    )
    acc.init_trackers("t")
    frames = [Image.new("RGB", (16, 16), c) for c in ("red", "green", "blue")]
    records = sample_files.write_samples(tmp_path, "after", [({"prompt": "p", "video": frames}, "left")])
    log_samples(acc, "after", records, tmp_path, step=2)
    acc.end_training()
    events = _events(tmp_path)
    gif = events.Images("samples/after/000/input")[-1]
    assert gif.step == 2 and gif.encoded_image_string[:6] == b"GIF89a"
    assert Image.open(__import__("io").BytesIO(gif.encoded_image_string)).n_frames == 3


def test_metrics_jsonl_is_strict_json(tmp_path):
    path = tmp_path / "metrics.jsonl"
    append_jsonl(path, {"step": 1, "reward/a": math.nan, "x": math.inf, "y": 0.5, "nested": [-math.inf, 1.0]})
    line = path.read_text()
    assert "NaN" not in line and "Infinity" not in line
    record = json.loads(line, parse_constant=lambda c: pytest.fail(f"non-JSON constant {c}"))
    assert record == {"step": 1, "reward/a": None, "x": None, "y": 0.5, "nested": [None, 1.0]}
