"""The demo page's logic without a browser: no server paths in sample lists, the ground-truth line after edits."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from PIL import Image

gr = pytest.importorskip("gradio", reason="the demo needs the demo extra: pip install -e '.[demo]'")

from mmgrpo.demo import Models, build_app, ground_truth_line, samples_text  # noqa: E402
from mmgrpo.loader import load_config  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def _handler(app, name: str):
    fns = [f.fn for f in app.fns.values() if getattr(f.fn, "__name__", "") == name]
    assert fns, name
    return fns[0]


class _Generator:
    """A policy stand-in that returns fixed images (the page logic under test never looks inside a model)."""

    def evaluate(self, rows):
        return [Image.new("RGB", (8, 8), "red") for _ in rows]

    def rollout(self, rows, group):
        return SimpleNamespace(outputs=[Image.new("RGB", (8, 8), "blue") for _ in range(group)])


class _FixedModels(Models):
    def get(self):
        return _Generator(), _Generator(), None


def test_flow_sample_list_shows_no_server_paths(tmp_path):
    cfg = load_config(ROOT / "configs/flow_grpo.yaml")
    app = build_app(tmp_path, _FixedModels(cfg, None), cfg)
    status, *updates = _handler(app, "run")("0: a red circle top right", "a red circle top right", 0, 2)
    assert status.startswith("done"), status
    base_samples, base_gallery = updates[5], updates[6]  # per side: text, image, video, audio, reward, samples, gallery
    assert base_samples["visible"] and base_samples["value"].splitlines()[0].startswith("sample 1 (image)   [reward")
    assert str(app.scratch_dir) not in base_samples["value"] and ".png" not in base_samples["value"]
    assert len(base_gallery["value"]) == 2  # the images themselves are in the gallery
    saved = [{"kind": "image", "file": "/tmp/mmgrpo-demo-x/base_1.png"}, {"kind": "text", "text": "a cat"}]
    assert samples_text(saved, ["reward 1.000", "reward 0.000"]) == (
        "sample 1 (image)   [reward 1.000]\na cat   [reward 0.000]"
    )


def test_ground_truth_line_is_cleared_after_an_upload_or_an_edit(tmp_path):
    cfg = load_config(ROOT / "configs/quickstart.yaml")
    app = build_app(tmp_path, Models(cfg, None), cfg)
    pick, on_edit = _handler(app, "pick"), _handler(app, "on_edit")
    label = next(b for b in app.blocks.values() if getattr(b, "elem_id", None) == "example").value
    prompt, truth, served_file = pick(label)
    assert truth.startswith("ground truth: `answer`=")
    assert on_edit(label, prompt, served_file) == truth  # the example's own image: the truth still applies
    upload = tmp_path / "mine.png"
    Image.new("RGB", (56, 56), "green").save(upload)
    edited = on_edit(label, prompt, str(upload))
    assert "n/a" in edited and "`answer`=" not in edited
    assert "n/a" in on_edit(label, prompt + " really?", served_file)
    row = {"prompt": "q", "answer": "red", "image": "x.png"}
    assert ground_truth_line(row, "image") == "ground truth: `answer`=red"
    assert ground_truth_line(row, "image", edited=True).startswith("ground truth: n/a")
    events = {(d.trigger, getattr(b, "elem_id", None)) for b, d in _triggers(app, on_edit)}
    assert ("upload", None) in events and ("input", "prompt") in events


def _triggers(app, fn):
    """(block, dependency) pairs of the events that call ``fn``."""
    out = []
    for dep in app.fns.values():
        if dep.fn is fn:
            for block_id, trigger in dep.targets:
                out.append((app.blocks[block_id], type("D", (), {"trigger": trigger})))
    return out
