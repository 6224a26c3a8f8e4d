"""Issue 54 (Reliability 4): run folders (docs/reliability.md, "A run directory has one live run").

An ``output_dir`` that exists and is not a run (notes, sources, a dataset) is refused in one line and nothing in it
is moved; the run lock lives inside the run directory, so every path reaching that directory (a symlink, a bind
mount) meets the same lock."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mmgrpo import checkpoint as ckpt
from mmgrpo import run_dir
from mmgrpo.config import ConfigError
from mmgrpo.trainer import Trainer, train
from tests.test_reliability import _cfg, _snapshot, _steps

ROOT = Path(__file__).resolve().parents[1]


def _a_project(path: Path) -> Path:
    """A folder that is not a run: notes, sources and a dataset (one file named like a run's config)."""
    (path / "src").mkdir(parents=True)
    (path / "src/main.py").write_text("print('mine')\n")
    (path / "notes.md").write_text("# notes\n")
    (path / "data.jsonl").write_text('{"prompt": "a red cube"}\n')
    (path / "config.yaml").write_text("seed: 0\n")
    return path


@pytest.mark.parametrize("extra", [(), ("overwrite=true",)], ids=["new run", "overwrite"])
def test_an_existing_folder_that_is_not_a_run_is_refused_and_nothing_moves(tmp_path, mmgrpo_cache, extra):
    """The old tree moved it aside to ``<dir>.old-<time>`` as "the leftovers of a run"."""
    out = _a_project(tmp_path / "project")
    before = _snapshot(out)
    with pytest.raises(ConfigError) as err:
        Trainer(_cfg(out, "steps=1", *extra))
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(f"output_dir={out} exists and is not an mmgrpo run (4 entries, e.g. config.yaml)")
    assert message.endswith("nothing was moved; choose a new or empty output_dir")
    assert _snapshot(out) == before and sorted(p.name for p in tmp_path.iterdir()) == ["project"]
    assert not run_dir.lock_path(out).exists()


def test_a_run_stopped_before_its_first_checkpoint_is_a_run(tmp_path, mmgrpo_cache):
    """A run marks its directory when it starts: a later start there moves its leftovers aside (even a file the user
    added), as before; a folder the run only passed through stays a run after the move."""
    out = tmp_path / "run"
    Trainer(_cfg(out, "steps=1")).close()  # started (marked), stopped before anything else
    assert (out / run_dir.MARK).is_file() and run_dir.is_a_run(out)
    (out / "metrics.jsonl").write_text('{"step": 1}\n')
    (out / "my_notes.txt").write_text("why this run\n")
    train(_cfg(out, "steps=1"))
    (aside,) = [p for p in tmp_path.iterdir() if p.name.startswith("run.old-")]
    assert (aside / "my_notes.txt").read_text() == "why this run\n" and (aside / run_dir.MARK).is_file()
    assert _steps(out) == [1] and run_dir.is_a_run(out)


def test_an_empty_or_new_folder_is_accepted_and_a_refused_run_leaves_no_folder(tmp_path, mmgrpo_cache):
    (tmp_path / "empty").mkdir()
    Trainer(_cfg(tmp_path / "empty", "steps=1")).close()
    assert sorted(p.name for p in (tmp_path / "empty").iterdir()) == [run_dir.MARK]  # the lock is gone
    with pytest.raises(ConfigError):  # refused after the lock made the directory: it is removed again
        Trainer(_cfg(tmp_path / "new", "steps=1", "resume=latest"))
    assert not (tmp_path / "new").exists()


def test_the_lock_lives_in_the_run_directory_and_a_symlink_meets_it(tmp_path):
    run = tmp_path / "run"
    link = tmp_path / "link"
    lock = run_dir.RunLock(run)
    lock.acquire()
    try:
        assert run_dir.lock_path(run) == run / ".mmgrpo-lock" and (run / ".mmgrpo-lock").is_file()
        assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]  # nothing beside the run directory
        link.symlink_to(run, target_is_directory=True)
        with pytest.raises(ckpt.RunDirError, match=f"is in use by mmgrpo process {os.getpid()} "):
            run_dir.RunLock(link).acquire()
    finally:
        lock.release()
    assert not (run / ".mmgrpo-lock").exists()


def _bind_mounts() -> bool:
    """Whether this machine lets a process bind-mount a folder in its own user and mount namespace."""
    if shutil.which("unshare") is None:
        return False
    import tempfile

    with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
        probe = subprocess.run(["unshare", "-rm", "mount", "--bind", a, b], capture_output=True, timeout=30)
    return probe.returncode == 0


@pytest.mark.skipif(not _bind_mounts(), reason="needs unshare and a user mount namespace for the bind mount")
def test_a_bind_mount_of_a_live_run_meets_its_lock(tmp_path):
    """The same run directory through a bind mount (``os.path.realpath`` cannot join the two paths): the old tree
    kept a lock file beside each path and both runs held a lock; now the second is refused."""
    run, alias = tmp_path / "run", tmp_path / "alias"
    run.mkdir()
    alias.mkdir()
    lock = run_dir.RunLock(run)
    lock.acquire()
    try:
        code = f"from mmgrpo.run_dir import RunLock; RunLock({str(alias)!r}).acquire(); print('acquired')"
        script = f'mount --bind {run} {alias} && {sys.executable} -c "{code}"'
        proc = subprocess.run(
            ["unshare", "-rm", "sh", "-c", script], capture_output=True, text=True, timeout=120, cwd=ROOT
        )
        assert "acquired" not in proc.stdout and proc.returncode != 0, proc.stdout + proc.stderr
        assert f"is in use by mmgrpo process {os.getpid()} " in proc.stderr, proc.stderr
    finally:
        lock.release()
