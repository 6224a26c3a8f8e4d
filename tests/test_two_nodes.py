"""Beyond one machine, simulated here: two "nodes" (two ``accelerate launch`` commands with ``--num_machines 2``,
``--machine_rank`` 0 and 1, one process each, gloo over 127.0.0.1, one shared output_dir as a cluster's shared file
system gives) train to the weights of the one-node two-process run, and a two-node run cut after its first
checkpoint resumes to them (docs/scale.md, "Several nodes").

Equal by construction, compared exactly: the same two ranks (global rank = machine_rank · processes per node +
local rank), the same threads, the same gloo collectives; only the rendezvous differs.
"""

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.test_trainer import QUICK, ROOT, SMALL

ACCELERATE = Path(sys.executable).parent / "accelerate"
CONFIG = ROOT / "configs/accelerate/cpu_2proc.yaml"
COMMON = [*SMALL, "steps=2", "warmup.steps=0", "eval.before=false", "eval.after=false", "logging.plot=false"]
COMMON += ["checkpoint.every=1", "checkpoint.keep_last=5"]
ENV = dict(os.environ, OMP_NUM_THREADS="1", ACCELERATE_USE_CPU="1")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _one_node(out: Path, *extra: str) -> None:
    cmd = [str(ACCELERATE), "launch", "--config_file", str(CONFIG), "--main_process_port", "0"]
    cmd += ["-m", "mmgrpo", "train", str(QUICK), *COMMON, f"output_dir={out}", *extra]
    run = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]


def _two_nodes(out: Path, *extra: str) -> None:
    """Both "nodes" at once, as a cluster scheduler starts them: rank 0's machine hosts the rendezvous."""
    port = _free_port()
    procs = []
    for machine_rank in (0, 1):
        cmd = [str(ACCELERATE), "launch", "--config_file", str(CONFIG), "--num_machines", "2", "--num_processes", "2"]
        cmd += ["--machine_rank", str(machine_rank), "--main_process_ip", "127.0.0.1", "--main_process_port", str(port)]
        cmd += ["-m", "mmgrpo", "train", str(QUICK), *COMMON, f"output_dir={out}", *extra]
        procs.append(subprocess.Popen(cmd, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outputs = [p.communicate(timeout=900) for p in procs]
    for machine_rank, (p, (_, err)) in enumerate(zip(procs, outputs)):
        assert p.returncode == 0, f"node {machine_rank}:\n{err[-3000:]}"


def _final(out: Path) -> dict[str, torch.Tensor]:
    return load_file(str(out / "checkpoints/final/state/model.safetensors"))


@pytest.mark.slow
def test_two_nodes_train_and_resume_to_the_one_node_weights(tmp_path, mmgrpo_cache):
    one, two, cut = tmp_path / "one", tmp_path / "two", tmp_path / "cut"
    _one_node(one)
    _two_nodes(two)
    a, b = _final(one), _final(two)
    assert a.keys() == b.keys() and len(a) > 0
    for k in a:
        torch.testing.assert_close(b[k], a[k], atol=0, rtol=0, msg=k)
    shutil.copytree(two, cut)
    for later in ("step-000002", "final"):  # cut after the first checkpoint, as a kill of both nodes leaves it
        shutil.rmtree(cut / "checkpoints" / later)
    _two_nodes(cut, "resume=latest")
    c = _final(cut)
    for k in a:
        torch.testing.assert_close(c[k], a[k], atol=0, rtol=0, msg=k)
