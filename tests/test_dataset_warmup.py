"""Warm-up from one's own data: ``warmup.target_column`` trains the tiny VLM on a dataset's answer column, so it
gets past the answer format before GRPO (held-out format reward 0 before the warm-up, 1 after)."""

import json
from pathlib import Path

import pytest
from PIL import Image

from mmgrpo.config import ConfigError
from mmgrpo.loader import load_config

ROOT = Path(__file__).resolve().parents[1]

COLOURS = {"red": (220, 40, 40), "green": (40, 180, 60), "blue": (50, 80, 230), "yellow": (235, 215, 40)}


def _colour_data(tmp_path: Path) -> Path:
    rows = []
    for i in range(32):
        name = list(COLOURS)[i % 4]
        Image.new("RGB", (28, 28), COLOURS[name]).save(tmp_path / f"{i}.png")
        rows.append({"prompt": "What colour is the image?", "image": f"{i}.png", "answer": name})
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return data


def test_a_dataset_warmup_teaches_the_answer_format(tmp_path, tiny_vlm_path):
    from mmgrpo.trainer import train

    data = _colour_data(tmp_path)
    cfg = load_config(
        None,
        [
            f"output_dir={tmp_path / 'run'}",
            "steps=1",
            "model.adapter=vlm",
            f"model.args.name_or_path={tiny_vlm_path}",
            "model.args.max_new_tokens=8",
            "task.name=dataset",
            f"task.args.train={data}",
            "task.args.eval_fraction=0.25",
            "rewards=[{name: format, kwargs: {think: false}}, {name: accuracy}]",
            "warmup.steps=40",
            "warmup.lr=3e-3",
            "warmup.batch_size=8",
            "warmup.target_column=answer",
            "warmup.target_template='<answer>{target}</answer>'",
            "eval.after=false",
            "algorithm.group_size=2",
            "algorithm.prompts_per_step=2",
            "logging.trackers=[]",
            "logging.progress=false",
            "logging.plot=false",
            "checkpoint.save_final=false",
        ],
    )
    summary = train(cfg)
    assert summary["eval/before/reward/format"] == 0.0  # the untrained tiny model never writes <answer>…</answer>
    assert summary["eval/warmup/reward/format"] >= 0.75  # measured 1.0 (8 held-out rows, seed 0)


def test_warmup_trainable_moves_only_the_named_parameters(mmgrpo_cache):
    """``warmup.trainable: [vision_model, connector]`` (LLaVA's first stage): a warm-up step moves the SmolVLM's
    vision tower and connector, leaves the language model bit-equal, and afterwards every parameter trains again with
    no gradient left over; a name that matches nothing is one ConfigError listing what names contain."""
    import torch
    from accelerate import Accelerator

    from mmgrpo import warmup
    from tests.adapter_cases import CASES, build

    adapter = build("vlm_idefics3", lora=False)
    rows = [dict(r, target="<answer>red</answer>") for r in CASES["vlm_idefics3"].rows()]
    cfg = load_config(
        ROOT / "configs/quickstart.yaml",
        ["warmup.batch_size=2", "warmup.steps=2", "warmup.trainable=[vision_model, connector]"],
    )
    before = {n: p.detach().clone() for n, p in adapter.model.named_parameters()}
    warmup.supervised_warmup(cfg, Accelerator(cpu=True), adapter, rows)
    moved = {n for n, p in adapter.model.named_parameters() if not torch.equal(p, before[n])}
    assert moved and all("vision_model" in n or "connector" in n for n in moved), sorted(moved)
    assert any("connector" in n for n in moved) and any("vision_model" in n for n in moved)
    assert all(p.requires_grad and p.grad is None for p in adapter.model.parameters())
    bad = load_config(ROOT / "configs/quickstart.yaml", ["warmup.steps=1", "warmup.trainable=[visual]"])
    with pytest.raises(ConfigError, match=r"warmup\.trainable: \['visual'\] match no trainable parameter name.*"):
        warmup.supervised_warmup(bad, Accelerator(cpu=True), adapter, rows)
    assert all(p.requires_grad for p in adapter.model.parameters())


def test_a_checkpoint_after_the_warmup_resumes_past_it_and_starts_other_runs(tmp_path, tiny_vlm_path):
    """``checkpoint.after_warmup``: step 0 is saved after the warm-up's evaluation; ``resume`` from it does not warm
    up again (its first GRPO step equals the uninterrupted run's), and its ``model/`` as ``name_or_path`` with
    ``warmup.steps: 0`` is the warmed-up policy (its eval before equals the first run's eval after the warm-up)."""
    from mmgrpo.trainer import train

    data = _colour_data(tmp_path)
    base = [
        "steps=1", "model.adapter=vlm", f"model.args.name_or_path={tiny_vlm_path}", "model.args.max_new_tokens=8",
        "task.name=dataset", f"task.args.train={data}", "task.args.eval_fraction=0.25",
        "rewards=[{name: format, kwargs: {think: false}}, {name: accuracy}]", "warmup.lr=3e-3",
        "warmup.batch_size=8", "warmup.target_column=answer", "warmup.target_template='<answer>{target}</answer>'",
        "eval.after=false", "algorithm.group_size=2", "algorithm.prompts_per_step=2", "logging.trackers=[]",
        "logging.progress=false", "logging.plot=false", "checkpoint.save_final=false",
    ]  # fmt: skip
    first = train(
        load_config(None, [*base, f"output_dir={tmp_path / 'a'}", "warmup.steps=40", "checkpoint.after_warmup=true"])
    )
    step0 = tmp_path / "a" / "checkpoints" / "step-000000"
    assert (step0 / "COMPLETE").read_text().split() == ["0", "manifest"] and (step0 / "model" / "config.json").is_file()
    assert json.loads((step0 / "state" / "trainer.json").read_text())["trainer"]["warmup_done"] is True

    (step1,) = [
        m
        for m in map(json.loads, (tmp_path / "a" / "metrics.jsonl").read_text().splitlines())
        if m.get("step") == 1 and "reward/mean" in m
    ]
    step1 = {k: v for k, v in step1.items() if k.startswith(("reward/", "loss"))}
    assert step1["reward/std"] > 0  # a step that learns: its loss depends on the weights
    train(
        load_config(None, [*base, f"output_dir={tmp_path / 'a'}", "warmup.steps=40", "checkpoint.after_warmup=true",
                           f"resume={step0}"])
    )  # fmt: skip
    lines = [json.loads(line) for line in (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()]
    assert sum("eval/warmup/reward/format" in m for m in lines) == 1  # no second warm-up
    (again,) = [m for m in lines if m.get("step") == 1 and "reward/mean" in m]  # the resumed run's step 1
    assert {k: again[k] for k in step1 if k.startswith(("reward/", "loss"))} == step1
    assert first["eval/warmup/reward/format"] >= 0.75

    other = train(
        load_config(None, [*base, f"output_dir={tmp_path / 'b'}", f"model.args.name_or_path={step0 / 'model'}",
                           "warmup.steps=0"])
    )  # fmt: skip
    for key in ("reward/format", "reward/accuracy"):
        assert other[f"eval/before/{key}"] == first[f"eval/warmup/{key}"]
    with pytest.raises(ConfigError, match=r"^checkpoint\.after_warmup: true but warmup\.steps is 0"):
        load_config(None, [*base, f"output_dir={tmp_path / 'c'}", "warmup.steps=0", "checkpoint.after_warmup=true"])
