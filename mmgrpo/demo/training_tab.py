"""The "training" tab: the reward curve and eval metrics from ``metrics.jsonl``, and the samples the trainer wrote
(``samples_<stage>.json`` and their media files), each shown where its kind's row of :data:`~mmgrpo.demo.kinds.KINDS`
says (images and video in the gallery, audio in the file list, text in the table)."""

from __future__ import annotations

import json
from pathlib import Path

from mmgrpo import samples as sample_files
from mmgrpo.demo.kinds import shown_as


def training_tab(app, run_dir: Path) -> None:
    """The tab's components, filled from the run directory on page load and on "Refresh"."""
    import gradio as gr

    with gr.Tab("training", elem_id="tab-training"):
        refresh = gr.Button("Refresh from the run directory", elem_id="refresh")
        plot = gr.Plot(label="reward curve")
        table = gr.Dataframe(headers=["step", "stage", "metric", "value"], label="eval metrics", elem_id="eval-table")
        gallery = gr.Gallery(
            label="samples written during training (images / video)", columns=6, height=260, elem_id="train-gallery"
        )
        audio_files = gr.Files(label="audio samples written during training")
        text = gr.Dataframe(
            headers=["stage", "prompt", "answer", "output"], label="samples", wrap=True, elem_id="train-samples"
        )

        def load_training():
            history = read_metrics(run_dir)
            g, t, a = sample_views(run_dir)
            return reward_figure(history), eval_table(history), g, gr.update(value=a or None, visible=bool(a)), t

        refresh.click(load_training, None, [plot, table, gallery, audio_files, text])
        app.load(load_training, None, [plot, table, gallery, audio_files, text])


def read_metrics(run_dir: Path) -> list[dict]:
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:  # a line being written
            continue
    return out


def reward_figure(history: list[dict]):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3))
    pts = [(h["step"], h["reward/mean"]) for h in history if "reward/mean" in h]
    if pts:
        ax.plot(*zip(*pts), marker=".", label="reward/mean")
    for key in sorted({k for h in history for k in h if k.startswith("eval/") and k.endswith("accuracy")}):
        e = [(h["step"], h[key]) for h in history if key in h]
        ax.plot(*zip(*e), "o--", label=key)
    ax.set_xlabel("step")
    ax.set_title("training reward" if pts else "no reward logged yet")
    if ax.lines:
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def eval_table(history: list[dict]) -> list[list]:
    rows = []
    for h in history:
        for k, v in h.items():
            if k.startswith("eval/"):
                _, stage, metric = k.split("/", 2)
                rows.append([h["step"], stage, metric, round(float(v), 4)])
    return rows


def sample_views(run_dir: Path) -> tuple[list, list[list], list[str]]:
    """Training samples: (gallery items of images/videos, text rows, audio files)."""
    gallery, table, audio = [], [], []
    for stage, records in sample_files.read_samples(run_dir).items():
        for rec in records:
            shown = rec["output"] if rec["output_kind"] == "text" else rec["output_kind"]
            caption = f"[{stage}] {rec['prompt'][:60]} → {shown}"
            output_as, input_as = shown_as(rec["output_kind"]), shown_as(rec.get("input_kind"))
            if output_as == "gallery":
                gallery.append((rec["output"], caption))
            elif input_as == "gallery":
                gallery.append((rec["input"], caption))
            if output_as == "files":
                audio.append(rec["output"])
            elif input_as == "files":
                audio.append(rec["input"])
            table.append([stage, rec["prompt"], str(rec.get("answer")), shown])
    return gallery, table, audio
