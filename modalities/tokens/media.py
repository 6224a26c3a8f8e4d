"""Media encoders: the parts a token policy composes to put a row's images, videos or audio into its prompt.

A token adapter (:class:`mmgrpo.modalities.vlm.adapter.VLMAdapter`) renders one chat prompt per row and calls
the model's processor once. Each medium is one encoder in its ``encoders`` list: the encoder reads its keys of
the row, decodes the media, and says which keyword arguments the processor takes for them. The user message
gets one ``{"type": kind}`` part per decoded item, in encoder order (images, then video, then audio), before
the text — as TRL and Qwen's processors take conversational prompts. An image + video + audio prompt
(Qwen2.5-Omni style) is the list ``[ImageEncoder, VideoEncoder, AudioEncoder]``, not a class hierarchy.

Encoders keep per-batch state (decoded clips that the G samples of a prompt share): the policy calls
``reset()`` before and after each rollout, evaluation or warm-up batch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from PIL import Image, UnidentifiedImageError

from mmgrpo.types import DataError


@runtime_checkable
class MediaEncoder(Protocol):
    """One medium of a token policy's prompts (see the module docstring)."""

    kind: str
    """The chat content part type this encoder fills: ``image`` | ``video`` | ``audio``."""

    def load(self, row: dict) -> list[Any]:
        """The decoded media of ``row`` (an empty list when the row has none). Raises :class:`DataError`."""
        ...

    def processor_kwargs(self, media: list[Any]) -> dict[str, Any]:
        """Keyword arguments for ``processor(text=..., **kwargs)`` for the non-empty ``media`` of one row."""
        ...

    def check(self, encoding: dict[str, Any], media: list[Any]) -> None:
        """Inspect (and fix in place) the processor output of a row that had ``media``."""
        ...

    def columns(self, rows: list[dict]) -> dict[str, list[Any]]:
        """Per-prompt reward columns (one value per row) about the media the rows were encoded with."""
        ...

    def reset(self) -> None:
        """Forget per-batch state (pinned decoded media)."""
        ...


def as_list(value: Any) -> list[Any]:
    """``None`` → [], a list/tuple → list, anything else → [value]."""
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return list(value)
    return [value]


def open_image(value: Any, what: str = "image") -> Image.Image:
    """An RGB PIL image from a PIL image, a path, or a ``{"path"|"bytes"}`` dict (the Arrow image struct).

    A missing, empty, truncated or unreadable file raises :class:`DataError` naming the file (``Image.open`` is
    lazy, so the pixels are loaded here to catch truncation).
    """
    if isinstance(value, Image.Image):
        return value.convert("RGB")
    if isinstance(value, dict) and (value.get("bytes") is not None or value.get("path")):
        if value.get("bytes") is not None:
            import io

            value = io.BytesIO(value["bytes"])
        else:
            value = value["path"]
    if isinstance(value, (str, Path)):
        path = Path(value)
        if not path.is_file():
            raise DataError(f"{what} file {str(path)!r} does not exist (relative paths resolve against media_root)")
        if path.stat().st_size == 0:
            raise DataError(f"{what} file {str(path)!r} is empty (0 bytes)")
    elif not hasattr(value, "read"):
        raise DataError(f"{what} must be a PIL image or a file path, got {type(value).__name__}")
    try:
        with Image.open(value) as img:
            img.load()
            return img.convert("RGB")
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as e:
        name = str(value) if isinstance(value, (str, Path)) else "bytes"
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise DataError(f"{what} file {name!r} cannot be read as an image ({reason})") from None


class ImageEncoder:
    """Images of a row (``images``: a list, or ``image``: one or a list) → ``processor(images=...)``."""

    kind = "image"

    def __init__(self, min_pixels: int | None = None, max_pixels: int | None = None):
        self.pixel_kwargs = {k: v for k, v in (("min_pixels", min_pixels), ("max_pixels", max_pixels)) if v is not None}

    def load(self, row: dict) -> list[Image.Image]:
        key = "images" if row.get("images") is not None else "image"
        return [open_image(img, f"row {key!r}") for img in as_list(row.get(key))]

    def processor_kwargs(self, media: list[Image.Image]) -> dict[str, Any]:
        return {"images": media, **self.pixel_kwargs}

    def check(self, encoding: dict[str, Any], media: list[Any]) -> None:
        pass

    def columns(self, rows: list[dict]) -> dict[str, list[Any]]:
        return {}

    def reset(self) -> None:
        pass


def count_parts(messages: list[dict], kind: str) -> int:
    """How many ``{"type": kind}`` content parts a conversational prompt holds."""
    n = 0
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list):
            n += sum(1 for part in content if isinstance(part, dict) and part.get("type") == kind)
    return n


__all__ = ["ImageEncoder", "MediaEncoder", "as_list", "count_parts", "open_image"]
