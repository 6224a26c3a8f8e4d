"""Issue 37, "one line for the remaining tracebacks": sizes that cannot fit stop at load, running out of memory names
the knob, a dead rank is named by its peer, and ranks stop when their launcher dies (mmgrpo/sizing.py,
mmgrpo/faults.py)."""

import contextlib
import json
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from mmgrpo import faults, sizing
from mmgrpo.config import ConfigError
from mmgrpo.loader import load_config
from mmgrpo.plugins import ADAPTERS
from tests.test_trainer import QUICK, ROOT, SMALL

MMGRPO = Path(sys.executable).parent / "mmgrpo"
ACCELERATE = Path(sys.executable).parent / "accelerate"
QUIET = ["warmup.steps=0", "eval.before=false", "eval.after=false", "logging.plot=false", "checkpoint.save_final=false"]


def _errors(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "mmgrpo:" in line and "error" in line]


# ------------------------------------------------------------------------------------------- load-time bound


def test_step_bytes_count_the_cores_unit_tensors():
    cfg = load_config(QUICK, ["algorithm.group_size=8", "algorithm.prompts_per_step=32", "model.args.max_new_tokens=8"])
    # B = 256 samples of T = 8 units: old_logprobs, mask, advantages and (beta 0.05 > 0) ref_logprobs, 4 bytes each,
    # plus 2 rewards per sample
    assert sizing.step_bytes(cfg, 8) == 256 * 8 * 16 + 256 * 4 * 2
    assert sizing.units_per_sample(cfg, ADAPTERS.get("vlm")) == (8, "model.args.max_new_tokens")
    flow = load_config(ROOT / "configs/flow_chunk.yaml", ["model.args.num_steps=7", "algorithm.chunk_sizes=[3, 4]"])
    assert sizing.units_per_sample(flow, ADAPTERS.get("flow")) == (7, "model.args.num_steps")


def test_a_step_that_cannot_fit_is_refused_naming_the_key_and_what_fits():
    cfg = load_config(QUICK, ["algorithm.beta=0", "rewards=[{name: accuracy}]", "model.args.max_new_tokens=8"])
    memory = 10**9
    sizing.check_step_fits(cfg, ADAPTERS.get("vlm"), memory=memory)  # 4 · 32 · 8 · 12 bytes: fits
    cfg.algorithm.group_size = 10**6  # 32e6 samples · (8 · 12 + 4) bytes = 3.2 GB > 1 GB
    with pytest.raises(ConfigError) as e:
        sizing.check_step_fits(cfg, ADAPTERS.get("vlm"), memory=memory)
    text = str(e.value)
    assert "\n" not in text and text.startswith("algorithm.group_size: 1000000 samples")
    assert "3.2 GB" in text and "1.0 GB" in text
    assert "at most 312500 fits" in text  # 1e9 // (32 · 100 bytes per sample)


def test_dry_run_refuses_a_group_size_no_machine_fits(tmp_path):
    proc = subprocess.run(
        [str(MMGRPO), "train", str(QUICK), "algorithm.group_size=1000000000", "--dry-run", f"output_dir={tmp_path}"],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
    )
    assert proc.returncode == 2, proc.stdout[-2000:]
    assert proc.stderr.strip().count("\n") == 0, proc.stderr
    assert proc.stderr.startswith("mmgrpo: config error: algorithm.group_size: 1000000000 samples")
    assert "lower algorithm.group_size" in proc.stderr


# ------------------------------------------------------------------------------------------- out of memory

_CPU_OOM = "[enforce fail at alloc_cpu.cpp:127] DefaultCPUAllocator: can't allocate memory: you tried to allocate 31948800000 bytes. Error code 12"  # noqa: E501


def _raised_in(name: str, exc: BaseException) -> BaseException:
    """``exc`` raised from inside a function called ``name`` (a trainer phase), with its traceback."""

    def phase():
        raise exc

    phase.__code__ = phase.__code__.replace(co_name=name)
    try:
        phase()
    except BaseException as caught:
        return caught
    raise AssertionError("unreachable")


@pytest.mark.parametrize(
    "phase, knob",
    [
        ("rollout", "algorithm.group_size (4), algorithm.prompts_per_step (32) or model.args.max_new_tokens"),
        ("_update", "algorithm.minibatch_size (64 samples per forward/backward)"),
        ("_evaluate", "eval.batch_size (100)"),
        ("_warmup", "warmup.batch_size (32)"),
        ("_build", "a smaller model"),
    ],
)
def test_out_of_memory_names_the_knob_of_its_phase(phase, knob):
    cfg = load_config(QUICK, ["algorithm.group_size=4"])
    line = faults.memory_line(_raised_in(phase, RuntimeError(_CPU_OOM)), cfg)
    assert line.startswith("out of host memory (an allocation of 31.9 GB); lower ")
    assert knob in line and "\n" not in line
    assert faults.memory_line(_raised_in(phase, MemoryError()), cfg).startswith("out of host memory; lower ")
    assert faults.memory_line(_raised_in(phase, RuntimeError("shape mismatch")), cfg) is None


def _limit_address_space():
    gib = 1 << 30
    resource.setrlimit(resource.RLIMIT_AS, (8 * gib, 8 * gib))  # the 32 GB KV cache cannot be allocated


@pytest.mark.skipif(sys.platform != "linux", reason="address-space limit (RLIMIT_AS) as the host memory")
def test_a_group_too_large_for_host_memory_stops_with_one_line(tmp_path, mmgrpo_cache):
    """group_size=200000 fits the load-time bound (its unit tensors are ~1 GB) but not the rollout's KV cache
    (32 GB): the run stops with one line naming the rollout's knobs, not a 51-line allocation traceback."""
    proc = subprocess.run(
        [str(MMGRPO), "train", str(QUICK), "algorithm.group_size=200000", "steps=1", *QUIET, f"output_dir={tmp_path}"],
        capture_output=True,
        text=True,
        timeout=600,
        env=dict(os.environ, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES=""),
        preexec_fn=_limit_address_space,
    )
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    (line,) = _errors(proc.stderr)
    assert "out of host memory (an allocation of" in line
    assert "lower algorithm.group_size (200000), algorithm.prompts_per_step (32) or model.args.max_new_tokens" in line


# ------------------------------------------------------------------------------------------- a peer process died

_GLOO = "[/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:561] Connection closed by peer [127.0.0.1]:12684. This is typically caused by a remote worker crashing."  # noqa: E501


def test_a_collective_failing_on_a_dead_peer_is_one_line(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.delenv("LOCAL_RANK", raising=False)  # no launcher here: the dead rank cannot be told
    line = faults.peer_line(RuntimeError(_GLOO))
    assert line.startswith(
        "a peer process died; rank 0 stopped in a collective: Connection closed by peer [127.0.0.1]:12684 ("
    )
    assert "\n" not in line
    assert faults.peer_line(ValueError(_GLOO)) is None
    assert faults.peer_line(RuntimeError("mat1 and mat2 shapes cannot be multiplied")) is None
    assert faults.peer_line(RuntimeError("[gloo/allreduce.cc:10] Gloo allreduce: sizes do not match")) is None
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert faults.peer_line(RuntimeError(_GLOO)) is None  # one process has no peers


def _launch(tmp_path: Path, steps: int) -> tuple[subprocess.Popen, Path, Path]:
    out, log = tmp_path / "run", tmp_path / "launch.log"
    cmd = [str(ACCELERATE), "launch", "--config_file", str(ROOT / "configs/accelerate/cpu_2proc.yaml")]
    cmd += ["--main_process_port", "0"]  # any free rendezvous port, not 29500: launches on two test workers at once
    cmd += ["-m", "mmgrpo", "train", str(QUICK), *SMALL, *QUIET, f"steps={steps}", f"output_dir={out}"]
    env = dict(os.environ, OMP_NUM_THREADS="1", ACCELERATE_USE_CPU="1")
    with open(log, "w") as f:  # a file, not a pipe: ranks that outlive the launcher would hold a pipe open
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=tmp_path)
    return proc, out, log


def _ranks_after_first_step(proc: subprocess.Popen, out: Path) -> dict[int, psutil.Process]:
    """The launcher's rank processes by RANK, once step 1 is in metrics.jsonl."""
    metrics = out / "metrics.jsonl"
    deadline = time.monotonic() + 600
    while not (metrics.exists() and any('"step": 1' in s for s in metrics.read_text().splitlines())):
        assert proc.poll() is None and time.monotonic() < deadline, "the run ended or stalled before step 1"
        time.sleep(0.2)
    return {int(c.environ()["RANK"]): c for c in psutil.Process(proc.pid).children()}


def _kill(processes: list) -> None:
    """SIGKILL what is still running of a launch (a test that failed midway leaves nothing behind)."""
    for p in processes:
        with contextlib.suppress(psutil.Error, ProcessLookupError):
            p.kill()


@pytest.mark.slow
def test_a_killed_rank_is_named_in_one_line_by_its_peer(tmp_path, mmgrpo_cache):
    proc, out, log = _launch(tmp_path, steps=100)
    ranks = {}
    try:
        ranks = _ranks_after_first_step(proc, out)
        os.kill(ranks[1].pid, signal.SIGKILL)
        proc.wait(timeout=300)
    finally:
        _kill([proc, *ranks.values()])
    text = log.read_text()
    assert proc.returncode != 0
    (line,) = _errors(text)
    assert "mmgrpo: error: rank 1 of 2 died; rank 0 stopped in a collective: " in line, text[-3000:]
    assert "resume=" in line or "run the same command again" in line
    assert "[rank0]: Traceback" not in text and "mmgrpo/trainer.py" not in text, text[-3000:]


@pytest.mark.slow
def test_ranks_stop_with_a_checkpoint_when_their_launcher_is_killed(tmp_path, mmgrpo_cache):
    steps = 1000  # minutes of training: ranks that keep going after the launcher died are still alive below
    proc, out, log = _launch(tmp_path, steps=steps)
    ranks = {}
    try:
        ranks = _ranks_after_first_step(proc, out)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        _, alive = psutil.wait_procs(list(ranks.values()), timeout=120)
    finally:
        _kill(list(ranks.values()))
    text = log.read_text()
    assert not alive, f"ranks {[p.pid for p in alive]} outlived their launcher by 120 s:\n{text[-3000:]}"
    # The rank whose watcher polls first says so and stops at the end of the step; the stop is collective, so the
    # other rank may end with it before its own watcher looks (seen under load): one line at least, both ranks gone.
    noticed = [r for r in (0, 1) if f"mmgrpo: rank {r}: the launcher (pid {proc.pid}) is gone" in text]
    assert noticed, text[-3000:]
    saved = sorted((out / "checkpoints").glob("step-*"))
    assert saved, text[-3000:]  # the stop at the end of the step saved the run
    last = max(json.loads(s)["step"] for s in (out / "metrics.jsonl").read_text().splitlines() if '"step"' in s)
    assert last < steps and saved[-1].name == f"step-{last:06d}"
