"""Two processes whose rewards differ: the logged metrics are those of all samples, not of process 0."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_trainer import QUICK, ROOT, SMALL, VARIED, VARIED_REWARD, assert_trained_after

REWARD = '''
import os


def rank_reward(completions, **kwargs):
    """Process r scores every sample r: 0 on process 0, 1 on process 1."""
    return [float(os.environ["RANK"])] * len(completions)
'''


@pytest.mark.slow
def test_two_processes_log_the_global_reward_mean(tmp_path, mmgrpo_cache):
    (tmp_path / "rank_rewards.py").write_text(REWARD)
    out = tmp_path / "run"
    accelerate = Path(sys.executable).parent / "accelerate"
    cmd = [
        str(accelerate),
        "launch",
        "--config_file",
        str(ROOT / "configs/accelerate/cpu_2proc.yaml"),
        "--main_process_port",
        "0",  # any free rendezvous port, not 29500: launches on two test workers at once
        "-m",
        "mmgrpo",
        "train",
        str(QUICK),
        *SMALL,
        "steps=2",
        "warmup.steps=0",
        "eval.before=false",
        "eval.after=false",
        "checkpoint.save_final=false",
        "logging.plot=false",
        "rewards=[{name: 'rank_rewards:rank_reward'}]",
        f"output_dir={out}",
    ]
    pythonpath = os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])
    env = dict(os.environ, OMP_NUM_THREADS="1", ACCELERATE_USE_CPU="1", PYTHONPATH=pythonpath)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "reward/mean" in r]
    assert [r["step"] for r in steps] == [1, 2]
    B = 2 * 4  # prompts_per_step · group_size per process: B zeros and B ones
    for r in steps:
        assert r["reward/mean"] == pytest.approx(0.5)  # process 0 alone would log 0.0
        assert r["reward/rank_reward"] == pytest.approx(0.5)
        assert r["reward/std"] == pytest.approx((2 * B * 0.25 / (2 * B - 1)) ** 0.5)  # unbiased, over 2B samples
        assert r["reward/errors"] == 0.0
        assert r["advantage/zero_std_fraction"] == 1.0  # every group is constant on its own process
    assert json.loads((out / "summary.json").read_text())["train/processes"] == 2


@pytest.mark.slow
def test_two_process_cpu_run_resumes_to_the_uninterrupted_weights(tmp_path, mmgrpo_cache):
    """A 2-process gloo run cut after its second checkpoint (its later checkpoints removed, as a kill leaves it)
    resumes to the uninterrupted run's final weights; resuming failed with "device cpu:0 is invalid" before. The
    reward varies within groups (tests/test_trainer.py's VARIED_REWARD), so the resumed step moves the weights."""
    import shutil

    import torch
    from safetensors.torch import load_file

    accelerate = Path(sys.executable).parent / "accelerate"
    launch = [str(accelerate), "launch", "--config_file", str(ROOT / "configs/accelerate/cpu_2proc.yaml")]
    launch += ["--main_process_port", "0"]  # any free rendezvous port, not 29500: launches on two test workers at once
    common = [*SMALL, "steps=3", "warmup.steps=0", "eval.before=false", "eval.after=false", "logging.plot=false"]
    common += ["checkpoint.every=1", "checkpoint.keep_last=5", VARIED]
    (tmp_path / "varied_reward.py").write_text(VARIED_REWARD)
    pythonpath = os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])
    env = dict(os.environ, OMP_NUM_THREADS="1", ACCELERATE_USE_CPU="1", PYTHONPATH=pythonpath)
    full, cut = tmp_path / "full", tmp_path / "cut"
    run = subprocess.run(
        [*launch, "-m", "mmgrpo", "train", str(QUICK), *common, f"output_dir={full}"],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    shutil.copytree(full, cut)
    for later in ("step-000003", "final"):
        shutil.rmtree(cut / "checkpoints" / later)
    before = load_file(str(cut / "checkpoints/step-000002/state/model.safetensors"))
    resumed = subprocess.run(
        [*launch, "-m", "mmgrpo", "train", str(QUICK), *common, f"output_dir={cut}", "resume=latest"],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    a = load_file(str(full / "checkpoints/final/state/model.safetensors"))
    b = load_file(str(cut / "checkpoints/final/state/model.safetensors"))
    assert a.keys() == b.keys()
    assert_trained_after(before, b, cut, 2)
    for k in a:  # equal by construction: the same 2 processes and threads; resume restores every state bit for bit
        torch.testing.assert_close(a[k], b[k], atol=0, rtol=0, msg=k)
    steps = [json.loads(line)["step"] for line in (cut / "metrics.jsonl").read_text().splitlines()]
    assert [s for s in steps if s] == [1, 2, 3]
