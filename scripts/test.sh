#!/usr/bin/env bash
# The test suite: set up .venv, then run pytest (slow learning tests included; pass -m "not slow" to skip) on two
# pytest-xdist workers, each file whole on one worker (--dist loadfile: a module's fixtures, such as a vLLM server,
# start once); pass -n 0 to run in one process. Each worker uses $OMP_NUM_THREADS threads (tests/conftest.py).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
export HF_HUB_OFFLINE=1  # tests build every model locally; never wait on a hub
exec .venv/bin/python -m pytest tests -q -n 2 --dist loadfile --durations=15 "$@"  # the 15 slowest tests, every run
