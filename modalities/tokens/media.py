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

from typing import Any, Protocol, runtime_checkable

from PIL import Image

from mmgrpo.media import as_list, count_parts, open_image


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


class ImageEncoder:
    """Images of a row (``images``: a list, or ``image``: one or a list) → ``processor(images=...)``."""

    kind = "image"

    def __init__(self, min_pixels: int | None = None, max_pixels: int | None = None, size: dict | None = None):
        """``size``: the image processor's default ``size``. Where it holds the pixel bounds as ``shortest_edge`` /
        ``longest_edge`` (Qwen2-VL's processors in transformers 5.x, which deprecate ``min_pixels`` / ``max_pixels``
        call arguments), the bounds are passed as a ``size`` of the images' kwargs; else as those arguments."""
        self.pixel_kwargs = {k: v for k, v in (("min_pixels", min_pixels), ("max_pixels", max_pixels)) if v is not None}
        size = dict(size or {})
        if self.pixel_kwargs and {"shortest_edge", "longest_edge"} <= set(size):
            size.update(
                {
                    "shortest_edge": min_pixels or size["shortest_edge"],
                    "longest_edge": max_pixels or size["longest_edge"],
                }
            )
            self.call_kwargs: dict[str, Any] = {"images_kwargs": {"size": size}}
        else:
            self.call_kwargs = dict(self.pixel_kwargs)
        # the vLLM engine gets the original images and resizes them with these bounds, as this processor does
        self.engine_kwargs = {"images_kwargs": dict(self.pixel_kwargs)} if self.pixel_kwargs else {}
        self._sizes: dict[int, list[tuple[int, int]]] = {}  # id(row) -> (W, H) per decoded image, this batch

    def load(self, row: dict) -> list[Image.Image]:
        key = "images" if row.get("images") is not None else "image"
        images = [open_image(img, f"row {key!r}") for img in as_list(row.get(key))]
        self._sizes[id(row)] = [img.size for img in images]
        return images

    def processor_kwargs(self, media: list[Image.Image]) -> dict[str, Any]:
        return {"images": media, **self.call_kwargs}

    def check(self, encoding: dict[str, Any], media: list[Any]) -> None:
        pass

    def columns(self, rows: list[dict]) -> dict[str, list[Any]]:
        """``image_size``: ``(W, H)`` of each decoded original image (one per row, unwrapped for one image)."""
        if not any(self._sizes.get(id(row)) for row in rows):
            return {}
        return {"image_size": [one_or_list(self._sizes.get(id(row), [])) for row in rows]}

    def reset(self) -> None:
        self._sizes.clear()


def one_or_list(values: list) -> Any:
    """None for no value, the value itself for one, the list for several (a row's one image is not a list)."""
    return None if not values else values[0] if len(values) == 1 else values


__all__ = ["ImageEncoder", "MediaEncoder", "as_list", "count_parts", "one_or_list", "open_image"]
