"""Every shipped config passes ``mmgrpo train --dry-run`` (the load-time check, ``mmgrpo.preflight``), and every
config that runs here (tiny built-in models) then trains for a step without failing: whatever a short real run
could fail on for a data, reward, path or option reason, the dry-run has caught first.

The example datasets come from ``examples/make_example_datasets.py`` and the recipes' prompt files are written
(as a user would download them) into a working directory; the hub recipes cannot load their models offline, so
for them only the dry-run runs, which checks everything but the model's weights (their model-based rewards'
weights and their policies' names are found in a Hugging Face cache laid out as a download leaves it,
:func:`hub_cache`). A config naming a real model (docs/real_models.md) trains its step once
``scripts/setup_real_models.sh`` has converted that model.
"""

import importlib.util
import sys
from pathlib import Path

import pytest
import yaml

from mmgrpo.cli import main
from mmgrpo.loader import load_builtins
from mmgrpo.modalities import real_models
from mmgrpo.plugins import TASKS

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = sorted((ROOT / "configs").glob("*.yaml"))
SMALL_TASK = {"train_size": 16, "eval_size": 4, "warmup_size": 8}  # synthetic tasks: fewer rows to generate


def _raw(config: Path) -> dict:
    return yaml.safe_load(config.read_text())


def _hub_model(config: Path) -> bool:
    """A recipe whose model is a hub id (it cannot load offline)."""
    return "/" in str(_raw(config).get("model", {}).get("args", {}).get("name_or_path", ""))


def _prompt_files(config: Path) -> list[str]:
    args = _raw(config).get("task", {}).get("args", {})
    return [args[k] for k in ("train_path", "eval_path") if args.get(k)]


def _small(config: Path) -> list[str]:
    """Overrides that shrink a synthetic task's splits (``SMALL_TASK``), for the fields its options class has."""
    load_builtins()
    raw = _raw(config)
    task = raw.get("task", {})
    names = set(TASKS.get(task.get("name", "shapes")).args.__dataclass_fields__)  # TaskSpec.args: the options class
    return [f"task.args.{k}={v}" for k, v in SMALL_TASK.items() if k in names]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """A working directory holding examples/data (made by the example script) and the recipes' prompt files."""
    root = tmp_path_factory.mktemp("configs_cwd")
    spec = importlib.util.spec_from_file_location("make_example_datasets", ROOT / "examples/make_example_datasets.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("make_example_datasets", module)
    spec.loader.exec_module(module)
    module.main([str(root / "examples" / "data")])
    for config in CONFIGS:
        for name in _prompt_files(config):
            path = root / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("".join(f"a photo of {i} red squares on a blue background\n" for i in range(400)))
    return root


HUB_WEIGHTS = {  # the model-based rewards' default hub ids the recipes use, and a weights file of each
    "yuvalkirstain/PickScore_v1": "model.safetensors",
    "laion/CLIP-ViT-H-14-laion2B-s32B-b79K": "preprocessor_config.json",
    "timm/vit_large_patch14_clip_224.openai": "open_clip_model.safetensors",
    # the hub recipes' policies: the model name is checked at load too (modalities/model_names.py, issue 53)
    "deepseek-community/Janus-Pro-7B": "config.json",
    "black-forest-labs/FLUX.1-dev": "model_index.json",
    "stabilityai/stable-diffusion-3.5-medium": "model_index.json",
    "Qwen/Qwen2-Audio-7B-Instruct": "config.json",
    "openai/whisper-small": "config.json",
}


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    """An offline Hugging Face cache holding snapshots of :data:`HUB_WEIGHTS`, laid out as a download leaves it
    (``models--org--name/refs/main`` naming ``snapshots/<commit>/``); the files are empty, never loaded."""
    for repo, filename in HUB_WEIGHTS.items():
        folder, commit = tmp_path / "hf" / "hub" / f"models--{repo.replace('/', '--')}", "0" * 40
        (folder / "snapshots" / commit).mkdir(parents=True)
        (folder / "snapshots" / commit / filename).write_bytes(b"")
        (folder / "refs").mkdir()
        (folder / "refs" / "main").write_text(commit)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def test_every_config_is_covered():
    assert len(CONFIGS) >= 20 and any(_hub_model(c) for c in CONFIGS) and any(not _hub_model(c) for c in CONFIGS)
    shrunk = [c.stem for c in CONFIGS if _small(c)]  # every built-in synthetic task is made small here
    assert {"quickstart", "speech_qwen2audio_qa", "video_motion"} <= set(shrunk), shrunk


@pytest.mark.parametrize("config", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_shipped_config_passes_dry_run(config, workdir, monkeypatch, mmgrpo_cache, hub_cache, capsys):
    monkeypatch.chdir(workdir)
    rc = main(["train", str(config), "--dry-run", f"output_dir={workdir / 'runs' / config.stem}", *_small(config)])
    assert rc == 0, capsys.readouterr().err


@pytest.mark.parametrize("config", [c for c in CONFIGS if _prompt_files(c)], ids=lambda p: p.stem)
def test_recipe_without_its_prompt_file_fails_the_dry_run_in_one_line(config, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["train", str(config), "--dry-run"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "task.args.train_path" in err and _prompt_files(config)[0] in err


TREE_OF_TWO = ["rollout.tree.trees=1", "rollout.tree.rounds=1", "rollout.tree.nodes=1", "rollout.tree.branches=1"]
"""A tree rollout (rollout.tree) in a group of 2: one chain and one branch (Tree-GRPO: 1 × (1 + 1 × 1 × 1))."""


def _short(config: Path, out: Path) -> list[str]:
    raw = _raw(config)
    algo, warmup = raw.get("algorithm", {}), raw.get("warmup", {})
    fewer = algo.get("updates_per_epoch", 1) <= 2  # P=1, G=2 still has a sample per update
    return [
        f"output_dir={out}",
        "steps=1",
        *(["algorithm.prompts_per_step=1", "algorithm.group_size=2"] if fewer else []),
        *(TREE_OF_TWO if fewer and raw.get("rollout", {}).get("tree") else []),
        *(["warmup.steps=1", "warmup.batch_size=2"] if warmup.get("steps", 0) > 0 else []),
        "eval.before=false",
        "eval.max_rows=1",
        "eval.batch_size=1",
        "eval.every=0",
        "checkpoint.every=0",
        "checkpoint.save_final=false",
        "logging.trackers=[]",
        "logging.progress=false",
        "logging.plot=false",
    ]


LOCAL = [c for c in CONFIGS if not _hub_model(c)]


@pytest.mark.slow
@pytest.mark.parametrize("config", LOCAL, ids=[p.stem for p in LOCAL])
def test_local_config_trains_a_step_after_a_clean_dry_run(config, workdir, monkeypatch, mmgrpo_cache, capsys):
    name = _raw(config).get("model", {}).get("args", {}).get("name_or_path", "")
    if name in real_models.MODELS and not (real_models.root() / name / "complete.json").is_file():
        pytest.skip(f"the real model {name!r} is not set up (bash scripts/setup_real_models.sh)")
    monkeypatch.chdir(workdir)
    overrides = [*_small(config), *_short(config, workdir / "runs" / f"{config.stem}-short")]
    assert main(["train", str(config), *overrides, "--dry-run"]) == 0, capsys.readouterr().err
    capsys.readouterr()
    rc = main(["train", str(config), *overrides])
    assert rc == 0, f"{config.name}: the dry-run passed but a one-step run failed: {capsys.readouterr().err[-2000:]}"


def test_every_config_a_config_or_document_names_exists():
    import re

    texts = [*CONFIGS, *(ROOT / "docs").glob("*.md"), ROOT / "README.md"]
    named = {(p.name, m) for p in texts for m in re.findall(r"configs/[\w./-]+\.yaml", p.read_text())}
    missing = sorted((where, name) for where, name in named if not (ROOT / name).is_file())
    assert named and not missing, missing
