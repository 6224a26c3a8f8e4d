"""Evaluation samples as files: text inline, images as PNG, video as mp4, audio as wav, next to a JSON index.

``write_samples(run_dir, stage, pairs)`` writes ``<run_dir>/samples_<stage>.json`` (one record per held-out row:
prompt, ground truth, output) and the media it names under ``<run_dir>/samples/<stage>/``. What a value becomes
depends only on its type (:func:`kind_of`), so a new model family needs no change here:

- ``str`` → kept inline in the JSON;
- ``PIL.Image.Image`` → PNG;
- video: a list of PIL images, or an array/tensor ``[T, H, W, 3]`` uint8 → mp4 (PyAV, H.264);
- audio: ``(array, sampling_rate)``, ``{"array": ..., "sampling_rate": ...}`` (the Hugging Face ``datasets``
  audio dict) → wav (soundfile);
- a path to an existing ``.png/.jpg/.mp4/.wav/...`` file (row inputs such as a task's video clips) → copied.

:func:`log_samples` sends the same records, inputs and outputs, to TensorBoard (images, audio, video as GIF, a
markdown table) and W&B (``wandb.Table`` with ``wandb.Image`` / ``wandb.Audio`` / ``wandb.Video`` cells) through the
accelerate trackers (:mod:`mmgrpo.tracking`).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from mmgrpo.media import write_mp4
from mmgrpo.types import Transcript

INPUT_KEYS = ("image", "images", "video", "audio")
"""Row columns holding the model's media input (written next to the output so a sample can be read alone)."""
_SUFFIX = {
    ".png": "image",
    ".jpg": "image",
    ".jpeg": "image",
    ".webp": "image",
    ".mp4": "video",
    ".webm": "video",
    ".avi": "video",
    ".mov": "video",
    ".wav": "audio",
    ".flac": "audio",
    ".mp3": "audio",
    ".ogg": "audio",
}


def _audio_parts(value: Any) -> tuple[np.ndarray, int] | None:
    if isinstance(value, dict) and "array" in value and "sampling_rate" in value:
        return np.asarray(value["array"]), int(value["sampling_rate"])
    if isinstance(value, tuple) and len(value) == 2 and isinstance(value[1], (int, np.integer)):
        arr = value[0].detach().cpu().numpy() if hasattr(value[0], "detach") else np.asarray(value[0])
        if arr.ndim in (1, 2):
            return arr, int(value[1])
    return None


def _video_frames(value: Any) -> list[Image.Image] | None:
    if isinstance(value, (list, tuple)) and len(value) > 1 and all(isinstance(v, Image.Image) for v in value):
        return [v.convert("RGB") for v in value]
    if hasattr(value, "detach"):
        value = value.detach().cpu().numpy()
    if isinstance(value, np.ndarray) and value.ndim == 4 and value.shape[-1] == 3:  # [T, H, W, 3]
        arr = value if value.dtype == np.uint8 else (np.clip(value, 0, 1) * 255).astype(np.uint8)
        return [Image.fromarray(frame) for frame in arr]
    return None


def kind_of(value: Any) -> str:
    """``text`` | ``image`` | ``video`` | ``audio`` | ``file`` (an existing media path) | ``other``."""
    if isinstance(value, Image.Image):
        return "image"
    if _audio_parts(value) is not None:
        return "audio"
    if _video_frames(value) is not None:
        return "video"
    if isinstance(value, (str, Path)):
        p = Path(value)
        if len(str(value)) < 4096 and p.suffix.lower() in _SUFFIX and p.is_file():
            return "file"
        return "text"
    return "other"


def save_value(value: Any, directory: Path, stem: str) -> dict:
    """Write one value where it needs a file; the JSON-able description of it (``kind`` + ``text`` or ``file``)."""
    kind = kind_of(value)
    directory = Path(directory)
    if isinstance(value, Transcript):  # a multi-turn answer: its text, and every message with its images' files
        turns = [
            {
                **m,
                "images": [
                    save_value(im, directory, f"{stem}_turn{i}_{j}")["file"] for j, im in enumerate(m["images"])
                ],
            }
            for i, m in enumerate(value.messages)
        ]
        return {"kind": "text", "text": str(value), "turns": turns}
    if kind == "text":
        return {"kind": "text", "text": str(value)}
    if kind == "other":
        return {"kind": "text", "text": repr(value)}
    directory.mkdir(parents=True, exist_ok=True)
    if kind == "image":
        path = directory / f"{stem}.png"
        value.save(path)
    elif kind == "audio":
        import soundfile

        arr, rate = _audio_parts(value)
        path = directory / f"{stem}.wav"
        soundfile.write(str(path), arr.T if arr.ndim == 2 and arr.shape[0] < arr.shape[1] else arr, rate)
    elif kind == "video":
        path = directory / f"{stem}.mp4"
        write_mp4(path, _video_frames(value))
    else:  # an existing media file: copy it so the run directory stands alone
        src = Path(value)
        path = directory / f"{stem}{src.suffix.lower()}"
        shutil.copyfile(src, path)
        kind = _SUFFIX[src.suffix.lower()]
    return {"kind": kind, "file": str(path)}


def ground_truth(row: dict) -> dict:
    """The row's plain columns other than the prompt and media (answers, solutions, boxes...): strings, numbers,
    booleans and lists of them."""
    plain = (str, int, float, bool, type(None))

    def is_plain(v: Any) -> bool:
        return isinstance(v, plain) or (isinstance(v, (list, tuple)) and all(is_plain(x) for x in v))

    skip = {"prompt", "images", "videos", "audios", *INPUT_KEYS}
    return {k: v for k, v in row.items() if k not in skip and is_plain(v)}


def write_samples(run_dir: Path, stage: str, pairs: list[tuple[dict, Any]], step: int | None = None) -> list[dict]:
    """Write ``samples_<stage>.json`` and its media for ``(row, output)`` pairs; returns the records.

    Each record: ``prompt``, ``answer`` (``None`` when the row has none) and the row's other plain ground-truth
    columns (:func:`ground_truth`: ``solution``, boxes...), ``step``, ``output`` (text, or the file's path
    relative to ``run_dir``), ``output_kind``, and ``input``/``input_kind`` for a row's media input; a multi-turn
    answer (:class:`~mmgrpo.types.Transcript`) adds ``turns``, its messages with their images' files.
    """
    run_dir = Path(run_dir)
    media_dir = run_dir / "samples" / stage
    shutil.rmtree(media_dir, ignore_errors=True)  # a re-run of the same stage replaces its files
    records = []
    for i, (row, output) in enumerate(pairs):
        rec: dict[str, Any] = {"prompt": str(row.get("prompt")), "answer": row.get("answer"), **ground_truth(row)}
        rec["step"] = step
        out = save_value(output, media_dir, f"{i:03d}_output")
        rec["output_kind"] = out["kind"]
        rec["output"] = out["text"] if "text" in out else str(Path(out["file"]).relative_to(run_dir))
        if "turns" in out:  # a multi-turn answer: every message, its observation images as files
            rec["turns"] = [
                {**m, "images": [str(Path(f).relative_to(run_dir)) for f in m["images"]]} for m in out["turns"]
            ]
        for key in INPUT_KEYS:
            value = row.get(key)
            if isinstance(value, (list, tuple)) and value and key == "images":
                value = value[0]
            if value is not None and kind_of(value) not in ("text", "other"):
                inp = save_value(value, media_dir, f"{i:03d}_input")
                rec["input_kind"], rec["input"] = inp["kind"], str(Path(inp["file"]).relative_to(run_dir))
                break
        records.append(rec)
    from mmgrpo.checkpoint import atomic_write_text

    atomic_write_text(run_dir / f"samples_{stage}.json", json.dumps(records, indent=1, default=str))
    return records


def read_samples(run_dir: Path) -> dict[str, list[dict]]:
    """``{stage: records}`` of every ``samples_<stage>.json`` in ``run_dir`` (paths made absolute)."""
    run_dir = Path(run_dir)
    out = {}
    for path in sorted(run_dir.glob("samples_*.json")):
        try:
            records = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        for rec in records:
            for key in ("output", "input"):
                kind = rec.get(f"{key}_kind")
                if kind in ("image", "video", "audio") and rec.get(key):
                    rec[key] = str(run_dir / rec[key])
        out[path.stem.removeprefix("samples_")] = records
    return out


def log_samples(accelerator, stage: str, records: list[dict], run_dir: Path, step: int) -> None:
    """Send sample records to the run's trackers with their media types (:func:`mmgrpo.tracking.log_samples`)."""
    from mmgrpo.tracking import log_samples as send

    send(accelerator, stage, records, run_dir, step)
