"""The media part of the load-time check (:mod:`mmgrpo.preflight`), and what ``--dry-run`` says when it passes.

For each of the first rows :func:`~mmgrpo.preflight.preflight` checks, :class:`RowMediaCheck`:

- refuses media kinds the adapter does not read (its spec's :class:`~mmgrpo.plugins.Inputs`): audio or video
  rows given to ``vlm`` would train with the medium silently ignored, image rows given to ``whisper`` would fail
  only after the model loads. The line names the adapter, the medium and an adapter that reads it;
- refuses a row without the medium a speech adapter needs (``media_required``), and a prompt-less audio row for
  an adapter that reads the prompt (``audio_llm``; Whisper reads none, so ``file,text`` ASR data needs no prompt);
- decodes the row's audio (soundfile) and a spread of its video frames (decord), as the adapters will — images
  are decoded when the row is built (:func:`mmgrpo.media.open_image`).

:class:`LoadReport` counts what was checked; ``mmgrpo train --dry-run`` prints it as one summary line.
"""

from __future__ import annotations

import inspect
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from mmgrpo.media import MEDIA_KINDS, as_list, decode_audio, decode_video, media_counts
from mmgrpo.plugins import ADAPTERS, AdapterSpec, Inputs
from mmgrpo.types import DataError

PREFLIGHT_VIDEO_FRAMES = 8
"""Frames of each checked row's video decoded at load, spread over the clip (the last one included)."""

_WHAT = {"image": "an image", "video": "a video", "audio": "audio"}
_PLURAL = {"image": "images", "video": "videos", "audio": "audio files", "video frame": "video frames"}


def adapter_inputs(adapter: str) -> Inputs | None:
    """The declared :class:`~mmgrpo.plugins.Inputs` of ``model.adapter`` (None: a plugin that declares none)."""
    try:
        spec = ADAPTERS.get(adapter)
    except Exception:  # an unknown adapter is the config check's to report
        return None
    return spec.inputs if isinstance(spec, AdapterSpec) else None


def readers(kind: str) -> list[str]:
    """Registered adapters whose prompts read ``kind`` (``audio`` → ``["audio_llm", "whisper"]``), sorted by name."""
    out = []
    for name in ADAPTERS.names():
        inputs = adapter_inputs(name)
        if inputs is not None and kind in inputs.media:
            out.append(name)
    return out


def _reads(adapter: str, inputs: Inputs) -> str:
    if not inputs.media:
        return f"the {adapter!r} adapter reads text prompts only"
    return f"the {adapter!r} adapter reads {' and '.join(_PLURAL[k] for k in inputs.media)} only"


def check_media_kinds(adapter: str, row: dict, where: str) -> None:
    """One :class:`DataError` line when ``row`` holds a medium ``adapter`` does not read, lacks one it needs, or
    (adapters that read the prompt) is an audio row without prompt text. No-op for undeclared adapters."""
    inputs = adapter_inputs(adapter)
    if inputs is None:
        return
    counts = media_counts(row)
    for kind in MEDIA_KINDS:
        if counts.get(kind) and kind not in inputs.media:
            others = readers(kind)
            use = " or ".join(f"model.adapter: {name}" for name in others) or "an adapter that reads it"
            column = "images" if kind == "image" and row.get("images") is not None else kind
            raise DataError(
                f"{where}: the row has {_WHAT[kind]} (column {column!r}), but "
                f"{_reads(adapter, inputs)}, so it would be ignored; use {use}, or drop the column from the data "
                f"(rename it if only a reward reads it)"
            )
    if inputs.media_required and not any(counts.get(kind) for kind in inputs.media):
        kinds = " or ".join(inputs.media)
        raise DataError(
            f"{where}: the row has no {kinds}, and every row of the {adapter!r} adapter needs one; map the column "
            f"that holds it with task.args.columns.{inputs.media[0]}: <the file's column> (the row has {sorted(row)})"
        )
    if inputs.prompt and counts.get("audio") and row.get("prompt") == "":
        raise DataError(
            f"{where}: the row has audio but no prompt text, and the {adapter!r} adapter reads the prompt beside the "
            "audio; map the question with task.args.columns.prompt: <the file's column> (only whisper needs none)"
        )


@dataclass
class LoadReport:
    """What the load-time check looked at: rows per split, decoded media, the rewards and how each resolved."""

    rows: dict[str, int] = field(default_factory=dict)
    """Rows built and checked, per split (``train``, ``eval``)."""
    media: Counter = field(default_factory=Counter)
    """Media items decoded, per kind (images when the row is built, audio and video frames here)."""
    rewards: list[str] = field(default_factory=list)
    """One entry per configured reward: its name and how it resolved (``built-in``, ``import path, not run``)."""

    def line(self) -> str:
        """``checked 8 train + 8 eval rows; decoded 16 images, 4 audio; rewards: iou (built-in), ...; no model
        loaded``."""
        rows = " + ".join(f"{n} {split}" for split, n in self.rows.items()) or "0"
        media = ", ".join(f"{n} {_PLURAL[k] if n != 1 else k}" for k, n in sorted(self.media.items()) if n)
        rewards = ", ".join(self.rewards) or "none"
        return (
            f"checked {rows} rows; decoded {media or 'no media'}; {len(self.rewards)} reward(s): {rewards}; "
            "no model loaded"
        )


class RowMediaCheck:
    """Checks one row's media for ``model.adapter`` and decodes its audio and video (module docstring); counts
    into ``report`` when given."""

    def __init__(self, adapter: str, report: LoadReport | None = None):
        self.adapter, self.report = adapter, report

    def __call__(self, row: Any, where: str) -> None:
        if not isinstance(row, dict):
            return
        check_media_kinds(self.adapter, row, where)
        decoded: Counter = Counter()
        images = row.get("images") if row.get("images") is not None else row.get("image")
        decoded["image"] += len(as_list(images))
        for kind in ("audio", "video"):
            if row.get(kind) is None:
                continue
            try:
                if kind == "audio":
                    decoded["audio"] += int(decode_audio(row["audio"]) > 0)
                else:
                    decoded["video frame"] += decode_video(row["video"], PREFLIGHT_VIDEO_FRAMES)
            except DataError as e:
                raise DataError(f"{where}: column {kind!r}: {e}") from None
        if self.report is not None:
            self.report.media.update(decoded)


def reward_resolutions(cfg: Any) -> list[str]:
    """``name (how it resolved)`` per configured reward: registered rewards are ``built-in`` (or ``registered``),
    ``module:function`` rewards are checked, not imported, by ``--dry-run``."""
    from mmgrpo.rewards.registry import REWARDS

    out = []
    for spec in cfg.rewards:
        if spec.name in REWARDS:
            fn = REWARDS.get(spec.name)
            module = inspect.getmodule(fn)
            builtin = module is not None and module.__name__.startswith("mmgrpo.")
            out.append(f"{spec.name} ({'built-in' if builtin else 'registered'})")
        else:
            out.append(f"{spec.name} (import path, checked, not run)")
    return out


__all__ = ["PREFLIGHT_VIDEO_FRAMES", "LoadReport", "RowMediaCheck", "adapter_inputs", "check_media_kinds", "readers"]
