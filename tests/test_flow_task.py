"""The flow_shapes task, its reward and quality proxy, the pre-training script, and the t2i_prompts task."""

import json

import numpy as np
import pytest
import torch
from PIL import Image

from mmgrpo.modalities.flow.adapter import build_flow_adapter
from mmgrpo.plugins import TASKS
from mmgrpo.tasks import flow_shapes as ft
from mmgrpo.tasks.t2i_prompts import build_t2i_prompts


def test_reward_orders_renderings():
    c = ("red", "circle", "top left")
    prompt = ft.prompt_of(*c)
    canonical = ft.shape_match(ft.render(*c), prompt)
    jittered = ft.shape_match(ft.render(*c, radius=5.0, dx=2.0, dy=-2.0), prompt)
    assert canonical > 0.8 and 0.3 < jittered < canonical
    assert ft.shape_match(ft.render("blue", "circle", "top left"), prompt) < 0.05  # wrong colour
    assert ft.shape_match(ft.render("red", "circle", "bottom right"), prompt) < 0.05  # wrong place
    assert ft.shape_match(ft.render("red", "square", "top left"), prompt) < canonical  # wrong shape
    assert ft.shape_match(Image.new("RGB", (32, 32), ft.BACKGROUND), prompt) < 0.05  # empty canvas
    with pytest.raises(ValueError, match="flow_shapes prompt"):
        ft.shape_match(ft.render(*c), "a red cat")


def test_reward_is_registered():
    from mmgrpo.rewards import load_reward

    fn = load_reward("flow_shape_match")
    img = ft.render("green", "square", "top right")
    expected = ft.shape_match(img, "a green square top right")
    assert fn([img], prompts=["a green square top right"]) == [pytest.approx(expected)]


def test_quality_proxy_zero_on_clean_renderings_and_high_on_noise():
    clean = [ft.render("yellow", "circle", "bottom left", radius=6.0, dx=1.0, dy=-1.0)]
    assert ft.template_rmse(clean)[0] < 1e-6
    noise = Image.fromarray(np.random.default_rng(0).integers(0, 256, (32, 32, 3), dtype=np.uint8))
    assert ft.template_rmse([noise])[0] > 0.3


def test_splits_hold_out_prompts():
    task = TASKS.get("flow_shapes")({"train_repeats": 2, "eval_seeds": 3}, seed=0)
    train = {r["prompt"] for r in task.train_rows()}
    held = {r["prompt"] for r in task.eval_rows()}
    assert len(task.train_rows()) == 48 and len(train) == 24
    assert len(task.eval_rows()) == 24 and len(held) == 8 and not train & held
    colours = {ft.parse_prompt(p)[0] for p in held}
    positions = {ft.parse_prompt(p)[2] for p in held}
    assert colours == set(ft.COLOURS) and positions == set(ft.POSITIONS)
    rows = task.eval_rows()[:2]
    scores = task.score([ft.render(*ft.parse_prompt(r["prompt"])) for r in rows], rows)
    assert set(scores) == {"reward", "realism", "template_rmse"} and scores["reward"] > 0.8


def test_shipped_base_is_a_sensible_model():
    """The checkpoint made by examples/pretrain_tiny_flow.py draws the prompt most of the time, not perfectly."""
    task = TASKS.get("flow_shapes")({"eval_seeds": 2}, seed=0)
    ad = build_flow_adapter(
        {"name_or_path": "tiny-sd3-flow-shapes", "resolution": 32, "cfg": "none", "eval_num_steps": 16, "device": "cpu"}
    )
    scores = task.score(ad.evaluate(task.eval_rows()), task.eval_rows())
    assert 0.5 < scores["reward"] < 0.8 and scores["realism"] > 0.6


def test_pretrain_smoke(tmp_path):
    import runpy
    from pathlib import Path

    script = runpy.run_path(str(Path(__file__).parents[1] / "examples" / "pretrain_tiny_flow.py"))
    settings = script["PretrainSettings"](vae_steps=2, flow_steps=2, batch_size=4)
    out = script["pretrain"](tmp_path / "base", settings, log=lambda s: None)
    ad = build_flow_adapter(
        {"name_or_path": str(out), "resolution": 32, "cfg": "none", "eval_num_steps": 2, "device": "cpu"}
    )
    img = ad.evaluate([{"prompt": "a red circle top left"}])[0]
    assert img.size == (32, 32)
    vae = ad.pipe.vae.config
    assert vae.scaling_factor != 1.0 and vae.shift_factor != 0.0  # latent statistics were written


def test_t2i_prompts_task(tmp_path):
    train = tmp_path / "train.txt"
    train.write_text("a red circle top left\n\na blue square top right\na green circle bottom left\n")
    evalf = tmp_path / "eval.jsonl"
    evalf.write_text(json.dumps({"prompt": "a yellow square bottom right", "tag": 1}) + "\n")
    task = build_t2i_prompts(
        {"train_path": str(train), "eval_path": str(evalf), "eval_rewards": [{"name": "flow_shape_match"}]}
    )
    assert [r["prompt"] for r in task.train_rows()] == [
        "a red circle top left",
        "a blue square top right",
        "a green circle bottom left",
    ]
    assert task.eval_rows() == [{"prompt": "a yellow square bottom right", "tag": 1}]
    img = ft.render("yellow", "square", "bottom right")
    assert task.score([img], task.eval_rows())["flow_shape_match"] > 0.8
    held = build_t2i_prompts({"train_path": str(train), "eval_size": 1}, seed=0)
    assert len(held.train_rows()) == 2 and len(held.eval_rows()) == 1
    from mmgrpo.config import ConfigError

    with pytest.raises(ConfigError, match="does not exist"):
        build_t2i_prompts({"train_path": str(tmp_path / "missing.txt")})


def test_eval_seed_column_changes_noise():
    ad = build_flow_adapter(
        {"name_or_path": "tiny-sd3-flow-shapes", "resolution": 32, "cfg": "none", "eval_num_steps": 4, "device": "cpu"}
    )
    a = ad.evaluate([{"prompt": "a red circle top left", "seed": 1}])[0]
    b = ad.evaluate([{"prompt": "a red circle top left", "seed": 2}])[0]
    assert not torch.equal(torch.tensor(np.asarray(a)), torch.tensor(np.asarray(b)))
