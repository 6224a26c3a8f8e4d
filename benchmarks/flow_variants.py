"""Flow-GRPO variants on the synthetic flow_shapes task: held-out reward and quality before vs after, on CPU.

    OMP_NUM_THREADS=1 python benchmarks/flow_variants.py --seeds 0 1 2 --steps 150 --extra --out runs/flow_variants

Trains ``configs/flow_{grpo,chunk,temporal,value_anchored}.yaml`` (identical except the variant's own keys) from
the same shipped base (``tiny-sd3-flow-shapes``) for each seed, in one process, and writes ``results.json`` and
``table.md`` (the table in ``docs/flow.md``). "before" is the base model on the 8 held-out prompts × 4 noises
(evaluation is deterministic, so it is the same for every run); "after" is the trained policy on the same rows.
Numbers are mean ± std over seeds. ``--extra`` adds GRPO-Guard, TempFlow branching, Flow-GRPO-Fast, DanceGRPO and CPS
rows (seeds ``--extra-seeds``). Quality proxy: ``realism`` = exp(−RMSE to the nearest clean rendering / 0.1) (higher
is better). Cost is the process CPU time of a whole run (training + two evaluations) relative to grpo's: wall-clock
times on a shared machine depend on its load.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

VARIANTS = {
    "grpo": ("configs/flow_grpo.yaml", []),
    "chunk": ("configs/flow_chunk.yaml", []),
    "temporal": ("configs/flow_temporal.yaml", []),
    "value_anchored": ("configs/flow_value_anchored.yaml", []),
}
EXTRA = {
    "grpo_guard": (
        "configs/flow_temporal.yaml",
        ["algorithm.ratio_norm=true", "algorithm.shaping_args.weights=inv_dt"],
    ),
    "tempflow_branching": ("configs/flow_temporal.yaml", ["model.args.steps=branching", "model.args.step_args={}"]),
    "fast_window": (
        "configs/flow_grpo.yaml",
        ["model.args.steps=sde_window", "model.args.step_args={window: 2, high: 4}"],
    ),
    "dance_sde": ("configs/flow_grpo.yaml", ["model.args.kernel=dance_sde", "model.args.noise_level=0.3"]),
    "cps": ("configs/flow_grpo.yaml", ["model.args.kernel=cps", "model.args.noise_level=0.8"]),
}
METRICS = ("reward", "realism", "template_rmse")


def run_one(config: str, overrides: list[str]) -> dict:
    from mmgrpo.loader import load_config
    from mmgrpo.trainer import train

    cfg = load_config(config, overrides)
    t0, c0 = time.perf_counter(), time.process_time()
    summary = train(cfg)
    cpu = time.process_time() - c0
    metrics = [json.loads(line) for line in (Path(cfg.output_dir) / "metrics.jsonl").read_text().splitlines()]
    steps = [m["perf/step_s"] for m in metrics if "perf/step_s" in m]
    return {
        **{f"{stage}/{k}": summary[f"eval/{stage}/{k}"] for stage in ("before", "after") for k in METRICS},
        "step_s": statistics.median(steps),
        "cpu_s": cpu,
        "wall_s": time.perf_counter() - t0,
    }


def fmt(values: list[float], digits: int = 3) -> str:
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return f"{statistics.mean(values):.{digits}f} ± {statistics.stdev(values):.{digits}f}"


def first_runs(results: dict[str, list[dict]]) -> list[dict]:
    return next(iter(results.values()))


def table(results: dict[str, list[dict]]) -> str:
    first = next(iter(results.values()))[0]
    lines = [
        "| variant | held-out reward after | Δ reward vs base | realism after | template RMSE after "
        "| CPU time ÷ grpo |",
        "|---|---|---|---|---|---|",
        f"| base (before) | {first['before/reward']:.3f} | — | {first['before/realism']:.3f} | "
        f"{first['before/template_rmse']:.4f} | — |",
    ]
    ref = statistics.median(r["cpu_s"] for r in results.get("grpo", first_runs(results)))
    for name, runs in results.items():
        after = [r["after/reward"] for r in runs]
        delta = [r["after/reward"] - r["before/reward"] for r in runs]
        lines.append(
            f"| {name} | {fmt(after)} | {fmt(delta)} (+ in {sum(d > 0 for d in delta)}/{len(delta)}) | "
            f"{fmt([r['after/realism'] for r in runs])} | {fmt([r['after/template_rmse'] for r in runs], 4)} | "
            f"{statistics.median(r['cpu_s'] for r in runs) / ref:.2f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--out", default="runs/flow_variants")
    ap.add_argument("--variants", nargs="*", default=None, help="subset of variant names")
    ap.add_argument("--extra", action="store_true", help="also run the extra variants")
    ap.add_argument("--extra-seeds", type=int, nargs="+", default=[0], help="seeds of the extra variants")
    a = ap.parse_args()
    torch.set_num_threads(1)
    todo = {**VARIANTS, **(EXTRA if a.extra else {})}
    if a.variants:
        todo = {k: v for k, v in todo.items() if k in a.variants}
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    results: dict[str, list[dict]] = {}
    for name, (config, extra) in todo.items():
        for seed in a.seeds if name in VARIANTS else a.extra_seeds:
            overrides = [f"output_dir={out / f'{name}-seed{seed}'}", f"seed={seed}", f"steps={a.steps}", *extra]
            r = run_one(config, overrides)
            results.setdefault(name, []).append({"seed": seed, **r})
            print(
                f"{name} seed {seed}: reward {r['before/reward']:.3f} -> {r['after/reward']:.3f}, "
                f"realism {r['before/realism']:.3f} -> {r['after/realism']:.3f} ({r['wall_s']:.0f}s)",
                flush=True,
            )
            (out / "results.json").write_text(json.dumps(results, indent=1))
    md = table(results)
    (out / "table.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
