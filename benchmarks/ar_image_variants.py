"""GRPO on image tokens on the synthetic flow_shapes task: held-out reward and realism before vs after, on CPU,
with the exact guided log-probs (``configs/ar_image_grpo.yaml``) and the reference implementations' conditional-only
shortcut
(``configs/ar_image_cond.yaml``, identical except ``model.args.cfg_logprob``).

    OMP_NUM_THREADS=1 python benchmarks/ar_image_variants.py --seeds 0 1 2 --out runs/ar_image_variants

Both start from the shipped base (``tiny-janus-shapes``). "before" is the base on the 8 held-out prompts × 4
sampling seeds (evaluation samples with a generator seeded per row, so it is the same for every run); "after" is
the trained policy on the same rows. Writes ``results.json`` and ``table.md`` (the table of docs/ar_image.md):
mean ± std over seeds and the number of seeds whose held-out reward beats the base's. Realism =
exp(−RMSE to the nearest clean rendering / 0.1) (higher is better; it must not collapse).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

VARIANTS = {"guided": "configs/ar_image_grpo.yaml", "cond": "configs/ar_image_cond.yaml"}
METRICS = ("reward", "realism")


def run_one(config: str, overrides: list[str]) -> dict:
    from mmgrpo.loader import load_config
    from mmgrpo.trainer import train

    cfg = load_config(config, overrides)
    t0 = time.perf_counter()
    summary = train(cfg)
    out = {f"{stage}/{k}": summary[f"eval/{stage}/{k}"] for stage in ("before", "after") for k in METRICS}
    out["wall_s"] = time.perf_counter() - t0
    return out


def _fmt(xs: list[float]) -> str:
    return f"{statistics.mean(xs):.3f} ± {statistics.stdev(xs):.3f}" if len(xs) > 1 else f"{xs[0]:.3f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--steps", type=int, default=None, help="override the configs' steps")
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    ap.add_argument("--out", default="runs/ar_image_variants")
    a = ap.parse_args()
    out = Path(a.out)
    results: dict[str, list[dict]] = {}
    for name in a.variants:
        for seed in a.seeds:
            over = [f"output_dir={out / f'{name}_seed{seed}'}", f"seed={seed}"]
            if a.steps is not None:
                over.append(f"steps={a.steps}")
            r = run_one(VARIANTS[name], over)
            results.setdefault(name, []).append({"seed": seed, **r})
            print(name, seed, json.dumps(r), flush=True)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=1))
    lines = [
        "| log-probs | reward before | reward after | seeds beating base "
        "| realism before | realism after | wall s/run |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, rows in results.items():
        col = {k: [r[k] for r in rows] for k in rows[0]}
        wins = sum(r["after/reward"] > r["before/reward"] for r in rows)
        lines.append(
            f"| {name} | {_fmt(col['before/reward'])} | {_fmt(col['after/reward'])} | {wins}/{len(rows)} | "
            f"{_fmt(col['before/realism'])} | {_fmt(col['after/realism'])} | {statistics.mean(col['wall_s']):.0f} |"
        )
    (out / "table.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
