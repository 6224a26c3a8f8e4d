"""The entropy curve of the ``entropy`` study of ``benchmarks/variants_table.py`` (issue 51 item 7, docs/variants.md).

    OMP_NUM_THREADS=1 python benchmarks/variants_table.py --study entropy --seeds 0 1 2 --out runs/variants
    python benchmarks/entropy_curve.py --out runs/variants

For each run of the study (``<out>/entropy/<arm>_seed<s>``): the mean of the logged ``entropy/mean`` (the entropy of
the sampling distribution over the trained tokens, nats) over steps 1-10, 26-35 and 51-60, the held-out accuracy after
the warm-up, at step 30 and after training, and for AEPO the share of steps at T_high and the REINFORCE samples per
step. Prints a markdown table (one row per run, a mean row per arm).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

ARMS = ("grpo", "entropy_bonus", "entropy_bonus_c0.1", "aepo")
WINDOWS = ((1, 10), (26, 35), (51, 60))


def run_row(folder: Path) -> dict:
    """The curve and accuracies of one run folder."""
    records = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    entropy = {r["step"]: r["entropy/mean"] for r in records if "entropy/mean" in r}
    summary = json.loads((folder / "summary.json").read_text())
    temps = [r["aepo/temperature"] for r in records if "aepo/temperature" in r]
    count = [r["aepo/reinforce_samples"] for r in records if "aepo/reinforce_samples" in r]
    return {
        "entropy": [statistics.fmean(v for s, v in entropy.items() if a <= s <= b) for a, b in WINDOWS],
        "accuracy": [summary.get(f"eval/{k}/accuracy") for k in ("warmup", "step30", "after")],
        "hot": sum(t > 1 for t in temps) / len(temps) if temps else None,
        "reinforce": statistics.fmean(count) if count else None,
    }


def _f(x: float | None, digits: int = 3) -> str:
    return "–" if x is None else f"{x:.{digits}f}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("runs/variants"))
    base = p.parse_args().out / "entropy"
    print("| run | seed | entropy, steps 1-10 | 26-35 | 51-60 | held-out accuracy: warm-up, step 30, after | "
          "steps at T_high | REINFORCE samples / step |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for arm in ARMS:
        done = [s for s in (0, 1, 2) if (base / f"{arm}_seed{s}" / "summary.json").exists()]
        rows = {s: run_row(base / f"{arm}_seed{s}") for s in done}
        for seed, r in rows.items():
            acc = " / ".join(_f(a, 2) for a in r["accuracy"])
            cells = " | ".join(_f(e) for e in r["entropy"])
            print(f"| `{arm}` | {seed} | {cells} | {acc} | {_f(r['hot'], 2)} | {_f(r['reinforce'], 1)} |")
        if rows:
            mean = [statistics.fmean(r["entropy"][i] for r in rows.values()) for i in range(len(WINDOWS))]
            after = statistics.fmean(r["accuracy"][2] for r in rows.values())
            print(f"| `{arm}` | mean | {' | '.join(_f(e) for e in mean)} | after {after:.3f} | | |")


if __name__ == "__main__":
    main()
