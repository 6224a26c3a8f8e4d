#!/usr/bin/env bash
# The test suite: set up .venv, then run pytest (slow learning tests included; pass -m "not slow" to skip) on two
# pytest-xdist workers, each file whole on one worker (--dist loadfile: a module's fixtures, such as a vLLM server,
# start once), handed out longest file first (tests/conftest.py HEAVY_FILES; --no-loadscope-reorder keeps that order:
# xdist would otherwise send the files with the most tests first and the long learning files last); pass -n 0 to run in
# one process.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
export HF_HUB_OFFLINE=1  # tests build every model locally; never wait on a hub
# OMP_NUM_THREADS is the suite's thread budget: each of the 2 workers (and every process it starts) gets its share, at
# least 1 thread. Two workers of 2 threads on 2 cores ran the quickstart's learning test 4x slower than alone (665 s).
# With -n given (e.g. -n 0: one process) the budget is that process's. The numerics sweep (scripts/test_numerics.sh)
# runs the rounding-sensitive tests at 1 and 2 threads.
workers=2
for a in "$@"; do [ "$a" != "-n" ] && [[ "$a" != -n[0-9]* ]] || workers=1; done
threads=$(( OMP_NUM_THREADS / workers )); [ "$threads" -ge 1 ] || threads=1
n=(); [ "$workers" = 1 ] || n=(-n "$workers")
OMP_NUM_THREADS=$threads exec .venv/bin/python -m pytest tests -q "${n[@]}" --dist loadfile --no-loadscope-reorder \
  --durations=15 "$@"  # the 15 slowest tests, every run
