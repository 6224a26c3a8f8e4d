"""benchmarks/flow_time_to_reward.py: the time-to-reward bookkeeping by hand; the whole machinery on 2 iterations."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest

PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "flow_time_to_reward.py"


@pytest.fixture(scope="module")
def ttr():
    spec = importlib.util.spec_from_file_location("flow_time_to_reward", PATH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve the module's string annotations through sys.modules
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


def _run(seed: int, points: list[tuple[int, float, float]]) -> dict:
    curve = [{"step": s, "train_cpu_s": c, "eval_cpu_s": 1.0, "reward": r} for s, c, r in points]
    return {"seed": seed, "steps": points[-1][0], "curve": curve, "train_cpu_s": points[-1][1],
            "eval_cpu_s": float(len(curve)), "wall_s": 0.0}  # fmt: skip


def test_target_and_first_reach_by_hand(ttr):
    grpo = [_run(0, [(0, 0.0, 0.60), (10, 4.0, 0.70), (20, 8.0, 0.76)]),
            _run(1, [(0, 0.0, 0.60), (10, 4.2, 0.74), (20, 8.2, 0.74)])]  # fmt: skip
    fast = [_run(0, [(0, 0.0, 0.60), (16, 2.0, 0.755), (32, 4.0, 0.70)]),
            _run(1, [(0, 0.0, 0.60), (16, 2.2, 0.70), (32, 4.4, 0.76)])]  # fmt: skip
    s = ttr.summarize({"grpo": grpo, "sde_window": fast})
    assert s["target"] == pytest.approx(0.75)  # mean of grpo's final rewards 0.76, 0.74
    assert s["grpo_budget_cpu_s"] == pytest.approx(8.1)
    g, f = s["rows"]["grpo"], s["rows"]["sde_window"]
    assert g["reach_per_seed"] == [8.0, None]  # seed 1 never reaches 0.75
    assert g["reach_mean_curve"] == pytest.approx(8.1)  # mean rewards 0.60, 0.72, 0.75
    assert f["reach_per_seed"] == [2.0, 4.4]
    assert f["reach_mean_curve"] is None  # mean rewards 0.60, 0.7275, 0.73: the mean curve never gets there
    assert f["vs_grpo_budget"] is None
    assert "not reached" in ttr.table(s)


def test_reward_at_interpolates_between_evaluations(ttr):
    curve = _run(0, [(0, 0.0, 0.6), (1, 4.0, 0.7), (2, 8.0, 0.8)])["curve"]
    assert ttr.reward_at(curve, 1.0) == pytest.approx(0.625)
    assert ttr.reward_at(curve, 6.0) == pytest.approx(0.75)
    assert ttr.reward_at(curve, 9.0) is None  # past the last evaluation: not extrapolated
    grpo = [_run(0, [(0, 0.0, 0.60), (10, 4.0, 0.70), (20, 9.0, 0.76)])]
    fast = [_run(0, [(0, 0.0, 0.60), (17, 2.0, 0.72), (34, 4.0, 0.77)])]
    row = ttr.summarize({"grpo": grpo, "sde_window": fast})["rows"]["sde_window"]
    assert row["reward_at_third"] == pytest.approx(0.745)  # 3.0 s = ⅓ of grpo's 9.0: halfway from 0.72 to 0.77
    assert row["reach_per_seed"] == [4.0] and row["vs_grpo_budget"] == pytest.approx(4.0 / 9.0)


def test_merge_reuses_recorded_runs_and_checks_their_length(ttr, tmp_path):
    grpo = _run(0, [(0, 0.0, 0.60), (1, 1.0, 0.70), (2, 2.0, 0.74)])
    fast = _run(0, [(0, 0.0, 0.60), (2, 1.0, 0.75), (3, 1.5, 0.76)])  # sde_window: round(2 × 1.7) = 3 iterations
    for sub, runs in (("a", {"grpo": [grpo]}), ("b", {"sde_window": [fast]})):
        (tmp_path / sub).mkdir()
        (tmp_path / sub / "results.json").write_text(json.dumps(runs))
    args = ["--seeds", "0", "--settings", "grpo", "sde_window", "--out", str(tmp_path / "m"), "--no-warmup",
            "--merge", str(tmp_path / "a"), str(tmp_path / "b")]  # fmt: skip
    s = ttr.main([*args, "--steps", "2"])  # nothing to train: a run would take seconds and change the curves
    assert s["target"] == pytest.approx(0.74)
    assert s["rows"]["sde_window"]["reach_per_seed"] == [1.0]
    assert json.loads((tmp_path / "m" / "results.json").read_text()) == {"grpo": [grpo], "sde_window": [fast]}
    with pytest.raises(SystemExit, match="recorded run has 2 iterations"):
        ttr.main([*args, "--steps", "3"])


def test_mean_curve_keeps_only_points_every_seed_has(ttr):
    runs = [_run(0, [(0, 0.0, 0.6), (10, 4.0, 0.7)]), _run(1, [(0, 0.0, 0.6)])]
    c = ttr.mean_curve(runs)
    assert [p["step"] for p in c] == [0]


def test_benchmark_runs_two_iterations(ttr, tmp_path):
    png = tmp_path / "ttr.png"
    s = ttr.main(["--seeds", "0", "--steps", "2", "--eval-every", "1", "--settings", "grpo", "--out", str(tmp_path),
                  "--plot", str(png), "--no-warmup"])  # fmt: skip
    run = json.loads((tmp_path / "results.json").read_text())["grpo"][0]
    curve = run["curve"]
    assert [p["step"] for p in curve] == [0, 1, 2]  # before, eval.every = 1, after
    cpu = [p["train_cpu_s"] for p in curve]
    assert cpu[0] < 0.2 < cpu[1] < cpu[2]  # the clock starts at run(); each iteration costs CPU
    assert all(p["eval_cpu_s"] > 0.1 for p in curve)  # evaluations are measured, and not in the clock
    # all the work ran in this process: child CPU (RUSAGE_CHILDREN, which in a long pytest session also counts an
    # earlier test's child reaped inside this window) stays a small fraction of the trainer's own
    assert run["children_cpu_s"] < 0.1 * cpu[-1]
    assert s["target"] == pytest.approx(curve[-1]["reward"])
    assert s["rows"]["grpo"]["reach_mean_curve"] <= cpu[-1]
    assert png.stat().st_size > 1000
    assert (tmp_path / "table.md").read_text().startswith("Target: grpo's final held-out reward")


def test_a_run_that_stopped_early_is_not_recorded(ttr, tmp_path, monkeypatch):
    def stopped(self):  # what Trainer.run leaves after SIGTERM at iteration 1 of 2: before, then the final eval
        self.curve = [{"step": 0, "train_cpu_s": 0.0, "reward": 0.6}, {"step": 1, "train_cpu_s": 0.5, "reward": 0.6}]
        return {}

    monkeypatch.setattr(ttr.TimedTrainer, "run", stopped)
    with pytest.raises(SystemExit, match="stopped at iteration 1 of 2"):
        ttr.run_one("grpo", 0, 2, 1, tmp_path)
