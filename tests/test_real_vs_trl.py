"""benchmarks/real_vs_trl.py: the bookkeeping (time to target, ratios, the table) by hand. The runs themselves need
the real SmolLM2 weights and minutes per step here; they were measured on a GPU (docs/benchmarks.md)."""

import importlib.util
import sys
from pathlib import Path

import pytest

PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "real_vs_trl.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("real_vs_trl", PATH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


def _run(toolkit, seed, curve, steps, peak):
    return {"toolkit": toolkit, "seed": seed, "curve": curve, "step_s": steps, "train_s": sum(steps), "peak_mb": peak}


def test_time_to_target_is_the_first_evaluation_that_reaches_it(bench):
    curve = [(0, 0.0, 0.18), (3, 3.0, 0.25), (6, 6.5, 0.30), (9, 9.0, 0.20), (12, 12.0, 0.31)]
    assert bench.time_to(curve, 0.30) == 6.5  # the first reach, not the last or the best
    assert bench.time_to(curve, 0.25) == 3.0  # reaching counts (>=)
    assert bench.time_to(curve, 0.32) is None


def test_ratios_by_hand(bench):
    runs = [
        _run("mmgrpo", 0, [(0, 0.0, 0.2), (3, 2.0, 0.3)], [1.0, 1.0, 2.0], 1000.0),
        _run("mmgrpo", 1, [(0, 0.0, 0.2), (3, 4.0, 0.35)], [1.0, 3.0, 1.0], 1200.0),
        _run("trl", 0, [(0, 0.0, 0.2), (3, 5.0, 0.3)], [2.0, 2.0, 2.0], 1500.0),
        _run("trl", 1, [(0, 0.0, 0.2), (3, 6.0, 0.25)], [2.0, 3.0, 2.0], 1800.0),
    ]
    table = bench.summarize(runs, target=0.3)
    assert table["mmgrpo"]["median_step_s"] == 1.0 and table["trl"]["median_step_s"] == 2.0  # medians of 6 steps
    assert table["mmgrpo"]["time_to_target_s"] == [2.0, 4.0] and table["trl"]["time_to_target_s"] == [5.0, None]
    ratios = table["ratios"]
    assert ratios["step (TRL / mmgrpo)"] == 2.0
    assert ratios["peak memory (TRL / mmgrpo)"] == 1.5  # the peaks over the seeds: 1800 / 1200
    assert ratios["time to target, per seed (TRL / mmgrpo)"] == [2.5]  # seed 1: TRL never reached it
    text = bench.markdown(table, 0.3, "cpu", 3)
    assert "| trl | 1 | 0.20 | 0.25 | 0.25 | not reached |" in text and "step 2.00x" in text
