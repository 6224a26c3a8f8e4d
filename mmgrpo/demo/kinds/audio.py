"""Audio: generated audio (wav) and the recording of a speech question (speech runs)."""

from __future__ import annotations

from mmgrpo.demo.kinds.base import OutputKind


def output(side: str):
    import gradio as gr

    return gr.Audio(label=f"{side} audio", elem_id=f"{side}-audio", visible=False)


def upload():
    import gradio as gr

    return gr.Audio(type="filepath", sources=["upload"], label="audio (upload to replace)")


SUFFIXES = frozenset({".wav", ".flac", ".mp3", ".ogg", ".m4a"})

KIND = OutputKind("audio", output, empty=None, shown_as="files", columns=("audio",), upload=upload, suffixes=SUFFIXES)
