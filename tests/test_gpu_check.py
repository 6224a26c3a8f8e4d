"""``scripts/gpu_check.sh`` on a machine without CUDA: one line saying what it skipped, exit 0; and the tests it runs
on a GPU machine (marked ``cuda``) are collected: at least 8."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is here: the script would run its checks")
def test_gpu_check_without_cuda_is_one_line_and_exit_0(tmp_path):
    env = {"PATH": "/usr/bin:/bin", "PYTHON": sys.executable, "GPU_CHECK_OUT": str(tmp_path / "out")}
    proc = subprocess.run(["bash", "scripts/gpu_check.sh"], cwd=ROOT, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpu_check: no CUDA device") and "skipped" in lines[0], lines
    assert "pytest -m cuda" in lines[0] and not (tmp_path / "out").exists()


def test_cuda_tests_are_collected():
    cmd = [sys.executable, "-m", "pytest", "-m", "cuda", "--collect-only", "-q", "-p", "no:cacheprovider"]
    cmd += ["tests/test_cuda.py", "tests/test_gpu.py"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-2000:]
    collected = [line for line in proc.stdout.splitlines() if "::" in line]
    assert len(collected) >= 8, proc.stdout[-2000:]
