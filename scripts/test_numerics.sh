#!/usr/bin/env bash
# The numerics sweep: the tests marked `numerics` (two evaluations of one quantity compared within a rounding
# tolerance from tests/numerics.py) under the thread counts and SIMD widths that users' machines have: one and two
# threads, and torch's and MKL's AVX2 and plain (no-SIMD) kernels on an AVX-512 machine, each of which sums in
# another order. A tolerance fitted to one machine's error fails here, not on a user's machine.
# tests/test_real_models.py is left out: its converted-vs-reference bounds are ~400x the measured differences and each
# setting would reload the real weights (about 1 min); the README's test command runs it once.
# Usage: bash scripts/test_numerics.sh [pytest args...]   (NUMERICS_MARKER overrides the default "numerics and not slow")
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
export HF_HUB_OFFLINE=1
marker=${NUMERICS_MARKER:-"numerics and not slow"}
settings=(
  "OMP_NUM_THREADS=1"
  "OMP_NUM_THREADS=2"
  "OMP_NUM_THREADS=2 ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 ONEDNN_MAX_CPU_ISA=AVX2"
  "OMP_NUM_THREADS=1 ATEN_CPU_CAPABILITY=default MKL_ENABLE_INSTRUCTIONS=SSE4_2 ONEDNN_MAX_CPU_ISA=SSE41"
)
failed=()
for setting in "${settings[@]}"; do
  echo "== numerics sweep: $setting"
  # shellcheck disable=SC2086  # the setting is a list of VAR=value words
  env $setting .venv/bin/python -m pytest tests -q -m "$marker" --ignore=tests/test_real_models.py "$@" || failed+=("$setting")
done
if [ ${#failed[@]} -gt 0 ]; then
  printf 'numerics sweep failed under: %s\n' "${failed[@]}" >&2
  exit 1
fi
echo "numerics sweep: green under all ${#settings[@]} settings"
