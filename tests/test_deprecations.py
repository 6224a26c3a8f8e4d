"""The deprecation count (tests/deprecations.py) fails a run: a bare pytest, with the plugin, on a generated test whose
call into a fake ``transformers`` raises a FutureWarning exits non-zero and names it, in one process, on two
pytest-xdist workers and from a ``python -m mmgrpo``-style child process; the same test without the warning passes.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

FAKE_LIBRARY = """
import warnings


def old_api():
    warnings.warn("`old_api` is deprecated and will be removed in v6. Use `new_api` instead.", FutureWarning)


def new_api():
    pass
"""

TEST_FILE = """
import subprocess
import sys

import transformers


def test_calls_the_library():
    transformers.{call}()


def test_a_child_process():
    code = "from mmgrpo.cli import note_deprecations; note_deprecations(); import transformers; transformers.{child}()"
    subprocess.run([sys.executable, "-c", code], check=True)
"""


def _run(tmp_path: Path, call: str, child: str, *args: str) -> subprocess.CompletedProcess:
    fake = tmp_path / "fake"
    (fake / "transformers").mkdir(parents=True, exist_ok=True)
    (fake / "transformers" / "__init__.py").write_text(FAKE_LIBRARY)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")  # not the repository's pyproject: no filters of ours
    (tmp_path / "test_generated.py").write_text(TEST_FILE.format(call=call, child=child))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(fake), str(ROOT)])}
    env.pop("MMGRPO_DEPRECATIONS", None)  # the inner session makes its own file
    cmd = [sys.executable, "-m", "pytest", "-p", "tests.deprecations", "-p", "no:cacheprovider", "-c"]
    cmd += [str(tmp_path / "pytest.ini"), "--rootdir", str(tmp_path), "-q", *args, "test_generated.py"]
    return subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)


def _count(out: str) -> int:
    found = re.findall(r"deprecation notices \(FutureWarning/DeprecationWarning\) in this run: (\d+)", out)
    assert len(found) == 1, out
    return int(found[0])


def _listed(out: str) -> str:
    """The count's line for the fake notice (pytest's own warnings summary names it too, in another form)."""
    return next(x for x in out.splitlines() if x.startswith("  1x FutureWarning: `old_api` is deprecated"))


def test_no_deprecation_passes(tmp_path):
    r = _run(tmp_path, "new_api", "new_api")
    assert r.returncode == 0 and _count(r.stdout) == 0, r.stdout + r.stderr


@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["one_process", "xdist"])
def test_a_futurewarning_from_a_library_fails_the_run_and_is_listed(tmp_path, workers):
    r = _run(tmp_path, "old_api", "new_api", *workers)
    assert r.returncode == 1 and _count(r.stdout) == 1, r.stdout + r.stderr
    assert "2 passed" in r.stdout  # the tests themselves pass: the count fails the run
    line = _listed(r.stdout)
    assert "transformers/__init__.py" in line, line
    assert "test_generated.py::test_calls_the_library" in line, line


def test_a_futurewarning_in_a_child_process_fails_the_run(tmp_path):
    r = _run(tmp_path, "new_api", "old_api")
    assert r.returncode == 1 and _count(r.stdout) == 1, r.stdout + r.stderr
    line = _listed(r.stdout)
    assert "(a child process)" in line, line


def test_a_child_of_another_environment_notes_nothing(tmp_path):
    """``note_deprecations`` notes only for the suite's own interpreter (``sys.prefix`` on the file's first line):
    the vLLM environments' processes, with vLLM's pinned transformers, are not counted."""
    log = tmp_path / "notices.txt"
    log.write_text("/another/venv\n")
    code = "from mmgrpo.cli import note_deprecations; note_deprecations(); import warnings; "
    code += "warnings.warn('x', FutureWarning)"
    env = {**os.environ, "MMGRPO_DEPRECATIONS": str(log)}
    subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True)
    assert log.read_text() == "/another/venv\n"
    log.write_text(sys.prefix + "\n")
    subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True)
    assert log.read_text().splitlines()[1].startswith("FutureWarning: x ("), log.read_text()


def test_no_code_of_ours_reads_is_gradient_checkpointing():
    """pyproject.toml ignores transformers' ``is_gradient_checkpointing`` notice by its message alone (peft reads the
    alias); that is safe only while none of our code reads it."""
    offenders = []
    for folder in ("mmgrpo", "modalities", "rewards", "tools", "tests", "scripts", "benchmarks"):
        for path in (ROOT / folder).rglob("*.py"):
            if path == Path(__file__).resolve():
                continue
            for n, line in enumerate(path.read_text().splitlines(), 1):
                if re.search(r"\.is_gradient_checkpointing\b|[\"']is_gradient_checkpointing[\"']", line):
                    offenders.append(f"{path.relative_to(ROOT)}:{n}")
    assert not offenders, offenders
