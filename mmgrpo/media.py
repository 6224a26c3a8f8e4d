"""Opening media files of dataset rows with one-line errors (shared by tasks and the token adapters' encoders).

Image files are opened with Pillow and fully read, so a truncated file fails here, naming the file, rather than
deep inside a processor; :class:`~mmgrpo.types.DataError` carries the message.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from PIL import Image, UnidentifiedImageError

from mmgrpo.types import DataError


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


__all__ = ["as_list", "open_image"]
