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

Safe by default: binds 127.0.0.1, no public share link unless ``--share``, uploads limited in size and type, a model
error is shown in the page and the app keeps serving. **A run directory from elsewhere is code**: its
``config.yaml`` can name rewards by import path (``module:function``) and set ``trust_remote_code``. Without
``--trust-run-config`` (``trust_run_config=False``) the demo imports none of that: rewards given by import path or
factory are not loaded (the page and the log say which; registry names and installed entry points load as
usual, :func:`mmgrpo.rewards.registry.reward_code_policy` ``"registered"``), and a config that sets
``trust_remote_code`` is refused with one line.
"""

from __future__ import annotations

import json
import logging
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
logger = logging.getLogger("mmgrpo.demo")


class DemoError(Exception):
    """A one-line, user-facing problem with the run directory or the options."""


# ----------------------------------------------------------------------------------------- run directory


def load_run_config(run_dir: Path, trust_run_config: bool = False):
    """The run's resolved config (``RUN_DIR/config.yaml``), or a one-line :class:`DemoError`.

    Loading checks the rewards without importing their code (:func:`mmgrpo.rewards.check_reward_spec`). Without
    ``trust_run_config`` a config that sets ``trust_remote_code`` anywhere under ``model.args`` is refused.
    """
    from mmgrpo.config import ConfigError, load_config

    path = Path(run_dir) / "config.yaml"
    if not path.is_file():
        raise DemoError(f"{run_dir}: no config.yaml — not an mmgrpo run directory (mmgrpo train writes one)")
    try:
        cfg = load_config(path)
    except ConfigError as e:
        raise DemoError(f"{path}: {e}") from None
    if not trust_run_config:
        for where in _remote_code_flags(cfg.model.args, "model.args"):
            raise DemoError(
                f"{path}: {where}: true would run code from the model's repository; a run directory from elsewhere "
                "is code: pass --trust-run-config if you trust this one"
            )
    return cfg


def _remote_code_flags(value: Any, where: str) -> list[str]:
    """Dotted paths of every truthy ``trust_remote_code`` in a nested mapping."""
    if isinstance(value, dict):
        out = []
        for k, v in value.items():
            if k == "trust_remote_code" and v:
                out.append(f"{where}.{k}")
            else:
                out += _remote_code_flags(v, f"{where}.{k}")
        return out
    if isinstance(value, (list, tuple)):
        return [w for i, v in enumerate(value) for w in _remote_code_flags(v, f"{where}[{i}]")]
    return []


def untrusted_rewards(cfg) -> list[str]:
    """The config's rewards that are code to import (``module:function``, factories): without
    ``--trust-run-config`` the demo does not load them."""
    from mmgrpo.rewards.registry import is_code_spec

    return [r.name for r in cfg.rewards if is_code_spec(r.name)]


def untrusted_message(names: list[str]) -> str:
    return (
        f"reward(s) {', '.join(repr(n) for n in names)} not loaded: the run's config.yaml names them as code to import "
        "(module:function); a run directory from elsewhere is code, so the demo runs it only with --trust-run-config"
    )


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
    trust_run_config: bool = False
    """Import the code the config names (rewards by import path). False: registered rewards only."""
    _built: dict = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def skipped_rewards(self) -> list[str]:
        """Rewards of the config not loaded because they are code and the run config is not trusted."""
        return [] if self.trust_run_config else untrusted_rewards(self.cfg)

    def policy(self):
        """The reward code policy everything built for the demo runs under."""
        from mmgrpo.rewards.registry import reward_code_policy

        return reward_code_policy("import" if self.trust_run_config else "registered")

    def get(self) -> tuple[Any, Any, Any]:
        with self._lock, self.policy():
            if not self._built:
                self._built = {
                    "base": build_policy(self.cfg, self.base_checkpoint),
                    "trained": build_policy(self.cfg, self.checkpoint),
                    "rewards": self._rewards(),
                }
            return self._built["base"], self._built["trained"], self._built["rewards"]

    def _rewards(self):
        """The run's RewardRunner over the rewards the demo may load, or ``None`` when there are none."""
        from mmgrpo.rewards import RewardRunner

        skipped = set(self.skipped_rewards)
        if skipped:
            logger.warning("mmgrpo demo: %s", untrusted_message(sorted(skipped)))
        kept = [r for r in self.cfg.rewards if r.name not in skipped]
        if not kept:
            return None
        rt = self.cfg.reward_runtime
        return RewardRunner(
            [(r.name, r.weight, r.kwargs) for r in kept],
            timeout_s=rt.timeout_s,
            on_error="nan",
            max_workers=rt.workers,
            reward_types=[r.reward_types for r in kept],
            isolation=rt.isolation,
        )


# ------------------------------------------------------------------------------------------- answering


def _eval_rows(cfg, trust_run_config: bool = False) -> tuple[list[dict], str | None]:
    """Held-out rows of the run's task (at most 50), or ``([], reason)`` when the task cannot be built here.

    The task is built under the demo's reward code policy: its eval rewards given by import path are not imported
    unless ``trust_run_config``."""
    from mmgrpo.plugins import TASKS, load_builtins
    from mmgrpo.rewards.registry import reward_code_policy

    load_builtins()
    try:
        with reward_code_policy("import" if trust_run_config else "registered"):
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

    if rewards is None:
        return ["reward n/a (no reward loaded: see the note at the top of the page)"] * len(outputs)
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
    rows, rows_problem = _eval_rows(cfg, models.trust_run_config)
    notes = [rows_problem] if rows_problem else []
    if models.skipped_rewards:
        notes.append(untrusted_message(models.skipped_rewards))
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
            f"base: `{base_name}` · trained: `{ckpt_name}`" + "".join(f"\n\n⚠ {n}" for n in notes)
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
                out = [row.get("prompt", ""), ground_truth_line(row, key)]
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

            def on_edit(label, prompt_text, *maybe_upload):
                """The ground-truth line once the question or the media is edited: the row's truth no longer
                applies (the rewards then get the prompt only)."""
                if not label:
                    return gr.update()
                row = rows[int(label.split(":", 1)[0])]
                uploaded = maybe_upload[0] if maybe_upload else None
                new_media = uploaded is not None and _digest(uploaded) != served.get(label)
                return ground_truth_line(row, key, edited=prompt_text != row.get("prompt") or new_media)

            edit_inputs = [example, prompt] + ([upload] if upload is not None else [])
            prompt.input(on_edit, edit_inputs, gt)
            if upload is not None:
                upload.upload(on_edit, edit_inputs, gt)

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
                    text_samples = samples_text(samples, r["rewards"][1:])
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


def ground_truth_line(row: dict, key: str | None, edited: bool = False) -> str:
    """The line under the prompt: the row's ground-truth columns, or, once the input is edited (a new upload or
    question), that they no longer apply."""
    if edited:
        return "ground truth: n/a — edited input (an upload or a new question); rewards that need it show n/a"
    truth = {k: v for k, v in row.items() if k not in ("prompt", key) and isinstance(v, (str, int, float))}
    return "ground truth: " + ", ".join(f"`{k}`={v}" for k, v in truth.items())


def samples_text(samples: list[dict], reward_lines: list[str]) -> str:
    """The sampled answers as text lines with their rewards. A media sample (image, video, audio) is shown in the
    gallery beside it, so its line names its number and kind, never the file's path on the server."""
    lines = []
    for i, (s, line) in enumerate(zip(samples, reward_lines), 1):
        shown = s["text"] if "text" in s else f"sample {i} ({s.get('kind', 'file')})"
        lines.append(f"{shown}   [{line}]")
    return "\n".join(lines)


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
        prevent_thread_lock=not block,
        allowed_paths=[str(run_dir_p / "samples"), str(app.scratch_dir)],
        show_error=True,
        inbrowser=False,
    )
    return app
