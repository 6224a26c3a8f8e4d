#!/usr/bin/env bash
# The quickstart: set up .venv, then train the tiny Qwen2.5-VL on the synthetic shapes task (CPU, minutes).
# Extra arguments are config overrides, e.g.  bash scripts/quickstart.sh steps=20
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
exec .venv/bin/mmgrpo train configs/quickstart.yaml output_dir=runs/quickstart "$@"
