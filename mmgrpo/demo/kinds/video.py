"""Video: generated clips (mp4 of the frames) and the clip of a video question (video LLM runs)."""

from __future__ import annotations

from mmgrpo.demo.kinds.base import OutputKind


def output(side: str):
    import gradio as gr

    return gr.Video(label=f"{side} video", elem_id=f"{side}-video", visible=False)


def upload():
    import gradio as gr

    return gr.Video(sources=["upload"], label="video clip (upload to replace)", height=224)


SUFFIXES = frozenset({".mp4", ".webm", ".mov", ".avi", ".mkv"})

KIND = OutputKind("video", output, empty=None, shown_as="gallery", columns=("video",), upload=upload, suffixes=SUFFIXES)
