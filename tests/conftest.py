"""Shared fixtures: tiny models are built once per test session into a temporary cache (no download).

Threads: ``MMGRPO_TEST_THREADS``, else ``OMP_NUM_THREADS``, else 2, so that ``OMP_NUM_THREADS=1 bash scripts/test.sh``
really runs the suite on one thread (the summation order of torch's CPU kernels depends on the thread count).

Tests that compare two evaluations of one quantity with a tolerance from ``tests/numerics.py`` are marked
``numerics`` here (by the helpers their module uses), so ``scripts/test_numerics.sh`` can run them under other thread
counts and SIMD widths.
"""

import os

import pytest
import torch

torch.set_num_threads(int(os.environ.get("MMGRPO_TEST_THREADS") or os.environ.get("OMP_NUM_THREADS") or "2"))

_NUMERICS = ("model_reductions", "adapter_reductions", "Reductions", "reorder_tol")


def pytest_collection_modifyitems(config, items):
    for item in items:
        module = getattr(item, "module", None)
        if module is not None and any(name in vars(module) for name in _NUMERICS):
            item.add_marker(pytest.mark.numerics)


_ESCAPES: list = []  # the session's file of CLI runs that ended in a traceback (mmgrpo.cli.ESCAPES_ENV)


@pytest.fixture(scope="session", autouse=True)
def _count_cli_tracebacks(tmp_path_factory):
    """Every ``mmgrpo`` run of the session — in-process ``main()``, ``python -m mmgrpo`` and ``accelerate launch``
    ranks, which inherit the environment — notes an exception that escaped it; the terminal summary counts them."""
    from mmgrpo.cli import ESCAPES_ENV

    path = tmp_path_factory.mktemp("cli") / "escaped.txt"
    path.touch()
    os.environ[ESCAPES_ENV] = str(path)
    _ESCAPES.append(path)
    yield
    os.environ.pop(ESCAPES_ENV, None)


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
