"""The model tab: one held-out (or edited) row answered by the base and the trained model side by side.

Its input is the run's modality: a row with a media column of :data:`~mmgrpo.demo.kinds.MEDIA_KEYS` gets that
kind's upload box and the tab is called "ask (<kind>)"; a prompt-only row gets the prompt box alone ("generate").
Each side has one output box per row of :data:`~mmgrpo.demo.kinds.KINDS`, all hidden but the one of the answer's
kind, plus its reward line and its sampled answers (text lines, and a gallery for the kinds shown in galleries).
"""

from __future__ import annotations

import tempfile
import traceback
from pathlib import Path

from mmgrpo.demo.answer import _check_upload, _digest, answer, ground_truth_line, media_key, samples_text
from mmgrpo.demo.kinds import KINDS, MEDIA_KEYS, OutputKind, shown_as
from mmgrpo.demo.run import DemoError, Models

SIDES = ("base", "trained")


def prompt_text(prompt) -> str:
    """What a prompt says, for a label: a string as it is; a chat's last user message (its text parts), else its
    last message; whitespace collapsed."""
    if isinstance(prompt, list):
        messages = [m for m in prompt if isinstance(m, dict)]
        users = [m for m in messages if m.get("role") == "user"] or messages
        content = users[-1].get("content", "") if users else ""
        if isinstance(content, list):
            content = " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict) and p.get("text"))
        prompt = content
    return " ".join(str(prompt if prompt is not None else "").split())


def example_label(i: int, row: dict) -> str:
    """``"i: <the prompt's text>"`` (at most 70 characters of it), the dropdown entry of held-out row ``i``."""
    text = prompt_text(row.get("prompt"))
    return f"{i}: {text[:70]}{'…' if len(text) > 70 else ''}"


def model_tab(app, models: Models, rows: list[dict], group: int, scratch: Path) -> None:
    """The tab's components and events (``group``: the run's G, the most sampled answers one may ask for)."""
    import gradio as gr

    key = media_key(rows)
    kind = KINDS[MEDIA_KEYS[key]] if key else None
    with gr.Tab(f"ask ({kind.name})" if kind else "generate", elem_id="tab-model"):
        labels = [example_label(i, r) for i, r in enumerate(rows)]
        example = gr.Dropdown(
            choices=labels, value=labels[0] if labels else None, label="held-out example", elem_id="example"
        )
        with gr.Row():
            upload = kind.upload() if kind is not None and kind.upload is not None else None
            with gr.Column():
                prompt = gr.Textbox(label="prompt / question", lines=3, elem_id="prompt")
                gt = gr.Markdown(elem_id="ground-truth")
                with gr.Row():
                    seed = gr.Number(value=0, precision=0, label="seed")
                    n_samples = gr.Slider(0, max(group, 1), value=0, step=1, label=f"sampled answers (G={group})")
                run_btn = gr.Button("Run base and trained", variant="primary", elem_id="run")
        status = gr.Markdown(elem_id="status")
        sides = {}
        with gr.Row():
            for side in SIDES:
                with gr.Column():
                    gr.Markdown(f"### {side}")
                    sides[side] = _side_outputs(side)
        maybe_upload = [upload] if upload is not None else []
        served: dict[str, str] = {}  # example label -> digest of the file shown for it

        def pick(label):
            if not label:
                return (gr.update(),) * (2 + len(maybe_upload))
            row = rows[int(label.split(":", 1)[0])]
            out = [row.get("prompt", ""), ground_truth_line(row, key)]
            if upload is not None:
                value = row[key][0] if isinstance(row[key], (list, tuple)) else row[key]
                value = kind.example_file(value, scratch, f"example_{label.split(':')[0]}")
                served[label] = _digest(value)
                out.append(str(value))
            return tuple(out)

        example.change(pick, example, [prompt, gt] + maybe_upload)
        app.load(pick, example, [prompt, gt] + maybe_upload)

        def on_edit(label, prompt_text, *maybe_uploaded):
            """The ground-truth line once the question or the media is edited: the row's truth no longer
            applies (the rewards then get the prompt only)."""
            if not label:
                return gr.update()
            row = rows[int(label.split(":", 1)[0])]
            uploaded = maybe_uploaded[0] if maybe_uploaded else None
            new_media = uploaded is not None and _digest(uploaded) != served.get(label)
            return ground_truth_line(row, key, edited=prompt_text != row.get("prompt") or new_media)

        prompt.input(on_edit, [example, prompt] + maybe_upload, gt)
        if upload is not None:
            upload.upload(on_edit, [example, prompt] + maybe_upload, gt)
        flat = [c for side in SIDES for c in sides[side].values()]

        def run(label, prompt_text, seed_value, g, *maybe_uploaded):
            uploaded = maybe_uploaded[0] if maybe_uploaded else None
            try:
                row, unchanged = _row_to_answer(rows, label, prompt_text, uploaded, key, kind, served)
                if kind is None:
                    row["seed"] = int(seed_value)  # generation: the same initial noise for both models
                res = answer(models, row, int(seed_value), int(g), unchanged, Path(tempfile.mkdtemp(dir=scratch)))
            except Exception as e:  # shown in the page; the app keeps serving
                traceback.print_exc()
                msg = str(e).splitlines()[0] if str(e) else ""
                return [f"**error:** {type(e).__name__}: {msg}"] + [gr.update() for _ in flat]
            updates = [u for side in SIDES for u in _side_updates(side, res[side], unchanged)]
            return ["done: same seed for both models"] + updates

        run_btn.click(run, [example, prompt, seed, n_samples] + maybe_upload, [status] + flat)


def _side_outputs(side: str) -> dict:
    """One side's components: an output box per kind (in table order), its reward line and its samples."""
    import gradio as gr

    return {
        **{name: k.output(side) for name, k in KINDS.items()},
        "reward": gr.Markdown(elem_id=f"{side}-reward"),
        "samples_text": gr.Textbox(label=f"{side} samples", lines=4, visible=False, elem_id=f"{side}-samples"),
        "gallery": gr.Gallery(label=f"{side} samples", visible=False, columns=4, height=200),
        "trajectory": gr.Chatbot(
            label=f"{side} trajectory (greedy): turns, tool calls and observations",
            visible=False,
            elem_id=f"{side}-trajectory",
            height=420,
        ),
    }


def trajectory_messages(turns: list[dict]) -> list[dict]:
    """A multi-turn answer's messages (:attr:`~mmgrpo.types.Transcript.messages`, images as files) as chat
    messages: the policy's turns as the assistant's, each observation as a user message naming its role, then
    one message per image it showed the policy (a crop, frames, the rendered state)."""
    out = []
    for m in turns:
        if m["role"] == "assistant":
            out.append({"role": "assistant", "content": m["text"]})
            continue
        out.append({"role": "user", "content": f"[{m['role']}] {m['text']}".strip()})
        out += [{"role": "user", "content": {"path": path}} for path in m["images"]]
    return out


def _side_updates(side: str, res: dict, unchanged: bool) -> list:
    """Updates of :func:`_side_outputs`'s components, in its order, for one side's answer."""
    import gradio as gr

    g_kind = res["greedy"]["kind"]
    value = res["greedy"].get("text", res["greedy"].get("file"))
    samples = res["samples"]
    media_samples = [s["file"] for s in samples if "file" in s and shown_as(s["kind"]) == "gallery"]
    return [
        *(gr.update(value=value if g_kind == name else k.empty, visible=g_kind == name) for name, k in KINDS.items()),
        f"**{side}** greedy: {res['rewards'][0]}"
        + ("" if unchanged else " — edited input: ground-truth rewards do not apply"),
        gr.update(value=samples_text(samples, res["rewards"][1:]), visible=bool(samples)),
        gr.update(value=media_samples, visible=bool(media_samples)),
        gr.update(
            value=trajectory_messages(turns) if (turns := res["greedy"].get("turns")) else [], visible=bool(turns)
        ),
    ]


def _row_to_answer(
    rows: list[dict], label, prompt_text, uploaded, key: str | None, kind: OutputKind | None, served: dict
) -> tuple[dict, bool]:
    """The row both models answer (the picked example with the page's prompt and upload) and whether it is the
    example unchanged (then the rewards get its ground-truth columns)."""
    row = dict(rows[int(label.split(":", 1)[0])]) if label else {}
    original = dict(row)
    row["prompt"] = prompt_text or row.get("prompt", "")
    media_changed = False
    if kind is not None and uploaded is not None:
        _check_upload(uploaded, kind.name)
        if _digest(uploaded) != served.get(label):  # not the picked example's own file
            row[key] = kind.load_upload(uploaded)
            media_changed = True
    elif kind is not None and row.get(key) is None:
        raise DemoError(f"upload a {kind.name} file or pick an example")
    if kind is not None and isinstance(row.get(key), (str, Path)):
        row[key] = kind.load_upload(row[key])
    unchanged = bool(original) and row["prompt"] == original.get("prompt") and not media_changed
    return row, unchanged
