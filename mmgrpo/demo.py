"""``mmgrpo demo RUN_DIR``: a Gradio app that shows what training changed, base model vs trained model.

The run's resolved ``config.yaml`` names the adapter, task and rewards. Both models are built by the SAME adapter
builder from that config: the base with the config's ``model.args`` as given, the trained one with the config's
LoRA settings and then the checkpoint's weights (``<checkpoint>/state/model.safetensors``, every tensor of the
exact module the trainer optimised, :mod:`mmgrpo.checkpoint`; loaded strictly — so a full fine-tune and a LoRA adapter
load the same way,
for every family). ``--base CHECKPOINT`` compares against another checkpoint of the same run instead.

Nothing here knows a family by name. The page is built from the held-out rows and the outputs:

- one "ask"/"generate" tab for the run's modality: a row with an ``image``/``images``, ``video`` or ``audio``
  column gets an upload box of that kind and the tab is called after it; a prompt-only row gets a prompt box.
  Each model answers greedily (``adapter.evaluate``) and, on request, with G samples (``adapter.rollout``); what
  an answer is shown as is decided by its type (text, image, video frames, audio — :func:`mmgrpo.samples.kind_of`).
  Rewards are the run's own reward functions, with the row's ground-truth columns when the example is unchanged
  and the prompt alone when it was edited (a reward that needs the ground truth then shows "n/a").
- a "training" tab: the reward curve and eval metrics from ``metrics.jsonl`` and the samples the trainer wrote
  (``samples_<stage>.json`` and their media files).

Safe by default: binds 127.0.0.1, no public share link unless ``--share``, remote model code only if the run's
config set it (the config's ``model.args`` are used as written), uploads limited in size and type, a model error
is shown in the page and the app keeps serving.
"""

from __future__ import annotations

import json
import tempfile
import threading
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from mmgrpo import samples as sample_files

MEDIA_KEYS = {"image": "image", "images": "image", "video": "video", "audio": "audio"}
"""Row column → upload kind. A row with none of them is prompt-only (generation)."""
UPLOAD_SUFFIXES = {
    "image": {".png", ".jpg", ".jpeg", ".webp", ".bmp", ".gif"},
    "video": {".mp4", ".webm", ".mov", ".avi", ".mkv"},
    "audio": {".wav", ".flac", ".mp3", ".ogg", ".m4a"},
}
MAX_FILE_SIZE = "20mb"


class DemoError(Exception):
    """A one-line, user-facing problem with the run directory or the options."""


# ----------------------------------------------------------------------------------------- run directory


def load_run_config(run_dir: Path):
    """The run's resolved config (``RUN_DIR/config.yaml``), or a one-line :class:`DemoError`."""
    from mmgrpo.config import ConfigError, load_config

    path = Path(run_dir) / "config.yaml"
    if not path.is_file():
        raise DemoError(f"{run_dir}: no config.yaml — not an mmgrpo run directory (mmgrpo train writes one)")
    try:
        return load_config(path)
    except ConfigError as e:
        raise DemoError(f"{path}: {e}") from None


def _weights(directory: Path) -> Path | None:
    path = Path(directory) / "state" / "model.safetensors"  # the layout of mmgrpo.checkpoint.save
    return path if path.is_file() else None


def find_checkpoint(run_dir: Path, checkpoint: str | None = None) -> Path:
    """``--checkpoint`` if given, else ``checkpoints/final``, else the newest complete ``checkpoints/step-*``."""
    from mmgrpo import checkpoint as ckpt

    run_dir = Path(run_dir)
    if checkpoint is not None:
        path = Path(checkpoint)
        if not path.is_absolute() and not path.exists():
            path = run_dir / "checkpoints" / checkpoint  # a name such as final or step-000010
        if not (path / "COMPLETE").is_file() or _weights(path) is None:
            raise DemoError(
                f"--checkpoint {checkpoint}: not a complete mmgrpo checkpoint (COMPLETE and state/model.safetensors)"
            )
        if (why := ckpt.damage(path)) is not None:
            raise DemoError(f"--checkpoint {checkpoint}: the checkpoint is damaged ({why}); pick another one")
        return path
    final = run_dir / "checkpoints" / "final"
    if (final / "COMPLETE").is_file() and _weights(final) is not None and ckpt.damage(final) is None:
        return final
    steps = [p for p in ckpt.complete_checkpoints(run_dir) if _weights(p) is not None and ckpt.damage(p) is None]
    if steps:
        return steps[-1]
    raise DemoError(
        f"{run_dir}: no checkpoint to show (no checkpoints/final or complete checkpoints/step-*); train with "
        "checkpoint.save_final=true or checkpoint.every=N, or pass --checkpoint PATH"
    )


def build_policy(cfg, checkpoint: Path | None):
    """The adapter the run's config describes; with ``checkpoint``, carrying that checkpoint's weights."""
    from safetensors.torch import load_model

    from mmgrpo.plugins import ADAPTERS, load_builtins

    load_builtins()
    build = ADAPTERS.get(cfg.model.adapter)
    lora = cfg.model.lora if checkpoint is not None else None  # the base is the model as named, without LoRA
    adapter = build(cfg.model.args, seed=cfg.seed, lora=lora, dtype=cfg.model.dtype, need_reference=False)
    if checkpoint is not None:
        from safetensors import SafetensorError

        try:
            missing, unexpected = load_model(adapter.model, str(_weights(checkpoint)), strict=False)
        except SafetensorError as e:  # a truncated or corrupt file: one line, not the library's traceback
            raise DemoError(f"{_weights(checkpoint)}: unreadable ({str(e).splitlines()[0][:160]})") from None
        if missing or unexpected:
            raise DemoError(
                f"{checkpoint}: weights do not match the model the run's config builds "
                f"({len(missing)} missing, {len(unexpected)} unexpected, e.g. {(missing or unexpected)[0]})"
            )
    adapter.model.eval()
    return adapter


@dataclass
class Models:
    """Base and trained policies plus the run's reward functions, built on first use (one at a time)."""

    cfg: Any
    checkpoint: Path | None
    base_checkpoint: Path | None = None
    _built: dict = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def get(self) -> tuple[Any, Any, Any]:
        with self._lock:
            if not self._built:
                from mmgrpo.rewards import RewardRunner

                rt = self.cfg.reward_runtime
                rewards = RewardRunner(
                    [(r.name, r.weight, r.kwargs) for r in self.cfg.rewards],
                    timeout_s=rt.timeout_s,
                    on_error="nan",
                    max_workers=rt.workers,
                    reward_types=[r.reward_types for r in self.cfg.rewards],
                )
                self._built = {
                    "base": build_policy(self.cfg, self.base_checkpoint),
                    "trained": build_policy(self.cfg, self.checkpoint),
                    "rewards": rewards,
                }
            return self._built["base"], self._built["trained"], self._built["rewards"]


# ------------------------------------------------------------------------------------------- answering


def _eval_rows(cfg) -> tuple[list[dict], str | None]:
    """Held-out rows of the run's task (at most 50), or ``([], reason)`` when the task cannot be built here."""
    from mmgrpo.plugins import TASKS, load_builtins

    load_builtins()
    try:
        task = TASKS.get(cfg.task.name)(cfg.task.args, seed=cfg.seed)
        return list(task.eval_rows()[:50]), None
    except Exception as e:  # e.g. a dataset that is not on this machine: the prompt box still works
        return [], f"held-out examples unavailable ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"


def media_key(rows: list[dict]) -> str | None:
    """The row column holding the model's media input, or None for prompt-only rows."""
    for key in MEDIA_KEYS:
        if rows and rows[0].get(key) is not None:
            return key
    return None


def _check_upload(path: str | None, kind: str) -> None:
    if path is None:
        return
    suffix = Path(path).suffix.lower()
    if suffix not in UPLOAD_SUFFIXES[kind]:
        raise DemoError(f"upload {Path(path).name}: {kind} files must be one of {sorted(UPLOAD_SUFFIXES[kind])}")


def score(rewards, outputs: list, row: dict, with_ground_truth: bool) -> list[str]:
    """One line per output: the weighted reward and each reward function's value ("n/a" where it cannot apply)."""
    from mmgrpo.advantages import combine_rewards

    columns = {k: [v] * len(outputs) for k, v in row.items() if k != "prompt"} if with_ground_truth else {}
    try:
        scores, _ = rewards(outputs, [row["prompt"]] * len(outputs), columns)  # [n, K]
    except Exception as e:
        return [f"reward n/a ({type(e).__name__})"] * len(outputs)
    total = combine_rewards(scores.view(1, len(outputs), -1), rewards.weights)[0]  # [n]
    lines = []
    for t, per in zip(total.tolist(), scores.tolist()):
        parts = ", ".join(f"{n}={'n/a' if v != v else f'{v:.3f}'}" for n, v in zip(rewards.names, per))
        lines.append(f"reward {'n/a' if t != t else f'{t:.3f}'} ({parts})")
    return lines


def answer(models: Models, row: dict, seed: int, group: int, with_ground_truth: bool, out_dir: Path) -> dict:
    """Greedy (and G sampled) outputs of base and trained for one row, as display values, with rewards."""
    base, trained, rewards = models.get()
    result = {}
    for name, adapter in (("base", base), ("trained", trained)):
        torch.manual_seed(seed)
        greedy = adapter.evaluate([row])[0]
        sampled = []
        if group > 0:
            torch.manual_seed(seed)
            sampled = list(adapter.rollout([row], group).outputs)
        lines = score(rewards, [greedy] + sampled, row, with_ground_truth)
        shown = [
            sample_files.save_value(_for_display(o), out_dir, f"{name}_{i}") for i, o in enumerate([greedy] + sampled)
        ]
        result[name] = {"greedy": shown[0], "samples": shown[1:], "rewards": lines}
    return result


# ------------------------------------------------------------------------------------------- training tab


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
            if rec["output_kind"] in ("image", "video"):
                gallery.append((rec["output"], caption))
            elif rec.get("input_kind") in ("image", "video"):
                gallery.append((rec["input"], caption))
            if rec["output_kind"] == "audio":
                audio.append(rec["output"])
            elif rec.get("input_kind") == "audio":
                audio.append(rec["input"])
            table.append(
                [
                    stage,
                    rec["prompt"],
                    str(rec.get("answer")),
                    rec["output"] if rec["output_kind"] == "text" else rec["output_kind"],
                ]
            )
    return gallery, table, audio


# ------------------------------------------------------------------------------------------------- app


def build_app(run_dir: Path, models: Models, cfg=None):
    """The Gradio Blocks app for ``run_dir`` (models load on the first request)."""
    import gradio as gr

    run_dir = Path(run_dir)
    cfg = cfg if cfg is not None else models.cfg
    rows, rows_problem = _eval_rows(cfg)
    key = media_key(rows)
    kind = MEDIA_KEYS.get(key) if key else None
    scratch = Path(tempfile.mkdtemp(prefix="mmgrpo-demo-"))
    group = cfg.algorithm.group_size
    ckpt_name = str(models.checkpoint) if models.checkpoint else "(none)"
    base_name = (
        str(models.base_checkpoint) if models.base_checkpoint else f"{cfg.model.args.get('name_or_path', 'base')}"
    )

    with gr.Blocks(title=f"mmgrpo demo — {run_dir.name}") as app:
        gr.Markdown(
            f"## mmgrpo demo: `{run_dir}`\nadapter **{cfg.model.adapter}**, task **{cfg.task.name}** — "
            f"base: `{base_name}` · trained: `{ckpt_name}`" + (f"\n\n⚠ {rows_problem}" if rows_problem else "")
        )
        with gr.Tab(f"ask ({kind})" if kind else "generate", elem_id="tab-model"):
            labels = [f"{i}: {str(r.get('prompt'))[:70]}" for i, r in enumerate(rows)]
            example = gr.Dropdown(
                choices=labels, value=labels[0] if labels else None, label="held-out example", elem_id="example"
            )
            with gr.Row():
                upload = None
                if kind == "image":
                    upload = gr.Image(
                        type="filepath", sources=["upload"], label="image (upload to replace)", height=224
                    )
                elif kind == "video":
                    upload = gr.Video(sources=["upload"], label="video clip (upload to replace)", height=224)
                elif kind == "audio":
                    upload = gr.Audio(type="filepath", sources=["upload"], label="audio (upload to replace)")
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
                for side in ("base", "trained"):
                    with gr.Column():
                        gr.Markdown(f"### {side}")
                        sides[side] = dict(
                            text=gr.Textbox(
                                label=f"{side} answer (greedy)", elem_id=f"{side}-text", lines=2, max_lines=6
                            ),
                            image=gr.Image(
                                label=f"{side} image (small outputs shown enlarged)",
                                elem_id=f"{side}-image",
                                visible=False,
                                height=224,
                            ),
                            video=gr.Video(label=f"{side} video", elem_id=f"{side}-video", visible=False),
                            audio=gr.Audio(label=f"{side} audio", elem_id=f"{side}-audio", visible=False),
                            reward=gr.Markdown(elem_id=f"{side}-reward"),
                            samples_text=gr.Textbox(
                                label=f"{side} samples", lines=4, visible=False, elem_id=f"{side}-samples"
                            ),
                            gallery=gr.Gallery(label=f"{side} samples", visible=False, columns=4, height=200),
                        )

            served: dict[str, str] = {}  # example label -> digest of the file shown for it

            def pick(label):
                if not label:
                    return (gr.update(),) * (3 if upload is not None else 2)
                row = rows[int(label.split(":", 1)[0])]
                truth = {k: v for k, v in row.items() if k not in ("prompt", key) and isinstance(v, (str, int, float))}
                out = [row.get("prompt", ""), "ground truth: " + ", ".join(f"`{k}`={v}" for k, v in truth.items())]
                if upload is not None:
                    value = row[key][0] if isinstance(row[key], (list, tuple)) else row[key]
                    if kind == "image" and not isinstance(value, (str, Path)):
                        value = sample_files.save_value(value, scratch, f"example_{label.split(':')[0]}")["file"]
                    served[label] = _digest(value)
                    out.append(str(value))
                return tuple(out)

            pick_outputs = [prompt, gt] + ([upload] if upload is not None else [])
            example.change(pick, example, pick_outputs)
            app.load(pick, example, pick_outputs)

            flat = [c for side in ("base", "trained") for c in sides[side].values()]

            def run(label, prompt_text, seed_value, g, *maybe_upload):
                uploaded = maybe_upload[0] if maybe_upload else None
                try:
                    row = dict(rows[int(label.split(":", 1)[0])]) if label else {}
                    original = dict(row)
                    row["prompt"] = prompt_text or row.get("prompt", "")
                    media_changed = False
                    if upload is not None and uploaded is not None:
                        _check_upload(uploaded, kind)
                        if _digest(uploaded) != served.get(label):  # not the picked example's own file
                            row[key] = uploaded if kind != "image" else _pil(uploaded)
                            media_changed = True
                    elif upload is not None and row.get(key) is None:
                        raise DemoError(f"upload a {kind} file or pick an example")
                    if kind == "image" and isinstance(row.get(key), (str, Path)):
                        row[key] = _pil(row[key])
                    unchanged = bool(original) and row["prompt"] == original.get("prompt") and not media_changed
                    if kind is None:
                        row["seed"] = int(seed_value)  # generation: the same initial noise for both models
                    out_dir = Path(tempfile.mkdtemp(dir=scratch))
                    res = answer(models, row, int(seed_value), int(g), unchanged, out_dir)
                except Exception as e:  # shown in the page; the app keeps serving
                    traceback.print_exc()
                    msg = str(e).splitlines()[0] if str(e) else ""
                    return [f"**error:** {type(e).__name__}: {msg}"] + [gr.update() for _ in flat]
                updates = []
                for side in ("base", "trained"):
                    r = res[side]
                    g_kind = r["greedy"]["kind"]
                    value = r["greedy"].get("text", r["greedy"].get("file"))
                    samples = r["samples"]
                    media_samples = [s["file"] for s in samples if "file" in s and s["kind"] in ("image", "video")]
                    text_samples = "\n".join(
                        f"{s.get('text', s.get('file'))}   [{line}]" for s, line in zip(samples, r["rewards"][1:])
                    )
                    updates += [
                        gr.update(value=value if g_kind == "text" else "", visible=g_kind == "text"),
                        gr.update(value=value if g_kind == "image" else None, visible=g_kind == "image"),
                        gr.update(value=value if g_kind == "video" else None, visible=g_kind == "video"),
                        gr.update(value=value if g_kind == "audio" else None, visible=g_kind == "audio"),
                        f"**{side}** greedy: {r['rewards'][0]}"
                        + ("" if unchanged else " — edited input: ground-truth rewards do not apply"),
                        gr.update(value=text_samples, visible=bool(samples)),
                        gr.update(value=media_samples, visible=bool(media_samples)),
                    ]
                return ["done: same seed for both models"] + updates

            inputs = [example, prompt, seed, n_samples] + ([upload] if upload is not None else [])
            run_btn.click(run, inputs, [status] + flat)

        with gr.Tab("training", elem_id="tab-training"):
            refresh = gr.Button("Refresh from the run directory", elem_id="refresh")
            plot = gr.Plot(label="reward curve")
            table = gr.Dataframe(
                headers=["step", "stage", "metric", "value"], label="eval metrics", elem_id="eval-table"
            )
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
    app.scratch_dir = scratch
    return app


def _for_display(output):
    """Small generated images enlarged by an integer factor (nearest neighbour: the pixels are the model's)."""
    from PIL import Image

    if isinstance(output, Image.Image) and max(output.size) < 256:
        k = 256 // max(output.size)
        return output.resize((output.width * k, output.height * k), Image.NEAREST)
    return output


def _digest(path) -> str:
    import hashlib

    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _pil(path):
    from PIL import Image

    return Image.open(path).convert("RGB")


def serve(
    run_dir: str,
    checkpoint: str | None = None,
    base: str | None = None,
    *,
    host: str = "127.0.0.1",
    port: int | None = None,
    share: bool = False,
    block: bool = True,
):
    """Check the run directory, load both models, and serve the app; returns the Blocks (non-blocking mode)."""
    run_dir_p = Path(run_dir)
    cfg = load_run_config(run_dir_p)
    trained = find_checkpoint(run_dir_p, checkpoint)
    base_ckpt = find_checkpoint(run_dir_p, base) if base else None
    models = Models(cfg, trained, base_ckpt)
    models.get()  # load now: a broken checkpoint is reported before the page opens
    app = build_app(run_dir_p, models)
    app.queue(default_concurrency_limit=1)
    app.launch(
        server_name=host,
        server_port=port,
        share=share,
        max_file_size=MAX_FILE_SIZE,
        prevent_thread_lock=not block,
        allowed_paths=[str(run_dir_p / "samples"), str(app.scratch_dir)],
        show_error=True,
        inbrowser=False,
    )
    return app
