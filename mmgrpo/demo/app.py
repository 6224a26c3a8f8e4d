"""The Gradio app: a header, the model tab (:mod:`mmgrpo.demo.model_tab`) and the training tab
(:mod:`mmgrpo.demo.training_tab`), served by :func:`serve` with the demo's safe defaults."""

from __future__ import annotations

import tempfile
from pathlib import Path

from mmgrpo.demo.answer import _eval_rows
from mmgrpo.demo.model_tab import model_tab
from mmgrpo.demo.run import Models, find_checkpoint, load_run_config, untrusted_message
from mmgrpo.demo.training_tab import training_tab

MAX_FILE_SIZE = "20mb"


def build_app(run_dir: Path, models: Models, cfg=None):
    """The Gradio Blocks app for ``run_dir`` (models load on the first request)."""
    import gradio as gr

    run_dir = Path(run_dir)
    cfg = cfg if cfg is not None else models.cfg
    rows, rows_problem = _eval_rows(cfg, models.trust_run_config)
    notes = [rows_problem] if rows_problem else []
    if models.skipped_rewards:
        notes.append(untrusted_message(models.skipped_rewards))
    scratch = Path(tempfile.mkdtemp(prefix="mmgrpo-demo-"))
    ckpt_name = str(models.checkpoint) if models.checkpoint else "(none)"
    base_name = (
        str(models.base_checkpoint) if models.base_checkpoint else f"{cfg.model.args.get('name_or_path', 'base')}"
    )

    with gr.Blocks(title=f"mmgrpo demo — {run_dir.name}") as app:
        gr.Markdown(
            f"## mmgrpo demo: `{run_dir}`\nadapter **{cfg.model.adapter}**, task **{cfg.task.name}** — "
            f"base: `{base_name}` · trained: `{ckpt_name}`" + "".join(f"\n\n⚠ {n}" for n in notes)
        )
        model_tab(app, models, rows, cfg.algorithm.group_size, scratch)
        training_tab(app, run_dir)
    app.scratch_dir = scratch
    return app


def serve(
    run_dir: str,
    checkpoint: str | None = None,
    base: str | None = None,
    *,
    host: str = "127.0.0.1",
    port: int | None = None,
    share: bool = False,
    block: bool = True,
    trust_run_config: bool = False,
):
    """Check the run directory, load both models, and serve the app; returns the Blocks (non-blocking mode).

    ``trust_run_config=False`` (``mmgrpo demo`` without ``--trust-run-config``): no code the run's config names is
    imported (see the module docstring)."""
    run_dir_p = Path(run_dir)
    cfg = load_run_config(run_dir_p, trust_run_config)
    trained = find_checkpoint(run_dir_p, checkpoint)
    base_ckpt = find_checkpoint(run_dir_p, base) if base else None
    models = Models(cfg, trained, base_ckpt, trust_run_config)
    models.get()  # load now: a broken checkpoint is reported before the page opens
    app = build_app(run_dir_p, models)
    app.queue(default_concurrency_limit=1)
    app.launch(
        server_name=host,
        server_port=port,
        share=share,
        max_file_size=MAX_FILE_SIZE,
        prevent_thread_lock=True,  # blocked below, after our own lines
        allowed_paths=[str(run_dir_p / "samples"), str(app.scratch_dir)],
        show_error=True,
        inbrowser=False,
        quiet=True,  # Gradio's own hint says `share=True` in `launch()`; the flag here is --share
    )
    print(f"* Running on local URL:  {app.local_url}", flush=True)
    if not share:
        print("* To create a public link, run `mmgrpo demo` with --share.", flush=True)
    if block:
        app.block_thread()
    return app
