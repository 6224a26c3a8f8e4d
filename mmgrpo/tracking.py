"""What leaves a run beyond the checkpoints: ``metrics.jsonl`` records and evaluation samples for the trackers.

- :func:`append_jsonl` writes one record per line as strict JSON: a non-finite value (NaN, ±inf) becomes ``null``
  (Python's ``json`` would write a bare ``NaN``, which JSON readers such as ``jq`` or JavaScript reject).
- :func:`log_samples` sends the evaluation samples that :func:`mmgrpo.samples.write_samples` wrote to every
  tracker that has media types, with the tracker's own types:

  - TensorBoard (``torch.utils.tensorboard.SummaryWriter``): ``add_image`` for images, ``add_audio`` for audio,
    video as an animated GIF in an image summary (what ``SummaryWriter.add_video`` writes; its own encoder needs
    moviepy, so the GIF is made here with Pillow from the sample's mp4), and one ``add_text`` markdown table per
    stage (prompt, answer, input, output). Tags: ``samples/<stage>/<i>`` (output), ``samples/<stage>/<i>/input``,
    ``samples/<stage>/table``.
  - Weights & Biases: one ``wandb.Table`` per stage (``samples/<stage>``) whose media cells are ``wandb.Image`` /
    ``wandb.Audio`` / ``wandb.Video``, plus the media as lists under ``samples/<stage>/<input|output>_<kind>``
    (media panels). Works offline (``WANDB_MODE=offline``: files under ``<output_dir>/wandb/offline-run-*``).

  Other trackers get the scalars only (accelerate's ``log``).
"""

from __future__ import annotations

import io
import json
import math
import os
from pathlib import Path

import numpy as np
from PIL import Image

from mmgrpo.compat import tensorboard_file_writer

MEDIA = ("image", "audio", "video")
GIF_MAX_FRAMES = 32  # frames of a sample video shown in TensorBoard (the mp4 in samples/ holds them all)


def json_safe(value):
    """``value`` with every non-finite float (NaN, ±inf) replaced by ``None`` (nested dicts and lists too)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def append_jsonl(path: Path, record: dict) -> None:
    """Append ``record`` as one line of strict JSON (non-finite values as ``null``), flushed and fsynced."""
    with open(path, "a") as f:
        f.write(json.dumps(json_safe(record), allow_nan=False) + "\n")
        f.flush()
        os.fsync(f.fileno())


def _tracker(accelerator, name: str):
    """The underlying object of tracker ``name`` (SummaryWriter, wandb run), or None when it is not in use."""
    try:
        tracker = accelerator.get_tracker(name)
    except ValueError:  # not among the run's trackers
        return None
    return getattr(tracker, "writer" if name == "tensorboard" else "run", None)  # a blank tracker has neither


def _cell(rec: dict, key: str) -> str:
    """A markdown-table cell: the text, or the media file's name."""
    value = rec.get(key)
    text = "" if value is None else (Path(value).name if rec.get(f"{key}_kind") in MEDIA else str(value))
    return text.replace("|", "\\|").replace("\n", "<br>")


def _gif(path: Path) -> tuple[bytes, int, int]:
    """An animated GIF of the first :data:`GIF_MAX_FRAMES` frames of a video file (PyAV decode, Pillow encode)."""
    import av

    frames = []
    with av.open(str(path)) as container:
        for frame in container.decode(video=0):
            frames.append(frame.to_image())
            if len(frames) == GIF_MAX_FRAMES:
                break
    buf = io.BytesIO()
    frames[0].save(buf, format="GIF", save_all=True, append_images=frames[1:], duration=250, loop=0)
    return buf.getvalue(), frames[0].height, frames[0].width


def _tensorboard(writer, stage: str, records: list[dict], run_dir: Path, step: int) -> None:
    from tensorboard.compat.proto.summary_pb2 import Summary

    for i, rec in enumerate(records):
        for key, tag in (("input", f"samples/{stage}/{i:03d}/input"), ("output", f"samples/{stage}/{i:03d}")):
            kind, value = rec.get(f"{key}_kind"), rec.get(key)
            if kind not in MEDIA or not value:
                continue
            path = run_dir / value
            if kind == "image":
                writer.add_image(tag, np.asarray(Image.open(path).convert("RGB")), step, dataformats="HWC")
            elif kind == "audio":
                import soundfile

                arr, rate = soundfile.read(str(path), dtype="float32", always_2d=True)
                writer.add_audio(tag, np.clip(arr.mean(axis=1), -1, 1), step, sample_rate=rate)
            else:  # video: as SummaryWriter.add_video stores it, a GIF in an image summary
                gif, h, w = _gif(path)
                image = Summary.Image(height=h, width=w, colorspace=3, encoded_image_string=gif)
                tensorboard_file_writer(writer).add_summary(Summary(value=[Summary.Value(tag=tag, image=image)]), step)
    header = "| # | prompt | answer | input | output |\n|---|---|---|---|---|\n"
    rows = "".join(
        f"| {i} | {_cell(r, 'prompt')} | {_cell(r, 'answer')} | {_cell(r, 'input')} | {_cell(r, 'output')} |\n"
        for i, r in enumerate(records)
    )
    writer.add_text(f"samples/{stage}/table", header + rows, step)
    writer.flush()


def _wandb(run, stage: str, records: list[dict], run_dir: Path, step: int) -> None:
    import wandb

    types = {"image": wandb.Image, "audio": wandb.Audio, "video": wandb.Video}

    def media(rec: dict, key: str):
        kind, value = rec.get(f"{key}_kind"), rec.get(key)
        if kind in types and value and kinds[key] == {kind}:
            return types[kind](str(run_dir / value))
        return None if value is None else _cell(rec, key)  # text, or a file name where a column mixes kinds

    # A table column holds one type (wandb.Table rejects a mix, and stores mixed media as their type names).
    kinds = {key: {r.get(f"{key}_kind") for r in records if r.get(key) is not None} for key in ("input", "output")}
    table = wandb.Table(columns=["step", "prompt", "answer", "input", "output"])
    panels: dict[str, list] = {}
    for rec in records:
        cells = {key: media(rec, key) for key in ("input", "output")}
        table.add_data(rec.get("step"), rec.get("prompt"), _text(rec.get("answer")), cells["input"], cells["output"])
        for key, cell in cells.items():
            if not isinstance(cell, str) and cell is not None:
                panels.setdefault(f"samples/{stage}/{key}_{rec[f'{key}_kind']}", []).append(cell)
    run.log({f"samples/{stage}": table, **panels}, step=step)


def _text(value) -> str | None:
    return None if value is None else str(value)


def log_samples(accelerator, stage: str, records: list[dict], run_dir: Path, step: int) -> None:
    """Send ``records`` (from :func:`mmgrpo.samples.write_samples`, paths relative to ``run_dir``) to TensorBoard
    and W&B when the run uses them (main process; other trackers: nothing)."""
    run_dir = Path(run_dir)
    writer = _tracker(accelerator, "tensorboard")
    if writer is not None and hasattr(writer, "add_image"):
        _tensorboard(writer, stage, records, run_dir, step)
    run = _tracker(accelerator, "wandb")
    if run is not None and hasattr(run, "log"):
        _wandb(run, stage, records, run_dir, step)


def flat_hparams(cfg) -> dict:
    """Scalars of the config, flattened with dots (what TensorBoard's hparams accept)."""
    from mmgrpo.config import to_dict

    flat: dict = {}

    def walk(prefix: str, node) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                walk(f"{prefix}.{k}" if prefix else k, v)
        elif isinstance(node, (int, float, str, bool)):
            flat[prefix] = node

    walk("", to_dict(cfg))
    return flat


def progress_bar(cfg, acc, initial: int = 0, total: int | None = None, desc: str = "grpo"):
    from tqdm.auto import tqdm

    return tqdm(
        total=total if total is not None else cfg.steps,
        initial=initial,
        desc=desc,
        disable=not (cfg.logging.progress and acc.is_main_process),
        dynamic_ncols=True,
    )
