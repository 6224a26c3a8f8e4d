#!/usr/bin/env bash
# Creates .venv (if missing) and installs mmgrpo with its test extras. Idempotent: re-installs only when
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
  .venv/bin/python -m pip install --quiet -e ".[test]"
  echo "$want" > "$stamp"
fi
# espeak-ng synthesises the speech of the spoken_digits task (a Debian/Ubuntu package, not a Python one).
if ! command -v espeak-ng >/dev/null 2>&1; then
  if command -v apt-get >/dev/null 2>&1; then
    SUDO=""; [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1 && SUDO="sudo"
    { $SUDO apt-get update -qq && $SUDO apt-get install -y -qq espeak-ng >/dev/null; } \
      || echo "setup_env: could not install espeak-ng (apt-get install -y espeak-ng); speech tests will skip" >&2
  else
    echo "setup_env: espeak-ng missing and no apt-get: install espeak-ng for the speech task and tests" >&2
  fi
fi
