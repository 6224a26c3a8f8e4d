"""Text answers (VLM, video and speech runs): a text box; never an upload."""

from __future__ import annotations

from mmgrpo.demo.kinds.base import OutputKind


def output(side: str):
    import gradio as gr

    return gr.Textbox(label=f"{side} answer (greedy)", elem_id=f"{side}-text", lines=2, max_lines=6)


KIND = OutputKind(name="text", output=output, empty="", shown_as="text")
