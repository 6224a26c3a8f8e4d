#!/usr/bin/env bash
# Creates .venv (if missing) and installs mmgrpo with its test and demo extras (plus the Debian espeak-ng, chromium
# and chromium-driver the speech task and the demo's browser tests use, when missing and apt-get is usable). Idempotent: re-installs only when
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
# Debian packages: espeak-ng synthesises the speech of the spoken_digits task; chromium + chromium-driver run the
# demo's browser tests. Installed once when missing and apt-get is usable; otherwise those tests skip with a reason.
need=()
command -v espeak-ng >/dev/null 2>&1 || need+=(espeak-ng)
[ -x /usr/bin/chromium ] || need+=(chromium)
[ -x /usr/bin/chromedriver ] || need+=(chromium-driver)
if [ ${#need[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1 && SUDO="sudo"
  if command -v apt-get >/dev/null 2>&1 && { [ "$(id -u)" -eq 0 ] || [ -n "$SUDO" ]; }; then
    { $SUDO apt-get update -qq && $SUDO apt-get install -y -qq "${need[@]}" >/dev/null; } \
      || echo "setup_env: could not apt-get install ${need[*]}; the speech and demo browser tests will skip" >&2
  else
    echo "setup_env: missing ${need[*]} and no usable apt-get; the speech and demo browser tests will skip" >&2
  fi
fi
