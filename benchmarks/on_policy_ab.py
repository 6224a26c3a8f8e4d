"""At μ = 1: the old-log-prob forward after sampling (recompute) against π_old left to the update (mmgrpo/on_policy.py).

Two trainers of the quickstart's tiny Qwen2.5-VL (P = 4, G = 8, 16 new tokens, one minibatch), the same steps, run
alternately in one process; the first 2 steps of each are warm-up. Prints the median ``perf/rollout_s`` and
``perf/step_s`` of each arm.

    python benchmarks/on_policy_ab.py [--steps 8]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from mmgrpo import on_policy
from mmgrpo.loader import load_config
from mmgrpo.trainer import Trainer

ROOT = Path(__file__).resolve().parents[1]
OVERRIDES = [
    "algorithm.prompts_per_step=4",
    "algorithm.group_size=8",
    "algorithm.minibatch_size=32",
    "model.args.max_new_tokens=16",
    "model.args.min_new_tokens=16",
    "warmup.steps=0",
    "logging.trackers=[]",
    "logging.progress=false",
    "eval.every=0",
    "task.args.train_size=64",
    "task.args.eval_size=4",
]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=8, help="steps per arm (the first 2 untimed)")
    a = p.parse_args()
    trainers = {}
    for deferred in (False, True):
        out = tempfile.mkdtemp(prefix="on_policy_ab_")
        t = Trainer(load_config(ROOT / "configs/quickstart.yaml", [*OVERRIDES, f"output_dir={out}"]))
        if deferred and not on_policy.configure(t.adapter, t.cfg):
            raise SystemExit(f"the forward is kept here: {on_policy.keeps_forward(t.cfg)}")
        trainers[deferred] = t
    timed: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
    for step in range(a.steps):
        for deferred in (False, True) if step % 2 == 0 else (True, False):
            m = trainers[deferred].train_step(step)
            if step >= 2:
                timed[deferred].append((m["perf/rollout_s"], m["perf/step_s"]))
    for deferred, rows in timed.items():
        rollout, step = statistics.median(r for r, _ in rows), statistics.median(s for _, s in rows)
        print(f"{'deferred ' if deferred else 'recompute'}: rollout {rollout:.3f} s, step {step:.3f} s (median)")


if __name__ == "__main__":
    main()
