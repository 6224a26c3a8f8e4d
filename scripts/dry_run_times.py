"""Time ``mmgrpo train CONFIG --dry-run`` on every shipped config, as a user runs it (issue 53: each under 15 s).

Each config runs in its own process (``python -m mmgrpo``, so the import time counts) from a working directory that
holds what the configs read, as tests/test_shipped_configs.py sets it up: the example datasets
(``examples/make_example_datasets.py``), the recipes' prompt files, and an offline Hugging Face cache with the hub
recipes' model and reward snapshots (empty files: the dry-run finds names, it loads no weights). The configs run at
their full size (no overrides but ``output_dir``). The synthetic tasks' data are built into ``MMGRPO_CACHE`` (a fresh
one in the working directory unless set: set it to time warm dry-runs, as a user's second one).

    .venv/bin/python scripts/dry_run_times.py [--limit 15] [--out runs/dry_run_times.json] [configs/a.yaml ...]

Prints one line per config (wall seconds, CPU seconds of the process, exit status) and exits 1 when a config fails
its dry-run or takes longer than ``--limit`` wall seconds. On a shared machine the wall time includes waiting for a
core; the CPU time does not.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def prepare(workdir: Path) -> dict[str, str]:
    """Fill ``workdir`` (datasets, prompt files, HF cache) and return the environment the dry-runs run in."""
    sys.path.insert(0, str(ROOT))
    from tests.test_shipped_configs import CONFIGS, HUB_WEIGHTS, _prompt_files  # the test's own setup data

    subprocess.run(
        [sys.executable, str(ROOT / "examples/make_example_datasets.py"), str(workdir / "examples" / "data")],
        check=True,
        capture_output=True,
    )
    for config in CONFIGS:
        for name in _prompt_files(config):
            path = workdir / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("".join(f"a photo of {i} red squares on a blue background\n" for i in range(400)))
    for repo, filename in HUB_WEIGHTS.items():
        folder, commit = workdir / "hf" / "hub" / f"models--{repo.replace('/', '--')}", "0" * 40
        (folder / "snapshots" / commit).mkdir(parents=True, exist_ok=True)
        (folder / "snapshots" / commit / filename).write_bytes(b"")
        (folder / "refs").mkdir(exist_ok=True)
        (folder / "refs" / "main").write_text(commit)
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_CACHE"}
    env.update(HF_HOME=str(workdir / "hf"), HF_HUB_OFFLINE="1")
    env.setdefault("MMGRPO_CACHE", str(workdir / "mmgrpo_cache"))  # a given cache: warm (second) dry-runs
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def time_dry_run(config: Path, workdir: Path, env: dict[str, str]) -> dict:
    """Wall and CPU seconds, exit status and last stderr line of one ``--dry-run``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    cmd = [
        sys.executable,
        "-m",
        "mmgrpo",
        "train",
        str(config),
        "--dry-run",
        f"output_dir={workdir / 'runs' / config.stem}",
    ]
    proc = subprocess.run(cmd, cwd=workdir, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    err = proc.stderr.strip().splitlines()
    return {"config": config.name, "wall_s": wall, "cpu_s": cpu, "rc": proc.returncode, "last": err[-1] if err else ""}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("configs", nargs="*", help="configs to time (default: configs/*.yaml)")
    parser.add_argument("--limit", type=float, default=15.0, help="wall seconds a dry-run may take")
    parser.add_argument("--out", help="write the results as JSON here")
    args = parser.parse_args(argv)
    configs = [Path(c).resolve() for c in args.configs] or sorted((ROOT / "configs").glob("*.yaml"))
    with tempfile.TemporaryDirectory(prefix="mmgrpo-dry-run-") as tmp:
        workdir = Path(tmp)
        env = prepare(workdir)
        results = []
        for config in configs:
            r = time_dry_run(config, workdir, env)
            results.append(r)
            flag = "" if r["wall_s"] <= args.limit else "  <-- over the limit"
            flag += "" if r["rc"] == 0 else f"  <-- failed: {r['last']}"
            line = f"{r['config']:40s} wall {r['wall_s']:6.2f} s  cpu {r['cpu_s']:6.2f} s  rc {r['rc']}"
            print(line + flag, flush=True)
    bad = [r for r in results if r["rc"] != 0 or r["wall_s"] > args.limit]
    walls = sorted(r["wall_s"] for r in results)
    print(
        f"{len(results)} configs: wall max {walls[-1]:.2f} s, median {walls[len(walls) // 2]:.2f} s; "
        f"cpu max {max(r['cpu_s'] for r in results):.2f} s; over {args.limit:g} s or failing: {len(bad)}"
    )
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(results, indent=1))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
