"""The suite's count of deprecation notices: a pytest plugin (tests/conftest.py loads it) that fails the session when
any FutureWarning, DeprecationWarning or PendingDeprecationWarning (or a subclass, such as pandas' Pandas4Warning) was
raised during the run, and lists them, one line each, after the test summary.

Where they come from:

- the test processes: every warning pytest records (``pytest_warning_recorded``; under pytest-xdist the workers
  send theirs to the controller, which calls the same hook), i.e. what pyproject.toml's ``filterwarnings`` neither
  turned into an error (our own call sites) nor ignored (the narrow, commented library-internal exceptions);
- the ``python -m mmgrpo`` processes the tests start, ``accelerate launch`` ranks included, and the multi-process
  test workers: they inherit ``$MMGRPO_DEPRECATIONS`` (:data:`mmgrpo.cli.DEPRECATIONS_ENV`), a file made here whose
  first line is this interpreter's ``sys.prefix``, and append one line per notice
  (:func:`mmgrpo.cli.note_deprecations`). Processes of another environment (``.venv-vllm``, ``.venv-colocate``:
  vLLM's pinned transformers) do not note theirs.

Why a count and not ``error::FutureWarning`` for everything: an error raised inside a library's ``try/except
Exception`` changes what the library does (gradio wraps the pandas call that warns in one) instead of failing the
test, and a warning raised while a module imports would break the import. The count changes nothing while the tests
run and still makes the session's exit status non-zero.

Standard library only (tests/test_deprecations.py runs it in a bare pytest): ``-p tests.deprecations``.
"""

from __future__ import annotations

import os
import sys
import tempfile
import warnings
from collections import Counter
from pathlib import Path

import pytest

KINDS = (DeprecationWarning, PendingDeprecationWarning, FutureWarning)
ENV = "MMGRPO_DEPRECATIONS"  # = mmgrpo.cli.DEPRECATIONS_ENV (not imported: this plugin runs without mmgrpo too)

_seen: list[str] = []  # this process's notices: in-process ones and, at the end, the children's
_children: list[Path] = []  # the file the child processes append to (controller only)


def _controller(config) -> bool:
    return not hasattr(config, "workerinput")


def pytest_configure(config):
    if not _controller(config):  # an xdist worker: the controller's file is already in the environment
        return
    fd, path = tempfile.mkstemp(prefix="mmgrpo-deprecations-", suffix=".txt")
    with os.fdopen(fd, "w") as f:
        f.write(sys.prefix + "\n")
    os.environ[ENV] = path
    _children.append(Path(path))


def pytest_warning_recorded(warning_message: warnings.WarningMessage, when: str, nodeid: str, location):
    category = warning_message.category
    if category is None or not issubclass(category, KINDS):
        return
    first = (str(warning_message.message).splitlines() or [""])[0][:300]
    where = f"{warning_message.filename}:{warning_message.lineno}"
    _seen.append(f"{category.__name__}: {first} ({where}; {nodeid or when})")


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session):
    if not _controller(session.config) or not _children:
        return
    lines = _children[0].read_text().splitlines()[1:] if _children[0].is_file() else []
    _seen.extend(f"{line} (a child process)" for line in lines)
    if _seen and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, config):
    if not _controller(config):
        return
    counts = Counter(_seen)
    terminalreporter.write_line(
        f"deprecation notices (FutureWarning/DeprecationWarning) in this run: {len(_seen)}", red=bool(_seen)
    )
    for line, n in sorted(counts.items()):
        terminalreporter.write_line(f"  {n}x {line}", red=True)


def pytest_unconfigure(config):
    if _controller(config) and _children:
        os.environ.pop(ENV, None)
        _children.pop().unlink(missing_ok=True)
