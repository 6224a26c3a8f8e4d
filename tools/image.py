"""``crop`` and ``zoom``: a box of the row's original image, as DeepEyes and verl's ``ImageZoomInTool`` read it.

verl ``verl/tools/image_zoom_in_tool.py`` ``ImageZoomInTool._maybe_resize_bbox`` (anchors §2.3), step by step:

1. ``bbox_2d = [x1, y1, x2, y2]`` in pixels of the **original** image (``ToolContext.images[image]``), x right,
   y down, ``x2``/``y2`` exclusive (PIL's crop box);
2. clamp to the image: ``x1 = max(0, x1)``, ``y1 = max(0, y1)``, ``x2 = min(W, x2)``, ``y2 = min(H, y2)``;
3. reject unless ``x1 < x2`` and ``y1 < y2`` (unordered, empty or wholly outside), or if the longer side is more
   than ``max_aspect`` = 100 times the shorter;
4. a side shorter than ``min_side`` = 28: scale the box about its centre so its shorter side is 28 (aspect kept),
   scaled down to fit the image if that is larger than the image, shifted back inside the image;
5. integer pixels: ``floor`` of the left/top, ``ceil`` of the right/bottom edge (the box covers every pixel it
   touches); a result with a side under 28 (an image smaller than 28 px) is rejected;
6. ``crop`` returns that region pixel for pixel; ``zoom`` also enlarges it so its longer side is ``target_size``
   (bicubic, aspect kept; never shrinks).

Departures: verl passes float boxes that were not grown straight to ``PIL.Image.crop`` (which rounds); here every
box goes through step 5. DeepEyes' own tool rejects boxes with a side ≤ 30 instead of growing them. Errors carry
verl's tool reward −0.05 only if the runner's ``error_reward`` says so (the tool itself returns reward 0).
"""

from __future__ import annotations

import math
from typing import Any

from PIL import Image

from .base import TOOLS, Observation, ToolContext

MIN_SIDE = 28
"""verl's ``ImageZoomInTool.MIN_DIMENSION``: Qwen2-VL's patch merge covers 28×28 pixels."""
MAX_ASPECT = 100.0
"""verl's and DeepEyes' aspect-ratio limit."""


def clamp_box(
    box: Any, width: int, height: int, *, min_side: int = MIN_SIDE, max_aspect: float = MAX_ASPECT
) -> tuple[tuple[int, int, int, int] | None, str]:
    """Steps 2–5 of the module docstring: the integer crop box inside a ``width × height`` image, or ``None``
    and a one-line reason naming the fix. ``box`` is whatever the model sent (checked here: 4 finite numbers)."""
    fix = f"give bbox_2d as [x1, y1, x2, y2] with x1 < x2 <= {width}, y1 < y2 <= {height} (original-image pixels)"
    if not isinstance(box, (list, tuple)) or len(box) != 4:
        return None, f"bbox_2d must be a list of 4 numbers, got {_show(box)}; {fix}"
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in box):
        return None, f"bbox_2d must hold 4 finite numbers, got {_show(box)}; {fix}"
    x1, y1 = max(0.0, float(box[0])), max(0.0, float(box[1]))
    x2, y2 = min(float(width), float(box[2])), min(float(height), float(box[3]))
    if not (x1 < x2 and y1 < y2):
        return None, f"bbox_2d {_show(box)} is empty inside the {width}x{height} image (unordered or outside); {fix}"
    w, h = x2 - x1, y2 - y1
    if max(w, h) / min(w, h) > max_aspect:
        return None, f"bbox_2d {_show(box)} is thinner than 1:{max_aspect:g}; {fix}"
    if w < min_side or h < min_side:  # grow about the centre to a shorter side of min_side (verl)
        cx, cy, ratio = (x1 + x2) / 2.0, (y1 + y2) / 2.0, min_side / min(w, h)
        w, h = w * ratio, h * ratio
        if w > width:
            w, h = float(width), h * width / w
        if h > height:
            w, h = w * height / h, float(height)
        x1 = min(max(0.0, cx - w / 2.0), width - w)
        y1 = min(max(0.0, cy - h / 2.0), height - h)
        x2, y2 = x1 + w, y1 + h
    out = (math.floor(x1), math.floor(y1), min(width, math.ceil(x2)), min(height, math.ceil(y2)))
    if out[2] - out[0] < min_side or out[3] - out[1] < min_side:
        return None, f"the {width}x{height} image is smaller than the minimum crop of {min_side}x{min_side} pixels"
    return out, ""


def _show(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


class CropTool:
    """A :class:`~mmgrpo.tools.Tool` that crops (and for ``zoom`` enlarges) a box of one of the row's images.

    Arguments (JSON): ``bbox_2d`` [x1, y1, x2, y2] in original-image pixels (required), ``label`` (optional text,
    echoed), ``image`` (optional index into the row's images, default 0 = the first).
    """

    def __init__(
        self,
        name: str = "crop",
        *,
        target_size: int | None = None,
        min_side: int = MIN_SIDE,
        max_aspect: float = MAX_ASPECT,
        description: str | None = None,
    ):
        self.name = name
        self.target_size = target_size
        self.min_side = min_side
        self.max_aspect = max_aspect
        what = "crop" if target_size is None else f"crop, enlarged to {target_size} px on its longer side"
        self.schema = {
            "type": "function",
            "function": {
                "name": name,
                "description": description
                or (
                    f"Zoom in on a region of the image: returns the {what}. Coordinates are pixels of the original "
                    "image (x to the right, y down)."
                ),
                "parameters": {
                    "type": "object",
                    "properties": {
                        "bbox_2d": {
                            "type": "array",
                            "items": {"type": "number"},
                            "minItems": 4,
                            "maxItems": 4,
                            "description": "The region as [x1, y1, x2, y2]: top-left and bottom-right corners.",
                        },
                        "label": {"type": "string", "description": "What is in the region (optional)."},
                        "image": {
                            "type": "integer",
                            "description": "Which input image to crop, 0 = the first (optional).",
                        },
                    },
                    "required": ["bbox_2d"],
                },
            },
        }

    def __call__(self, arguments: dict[str, Any], context: ToolContext) -> Observation:
        index = arguments.get("image", 0)
        n = len(context.images)
        if n == 0:
            return Observation(text=f"Error: {self.name} needs an image, and this prompt has none.", error="no image")
        if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < n:
            msg = f"image must be an integer index from 0 to {n - 1}, got {_show(index)}"
            return Observation(text=f"Error: {msg}.", error=msg)
        image = context.images[index]
        box, reason = clamp_box(
            arguments.get("bbox_2d"), image.width, image.height, min_side=self.min_side, max_aspect=self.max_aspect
        )
        if box is None:
            return Observation(text=f"Error: {reason}.", error=reason)
        region = image.crop(box)
        if self.target_size is not None and max(region.size) < self.target_size:
            scale = self.target_size / max(region.size)
            size = (max(1, round(region.width * scale)), max(1, round(region.height * scale)))
            region = region.resize(size, Image.Resampling.BICUBIC)
        label = arguments.get("label")
        about = f" with label {label}" if isinstance(label, str) and label else ""
        text = f"Zoomed in on the image to the region {list(box)}{about}."
        return Observation(text=text, images=[region])

    def __repr__(self) -> str:
        return f"CropTool({self.name!r}, target_size={self.target_size})"


TOOLS.add("crop", CropTool("crop"))
TOOLS.add("zoom", CropTool("zoom", target_size=448))
