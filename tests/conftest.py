"""Shared fixtures: tiny models are built once per test session into a temporary cache (no download).

Threads: ``MMGRPO_TEST_THREADS``, else ``OMP_NUM_THREADS``, else 2, so that ``OMP_NUM_THREADS=1 bash scripts/test.sh``
really runs the suite on one thread (the summation order of torch's CPU kernels depends on the thread count).

Tests that compare two evaluations of one quantity with a tolerance from ``tests/numerics.py`` are marked
``numerics`` here (by the helpers their module uses), so ``scripts/test_numerics.sh`` can run them under other thread
counts and SIMD widths.

Parallel runs (``scripts/test.sh`` runs pytest-xdist with two workers, ``--dist loadfile``): each file runs whole on
one worker, so module fixtures (the vLLM servers) start once; the longest files are handed out first
(``HEAVY_FILES``), so the fast files fill the end of the run instead of one learning test running alone; the count of
CLI tracebacks is kept in one file that the controller makes and every worker appends to.
"""

import os
import tempfile
from pathlib import Path

import pytest
import torch

pytest_plugins = ("tests.deprecations",)  # the run fails on any deprecation notice, counted and listed

torch.set_num_threads(int(os.environ.get("MMGRPO_TEST_THREADS") or os.environ.get("OMP_NUM_THREADS") or "2"))

_NUMERICS = ("model_reductions", "adapter_reductions", "Reductions", "reorder_tol")


def pytest_collection_modifyitems(config, items):
    for item in items:
        module = getattr(item, "module", None)
        if module is not None and any(name in vars(module) for name in _NUMERICS):
            item.add_marker(pytest.mark.numerics)
    if config.getoption("dist", "no") != "no" or hasattr(config, "workerinput"):
        _longest_files_first(items)


# Seconds each of the heaviest files took in a one-thread run (`--durations=60` of `bash scripts/test.sh`, summed per
# file; 2026-11-26, on the 2-core machine with another job on it). Only their order matters: under xdist the files
# are handed out longest first (the LPT rule), so the last files to start are short ones and no learning test runs
# alone at the end. A file not listed weighs half a second per test. Re-measure when a file's tests change much.
HEAVY_FILES = {
    "tests/test_trainer.py": 323,  # test_quickstart_learns alone: 143-256 s
    "tests/test_fsdp.py": 298,
    "tests/test_world_size.py": 229,
    "tests/test_engine.py": 176,
    "tests/test_engine_archs.py": 600,  # 9 vLLM servers, about a minute each to start (wt/engine, 2026-11-26)
    "tests/test_speech_learning.py": 121,
    "tests/test_real_models.py": 160,  # + the SmolVLM warm-up and GRPO steps (about 60 s)
    "tests/test_flow_learning.py": 98,
    "tests/test_colocate.py": 79,
    "tests/test_multiprocess.py": 75,
    "tests/test_process_faults.py": 69,
    "tests/test_video_learning.py": 58,
    "tests/test_demo.py": 46,
    "tests/test_two_nodes.py": 57,  # measured alone, with the CI run on the other core
    "tests/test_prefix_sharing.py": 62,  # 89 tests: every text and media architecture (wt/38's one-thread run)
    "tests/test_turns.py": 20,
}


def _longest_files_first(items: list) -> None:
    """Under xdist, reorder the files (each kept whole and in its own order) by their expected time, longest first
    (``HEAVY_FILES``): ``--dist loadfile`` hands files out in collection order, and a long file handed out last would
    run alone on one worker while the other waits. Every worker collects the same order (the sort is stable)."""
    count: dict[str, int] = {}
    for item in items:
        path = item.nodeid.split("::")[0]
        count[path] = count.get(path, 0) + 1

    def weight(path: str) -> float:
        return HEAVY_FILES.get(path, 0.5 * count[path])

    items.sort(key=lambda item: -weight(item.nodeid.split("::")[0]))


_ESCAPES: list[Path] = []  # the session's file of CLI runs that ended in a traceback (mmgrpo.cli.ESCAPES_ENV)


def pytest_configure(config):
    """Every ``mmgrpo`` run of the session — in-process ``main()``, ``python -m mmgrpo`` and ``accelerate launch``
    ranks, which inherit the environment — notes an exception that escaped it in one file; the terminal summary
    counts them. The file is made here in the controlling process, before xdist starts its workers, which inherit
    the variable and append to it (one short ``O_APPEND`` write per escape)."""
    if hasattr(config, "workerinput"):  # an xdist worker: the controller's file is already in the environment
        return
    from mmgrpo.cli import ESCAPES_ENV

    fd, path = tempfile.mkstemp(prefix="mmgrpo-escaped-", suffix=".txt")
    os.close(fd)
    os.environ[ESCAPES_ENV] = path
    _ESCAPES.append(Path(path))


def pytest_unconfigure(config):
    if hasattr(config, "workerinput") or not _ESCAPES:
        return
    from mmgrpo.cli import ESCAPES_ENV

    os.environ.pop(ESCAPES_ENV, None)
    _ESCAPES.pop().unlink(missing_ok=True)


def pytest_terminal_summary(terminalreporter):
    if not _ESCAPES or not _ESCAPES[0].is_file():
        return
    lines = _ESCAPES[0].read_text().splitlines()
    terminalreporter.write_line(f"mmgrpo CLI runs that ended in a traceback: {len(lines)}")
    for line in lines:
        terminalreporter.write_line(f"  {line}")


@pytest.fixture(scope="session")
def mmgrpo_cache(tmp_path_factory):
    path = tmp_path_factory.mktemp("mmgrpo_cache")
    old = os.environ.get("MMGRPO_CACHE")
    os.environ["MMGRPO_CACHE"] = str(path)
    yield path
    if old is None:
        os.environ.pop("MMGRPO_CACHE", None)
    else:
        os.environ["MMGRPO_CACHE"] = old


@pytest.fixture(scope="session")
def tiny_vlm_path(mmgrpo_cache):
    from mmgrpo.modalities.vlm.tiny import resolve_model_path

    return resolve_model_path("tiny-qwen2.5-vl")
