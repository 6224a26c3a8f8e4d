"""Flow time-to-reward: training CPU seconds to reach a fixed held-out reward on the synthetic flow_shapes task.

    OMP_NUM_THREADS=1 nice -n 10 python benchmarks/flow_time_to_reward.py --seeds 0 1 2 --steps 150 \\
        --eval-every 10 --out runs/flow_ttr --plot docs/img/flow_time_to_reward.png

(``--settings A B …`` runs a subset. Two subsets can run in two processes, each with its own ``--out``, and be
merged with ``--merge OUT_A OUT_B --no-warmup``, which reuses their runs and trains nothing that is already there;
the recorded CPU seconds are per process, so they do not depend on how the runs were split.)

Settings (all from the shipped base ``tiny-sd3-flow-shapes`` and the hyper-parameters of ``configs/flow_grpo.yaml``;
each changes only the keys shown in ``SETTINGS``):

- ``grpo``: the Flow-GRPO default (Liu et al. 2025, arXiv 2505.05470, §5.1; yifan123/flow_grpo ``config/grpo.py``):
  CFG with w = 4.5 (their SD3.5 value) in rollout, training and evaluation, every rollout step stochastic and the
  first ⌊0.99·T⌋ = 7 of T = 8 trained (``steps: fraction``; their ``timestep_fraction`` 0.99 skips only the last,
  near-clean step). CFG is meaningful on this base: ``examples/pretrain_tiny_flow.py`` drops the prompt to "" with
  probability 0.1 (``cond_dropout``), so the "" branch is a trained unconditional model. It costs twice the
  denoiser rows per step, and on this base it lowers the held-out reward of the untrained model (0.594 at w = 4.5
  vs 0.639 CFG-free, 16-step ODE evaluation): the target is measured under CFG, as the paper's evaluation is.
- ``temporal``: as grpo with TempFlow-GRPO's noise-level step weights (He et al. 2025, arXiv 2508.04324, §3.2;
  ``configs/flow_temporal.yaml``).
- ``sde_window``: Flow-GRPO-Fast (yifan123/flow_grpo ``scripts/train_sd3_fast.py``): one 2-step SDE window drawn in
  steps 0–3 (the high-noise half), ODE elsewhere; only the window is trained. CFG as grpo.
- ``sliding_window``: MixGRPO (Li et al. 2025, arXiv 2507.21802, §3.2): a 2-step window that moves one step
  towards low noise every 25 iterations (the selector's default ``every``). CFG as grpo.
- ``branching``: TempFlow-GRPO trajectory branching (arXiv 2508.04324, §3.1): one stochastic, trained step per group,
  with TempFlow weights. CFG as grpo.
- ``sde_window_temporal``: the SDE window with TempFlow weights. CFG as grpo.
- ``nocfg``: grpo without CFG (the recipe ``configs/flow_grpo.yaml`` ships; Flow-GRPO's "No-CFG training on SD3",
  yifan123/flow_grpo README, 2025-10-14): conditional velocity only in rollout, training and evaluation. It
  differs from grpo by definition in the sampler that is evaluated, so its curve starts from the CFG-free base
  (0.639), above the CFG base (0.594); the docs report the CFG-matched settings separately.
- ``nocfg_sde_window_temporal``: the cheapest combination: CFG-free, SDE window, TempFlow weights.
- ``dgpo``: DGPO (Luo et al. 2025, arXiv 2510.08425; Luo-Yihong/DGPO) as ``configs/variant_dgpo.yaml`` ships it:
  CFG-free deterministic (ODE) rollouts, the group-preference loss on M = 4 DSM levels, β = 0.02 velocity KL, one
  update per rollout batch. Its sampler is CFG-free, so it is compared with ``nocfg`` (same evaluation sampler) as
  well as with grpo's target. One iteration costs about what a CFG-free one does (0.34 s vs 0.33 s for
  ``configs/flow_grpo.yaml`` on one thread), so its scale is nocfg's.

Every setting gets about grpo's CPU budget: one iteration of a setting that trains fewer steps, or runs no CFG,
costs less, so it runs ``scale`` × grpo's iterations (and evaluates every ``scale`` × as many), ``scale`` = grpo's
CPU per iteration ÷ its own, measured on 4 iterations (0.70 s for grpo; 0.41 window, 0.35 branching, 0.39 CFG-free,
0.25 CFG-free window). The table reports the CPU per iteration of the real runs.

Time axis: ``time.process_time()`` of this (the training) process, i.e. user + system CPU of all its threads
(reward threads included), counted from the start of ``Trainer.run`` with the CPU spent inside each held-out
evaluation subtracted; model loading is not counted. ``resource.getrusage(RUSAGE_CHILDREN)`` is recorded per run
to show that no work ran in child processes. Wall time is recorded but not used: the machine is shared.

Target: the grpo setting's final held-out reward (``eval/after``: 8 held-out prompts × 4 fixed noises), mean over
seeds. Per run, "CPU to target" is the training CPU at the first evaluation whose reward is ≥ the target; the mean
curve (evaluations aligned by iteration, reward and CPU averaged over seeds) gives the row's headline number, its
ratio to grpo's whole budget (the issue's criterion: ≤ ⅓) and the reward it has at ⅓ of that budget (linear between
evaluations). Writes ``results.json``, ``summary.json``, ``table.md`` and the plot (reward vs training CPU, mean
over seeds with the min–max band).
"""

from __future__ import annotations

import argparse
import itertools
import json
import resource
import shutil
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from mmgrpo.loader import load_config
from mmgrpo.trainer import Trainer

ROOT = Path(__file__).resolve().parents[1]
CFG = ["model.args.cfg=guided", "model.args.guidance_scale=4.5"]  # Flow-GRPO SD3.5: CFG 4.5 in rollout, training, eval
WINDOW = ["model.args.steps=sde_window", "model.args.step_args={window: 2, high: 4}"]


@dataclass(frozen=True)
class Setting:
    config: str
    overrides: list[str] = field(default_factory=list)
    scale: float = 1.0  # iterations (and evaluation interval) relative to --steps / --eval-every
    note: str = ""


SETTINGS = {
    "grpo": Setting("configs/flow_grpo.yaml", CFG, 1.0, "Flow-GRPO default: CFG 4.5, all 8 steps SDE, first 7 trained"),
    "temporal": Setting("configs/flow_temporal.yaml", CFG, 1.0, "as grpo + TempFlow step weights"),
    "sde_window": Setting("configs/flow_grpo.yaml", CFG + WINDOW, 1.7, "CFG, 2-step SDE window in steps 0–3"),
    "sliding_window": Setting(
        "configs/flow_grpo.yaml",
        [*CFG, "model.args.steps=sliding_window", "model.args.step_args={window: 2, stride: 1, every: 25}"],
        1.7,
        "CFG, 2-step window, +1 step every 25 iterations",
    ),
    "branching": Setting(
        "configs/flow_temporal.yaml",
        [*CFG, "model.args.steps=branching", "model.args.step_args={}"],
        2.0,
        "CFG, 1 SDE + trained step per group, TempFlow weights",
    ),
    "sde_window_temporal": Setting(
        "configs/flow_temporal.yaml", CFG + WINDOW, 1.7, "CFG, SDE window + TempFlow step weights"
    ),
    "nocfg": Setting("configs/flow_grpo.yaml", [], 1.8, "CFG-free (shipped recipe), all steps SDE, 7 trained"),
    "nocfg_sde_window_temporal": Setting(
        "configs/flow_temporal.yaml", WINDOW, 2.8, "CFG-free, SDE window + TempFlow step weights"
    ),
    "dgpo": Setting(
        "configs/variant_dgpo.yaml", [], 1.8, "DGPO: CFG-free ODE rollouts, group preference on 4 DSM levels"
    ),
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


def run_one(name: str, seed: int, steps: int, eval_every: int, out: Path, extra: tuple[str, ...] = ()) -> dict:
    s = SETTINGS[name]
    run_dir = out / f"{name}-seed{seed}"
    if run_dir.exists():
        shutil.rmtree(run_dir)  # this benchmark's own output from an earlier attempt
    n_steps = max(1, round(steps * s.scale))
    every = max(1, round(eval_every * s.scale))
    overrides = [
        f"output_dir={run_dir}", f"seed={seed}", f"steps={n_steps}", f"eval.every={every}", "eval.before=true",
        "eval.after=true", "checkpoint.save_final=false", *s.overrides, *extra,
    ]  # fmt: skip
    cfg = load_config(ROOT / s.config, overrides)
    children0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    wall0 = time.perf_counter()
    trainer = TimedTrainer(cfg)
    trainer.run()
    if trainer.curve[-1]["step"] != n_steps:  # SIGTERM / Ctrl-C: the trainer saved and stopped early
        stop = trainer.curve[-1]["step"]
        raise SystemExit(f"{name} seed {seed} stopped at iteration {stop} of {n_steps}; the run is not recorded")
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


def reward_at(curve: list[dict], cpu: float) -> float | None:
    """Held-out reward at ``cpu`` training seconds, linear between evaluations (None: the curve ends before)."""
    for a, b in itertools.pairwise(curve):
        if a["train_cpu_s"] <= cpu <= b["train_cpu_s"]:
            w = (cpu - a["train_cpu_s"]) / max(b["train_cpu_s"] - a["train_cpu_s"], 1e-12)
            return a["reward"] + w * (b["reward"] - a["reward"])
    return None


def summarize(results: dict[str, list[dict]]) -> dict:
    """Target (grpo's final reward, mean over seeds) and, per setting, CPU seconds to reach it."""
    grpo = results["grpo"]
    target = statistics.mean(r["curve"][-1]["reward"] for r in grpo)
    grpo_budget = statistics.mean(r["train_cpu_s"] for r in grpo)
    grpo_reach = first_reach(mean_curve(grpo), target)
    rows = {}
    for name, runs in results.items():
        finals = [r["curve"][-1]["reward"] for r in runs]
        curve = mean_curve(runs)
        reach = first_reach(curve, target)
        rows[name] = {
            "seeds": [r["seed"] for r in runs],
            "steps": runs[0]["steps"],
            "cpu_per_step_s": statistics.mean(r["train_cpu_s"] / r["steps"] for r in runs),
            "budget_cpu_s": statistics.mean(r["train_cpu_s"] for r in runs),
            "start_reward": statistics.mean(r["curve"][0]["reward"] for r in runs),
            "final_reward": finals,
            "final_realism": [r["curve"][-1].get("realism", float("nan")) for r in runs],
            "reward_at_third": reward_at(curve, grpo_budget / 3),
            "reach_per_seed": [first_reach(r["curve"], target) for r in runs],
            "reach_mean_curve": reach,
            "vs_grpo_budget": None if reach is None else reach / grpo_budget,
            "vs_grpo_reach": None if reach is None or not grpo_reach else reach / grpo_reach,
        }
    return {"target": target, "grpo_budget_cpu_s": grpo_budget, "grpo_reach_cpu_s": grpo_reach, "rows": rows}


def _fmt(values: list[float]) -> str:
    if any(v != v for v in values):  # NaN: not recorded
        return "—"
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
        "| setting | what | iterations | CPU s / iteration | reward before | final held-out reward | final realism "
        "| reward at ⅓ grpo budget | CPU s to target, per seed | CPU s to target, mean curve | ÷ grpo budget "
        "| ÷ grpo's own time to target |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in summary["rows"].items():
        ratio = "—" if r["vs_grpo_budget"] is None else f"{r['vs_grpo_budget']:.2f}"
        ratio2 = "—" if r["vs_grpo_reach"] is None else f"{r['vs_grpo_reach']:.2f}"
        third = "—" if r["reward_at_third"] is None else f"{r['reward_at_third']:.3f}"
        per_seed = ", ".join(_sec(x) for x in r["reach_per_seed"])
        lines.append(
            f"| {name} | {SETTINGS[name].note} | {r['steps']} | {r['cpu_per_step_s']:.2f} | {r['start_reward']:.3f} "
            f"| {_fmt(r['final_reward'])} | {_fmt(r['final_realism'])} | {third} | {per_seed} "
            f"| {_sec(r['reach_mean_curve'])} | {ratio} | {ratio2} |"
        )
    return "\n".join(lines) + "\n"


def plot(results: dict[str, list[dict]], target: float, grpo_budget: float, path: Path) -> None:
    """Reward vs training CPU per setting (mean over seeds, min–max band), the target and ⅓ of grpo's budget."""
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
    ax.axvline(grpo_budget / 3, color="grey", ls=":", lw=1, label="⅓ of grpo's CPU budget")
    ax.set_xlabel("training CPU seconds (process time, evaluation excluded)")
    ax.set_ylabel("held-out reward (8 prompts × 4 noises)")
    ax.set_title("flow_shapes: held-out reward vs CPU time (mean, band = min–max over seeds)", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower left")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


def _reuse(done: dict[str, list[dict]], name: str, seed: int, steps: int) -> dict | None:
    """The recorded run of (setting, seed) from --resume / --merge, if any; it must have this --steps' iterations."""
    r = next((r for r in done.get(name, []) if r["seed"] == seed), None)
    want = max(1, round(steps * SETTINGS[name].scale))
    if r is not None and r["steps"] != want:
        raise SystemExit(f"{name} seed {seed}: the recorded run has {r['steps']} iterations, --steps {steps} needs "
                         f"{want}; pass the --steps it was run with, or another --out")  # fmt: skip
    return r


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--steps", type=int, default=150, help="grpo's iterations; the others run scale × as many")
    ap.add_argument("--eval-every", type=int, default=10, help="grpo's evaluation interval (× scale for the others)")
    ap.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    ap.add_argument("--out", default="runs/flow_ttr")
    ap.add_argument(
        "--override", nargs="*", default=[], help="extra config overrides for every run, e.g. rollout_noise=per_process"
    )
    ap.add_argument("--plot", default=None, help="PNG path for the plot (none if omitted)")
    ap.add_argument("--resume", action="store_true", help="keep the runs already in OUT/results.json")
    ap.add_argument("--merge", nargs="+", default=[], help="also keep the runs in these dirs' results.json")
    ap.add_argument("--warmup", action=argparse.BooleanOptionalAction, default=True,
                    help="one unrecorded 1-iteration grpo run first, so one-time costs (lazy imports, first "
                         "allocations) are not charged to the first recorded run")  # fmt: skip
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    results_path = out / "results.json"
    done = json.loads(results_path.read_text()) if a.resume and results_path.exists() else {}
    for other in a.merge:
        for name, runs in json.loads((Path(other) / "results.json").read_text()).items():
            done.setdefault(name, []).extend(runs)
    if a.warmup:
        run_one("grpo", a.seeds[0], 1, 1, out / "warmup")
    results: dict[str, list[dict]] = {name: [] for name in a.settings}
    for seed in a.seeds:  # seeds outer: an interrupted benchmark has every setting at its first seeds
        for name in a.settings:
            r = _reuse(done, name, seed, a.steps) or run_one(name, seed, a.steps, a.eval_every, out, tuple(a.override))
            results[name].append(r)
            kept = {n: [d for d in done.get(n, []) if d["seed"] not in {x["seed"] for x in results.get(n, [])}]
                    for n in {*done, *results}}  # fmt: skip
            results_path.write_text(json.dumps({n: results.get(n, []) + kept[n] for n in kept}, indent=1))
            print(f"{name} seed {seed}: reward {r['curve'][0]['reward']:.3f} -> {r['curve'][-1]['reward']:.3f} in "
                  f"{r['train_cpu_s']:.1f} training CPU s (+{r['eval_cpu_s']:.1f} eval, {r['wall_s']:.0f} s wall)",
                  flush=True)  # fmt: skip
    if "grpo" not in results or not results["grpo"]:
        print(f"runs in {results_path}; no grpo runs, so no summary: pass this OUT to --merge of a run with grpo")
        return {}
    summary = summarize(results)
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    md = table(summary)
    (out / "table.md").write_text(md)
    if a.plot:
        plot(results, summary["target"], summary["grpo_budget_cpu_s"], Path(a.plot))
    print(md)
    return summary


if __name__ == "__main__":
    main()
