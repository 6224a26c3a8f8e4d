"""Flow time-to-reward: training CPU seconds to reach a fixed held-out reward on the synthetic flow_shapes task.

    OMP_NUM_THREADS=1 nice -n 10 python benchmarks/flow_time_to_reward.py --seeds 0 1 2 --steps 150 \\
        --eval-every 10 --out runs/flow_ttr --plot docs/img/flow_time_to_reward.png

Settings (all from the shipped base ``tiny-sd3-flow-shapes``, the hyper-parameters of ``configs/flow_grpo.yaml``;
each changes only the keys shown in ``SETTINGS``):

- ``grpo``: the Flow-GRPO default (Liu et al. 2025, arXiv 2505.05470, §5.1): every rollout step stochastic, the
  first 7 of 8 trained (``steps: fraction``, 0.99), CFG as shipped (``cfg: none``, the "nocfg" recipe).
- ``temporal``: ``configs/flow_temporal.yaml``, TempFlow-GRPO's noise-level step weights (He et al. 2025,
  arXiv 2508.04324, §3.2) on the same steps.
- ``sde_window``: Flow-GRPO-Fast (yifan123/flow_grpo ``scripts/train_sd3_fast.py``): one 2-step SDE window drawn in
  the high-noise half, ODE elsewhere; only the window is trained.
- ``sliding_window``: MixGRPO (Li et al. 2025, arXiv 2507.21802, §3.2): a 2-step window that moves one step
  towards low noise every 25 iterations (the selector's default ``every``).
- ``branching``: TempFlow-GRPO trajectory branching (arXiv 2508.04324, §3.1): one stochastic, trained step per group,
  with TempFlow weights.
- ``sde_window_temporal``: the SDE window with TempFlow weights.

The settings that train fewer steps cost about 0.6× grpo's CPU per iteration, so they run ``scale`` = 1.6× the
iterations (and evaluate every 1.6× as many): every setting gets about the CPU budget of the grpo run.

Time axis: ``time.process_time()`` of this (the training) process, i.e. user + system CPU of all its threads
(reward threads included), counted from the start of ``Trainer.run`` with the CPU spent inside each held-out
evaluation subtracted; model loading is not counted. ``resource.getrusage(RUSAGE_CHILDREN)`` is recorded per run
to show that no work ran in child processes. Wall time is recorded but not used: the machine is shared.

Target: the grpo setting's final held-out reward (``eval/after``), mean over seeds. Per run, "CPU to target" is the
training CPU at the first evaluation whose reward is ≥ the target; the mean curve (evaluations aligned by
iteration, reward and CPU averaged over seeds) gives the row's headline number. Writes ``results.json``,
``table.md`` and the plot (reward vs training CPU, mean over seeds with the min–max band).
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from mmgrpo.config import load_config
from mmgrpo.trainer import Trainer

ROOT = Path(__file__).resolve().parents[1]
WINDOW = ["model.args.steps=sde_window", "model.args.step_args={window: 2, high: 4}"]


@dataclass(frozen=True)
class Setting:
    config: str
    overrides: list[str] = field(default_factory=list)
    scale: float = 1.0  # iterations (and evaluation interval) relative to --steps / --eval-every
    note: str = ""


SETTINGS = {
    "grpo": Setting("configs/flow_grpo.yaml", [], 1.0, "all 8 steps SDE, first 7 trained"),
    "temporal": Setting("configs/flow_temporal.yaml", [], 1.0, "as grpo + TempFlow step weights"),
    "sde_window": Setting("configs/flow_grpo.yaml", WINDOW, 1.6, "2-step SDE window in steps 0–3"),
    "sliding_window": Setting(
        "configs/flow_grpo.yaml",
        ["model.args.steps=sliding_window", "model.args.step_args={window: 2, stride: 1, every: 25}"],
        1.6,
        "2-step window, +1 step every 25 iterations",
    ),
    "branching": Setting(
        "configs/flow_temporal.yaml",
        ["model.args.steps=branching", "model.args.step_args={}"],
        1.6,
        "1 SDE + trained step per group, TempFlow weights",
    ),
    "sde_window_temporal": Setting("configs/flow_temporal.yaml", WINDOW, 1.6, "SDE window + TempFlow step weights"),
}


class TimedTrainer(Trainer):
    """The trainer, with the CPU time of every held-out evaluation measured and taken out of the training clock."""

    def run(self) -> dict:
        self.curve: list[dict] = []
        self._eval_cpu = 0.0
        self._cpu0 = time.process_time()
        return super().run()

    def _evaluate(self, stage: str, step: int | None = None) -> dict[str, float]:
        start = time.process_time()
        train_cpu = start - self._cpu0 - self._eval_cpu
        result = super()._evaluate(stage, step)
        eval_cpu = time.process_time() - start
        self._eval_cpu += eval_cpu
        self.curve.append({
            "step": self.state.step,
            "train_cpu_s": train_cpu,
            "eval_cpu_s": eval_cpu,
            "reward": result[f"eval/{stage}/reward"],
            "realism": result.get(f"eval/{stage}/realism", float("nan")),
        })  # fmt: skip
        return result


def run_one(name: str, seed: int, steps: int, eval_every: int, out: Path) -> dict:
    s = SETTINGS[name]
    run_dir = out / f"{name}-seed{seed}"
    if run_dir.exists():
        shutil.rmtree(run_dir)  # this benchmark's own output from an earlier attempt
    n_steps = max(1, round(steps * s.scale))
    every = max(1, round(eval_every * s.scale))
    overrides = [
        f"output_dir={run_dir}", f"seed={seed}", f"steps={n_steps}", f"eval.every={every}", "eval.before=true",
        "eval.after=true", "checkpoint.save_final=false", *s.overrides,
    ]  # fmt: skip
    cfg = load_config(ROOT / s.config, overrides)
    children0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    wall0 = time.perf_counter()
    trainer = TimedTrainer(cfg)
    trainer.run()
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {
        "setting": name,
        "seed": seed,
        "steps": n_steps,
        "curve": trainer.curve,
        "train_cpu_s": trainer.curve[-1]["train_cpu_s"],
        "eval_cpu_s": sum(p["eval_cpu_s"] for p in trainer.curve),
        "children_cpu_s": (children.ru_utime + children.ru_stime) - (children0.ru_utime + children0.ru_stime),
        "wall_s": time.perf_counter() - wall0,
    }


def first_reach(curve: list[dict], target: float) -> float | None:
    """Training CPU seconds at the first evaluation whose held-out reward is ≥ target (None: never)."""
    return next((p["train_cpu_s"] for p in curve if p["reward"] >= target), None)


def mean_curve(runs: list[dict]) -> list[dict]:
    """Evaluations aligned by iteration: mean CPU, mean / min / max reward over the seeds that have that point."""
    by_step: dict[int, list[dict]] = {}
    for r in runs:
        for p in r["curve"]:
            by_step.setdefault(p["step"], []).append(p)
    n = len(runs)
    return [
        {
            "step": step,
            "train_cpu_s": statistics.mean(p["train_cpu_s"] for p in pts),
            "reward": statistics.mean(p["reward"] for p in pts),
            "low": min(p["reward"] for p in pts),
            "high": max(p["reward"] for p in pts),
        }
        for step, pts in sorted(by_step.items())
        if len(pts) == n
    ]


def summarize(results: dict[str, list[dict]]) -> dict:
    """Target (grpo's final reward, mean over seeds) and, per setting, CPU seconds to reach it."""
    grpo = results["grpo"]
    target = statistics.mean(r["curve"][-1]["reward"] for r in grpo)
    grpo_budget = statistics.mean(r["train_cpu_s"] for r in grpo)
    grpo_reach = first_reach(mean_curve(grpo), target)
    rows = {}
    for name, runs in results.items():
        finals = [r["curve"][-1]["reward"] for r in runs]
        reach = first_reach(mean_curve(runs), target)
        rows[name] = {
            "seeds": [r["seed"] for r in runs],
            "steps": runs[0]["steps"],
            "cpu_per_step_s": statistics.mean(r["train_cpu_s"] / r["steps"] for r in runs),
            "budget_cpu_s": statistics.mean(r["train_cpu_s"] for r in runs),
            "final_reward": finals,
            "reach_per_seed": [first_reach(r["curve"], target) for r in runs],
            "reach_mean_curve": reach,
            "vs_grpo_budget": None if reach is None else reach / grpo_budget,
            "vs_grpo_reach": None if reach is None or not grpo_reach else reach / grpo_reach,
        }
    return {"target": target, "grpo_budget_cpu_s": grpo_budget, "grpo_reach_cpu_s": grpo_reach, "rows": rows}


def _fmt(values: list[float]) -> str:
    if len(values) == 1:
        return f"{values[0]:.3f}"
    return f"{statistics.mean(values):.3f} ± {statistics.stdev(values):.3f}"


def _sec(x: float | None) -> str:
    return "not reached" if x is None else f"{x:.1f}"


def table(summary: dict) -> str:
    lines = [
        f"Target: grpo's final held-out reward, mean over its seeds = **{summary['target']:.3f}**; grpo's whole "
        f"budget = {summary['grpo_budget_cpu_s']:.0f} CPU s of training.",
        "",
        "| setting | what | iterations | CPU s / iteration | final held-out reward | CPU s to target, per seed "
        "| CPU s to target, mean curve | ÷ grpo budget | ÷ grpo's own time to target |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in summary["rows"].items():
        ratio = "—" if r["vs_grpo_budget"] is None else f"{r['vs_grpo_budget']:.2f}"
        ratio2 = "—" if r["vs_grpo_reach"] is None else f"{r['vs_grpo_reach']:.2f}"
        per_seed = ", ".join(_sec(x) for x in r["reach_per_seed"])
        lines.append(
            f"| {name} | {SETTINGS[name].note} | {r['steps']} | {r['cpu_per_step_s']:.2f} | {_fmt(r['final_reward'])} "
            f"| {per_seed} | {_sec(r['reach_mean_curve'])} | {ratio} | {ratio2} |"
        )
    return "\n".join(lines) + "\n"


def plot(results: dict[str, list[dict]], target: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=90)
    for name, runs in results.items():
        c = mean_curve(runs)
        x = [p["train_cpu_s"] for p in c]
        (line,) = ax.plot(x, [p["reward"] for p in c], lw=1.5, label=f"{name} ({len(runs)} seeds)")
        ax.fill_between(x, [p["low"] for p in c], [p["high"] for p in c], color=line.get_color(), alpha=0.15, lw=0)
    ax.axhline(target, color="k", ls="--", lw=1, label=f"target = grpo final ({target:.3f})")
    ax.set_xlabel("training CPU seconds (process time, evaluation excluded)")
    ax.set_ylabel("held-out reward (8 prompts × 4 noises)")
    ax.set_title("flow_shapes: held-out reward vs CPU time (mean, band = min–max over seeds)", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--steps", type=int, default=150, help="grpo's iterations; the others run scale × as many")
    ap.add_argument("--eval-every", type=int, default=10, help="grpo's evaluation interval (× scale for the others)")
    ap.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    ap.add_argument("--out", default="runs/flow_ttr")
    ap.add_argument("--plot", default=None, help="PNG path for the plot (none if omitted)")
    ap.add_argument("--resume", action="store_true", help="keep the runs already in OUT/results.json")
    ap.add_argument("--warmup", action=argparse.BooleanOptionalAction, default=True,
                    help="one unrecorded 1-iteration grpo run first, so one-time costs (lazy imports, first "
                         "allocations) are not charged to the first recorded run")  # fmt: skip
    a = ap.parse_args(argv)
    if "grpo" not in a.settings:
        ap.error("--settings must include grpo: its final reward is the target")
    torch.set_num_threads(1)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    results_path = out / "results.json"
    done = json.loads(results_path.read_text()) if a.resume and results_path.exists() else {}
    if a.warmup:
        run_one("grpo", a.seeds[0], 1, 1, out / "warmup")
    results: dict[str, list[dict]] = {name: [] for name in a.settings}
    for seed in a.seeds:  # seeds outer: an interrupted benchmark has every setting at its first seeds
        for name in a.settings:
            r = next((r for r in done.get(name, []) if r["seed"] == seed), None) or run_one(
                name, seed, a.steps, a.eval_every, out
            )
            results[name].append(r)
            kept = {n: [d for d in done.get(n, []) if d["seed"] not in {x["seed"] for x in results.get(n, [])}]
                    for n in {*done, *results}}  # fmt: skip
            results_path.write_text(json.dumps({n: results.get(n, []) + kept[n] for n in kept}, indent=1))
            print(f"{name} seed {seed}: reward {r['curve'][0]['reward']:.3f} -> {r['curve'][-1]['reward']:.3f} in "
                  f"{r['train_cpu_s']:.1f} training CPU s (+{r['eval_cpu_s']:.1f} eval, {r['wall_s']:.0f} s wall)",
                  flush=True)  # fmt: skip
    summary = summarize(results)
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    md = table(summary)
    (out / "table.md").write_text(md)
    if a.plot:
        plot(results, summary["target"], Path(a.plot))
    print(md)
    return summary


if __name__ == "__main__":
    main()
