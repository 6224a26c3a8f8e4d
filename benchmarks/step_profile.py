"""Where one mmgrpo GRPO step spends its time: phases timed with the device synchronised, kernel launches counted.

    python benchmarks/step_profile.py --out runs/step_profile     # SmolLM2 as real_vs_trl.py runs it, CUDA if present
    python benchmarks/step_profile.py --set model.args.compile_decode=false --trace

The model and settings are ``benchmarks/real_vs_trl.py``'s (``configs/real_smollm2_arithmetic.yaml``: SmolLM2-135M-
Instruct from ``MMGRPO_REAL_MODELS``, 2 prompts × G = 8, 32 new tokens, fp32; ``--set`` overrides mmgrpo options).
After ``--warmup`` steps (the first compiles the decode graph under ``compile_decode``), ``--steps`` steps run under
``torch.profiler`` with the phases marked and the device synchronised at each phase's edges:

* ``rollout`` (the adapter's ``rollout``: prefill, the decode loop, detokenising), inside it ``decode_step`` (the
  model's step per token: the compiled graph's replay or the eager forward) and ``sampling`` (the per-token draw);
* ``update`` (the trainer's ``_update``: log-prob forward, loss, backward, optimizer step);
* the rest of ``train_step`` (reward, advantages, metrics) is ``other``.

Per phase: wall seconds, the CPU-side launches (``cudaLaunchKernel``-style runtime calls and CUDA-graph launches), the
GPU's summed kernel time, and so how much of the wall time the GPU was busy (a launch-bound phase has a low share).
Also: the 25 operators with the most CPU time, the 15 with the most device time, the inductor counters (CUDA-graph
skips with their reasons, graphs compiled). Writes ``step_profile.json`` (and ``trace_<variant>.json.gz`` with
``--trace``) under ``--out`` and prints a summary. ``--variant NAME:KEY=VALUE,...`` profiles other settings in the same
process after the default one (e.g. the training forward's layouts).
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import gzip
import json
import os
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, record_function

sys.path.insert(0, str(Path(__file__).resolve().parent))

PHASES = ("rollout", "decode_step", "sampling", "update")
LAUNCHES = ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernelEx", "cudaGraphLaunch")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _marked(name: str, fn: Callable, device: torch.device, wall: dict, sync: bool = True) -> Callable:
    """``fn`` inside a profiler range ``name``, its wall time added to ``wall[name]`` (synchronised when ``sync``)."""

    def call(*args, **kwargs):
        if sync:
            _sync(device)
        start = time.perf_counter()
        with record_function(name):
            out = fn(*args, **kwargs)
            if sync:
                _sync(device)
        wall[name] += time.perf_counter() - start
        return out

    return call


_WALL: dict[str, float] = defaultdict(float)
"""The marked phases' wall seconds of the variant being profiled (reset by :func:`_instrument`)."""


def _instrument(trainer, device: torch.device) -> dict[str, float]:
    """Mark the phases: the adapter's rollout and the trainer's update (synchronised), and per decoding token the
    stepper's step and the draw (not synchronised: they overlap with the device's queue as in a real run). Returns
    the dict their wall seconds add up in."""
    from mmgrpo.modalities.tokens import decode

    _WALL.clear()
    wall = _WALL
    adapter = trainer.adapter
    adapter.rollout = _marked("rollout", adapter.rollout, device, wall)
    trainer._update = _marked("update", trainer._update, device, wall)
    make_stepper = adapter._stepper  # whichever stepper the adapter picks (compiled, shared-prompt, expanded)

    def stepper(*args, **kwargs):
        made = make_stepper(*args, **kwargs)
        made.step = _marked("decode_step", made.step, device, wall, sync=False)
        return made

    adapter._stepper = stepper
    if not getattr(decode.draw_token, "marked", False):  # once per process; later variants add to the same _WALL
        decode.draw_token = _marked("sampling", decode.draw_token, device, wall, sync=False)
        decode.draw_token.marked = True
    return wall


def _ranges(prof) -> dict[str, list[tuple[float, float]]]:
    """The CPU time ranges (µs) of each marked phase."""
    out = defaultdict(list)
    for e in prof.events():
        if e.name in PHASES and e.device_type == torch.autograd.DeviceType.CPU:
            out[e.name].append((e.time_range.start, e.time_range.end))
    return out


def _phase_stats(prof, ranges: dict, steps_window: list[tuple[float, float]]) -> dict:
    """Per phase: launches (runtime calls inside its CPU ranges) and the device's kernel time that started inside
    them (the device is synchronised at the synchronised phases' ends, so nothing of theirs starts later)."""
    events = prof.events()
    launches = [e.time_range.start for e in events if e.name in LAUNCHES]
    cpu_ops = [e.time_range.start for e in events if e.name.startswith("aten::") and e.device_type.name == "CPU"]
    kernels = [
        (e.time_range.start, e.time_range.elapsed_us())
        for e in events
        if e.device_type != torch.autograd.DeviceType.CPU
        and e.time_range.elapsed_us() > 0
        and e.name not in (*PHASES, "train_step")  # the marked ranges' own spans on the device timeline
    ]

    def inside(t: float, spans: list) -> bool:  # spans sorted by start, not overlapping
        i = bisect.bisect_right(spans, (t, float("inf"))) - 1
        return i >= 0 and spans[i][0] <= t <= spans[i][1]

    stats = {}
    for name, spans in {**ranges, "step": steps_window}.items():
        spans = sorted(spans)
        stats[name] = {
            "calls": len(spans),
            "launches": sum(inside(t, spans) for t in launches),
            "aten_ops": sum(inside(t, spans) for t in cpu_ops),
            "device_kernel_ms": round(sum(d for t, d in kernels if inside(t, spans)) / 1e3, 3),
        }
    return stats


def _table(prof, key: str, rows: int) -> list[dict]:
    """The ``rows`` operators with the most ``key`` time (µs totals over the profiled steps)."""
    avg = prof.key_averages()
    best = sorted(avg, key=lambda e: -getattr(e, key, 0))[:rows]
    return [
        {
            "op": e.key,
            "count": e.count,
            "self_cpu_ms": round(e.self_cpu_time_total / 1e3, 3),
            "cpu_total_ms": round(e.cpu_time_total / 1e3, 3),
            "device_ms": round(getattr(e, "self_device_time_total", 0) / 1e3, 3),
        }
        for e in best
    ]


def profile_variant(name: str, overrides: list[str], args, out: Path) -> dict:
    """Build a trainer with ``overrides``, run ``args.warmup`` steps, then profile ``args.steps`` steps (module
    docstring); the variant's result."""
    from real_vs_trl import _config

    from mmgrpo import on_policy
    from mmgrpo.trainer import Trainer

    cfg = _config(0, args.warmup + args.steps, out / f"run_{name}", overrides)
    trainer = Trainer(cfg)  # on CUDA where there is one (accelerate's choice)
    device = trainer.acc.device
    on_policy.configure(trainer.adapter, cfg)  # as Trainer.run: at μ = 1 no old-log-prob forward
    warm = []
    for step in range(args.warmup):
        _sync(device)
        start = time.perf_counter()
        trainer.train_step(step)
        _sync(device)
        warm.append(round(time.perf_counter() - start, 4))
    wall = _instrument(trainer, device)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    step_walls = []
    with profile(activities=activities) as prof:
        for step in range(args.warmup, args.warmup + args.steps):
            _sync(device)
            start = time.perf_counter()
            with record_function("train_step"):
                trainer.train_step(step)
                _sync(device)
            step_walls.append(time.perf_counter() - start)
    trainer.close()  # the run lock; the next variant builds its own trainer
    steps_window = [(e.time_range.start, e.time_range.end) for e in prof.events() if e.name == "train_step"]
    phases = _phase_stats(prof, _ranges(prof), steps_window)
    n = args.steps
    for phase, s in phases.items():
        seconds = sum(step_walls) if phase == "step" else wall[phase]
        s["wall_ms_per_step"] = round(1e3 * seconds / n, 2)
        s["launches_per_step"] = round(s["launches"] / n, 1)
        s["aten_ops_per_step"] = round(s["aten_ops"] / n, 1)
        s["device_busy_share"] = round(s["device_kernel_ms"] / (1e3 * seconds), 3) if seconds else None
    other = phases["step"]["wall_ms_per_step"] - sum(phases[p]["wall_ms_per_step"] for p in ("rollout", "update"))
    if args.trace:
        raw = out / f"trace_{name}.json"
        prof.export_chrome_trace(str(raw))
        with open(raw, "rb") as f, gzip.open(out / f"trace_{name}.json.gz", "wb") as g:
            g.write(f.read())
        raw.unlink()
    print(f"[{name}] {' '.join(overrides) or '(the config as shipped)'}")
    print(f"  step {1e3 * sum(step_walls) / n:.1f} ms (other {other:.1f} ms); per step:")
    for phase, s in phases.items():
        print(
            f"  {phase:12s} {s['wall_ms_per_step']:9.2f} ms  launches {s['launches_per_step']:8.1f}  aten ops "
            f"{s['aten_ops_per_step']:8.1f}  device {s['device_kernel_ms'] / n:8.2f} ms  busy {s['device_busy_share']}",
            flush=True,
        )
    return {
        "overrides": overrides,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "warmup_step_s": warm,
        "step_s": [round(s, 4) for s in step_walls],
        "other_ms_per_step": round(other, 2),
        "phases": phases,
        "decode_tokens": phases.get("decode_step", {}).get("calls", 0),
        "top_cpu": _table(prof, "self_cpu_time_total", 25),
        "top_device": _table(prof, "self_device_time_total", 15) if device.type == "cuda" else [],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--warmup", type=int, default=2, help="unprofiled steps first (the first compiles)")
    parser.add_argument("--steps", type=int, default=2, help="profiled steps")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="an mmgrpo config override")
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="NAME:KEY=VALUE[,KEY=VALUE]",
        help="profile this variant too (after the --set one, named default), in the same process",
    )
    parser.add_argument("--trace", action="store_true", help="also write the profiler's Chrome traces (gzipped)")
    parser.add_argument("--out", type=Path, default=Path("runs/step_profile"))
    args = parser.parse_args(argv)
    variants = {"default": args.set}
    for v in args.variant:
        name, _, kvs = v.partition(":")
        if not name or not kvs:
            parser.error(f"--variant {v!r}: write NAME:KEY=VALUE[,KEY=VALUE]")
        variants[name] = [*args.set, *kvs.split(",")]
    args.out.mkdir(parents=True, exist_ok=True)
    results = {name: profile_variant(name, overrides, args, args.out) for name, overrides in variants.items()}
    counters = {}
    with contextlib.suppress(Exception):
        from torch._dynamo.utils import counters as dyn

        counters = {k: dict(v) for k, v in dyn.items() if k in ("inductor", "stats", "graph_break")}
    result = {
        "versions": {"torch": torch.__version__, "python": sys.version.split()[0]},
        "settings": {"warmup": args.warmup, "steps": args.steps, "real": os.environ.get("MMGRPO_REAL_MODELS")},
        "variants": results,
        "dynamo_counters": counters,  # the whole process (every variant)
    }
    (args.out / "step_profile.json").write_text(json.dumps(result, indent=1))
    print(f"inductor counters: {counters.get('inductor', {})}")
    print(f"wrote {args.out / 'step_profile.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
