"""Images: generated images (flow, AR-image runs) and the image of an image question (VLM runs)."""

from __future__ import annotations

from pathlib import Path

from mmgrpo import samples as sample_files
from mmgrpo.demo.kinds.base import OutputKind


def output(side: str):
    import gradio as gr

    return gr.Image(
        label=f"{side} image (small outputs shown enlarged)", elem_id=f"{side}-image", visible=False, height=224
    )


def upload():
    import gradio as gr

    return gr.Image(type="filepath", sources=["upload"], label="image (upload to replace)", height=224)


def load(path):
    """The adapters take PIL images, not paths."""
    from PIL import Image

    return Image.open(path).convert("RGB")


def example_file(value, scratch: Path, stem: str):
    """A held-out row's image: its path, or, for an in-memory image, a PNG written under ``scratch``."""
    if isinstance(value, (str, Path)):
        return value
    return sample_files.save_value(value, scratch, stem)["file"]


KIND = OutputKind(
    name="image",
    output=output,
    empty=None,
    shown_as="gallery",
    columns=("image", "images"),
    upload=upload,
    suffixes=frozenset({".png", ".jpg", ".jpeg", ".webp", ".bmp", ".gif"}),
    load_upload=load,
    example_file=example_file,
)
