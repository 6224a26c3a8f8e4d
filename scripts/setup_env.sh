#!/usr/bin/env bash
# Creates .venv (if missing) and installs mmgrpo with its test and demo extras (plus the Debian chromium and
# chromium-driver the demo's browser tests drive, when missing and apt-get is usable). Idempotent: re-installs only when
# pyproject.toml changed since the last successful install. Used by scripts/quickstart.sh and scripts/test.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
  .venv/bin/python -m pip install --quiet --upgrade pip
fi
stamp=.venv/.mmgrpo-installed
want=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  # torch first, pinned: the CPU-usable build on this machine's local wheel cache (see README).
  .venv/bin/python -m pip install --quiet "torch==2.14.1" "torchvision==0.29.1"
  .venv/bin/python -m pip install --quiet -e ".[test,demo]"
  echo "$want" > "$stamp"
fi
if [ ! -x /usr/bin/chromium ] || [ ! -x /usr/bin/chromedriver ]; then
  if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
    apt-get update -qq && apt-get install -y -qq chromium chromium-driver >/dev/null
  else
    echo "setup_env: /usr/bin/chromium or chromedriver missing; the demo's browser tests will skip" >&2
  fi
fi
