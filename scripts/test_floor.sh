#!/usr/bin/env bash
# The floor-version job (issue 35): a separate venv with every dependency at the minimum pyproject.toml declares
# (scripts/floor_requirements.py: name==floor for each >= bound), mmgrpo installed into it without its own
# dependency resolution, then a fast subset of the tests: the math, the options and engine contracts, the
# compatibility list of private library touchpoints (mmgrpo/compat.py) and one tiny model per token adapter.
# A floor that does not install or fails here must be raised in pyproject.toml to what passes.
#
#   bash scripts/test_floor.sh                 # .venv-floor, made once (re-made when pyproject.toml changes)
#   FLOOR_VENV=/tmp/floor bash scripts/test_floor.sh -x -q     # extra arguments go to pytest
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${FLOOR_VENV:-.venv-floor}
stamp="$VENV/.mmgrpo-floor"
reqs=/tmp/mmgrpo-floor-reqs.$$
trap 'rm -f "$reqs"' EXIT
"$PY" scripts/floor_requirements.py --check > "$reqs"
# the venv is re-made when the floors or this script change (not for any edit of pyproject.toml)
want=$(cat "$reqs" scripts/test_floor.sh | sha256sum | cut -d' ' -f1)
start=$(date +%s)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  rm -rf "$VENV"
  "$PY" -m venv "$VENV"
  "$VENV/bin/python" -m pip install --quiet --upgrade pip || echo "test_floor: pip not upgraded" >&2
  echo "test_floor: installing the floors:" $(cat "$reqs") >&2
  # the floors exactly (their own dependencies resolved by pip), from the package index alone: a local wheel
  # folder (pip's find-links) may hold another build of the same version (torch 2.13.0+cpu), which pip prefers and
  # whose companions (torchvision's compiled ops) do not load against it; then mmgrpo itself, not re-resolving them
  if ! PIP_FIND_LINKS= PIP_CONFIG_FILE=/dev/null "$VENV/bin/python" -m pip install --quiet -r "$reqs"; then
    # exit 3: the index could not be reached (.ci/run reports it and goes on); 1: a floor does not install here
    if ! PIP_FIND_LINKS= PIP_CONFIG_FILE=/dev/null "$VENV/bin/python" -m pip download --quiet --no-deps \
        -d "$VENV/.probe" pyyaml==6.0.2; then
      echo "test_floor: the package index is unreachable; the floor versions were not installed or tested" >&2
      exit 3
    fi
    echo "test_floor: a floor above does not install (the index is reachable): raise it in pyproject.toml" >&2
    exit 1
  fi
  "$VENV/bin/python" -m pip install --quiet --no-deps -e .
  # test tools at current versions (not the library floors under test); trl/math-verify for the reward tests
  "$VENV/bin/python" -m pip install --quiet "pytest>=8.0" "pytest-timeout>=2.3" "psutil>=5.9"
  echo "$want" > "$stamp"
fi
rm -f "$reqs"
echo "test_floor: venv ready in $(( $(date +%s) - start )) s" >&2
# a conflict is a floor below what another dependency needs: raise it. decord's only Linux wheel (0.6.0, the newest
# release) is tagged cp36, which pip check reports as "not supported on this platform"; it imports and runs.
conflicts=$("$VENV/bin/python" -m pip check 2>&1 | grep -v "^decord .* is not supported on this platform" || true)
if [ -n "$conflicts" ] && [ "$conflicts" != "No broken requirements found." ]; then
  echo "$conflicts" >&2
  echo "test_floor: pip check reports conflicts above (floors declared below what a dependency needs)" >&2
  exit 1
fi
"$VENV/bin/python" - <<'PY'
import importlib.metadata as md
for name in ("torch", "transformers", "diffusers", "accelerate", "peft", "tensorboard", "numpy"):
    print(f"test_floor: {name} {md.version(name)}")
PY
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
exec "$VENV/bin/python" -m pytest -p no:cacheprovider -m "not slow" \
  tests/test_advantages.py tests/test_losses.py tests/test_variants.py tests/test_shaping.py \
  tests/test_options.py tests/test_engine_contract.py tests/test_compat.py tests/test_capabilities.py \
  tests/test_config_validation.py tests/test_adapter_contract.py "$@"
