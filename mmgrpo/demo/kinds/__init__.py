"""The table the demo page is built from: output kind -> how the page shows it (and takes it as input).

A new kind of model output is one module here defining ``KIND`` (:class:`~mmgrpo.demo.kinds.base.OutputKind`) and
one row below; the page gets a hidden output box per model side for it, and an upload box when held-out rows carry
it in one of its ``columns``. The order of the rows is the order of the boxes on the page.
"""

from __future__ import annotations

from mmgrpo.demo.kinds import audio, image, text, video
from mmgrpo.demo.kinds.base import OutputKind

KINDS: dict[str, OutputKind] = {
    "text": text.KIND,
    "image": image.KIND,
    "video": video.KIND,
    "audio": audio.KIND,
}

MEDIA_KEYS = {column: kind.name for kind in KINDS.values() for column in kind.columns}
"""Row column -> upload kind. A row with none of them is prompt-only (generation)."""
UPLOAD_SUFFIXES = {kind.name: set(kind.suffixes) for kind in KINDS.values() if kind.upload is not None}


def shown_as(kind: str | None) -> str | None:
    """Where samples of ``kind`` are shown (:attr:`OutputKind.shown_as`); None for a kind without a row."""
    return KINDS[kind].shown_as if kind in KINDS else None


__all__ = ["KINDS", "MEDIA_KEYS", "UPLOAD_SUFFIXES", "OutputKind", "shown_as"]
