"""The run lock: one live run per output_dir, refused in one line naming the holder, stale locks taken over
(docs/reliability.md, "A run directory has one live run")."""

import json
import os
import signal
import socket
import subprocess
import sys

import pytest

from mmgrpo import checkpoint as ckpt
from mmgrpo import run_dir
from mmgrpo.trainer import Trainer
from tests.test_reliability import QUICK, TINY, _cfg, _snapshot, _steps


def test_a_second_holder_is_refused_with_the_pid_and_host(tmp_path):
    first = run_dir.RunLock(tmp_path / "run")
    assert first.acquire() is None
    record = json.loads(run_dir.lock_path(tmp_path / "run").read_text())
    assert record["pid"] == os.getpid() and record["host"] == socket.gethostname()
    with pytest.raises(ckpt.RunDirError) as err:  # another open file description: refused even in one process
        run_dir.RunLock(tmp_path / "run").acquire()
    message = str(err.value)
    assert "\n" not in message and f"in use by mmgrpo process {os.getpid()} on host {socket.gethostname()}" in message
    first.release()
    assert not run_dir.lock_path(tmp_path / "run").exists()  # released: the file is gone
    again = run_dir.RunLock(tmp_path / "run")
    assert again.acquire() is None
    again.release()


def test_the_stale_lock_of_a_killed_holder_is_taken_over(tmp_path):
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import time; from mmgrpo.run_dir import RunLock; "
            f"lock = RunLock({str(tmp_path / 'run')!r}); lock.acquire(); print('locked', flush=True); time.sleep(600)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout.readline().strip() == "locked"
    with pytest.raises(ckpt.RunDirError, match=f"in use by mmgrpo process {holder.pid} "):
        run_dir.RunLock(tmp_path / "run").acquire()
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    assert run_dir.lock_path(tmp_path / "run").exists()  # SIGKILL left the file, but the kernel dropped the lock
    lock = run_dir.RunLock(tmp_path / "run")
    stale = lock.acquire()
    assert stale is not None and stale["pid"] == holder.pid  # taken over, and the dead holder is reported
    assert json.loads(run_dir.lock_path(tmp_path / "run").read_text())["pid"] == os.getpid()
    lock.release()


def test_a_second_train_and_a_resume_are_refused_while_a_run_holds_the_directory(tmp_path, mmgrpo_cache):
    """Run A holds the lock from construction to the end of run(); B (a new run, the CLI, resume=latest) is refused
    before it writes anything, and A then trains to its end with its own metrics only."""
    out = tmp_path / "run"
    first = Trainer(_cfg(out, "steps=2", "checkpoint.every=1"))
    first._save(0)  # A's files exist, as they would mid-run: a complete checkpoint to resume from
    before = _snapshot(out)
    with pytest.raises(ckpt.RunDirError, match=f"in use by mmgrpo process {os.getpid()} on host"):
        Trainer(_cfg(out, "steps=2", "checkpoint.every=1", "overwrite=true"))
    with pytest.raises(ckpt.RunDirError, match=f"in use by mmgrpo process {os.getpid()} on host"):
        Trainer(_cfg(out, "steps=2", "checkpoint.every=1", "resume=latest"))
    proc = subprocess.run(
        [sys.executable, "-m", "mmgrpo", "train", str(QUICK), *TINY, "steps=2", f"output_dir={out}", "resume=latest"],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
    )
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"mmgrpo: error: output_dir={out} is in use by mmgrpo process {os.getpid()} on host")
    assert _snapshot(out) == before  # nothing of A's changed
    first.run()
    assert _steps(out) == [1, 2] and not run_dir.lock_path(out).exists()
    Trainer(_cfg(out, "steps=3", "checkpoint.every=1", "resume=latest")).close()  # free again once A ended


def test_the_lock_is_released_when_construction_fails(tmp_path, mmgrpo_cache):
    out = tmp_path / "run"
    out.mkdir()
    (out / "summary.json").write_text("{}")  # a finished run: a new run is refused after the lock was taken
    with pytest.raises(Exception, match="already holds a run"):
        Trainer(_cfg(out, "steps=1"))
    assert not run_dir.lock_path(out).exists()


def test_a_lock_still_held_at_interpreter_exit_is_released_quietly(tmp_path):
    """A script that builds a Trainer and never calls train() (benchmarks/real_vs_trl.py does) ends with the lock
    held: it is unlinked at exit, with no "Exception ignored in RunLock.__del__" from a torn-down os module."""
    code = (
        "from mmgrpo.loader import load_config; from mmgrpo.trainer import Trainer; "
        f"t = Trainer(load_config('configs/quickstart.yaml', ['output_dir={tmp_path / 'run'}'])); "
        "print('locked', flush=True)"
    )
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=root)
    assert proc.returncode == 0 and proc.stdout.strip() == "locked", proc.stderr
    assert "Exception ignored" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert not run_dir.lock_path(tmp_path / "run").exists()
