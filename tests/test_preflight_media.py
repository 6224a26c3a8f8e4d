"""The load-time check knows which media each adapter reads, decodes the first rows' audio and video, and a bad
audio or video row past them is skipped and counted as a bad image is (issue 36). Each refusal is one line, exit
status 2, before any model loads (the model paths below hold no model)."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from mmgrpo.cli import main
from mmgrpo.plugins import ADAPTERS
from mmgrpo.tasks.dataset import build_dataset_task
from mmgrpo.types import DataError
from mmgrpo.warmup import read_rows

NO_MODEL = os.path.dirname(os.path.abspath(__file__))  # a folder without a model: never loaded (issue 53: the
# name is checked at load, so it must exist; the load-time checks under test come first)

BASE = ["task.name=dataset", "logging.trackers=[]", "logging.progress=false", "rewards=[{name: format}]"]
VLM = ["model.adapter=vlm", f"model.args.name_or_path={NO_MODEL}"]
WHISPER = ["model.adapter=whisper", f"model.args.name_or_path={NO_MODEL}", "rewards=[{name: wer}]"]


def _wav(path, seconds=0.5, rate=16000):
    import soundfile as sf

    path.parent.mkdir(parents=True, exist_ok=True)
    t = np.arange(int(seconds * rate)) / rate
    sf.write(str(path), (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32), rate)
    return path


def _mp4(path, n=8):
    from mmgrpo.media import write_mp4

    path.parent.mkdir(parents=True, exist_ok=True)
    write_mp4(path, [np.full((32, 32, 3), 10 * i, dtype=np.uint8) for i in range(n)], 4)
    return path


def _png(path):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (16, 16), "red").save(path)
    return path


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture
def empty(tmp_path):
    (tmp_path / "empty.yaml").write_text("{}\n")
    return tmp_path / "empty.yaml"


def _dry(capsys, config, *args) -> tuple[int, str]:
    """Exit status and what the user reads: the error line (stderr), or the summary line (stdout)."""
    rc = main(["train", str(config), "--dry-run", *args])
    captured = capsys.readouterr()
    return rc, (captured.err if rc else captured.out).strip()


def test_every_builtin_adapter_declares_the_media_it_reads():
    from mmgrpo.loader import load_builtins

    load_builtins()
    declared = {name: ADAPTERS.get(name).inputs for name in ("vlm", "video", "whisper", "audio_llm", "flow")}
    assert declared["vlm"].media == ("image",) and set(declared["video"].media) == {"image", "video"}
    assert declared["whisper"].media_required and not declared["whisper"].prompt
    assert declared["audio_llm"].media == ("audio",) and declared["audio_llm"].prompt
    assert declared["flow"].media == ()


@pytest.mark.parametrize(
    ("kind", "fix"),
    [("audio", "model.adapter: audio_llm or model.adapter: whisper"), ("video", "model.adapter: video")],
)
def test_audio_or_video_rows_given_to_the_vlm_adapter_are_one_line(tmp_path, capsys, empty, kind, fix):
    media = _wav(tmp_path / "a.wav") if kind == "audio" else _mp4(tmp_path / "v.mp4")
    data = _jsonl(tmp_path / "d.jsonl", [{"prompt": "What is it?", kind: media.name}] * 2)
    rc, err = _dry(capsys, empty, *BASE, *VLM, f"task.args.train={data}")
    assert rc == 2 and len(err.splitlines()) == 1 and "Traceback" not in err
    assert f"{data}: line 1" in err and f"{'audio' if kind == 'audio' else 'a video'} (column '{kind}')" in err
    assert "'vlm' adapter reads images only" in err and fix in err
    assert main(["train", str(empty), *BASE, *VLM, f"task.args.train={data}"]) == 2  # train: same line, no model
    assert capsys.readouterr().err.strip() == err


def test_image_rows_given_to_whisper_fail_before_the_model_loads(tmp_path, capsys, empty):
    _png(tmp_path / "i.png")
    data = _jsonl(tmp_path / "d.jsonl", [{"prompt": "q", "image": "i.png", "answer": "a b"}] * 2)
    rc, err = _dry(capsys, empty, *BASE, *WHISPER, f"task.args.train={data}")
    assert rc == 2 and len(err.splitlines()) == 1
    assert "an image (column 'image')" in err and "'whisper' adapter reads audio files only" in err
    assert "model.adapter: vlm" in err


def test_a_speech_adapters_rows_must_have_audio(tmp_path, capsys, empty):
    data = _jsonl(tmp_path / "d.jsonl", [{"prompt": "q", "answer": "a b"}] * 2)
    rc, err = _dry(capsys, empty, *BASE, *WHISPER, f"task.args.train={data}")
    assert rc == 2 and len(err.splitlines()) == 1
    assert f"{data}: line 1" in err and "no audio" in err and "'whisper' adapter needs one" in err
    assert "task.args.columns.audio" in err


def test_matching_media_pass_and_the_dry_run_ends_with_a_summary(tmp_path, capsys, empty):
    _wav(tmp_path / "a.wav")
    data = _jsonl(tmp_path / "d.jsonl", [{"prompt": "", "audio": "a.wav", "answer": "a b"}] * 3)
    rc, err = _dry(capsys, empty, *BASE, *WHISPER, f"task.args.train={data}")
    assert rc == 0, err
    summary = "mmgrpo: dry run OK: checked 3 train + 0 eval rows; decoded 3 audio files; 1 reward(s): wer (built-in)"
    assert summary in err


def test_the_first_rows_audio_is_decoded_at_load(tmp_path, capsys, empty):
    """A corrupt wav among the first rows: one line with the file's line at --dry-run (it used to pass, then stop
    the run at the rollout that read it, naming no line)."""
    _wav(tmp_path / "ok.wav")
    (tmp_path / "bad.wav").write_bytes(b"RIFF\x24\x00\x00\x00WAVEfmt " + b"\x00" * 40)
    rows = [{"prompt": "", "audio": "ok.wav", "answer": "a"}, {"prompt": "", "audio": "bad.wav", "answer": "a"}]
    data = _jsonl(tmp_path / "d.jsonl", rows)
    rc, err = _dry(capsys, empty, *BASE, *WHISPER, f"task.args.train={data}")
    assert rc == 2 and len(err.splitlines()) == 1
    assert f"{data}: line 2: column 'audio'" in err and "bad.wav" in err and "cannot be decoded" in err


def test_the_first_rows_video_frames_are_decoded_at_load(tmp_path, capsys, empty):
    _mp4(tmp_path / "ok.mp4")
    good = _jsonl(tmp_path / "good.jsonl", [{"prompt": "q", "video": "ok.mp4"}] * 2)
    video = ["model.adapter=video", f"model.args.name_or_path={NO_MODEL}"]
    rc, err = _dry(capsys, empty, *BASE, *video, f"task.args.train={good}")
    assert rc == 0 and "decoded 16 video frames" in err  # 8 frames of each of the 2 rows
    cut = tmp_path / "cut.mp4"
    cut.write_bytes((tmp_path / "ok.mp4").read_bytes()[: (tmp_path / "ok.mp4").stat().st_size // 2])
    bad = _jsonl(tmp_path / "bad.jsonl", [{"prompt": "q", "video": "cut.mp4"}])
    rc, err = _dry(capsys, empty, *BASE, *video, f"task.args.train={bad}")
    assert rc == 2 and len(err.splitlines()) == 1
    assert f"{bad}: line 1: column 'video'" in err and "cut.mp4" in err


@pytest.mark.parametrize("kind", ["audio", "video"])
def test_bad_audio_and_video_rows_at_train_time_are_skipped_and_counted(tmp_path, kind):
    """Past the start-up check, a bad audio or video row is skipped for the next one and counted (warned with its
    file and line), as a bad image is: it no longer stops the run."""
    good = _wav(tmp_path / "ok.wav") if kind == "audio" else _mp4(tmp_path / "ok.mp4")
    (tmp_path / f"bad{good.suffix}").write_bytes(b"\x00\x00\x00\x18ftypmp42" + b"garbage" * 50)
    rows = [{"prompt": "q", kind: good.name, "answer": "a"} for _ in range(4)]
    rows[2][kind] = f"bad{good.suffix}"
    task = build_dataset_task({"train": str(_jsonl(tmp_path / "d.jsonl", rows)), "check_rows": 2})
    with pytest.raises(DataError, match=rf"d.jsonl: line 3: column '{kind}': .*bad{good.suffix}"):
        task.train_rows()[2]
    bad: set[int] = set()
    got, skipped = read_rows(task.train_rows(), [2, 3], bad)
    assert skipped == 1 and bad == {2} and len(got) == 2  # row 2 skipped for row 3, which is then read too


def test_dry_run_is_one_summary_line_and_no_config_dump(tmp_path):
    """`mmgrpo train CONFIG --dry-run` from a shell: the summary, not 130-180 lines of YAML (--print-config has it)."""
    from pathlib import Path

    quick = Path(__file__).resolve().parents[1] / "configs" / "quickstart.yaml"
    proc = subprocess.run(
        [sys.executable, "-m", "mmgrpo", "train", str(quick), f"output_dir={tmp_path / 'r'}", "--dry-run"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    summary = proc.stdout.splitlines()
    assert len(summary) == 1 and summary[0].startswith("mmgrpo: dry run OK: checked 8 train + 8 eval rows")
    assert "images" in summary[0] and "reward(s)" in summary[0] and summary[0].endswith("no model loaded")


def test_a_corrupt_wav_past_the_first_rows_is_skipped_in_a_whisper_run(tmp_path, capsys, caplog, empty, mmgrpo_cache):
    """The issue's case end to end: Whisper on a CSV ``file,text`` with a corrupt wav past the start-up check trains
    to the end, the row skipped and counted with its file and line (it used to stop the run at the step that drew
    it, naming no line)."""
    for i in range(3):
        _wav(tmp_path / f"u{i}.wav")
    (tmp_path / "bad.wav").write_bytes(b"RIFF\x24\x00\x00\x00WAVEfmt " + b"\x00" * 40)
    csv = tmp_path / "train.csv"
    csv.write_text("file,text\nu0.wav,one\nu1.wav,two\nu2.wav,three\nbad.wav,four\n")
    out = tmp_path / "run"
    args = [
        "model.adapter=whisper",
        "model.args.name_or_path=tiny-whisper",
        "model.args.max_new_tokens=3",
        "task.name=dataset",
        f"task.args.train={csv}",
        "task.args.columns={audio: file, answer: text}",
        "task.args.check_rows=2",
        "rewards=[{name: wer}]",
        "steps=2",
        "algorithm.group_size=2",
        "algorithm.prompts_per_step=4",
        "algorithm.minibatch_size=8",
        "eval.before=false",
        "eval.after=false",
        "logging.trackers=[]",
        "logging.progress=false",
        "logging.plot=false",
        "checkpoint.save_final=false",
        f"output_dir={out}",
    ]
    assert main(["train", str(empty), *args]) == 0, capsys.readouterr().err
    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps[0]["data/skipped_rows"] >= 1  # 4 prompts per step over 4 rows: the bad one was drawn
    warned = [r.getMessage() for r in caplog.records if "skipped row" in r.getMessage()]
    assert warned and f"{csv}: row 4 (line 5): column 'audio'" in warned[0] and "bad.wav" in warned[0]


def test_decode_audio_takes_every_form_the_speech_adapters_take():
    import torch

    from mmgrpo.media import decode_audio

    assert (
        decode_audio(np.ones(10)) == 10 and decode_audio((np.ones(5), 16000)) == 5 and decode_audio(torch.ones(7)) == 7
    )
    assert decode_audio({"array": [0.1, 0.2], "sampling_rate": 16000}) == 2
    for bad, message in ((np.array([]), "empty"), (np.array([np.nan]), "NaN"), ({"path": None}, "empty")):
        with pytest.raises(DataError, match=message):
            decode_audio(bad)
