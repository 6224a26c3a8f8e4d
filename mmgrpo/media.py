"""Media of dataset rows: opening files with one-line errors, and the chat parts that stand for them.

Image files are opened with Pillow and fully read, so a truncated file fails here, naming the file, rather than
deep inside a processor; audio files are decoded with soundfile and videos' frames with decord
(:func:`decode_audio`, :func:`decode_video`) for the same reason. :class:`~mmgrpo.types.DataError` carries the
message; the dataset task prefixes the file and line, and the trainer skips and counts such a row.

:func:`add_media_parts` gives a conversational prompt one ``{"type": kind}`` content part per image / video /
audio of its row, as TRL does for its vision datasets (``trl.data_utils.prepare_multimodal_messages``, TRL 1.16):
a prompt whose messages hold string content gets the parts inserted before the text of its first user message
with string content; every other string content becomes one text part; a prompt that already holds parts is
checked (one part per item). The dataset task and the token adapters call the same function, so a row that one
accepts the other accepts too.
"""

from __future__ import annotations

import io
import re
from pathlib import Path
from typing import Any

from PIL import Image, UnidentifiedImageError

from mmgrpo.types import DataError

MAX_IMAGE_SIDE = 3584
"""The largest square image side a task may draw: Qwen2-VL's processor default ``max_pixels`` = 12845056 = 3584²
(a larger image is resized down by the processor anyway; ``image_size=100000`` asked for 30 GB of pixels)."""
MAX_FRAME_SIDE = 1024
"""The largest square video frame side a task may draw (Qwen2.5-VL's video path resizes frames to about 768·28²
pixels, 776², by default)."""
MAX_FRAMES = 1024
"""The most frames a task may write into one video."""


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
    except Image.DecompressionBombError:  # not an OSError: a header claiming more pixels than Pillow will allocate
        name = str(value) if isinstance(value, (str, Path)) else "bytes"
        raise DataError(
            f"{what} file {name!r} is a decompression bomb (its header claims more than {2 * Image.MAX_IMAGE_PIXELS} "
            "pixels, Pillow's limit); replace or drop the file"
        ) from None
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as e:
        name = str(value) if isinstance(value, (str, Path)) else "bytes"
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise DataError(f"{what} file {name!r} cannot be read as an image ({reason})") from None


def decode_audio(value: Any, what: str = "audio") -> int:
    """Decode a row's audio as the speech adapters will (``soundfile``: wav, flac, ogg, mp3) and return its sample
    count; a file path, a ``{"bytes"|"path"}`` dict (the Arrow audio struct), or samples: a ``{"array",
    "sampling_rate"}`` dict, an ``(array, rate)`` pair, an array or a CPU tensor.

    A missing, empty, undecodable file, a signal of 0 samples or with NaN/inf samples raises :class:`DataError`
    naming the file (the adapters' ``silence_threshold`` is theirs to check)."""
    import numpy as np

    if isinstance(value, str) and value.startswith(("http://", "https://")):
        return 0
    if isinstance(value, dict) and value.get("bytes") is None and value.get("array") is None:
        value = value.get("path")  # the Arrow audio struct without its bytes
    if value is None:
        raise DataError(f"{what} is empty (no path, bytes or array)")
    if isinstance(value, dict) and value.get("bytes") is not None:
        value = io.BytesIO(value["bytes"])
    if not isinstance(value, (str, Path, io.IOBase)):  # an array, (array, rate), {"array", "sampling_rate"}
        array = value["array"] if isinstance(value, dict) else value[0] if isinstance(value, tuple) else value
        try:
            data = np.asarray(array, dtype=np.float32)  # numpy, lists, CPU tensors
        except (TypeError, ValueError, RuntimeError) as e:
            reason = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise DataError(
                f"{what} must be a file path or an array of samples, got {type(value).__name__} ({reason})"
            ) from None
        name = "array"
    else:
        if isinstance(value, (str, Path)):
            _check_file(value, what)
        import soundfile as sf

        name = str(value) if isinstance(value, (str, Path)) else "bytes"
        try:
            data, _ = sf.read(value, dtype="float32", always_2d=True)  # [N, channels]
        except Exception as e:  # libsndfile's errors name no file: add it
            reason = (str(e).strip().splitlines() or [type(e).__name__])[0][:160]
            raise DataError(f"{what} file {name!r} cannot be decoded ({reason}); use wav, flac, ogg or mp3") from None
    if data.size == 0:
        raise DataError(f"{what} {name!r} is empty (0 samples)")
    if not np.isfinite(data).all():
        raise DataError(f"{what} {name!r} has NaN or infinite samples")
    return int(data.shape[0])


def decode_video(value: Any, frames: int = 8, what: str = "video") -> int:
    """Decode ``frames`` frames of a video file spread over its length, the last one included (decord, the reader
    the video adapter's frame sampling uses), and return how many were decoded: a file that is missing, empty,
    cannot be opened, has no frames or is cut short raises :class:`DataError` naming it. A list of frames (already
    decoded) and URLs are returned as they are (0 decoded); ``frames=0`` checks only that the file exists."""
    if not isinstance(value, (str, Path)) or str(value).startswith(("http://", "https://")):
        return 0
    _check_file(value, what)
    if frames <= 0:
        return 0
    try:
        import decord
    except ImportError:
        return 0
    try:
        reader = decord.VideoReader(str(value), num_threads=1)
        n = len(reader)
        if n > 0:
            k = max(1, min(frames, n))
            reader.get_batch([round(j * (n - 1) / max(1, k - 1)) for j in range(k)] if k > 1 else [n - 1])
    except Exception as e:
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0][:160]
        raise DataError(f"{what} file {str(value)!r} cannot be decoded ({reason})") from None
    if n == 0:
        raise DataError(f"{what} file {str(value)!r} has no frames")
    return k


def _check_file(value: Any, what: str) -> None:
    path = Path(value)
    if not path.is_file():
        raise DataError(f"{what} file {str(path)!r} does not exist (relative paths resolve against media_root)")
    if path.stat().st_size == 0:
        raise DataError(f"{what} file {str(path)!r} is empty (0 bytes)")


MEDIA_KINDS = ("image", "video", "audio")
"""Content-part types, in the order their parts precede the text (the token adapters' encoder order)."""


def media_counts(row: dict) -> dict[str, int]:
    """Items of each kind a row holds: images from ``images`` (else ``image``; one or a list, as TRL reads them),
    one ``video`` and one ``audio`` when present. Kinds with no item are left out."""
    images = row.get("images") if row.get("images") is not None else row.get("image")
    counts = {"image": len(as_list(images)), "video": int(row.get("video") is not None)}
    counts["audio"] = int(row.get("audio") is not None)
    return {kind: n for kind, n in counts.items() if n}


def count_parts(messages: list, kind: str) -> int:
    """How many ``{"type": kind}`` content parts a conversational prompt holds (tool messages not counted)."""
    n = 0
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list) and message.get("role") != "tool":
            n += sum(1 for part in content if isinstance(part, dict) and part.get("type") == kind)
    return n


IMAGE_PLACEHOLDER = "<image>"
PLACEHOLDERS = {IMAGE_PLACEHOLDER: "image", "<video>": "video"}
"""Media placeholders in prompt text (EasyR1, LLaVA, Video-R1 data): each becomes that kind's part at its place."""

_PLACEHOLDER = re.compile("|".join(map(re.escape, PLACEHOLDERS)))


def placeholder_kinds(text: str) -> set[str]:
    """Kinds whose placeholder (``<image>``, ``<video>``) appears in ``text``."""
    return {PLACEHOLDERS[m] for m in _PLACEHOLDER.findall(text)}


def media_content(text: str, counts: dict[str, int], placed: set[str] | None = None) -> list[dict]:
    """The content parts of a user message whose text is ``text``: one ``{"type": kind}`` part per media item.

    Each ``<image>`` / ``<video>`` placeholder of ``text`` becomes that kind's part at its place, the text around it
    text parts (empty ones dropped), as EasyR1 builds its messages (hiyouga/EasyR1 ``verl/utils/dataset.py``,
    ``_build_messages``: ``prompt.split("<image>")``) and TRL's vision datasets are written; the items of kinds
    without a placeholder (in ``placed``, default the kinds placed in ``text``) come first, in
    :data:`MEDIA_KINDS` order, as before. The caller checks that the parts and the row's items agree in number."""
    placed = placeholder_kinds(text) if placed is None else placed
    parts: list[dict] = [
        {"type": kind} for kind in MEDIA_KINDS if kind not in placed for _ in range(counts.get(kind, 0))
    ]
    return parts + _split(text, counts)


def _split(text: str, counts: dict[str, int]) -> list[dict]:
    """``text`` as text parts with a media part at each placeholder of a kind the row holds (others stay text)."""
    parts: list[dict] = []
    pos = 0
    for m in _PLACEHOLDER.finditer(text):
        kind = PLACEHOLDERS[m.group()]
        if not counts.get(kind):
            continue  # the row holds no such item: a literal tag (the count check reports a mismatch)
        if text[pos : m.start()]:
            parts.append({"type": "text", "text": text[pos : m.start()]})
        parts.append({"type": kind})
        pos = m.end()
    if text[pos:] or not parts:
        parts.append({"type": "text", "text": text[pos:]})
    return parts


def check_media_content(text: str, counts: dict[str, int]) -> None:
    """Raise :class:`DataError` when ``text``'s placeholders of a kind differ in number from the row's items."""
    for tag, kind in PLACEHOLDERS.items():
        n = text.count(tag)
        if n and counts.get(kind) and n != counts[kind]:
            raise DataError(
                f"the prompt holds {n} {tag} placeholder(s) but the row has {counts[kind]} {kind}(s); give one "
                f"{tag} per {kind}, or none (the {kind}s then come before the text)"
            )


def add_media_parts(messages: list, counts: dict[str, int]) -> list:
    """``messages`` with one ``{"type": kind}`` part per media item of the row (see the module docstring).

    Follows ``trl.data_utils.prepare_multimodal_messages``: string content is wrapped as ``{"type": "text"}``
    parts, and the first user message with string content gets the media parts (images, then video, then audio)
    before its text; an ``<image>`` / ``<video>`` placeholder in a user message's text becomes that part at its
    place instead (:func:`media_content`, EasyR1 / LLaVA-style text). Departures: the parts carry no payload (the
    decoded media stay in the row's columns, where the adapter's encoders and the rewards read them), and a row
    without media is returned unchanged (string content kept), so text-only chats render as before. Raises
    :class:`DataError` when the parts and the row's items differ in number, naming both. Returns a new list;
    ``messages`` is not modified.
    """
    if not any(counts.values()):
        return messages
    placed = set()
    for message in messages:
        if isinstance(message, dict) and message.get("role") == "user" and isinstance(message.get("content"), str):
            check_media_content(message["content"], counts)
            placed |= {kind for kind in placeholder_kinds(message["content"]) if counts.get(kind)}
    out, inserted = [], False
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or "role" not in message:
            raise DataError(f"message {i} of the prompt is not a {{'role': ..., 'content': ...}} mapping: {message!r}")
        if message["role"] not in ("system", "user", "assistant", "tool"):
            raise DataError(
                f"message {i} of the prompt has role {message['role']!r}; expected system, user, assistant or tool"
            )
        content = message.get("content")
        if isinstance(content, str):
            parts = [{"type": "text", "text": content}]
            if message["role"] == "user":
                parts = _split(content, counts)
                if not inserted:
                    parts = media_content(content, counts, placed)
                    inserted = True
            message = {**message, "content": parts}
        out.append(message)
    for kind in MEDIA_KINDS:
        have, want = count_parts(out, kind), counts.get(kind, 0)
        if have != want:
            raise DataError(
                f"the prompt's messages hold {have} {{'type': '{kind}'}} part(s) but the row has {want} {kind}(s); "
                f"give one part per {kind}, or give the first user message string content and the parts are added"
            )
    return out


def write_mp4(path: str | Path, frames: list, fps: float = 4.0, lossless: bool = False) -> None:
    """Write RGB frames (PIL images or [H, W, 3] uint8 arrays) as an H.264 mp4 with PyAV, yuv420p.

    Odd sides are resized up to even ones (yuv420p needs them). ``lossless``: crf 0 with the ultrafast preset, for
    task files whose pixels the rewards and tests read back; otherwise libx264's default quality (evaluation
    samples, example datasets)."""
    import av
    import numpy as np

    arrays = [np.asarray(f.convert("RGB")) if isinstance(f, Image.Image) else np.asarray(f) for f in frames]
    h, w = arrays[0].shape[:2]
    w2, h2 = w + w % 2, h + h % 2
    with av.open(str(path), mode="w") as container:
        stream = container.add_stream("libx264", rate=max(1, round(fps)))
        stream.width, stream.height, stream.pix_fmt = w2, h2, "yuv420p"
        if lossless:
            stream.options = {"crf": "0", "preset": "ultrafast"}
        for arr in arrays:
            if (arr.shape[1], arr.shape[0]) != (w2, h2):
                arr = np.asarray(Image.fromarray(arr).resize((w2, h2)))
            frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(arr, dtype=np.uint8), format="rgb24")
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)


__all__ = [
    "MEDIA_KINDS",
    "PLACEHOLDERS",
    "add_media_parts",
    "as_list",
    "check_media_content",
    "count_parts",
    "decode_audio",
    "decode_video",
    "media_content",
    "media_counts",
    "open_image",
    "placeholder_kinds",
    "write_mp4",
]
