"""Published data formats as they are (issue 36): ``<image>`` / ``<video>`` placeholders in EasyR1 / LLaVA-style
text become the media parts at their place (not a literal ``<image>`` beside the real image part), and Whisper
ASR data in a CSV ``file,text`` needs no ``prompt`` column."""

import io
import json
import os

import numpy as np
import pytest
from PIL import Image

from mmgrpo.cli import main
from mmgrpo.media import add_media_parts, media_content
from mmgrpo.tasks.dataset import build_dataset_task
from mmgrpo.types import DataError

NO_MODEL = os.path.dirname(os.path.abspath(__file__))  # a folder without a model: never loaded (issue 53: the
# name is checked at load, so it must exist; the load-time checks under test come first)

BASE = ["task.name=dataset", "logging.trackers=[]", "logging.progress=false", "rewards=[{name: format}]"]


@pytest.fixture
def empty(tmp_path):
    (tmp_path / "empty.yaml").write_text("{}\n")
    return tmp_path / "empty.yaml"


def _png_bytes(color="red") -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (56, 56), color).save(buf, format="PNG")
    return buf.getvalue()


def _easyr1_parquet(path, problems: list[str], n_images: int = 1):
    """EasyR1's layout: ``problem`` (with ``<image>``), ``answer``, ``images`` (a list of {bytes, path} structs)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    images = [[{"bytes": _png_bytes(), "path": None} for _ in range(n_images)] for _ in problems]
    pq.write_table(pa.table({"problem": problems, "answer": ["red"] * len(problems), "images": images}), path)
    return path


def test_placeholders_become_parts_at_their_place():
    parts = media_content("Compare <image> with <image>: which is red?", {"image": 2})
    assert parts == [
        {"type": "text", "text": "Compare "},
        {"type": "image"},
        {"type": "text", "text": " with "},
        {"type": "image"},
        {"type": "text", "text": ": which is red?"},
    ]
    assert media_content("<video>What moves?", {"video": 1, "image": 1})[:2] == [{"type": "image"}, {"type": "video"}]
    assert media_content("No tag here", {"image": 1}) == [{"type": "image"}, {"type": "text", "text": "No tag here"}]
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "<image>\nWhat shape?"}]
    assert add_media_parts(chat, {"image": 1})[1]["content"] == [
        {"type": "image"},
        {"type": "text", "text": "\nWhat shape?"},
    ]
    with pytest.raises(DataError, match=r"holds 2 <image> placeholder\(s\) but the row has 1 image"):
        add_media_parts([{"role": "user", "content": "<image> vs <image>"}], {"image": 1})


def test_easyr1_parquet_renders_the_image_where_the_placeholder_is(tmp_path, tiny_vlm_path):
    from mmgrpo.modalities.vlm.adapter import build_vlm_adapter

    data = _easyr1_parquet(tmp_path / "train.parquet", ["Look at this: <image> What color is it?"] * 2)
    task = build_dataset_task({"train": str(data), "columns": {"prompt": "problem"}})
    row = task.train_rows()[0]
    adapter = build_vlm_adapter({"name_or_path": tiny_vlm_path, "max_new_tokens": 4})
    text = adapter.tokenizer.decode(adapter._encode_prompt(row)["input_ids"][0])
    assert "<image>" not in text and text.count("<|vision_start|>") == 1
    assert text.index("Look at this:") < text.index("<|vision_start|>") < text.index("What color is it?")
    chat = build_dataset_task({"train": str(data), "columns": {"prompt": "problem"}, "system_prompt": "Be brief."})
    content = chat.train_rows()[0]["prompt"][1]["content"]
    assert [p["type"] for p in content] == ["text", "image", "text"]


def test_a_placeholder_count_mismatch_is_one_line_at_dry_run(tmp_path, capsys, empty):
    data = _easyr1_parquet(tmp_path / "train.parquet", ["<image> or <image>?"] * 2)
    args = [*BASE, "model.adapter=vlm", f"model.args.name_or_path={NO_MODEL}", f"task.args.train={data}"]
    assert main(["train", str(empty), "--dry-run", *args, "task.args.columns={prompt: problem}"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"{data}: row 0" in err
    assert "2 <image> placeholder(s) but the row has 1 image" in err


def _asr_csv(tmp_path):
    import soundfile as sf

    t = np.arange(8000) / 16000
    for i in range(3):
        sf.write(str(tmp_path / f"u{i}.wav"), (0.3 * np.sin(2 * np.pi * 300 * (i + 1) * t)).astype(np.float32), 16000)
    csv = tmp_path / "train.csv"
    csv.write_text("file,text\n" + "".join(f"u{i}.wav,one two\n" for i in range(3)))
    return csv


def test_whisper_csv_file_text_needs_no_prompt_column(tmp_path, capsys, empty):
    csv = _asr_csv(tmp_path)
    args = [*BASE, f"model.args.name_or_path={NO_MODEL}", f"task.args.train={csv}", "rewards=[{name: wer}]"]
    mapping = "task.args.columns={audio: file, answer: text}"
    assert main(["train", str(empty), "--dry-run", "model.adapter=whisper", *args, mapping]) == 0
    assert "dry run OK" in capsys.readouterr().out
    # an adapter that reads the prompt beside the audio says so, in one line
    assert main(["train", str(empty), "--dry-run", "model.adapter=audio_llm", *args, mapping]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "row 1 (line 2)" in err and "task.args.columns.prompt" in err
    assert "'audio_llm' adapter reads the prompt" in err


def test_text_rows_still_need_a_prompt(tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"question": "q", "answer": "a"}) + "\n")
    with pytest.raises(DataError, match="column 'prompt' is missing"):
        build_dataset_task({"train": str(data)})
