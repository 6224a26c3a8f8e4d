"""Colocate mode (``rollout.engine: vllm``, ``rollout.vllm_mode: colocate``): vLLM inside the training process.

The config checks run here; the colocated engine runs only in ``.venv-colocate`` (``bash scripts/setup_colocate.sh``
after ``scripts/setup_vllm.sh``: vLLM pins its own torch), so those tests start the trainer, or
``tests/colocate_worker.py``, under ``.venv-colocate/bin/python`` as a subprocess and skip without it."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.numerics import model_reductions

ROOT = Path(__file__).resolve().parents[1]
COLOCATE_PYTHON = Path(os.environ.get("MMGRPO_COLOCATE_PYTHON", ROOT / ".venv-colocate/bin/python"))

needs_colocate = pytest.mark.skipif(
    not COLOCATE_PYTHON.is_file(),
    reason="no .venv-colocate: run `bash scripts/setup_vllm.sh && bash scripts/setup_colocate.sh` (CI does) for the "
    "colocated-engine tests",
)


# ---------------------------------------------------------------------------------------------- config


def test_colocate_outside_its_environment_is_one_line_before_any_model_loads(tmp_path):
    """``--dry-run`` (the trainer's first check) in an environment without vllm: one line naming the script that
    builds the colocate environment and the command to run there; no model loaded, no run directory."""
    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vllm is importable in this environment: the check has nothing to refuse")
    out = subprocess.run(
        [sys.executable, "-m", "mmgrpo", "train", "configs/quickstart.yaml", f"output_dir={tmp_path / 'run'}",
         "rollout.engine=vllm", "rollout.vllm_mode=colocate", "--dry-run"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 2, out.stderr
    lines = [line for line in out.stderr.splitlines() if line.startswith("mmgrpo:")]
    assert len(lines) == 1, out.stderr
    assert "scripts/setup_colocate.sh" in lines[0] and ".venv-colocate/bin/mmgrpo" in lines[0], lines[0]
    assert "Loading weights" not in out.stderr and not (tmp_path / "run").exists()


def test_colocate_needs_the_vllm_engine_and_a_memory_fraction_in_range():
    from mmgrpo.config import ConfigError
    from mmgrpo.loader import load_config

    cfg = load_config(ROOT / "configs/quickstart.yaml", ["rollout.engine=vllm", "rollout.vllm_mode=colocate"])
    assert cfg.rollout.vllm_mode == "colocate" and cfg.rollout.vllm_gpu_memory_utilization is None
    with pytest.raises(ConfigError, match=r"rollout\.vllm_mode: colocate .* needs rollout\.engine: vllm"):
        load_config(ROOT / "configs/quickstart.yaml", ["rollout.vllm_mode=colocate"])
    with pytest.raises(ConfigError, match=r"rollout\.vllm_mode"):
        load_config(ROOT / "configs/quickstart.yaml", ["rollout.engine=vllm", "rollout.vllm_mode=inprocess"])
    with pytest.raises(ConfigError, match=r"rollout\.vllm_gpu_memory_utilization"):
        load_config(
            ROOT / "configs/quickstart.yaml", ["rollout.engine=vllm", "rollout.vllm_gpu_memory_utilization=1.5"]
        )


def test_server_and_colocated_engine_take_the_same_options(mmgrpo_cache):
    """One list of engine options (``engine_args``) for both modes: the server's command is it plus the address."""
    from mmgrpo.loader import load_config
    from mmgrpo.modalities.tokens.engine import engine_args, server_command

    cfg = load_config(
        ROOT / "configs/quickstart.yaml",
        ["rollout.engine=vllm", "rollout.url=http://127.0.0.1:8123", "rollout.vllm_gpu_memory_utilization=0.25"],
    )
    args = engine_args(cfg)
    assert args[args.index("--gpu-memory-utilization") + 1] == "0.25"
    cmd = server_command(cfg, python=sys.executable)
    assert cmd[2:] == [*args, "--host", "127.0.0.1", "--port", "8123"]


# ---------------------------------------------------------------------------------------------- real engine


def _env() -> dict[str, str]:
    return dict(os.environ, OMP_NUM_THREADS="2", HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT))


@pytest.mark.slow
@needs_colocate
def test_colocated_engine_greedy_equals_native_after_a_weight_push(tmp_path, mmgrpo_cache):
    """The adapter's engine is vLLM in the same process (tests/colocate_worker.py): after the trainer's perturbed
    weights are handed over in-process, its greedy completions equal the native decode loop's (and differ from
    before the push), its log-probs of its own samples equal the trainer's, and a version it did not receive stops
    the rollout with one line."""
    out = tmp_path / "result.json"
    proc = subprocess.run(
        [str(COLOCATE_PYTHON), str(ROOT / "tests/colocate_worker.py"), str(out)],
        cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    r = json.loads(out.read_text())
    assert len({tuple(x) for x in r["native"]}) > 1  # the completions depend on the image: images reach both
    assert r["engine"] == r["native"]
    assert r["engine_before"] != r["engine"]  # the push changed what the engine samples
    assert r["sampled_tokens"] > 0 and r["logprob_max_abs_diff"] <= r["logprob_tol"], r  # the model's rounding budget
    err = r["stale_version_error"]
    assert err is not None and "weights version 1" in err and "version 2" in err and "\n" not in err, err


@pytest.mark.slow
@needs_colocate
def test_colocated_training_run_logs_engine_metrics(tmp_path, mmgrpo_cache):
    """``mmgrpo train ... rollout.vllm_mode=colocate`` under .venv-colocate: a short run of the quickstart on the
    engine-sized tiny Qwen2.5-VL completes (exit 0, no traceback at shutdown), every step logs the engine/trainer
    log-prob gap within the model's rounding budget (tests/numerics.py; relative to 1 + the mean |log π_old|, which
    bounds the mean of max(1, |log π_old|)) and the TIS ratio 1 within it."""
    run = tmp_path / "run"
    cmd = [
        str(COLOCATE_PYTHON), "-m", "mmgrpo", "train", "configs/quickstart.yaml",
        "model.args.name_or_path=tiny-qwen2.5-vl-engine", "rollout.engine=vllm", "rollout.vllm_mode=colocate",
        "steps=3", "warmup.steps=4", "algorithm.prompts_per_step=4", "eval.before=false", "eval.after=false",
        "eval.every=0", "logging.every=1", "logging.progress=false", f"output_dir={run}",
    ]  # fmt: skip
    proc = subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-4000:]
    steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [s for s in steps if "engine/logprob_abs_diff" in s]
    assert len(steps) == 3, steps
    from transformers import AutoConfig

    from mmgrpo.modalities.vlm.tiny import ENGINE_NAME, resolve_model_path

    budget = model_reductions(AutoConfig.from_pretrained(resolve_model_path(ENGINE_NAME)))
    for s in steps:
        tol = budget.tol(1 + s["engine/logprob_abs_mean"])
        assert s["engine/logprob_abs_diff"] <= tol and abs(s["engine/is_ratio_mean"] - 1.0) <= math.expm1(tol), (s, tol)
