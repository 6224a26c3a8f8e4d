"""Config loading, overrides, validation errors, and the CLI's handling of them."""

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from mmgrpo.cli import main
from mmgrpo.config import ConfigError, TrainConfig, apply_override, field_docs, from_dict
from mmgrpo.loader import load_config

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = sorted(p for p in (ROOT / "configs").glob("*.yaml"))


@pytest.mark.parametrize("path", CONFIGS, ids=[p.name for p in CONFIGS])
def test_every_shipped_config_loads_and_validates(path):
    cfg = load_config(path)
    assert isinstance(cfg, TrainConfig)
    assert cfg.rewards


def test_overrides_set_nested_values_with_yaml_types():
    cfg = load_config(
        ROOT / "configs/quickstart.yaml",
        [
            "algorithm.beta=0.04",
            "steps=3",
            "output_dir=/tmp/x",
            "algorithm.surrogate_args.dual_clip=3",
            "logging.trackers=[]",
        ],
    )
    assert cfg.algorithm.beta == 0.04 and cfg.steps == 3 and cfg.output_dir == "/tmp/x"
    assert cfg.algorithm.surrogate_args["dual_clip"] == 3 and cfg.logging.trackers == []


def test_apply_override_rejects_malformed():
    with pytest.raises(ConfigError, match=r"key.sub=value"):
        apply_override({}, "algorithm.beta")
    with pytest.raises(ConfigError, match="steps is not a section"):
        apply_override({"steps": 3}, "steps.x=1")


@pytest.mark.parametrize(
    "override, message",
    [
        ("algorithm.estimater=grpo", "unknown field 'algorithm.estimater'; allowed: group_size"),
        ("algorithm.estimator=ppo", "algorithm.estimator: 'ppo' is not allowed; choose one of: dr_grpo, grpo, rloo"),
        ("algorithm.group_size=one", "algorithm.group_size: expected an integer, got 'one'"),
        ("algorithm.group_size=1", "algorithm.group_size: group-relative advantages need at least 2"),
        ("algorithm.scale=std", "algorithm.scale: 'std' is not allowed; choose one of: auto, group, batch, none"),
        ("algorithm.surrogate_args.dual_clip=0.5", "algorithm.surrogate_args.dual_clip: must be > 1"),
        ("algorithm.ratio_level=chunk", "algorithm.chunk_sizes: ratio_level=chunk needs chunk sizes"),
        ("optim.lr=-1", "optim.lr: must be > 0"),
        ("model.adapter=nope", "model.adapter: 'nope' is not allowed; choose one of:"),
        ("rewards=[]", "rewards: list at least one reward"),
    ],
)
def test_malformed_config_names_the_field(override, message):
    with pytest.raises(ConfigError) as err:
        load_config(ROOT / "configs/quickstart.yaml", [override])
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_missing_file_and_bad_yaml(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("steps: [1, 2\n")
    with pytest.raises(ConfigError, match="is not valid YAML"):
        load_config(bad)


def test_every_config_field_has_a_docstring():
    import dataclasses

    from mmgrpo import config as c

    for cls in [obj for obj in vars(c).values() if dataclasses.is_dataclass(obj)]:
        docs = field_docs(cls)
        missing = [f.name for f in dataclasses.fields(cls) if f.name not in docs]
        assert not missing, f"{cls.__name__} fields without a docstring: {missing}"


def test_cli_dry_run_prints_resolved_config(capsys):
    assert main(["train", str(ROOT / "configs/quickstart.yaml"), "steps=7", "--dry-run", "--print-config"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[-1].startswith("# mmgrpo: dry run OK: checked")  # the summary, as a YAML comment
    printed = yaml.safe_load(out)
    assert printed["steps"] == 7 and printed["model"]["adapter"] == "vlm"


def test_cli_config_error_is_one_line_without_traceback(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "mmgrpo", "train", str(ROOT / "configs/quickstart.yaml"), "algorithm.surrogate=ppo"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert lines == [lines[0]] and lines[0].startswith("mmgrpo: config error: algorithm.surrogate: 'ppo'")
    assert "Traceback" not in proc.stderr


def test_cli_adapter_args_error_is_reported(tmp_path, capsys):
    code = main(
        [
            "train",
            str(ROOT / "configs/quickstart.yaml"),
            "model.args.max_new_tokenz=3",
            f"output_dir={tmp_path}",
            "logging.trackers=[]",
        ]
    )
    assert code == 2
    assert "unknown field 'model.args.max_new_tokenz'" in capsys.readouterr().err


def test_a_range_on_a_list_bounds_its_length_and_literal_items_are_checked():
    from mmgrpo.tasks.video_motion import VideoMotionArgs

    with pytest.raises(ConfigError, match=r"^task\.args\.questions: the number of items must be >= 1, got \[\]$"):
        from_dict(VideoMotionArgs, {"questions": []}, "task.args")
    with pytest.raises(ConfigError, match=r"^task\.args\.directions\[1\]: 'north' is not allowed; choose one of: left"):
        from_dict(VideoMotionArgs, {"directions": ["up", "north"]}, "task.args")
    assert from_dict(VideoMotionArgs, {"questions": ["when"]}, "task.args").questions == ["when"]
