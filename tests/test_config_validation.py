"""Bad values are caught at config load: one line naming the field, exit 2 from ``--dry-run``."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from mmgrpo.config import ConfigError
from mmgrpo.loader import load_config

ROOT = Path(__file__).resolve().parents[1]
QUICK = ROOT / "configs/quickstart.yaml"
FLOW = ROOT / "configs/flow_grpo.yaml"

BAD = [
    (QUICK, "model.args.temperature=0", "model.args.temperature: must be > 0"),
    (QUICK, "model.args.top_p=1.5", "model.args.top_p: must be > 0 and <= 1"),
    (QUICK, "model.args.old_logprobs=foo", "model.args.old_logprobs: 'foo' is not allowed"),
    (FLOW, "model.args.kernel=euler", "model.args.kernel: 'euler' is not allowed"),
    (QUICK, "algorithm.eps=-1", "algorithm.eps: must be >= 0"),
    (QUICK, "algorithm.beta=.nan", "algorithm.beta: is NaN"),
    (QUICK, "eval.every=-1", "eval.every: must be >= 0"),
    (QUICK, "checkpoint.every=-1", "checkpoint.every: must be >= 0"),
    (QUICK, "task.args.train_size=0", "task.args.train_size: must be >= 1"),
    (QUICK, "algorithm.ratio_norm=true", "algorithm.ratio_norm: true needs an adapter with ratio_norm_inputs()"),
    (
        QUICK,
        "algorithm.beta=0.1 algorithm.kl=gaussian_exact",
        "algorithm.kl: gaussian_exact needs an adapter with exact_kl()",
    ),
    (QUICK, "algorithm.shaping_args.lam=0.5", "unknown field 'algorithm.shaping_args.lam'"),
    (FLOW, "algorithm.shaping=temporal algorithm.shaping_args.weights=foo", "algorithm.shaping_args.weights: 'foo'"),
    (FLOW, "algorithm.shaping=value_anchored algorithm.shaping_args.lamda=1", "'algorithm.shaping_args.lamda'"),
    (QUICK, "logging.trackers=[nonsense]", "logging.trackers: 'nonsense' is not allowed"),
]


@pytest.mark.parametrize("path,overrides,message", BAD, ids=[b[1] for b in BAD])
def test_bad_value_is_a_one_line_config_error(path, overrides, message):
    with pytest.raises(ConfigError) as e:
        load_config(path, overrides.split())
    assert message in str(e.value)
    assert "\n" not in str(e.value)


def test_valid_values_still_load():
    cfg = load_config(
        FLOW,
        [
            "algorithm.shaping=temporal",
            "algorithm.shaping_args.weights=inv_dt",
            "algorithm.ratio_norm=true",
            "model.args.kernel=cps",
            "algorithm.eps=0",
        ],
    )
    assert cfg.algorithm.shaping_args == {"weights": "inv_dt"} and cfg.algorithm.ratio_norm
    assert load_config(QUICK, ["model.args.temperature=0.7"]).model.args["temperature"] == 0.7


def test_wandb_tracker_without_wandb_is_an_error(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    with pytest.raises(ConfigError, match=r"logging.trackers: 'wandb' is not installed; pip install wandb"):
        load_config(QUICK, ["logging.trackers=[wandb]"])


def test_dry_run_fails_with_one_line_and_exit_2():
    cmd = [sys.executable, "-m", "mmgrpo", "train", str(QUICK), "model.args.temperature=0", "--dry-run"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == ["mmgrpo: config error: model.args.temperature: must be > 0, got 0.0"]
