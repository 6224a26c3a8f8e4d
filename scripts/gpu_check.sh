#!/usr/bin/env bash
# The GPU acceptance run (issue 52, item 4; docs/benchmarks.md "On a GPU: scripts/gpu_check.sh"): one command for a
# machine with one CUDA GPU and no network, <= 8 minutes, one JSON of results (default runs/gpu_check/gpu_check.json):
#   1. pytest -m cuda (tests/test_cuda.py, tests/test_gpu.py): each family trains 2 steps in bf16 mixed precision,
#      keyed rollouts on CUDA draw the CPU's tokens, the fused head on CUDA, the colocated vLLM engine if vllm imports;
#   2. a short benchmarks/real_vs_trl.py (SmolLM2-135M-Instruct, both toolkits, 1 seed) when the real weights are set
#      up (scripts/setup_real_models.sh; MMGRPO_REAL_MODELS) and trl imports;
#   3. where mmgrpo's SmolLM2 step spends its time (benchmarks/step_profile.py: the phases timed with the device
#      synchronised, kernel launches and the GPU's busy share per phase, a Chrome trace) when SmolLM2 is there;
#   4. the SmolVLM 8:1 comparison against TRL's GPU rule, short (benchmarks/vs_trl.py --arch idefics3 --ratios 8,
#      1 repeat) when trl imports;
#   5. the decode step on CUDA, compiled (CUDA graphs) vs eager, in bf16 at batch 16 (benchmarks/compiled_decode.py
#      --device cuda --dtype bf16: SmolLM2 when set up, the tiny Qwen2.5-VL): each decoding step timed alone too, and
#      against the time to read the weights once at the measured copy bandwidth; inductor's count of graphs run
#      without CUDA graphs, the reason in the log (perf_hints).
# GPU_CHECK_SMOLLM2_SKELETON=DIR (a folder with SmolLM2-135M-Instruct's config.json and tokenizer files, no weights):
# where the real weights cannot be brought to the machine, the model is built from that config with random weights
# (the same architecture, sizes and tokenizer; every timed run decodes a fixed number of tokens or to the length
# cap, so the timings hold, the accuracies do not) and recorded as such in the JSON.
# Python: $PYTHON, else .venv/bin/python when it imports torch and mmgrpo, else the machine's python3 with the
# packages installed there (the project's pins cannot be installed without a network); mmgrpo is then imported from
# this checkout (a path finder for its package-dir mapping, no pip). The versions that ran are printed and recorded.
# Without CUDA it prints one line saying what it skipped and exits 0; with CUDA it exits 1 when a cuda test failed.
# Options (environment): GPU_CHECK_OUT (output folder), GPU_CHECK_BUDGET_S (480), PYTHON; for a second, shorter call
# in the same lease: GPU_CHECK_ONLY (the steps to run, by name: "cuda_tests step_profile"), GPU_CHECK_PYTEST_K
# (pytest -k of the cuda tests), GPU_CHECK_PROFILE_ARGS (more arguments of step_profile.py, e.g. --variant ...) and
# GPU_CHECK_PROFILE_LIMIT_S (its seconds, 90).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${GPU_CHECK_OUT:-runs/gpu_check}
BUDGET=${GPU_CHECK_BUDGET_S:-480}
START=$(date +%s)

PY=${PYTHON:-}
if [ -z "$PY" ]; then
  if [ -x .venv/bin/python ] && .venv/bin/python -c "import torch, mmgrpo" >/dev/null 2>&1; then
    PY=.venv/bin/python
  else
    PY=$(command -v python3 || command -v python || echo python3)
  fi
fi
if ! "$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" >/dev/null 2>&1; then
  echo "gpu_check: no CUDA device ($PY: torch.cuda.is_available() is false or torch does not import): skipped pytest -m cuda, benchmarks/real_vs_trl.py, the step profile (step_profile.py), the SmolVLM 8:1 comparison (vs_trl.py --arch idefics3) and the CUDA decode step (compiled_decode.py --device cuda)"
  exit 0
fi

mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false MMGRPO_CACHE=${MMGRPO_CACHE:-$OUT/cache}
if ! "$PY" -c "import mmgrpo.modalities, mmgrpo.rewards, mmgrpo.tools" >/dev/null 2>&1; then
  # not installed: the checkout's packages by path (pyproject's package-dir: mmgrpo.modalities = modalities/, ...)
  mkdir -p "$OUT/shim"
  cat > "$OUT/shim/sitecustomize.py" <<EOF
import importlib.abc, importlib.util, sys
_DIRS = {"mmgrpo.modalities": "$PWD/modalities", "mmgrpo.rewards": "$PWD/rewards", "mmgrpo.tools": "$PWD/tools"}
class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name not in _DIRS:
            return None
        return importlib.util.spec_from_file_location(
            name, _DIRS[name] + "/__init__.py", submodule_search_locations=[_DIRS[name]]
        )
sys.meta_path.insert(0, _Finder())
EOF
  export PYTHONPATH="$OUT/shim:$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

"$PY" - "$OUT/versions.json" <<'EOF'
import importlib, json, platform, sys
import torch
v = {"python": platform.python_version(), "executable": sys.executable, "torch": torch.__version__,
     "cuda": torch.version.cuda}
if torch.cuda.is_available():
    v |= {"gpu": torch.cuda.get_device_name(0),
          "gpu_memory_gib": round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1)}
for name in ("transformers", "accelerate", "peft", "diffusers", "trl", "vllm", "datasets", "mmgrpo"):
    try:
        v[name] = getattr(importlib.import_module(name), "__version__", "installed")
    except Exception as e:  # not installed here: the tests and benchmarks needing it skip or fail, recorded
        v[name] = f"not importable ({type(e).__name__})"
print("gpu_check: ran with " + ", ".join(f"{k} {x}" for k, x in v.items()), flush=True)
open(sys.argv[1], "w").write(json.dumps(v, indent=1))
EOF

REAL=${MMGRPO_REAL_MODELS:-$HOME/.cache/mmgrpo/real}
if [ -n "${GPU_CHECK_SMOLLM2_SKELETON:-}" ] && [ ! -d "$REAL/smollm2-135m-instruct" ]; then
  REAL=$OUT/real
  "$PY" - "$GPU_CHECK_SMOLLM2_SKELETON" "$REAL/smollm2-135m-instruct" "$OUT/versions.json" <<'EOF'
import json, shutil, sys
from pathlib import Path
import torch
from transformers import AutoConfig, AutoModelForCausalLM
src, dst, versions = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
torch.manual_seed(0)
model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(src), dtype=torch.float32)
model.save_pretrained(dst)
for f in src.iterdir():
    if f.name not in ("config.json", "model.safetensors"):
        shutil.copy(f, dst / f.name)
v = json.loads(versions.read_text())
v["smollm2_weights"] = f"random init from {src}/config.json (the real weights could not be brought here)"
versions.write_text(json.dumps(v, indent=1))
print(f"gpu_check: SmolLM2-135M-Instruct built from its config with random weights in {dst}", flush=True)
EOF
fi
export MMGRPO_REAL_MODELS=$REAL

left() { echo $(( BUDGET - ($(date +%s) - START) )); }
run_step() {  # name, seconds at most, command...: its exit status, seconds and log under $OUT
  local name=$1 limit=$2; shift 2
  local t0=$(date +%s) rc
  if [ -n "${GPU_CHECK_ONLY:-}" ] && [[ " $GPU_CHECK_ONLY " != *" $name "* ]]; then
    echo "{\"rc\": null, \"skipped\": \"not in GPU_CHECK_ONLY ($GPU_CHECK_ONLY)\"}" > "$OUT/$name.step.json"; return
  fi
  [ "$(left)" -lt "$limit" ] && limit=$(left)
  if [ "$limit" -le 10 ]; then
    echo "{\"rc\": null, \"skipped\": \"the ${BUDGET}s budget is spent\"}" > "$OUT/$name.step.json"; return
  fi
  echo "gpu_check: $name (at most ${limit}s)" >&2
  timeout --kill-after=10 "$limit" "$@" > "$OUT/$name.log" 2>&1; rc=$?
  echo "{\"rc\": $rc, \"seconds\": $(( $(date +%s) - t0 )), \"timed_out\": $([ $rc = 124 ] || [ $rc = 137 ] && echo true || echo false), \"command\": \"$*\"}" > "$OUT/$name.step.json"
}

# only the files holding cuda tests: collecting the whole suite would import what the machine may lack (the demo's
# browser, math-verify), and one collection error stops a pytest run
CUDA_FILES=$(grep -l "mark.cuda" tests/test_*.py)
run_step cuda_tests 270 "$PY" -m pytest $CUDA_FILES -m cuda -q -rs -p no:cacheprovider --continue-on-collection-errors \
  --junitxml="$OUT/cuda_tests.xml" ${GPU_CHECK_PYTEST_K:+-k "$GPU_CHECK_PYTEST_K"}
HAVE_TRL=$("$PY" -c "import trl" >/dev/null 2>&1 && echo 1 || echo 0)
if [ "$HAVE_TRL" = 1 ] && [ -d "$REAL/smollm2-135m-instruct" ]; then
  run_step real_vs_trl 150 "$PY" benchmarks/real_vs_trl.py --out "$OUT/real_vs_trl" --seeds 0 --steps 4 \
    --eval-every 4 --eval-rows 20 --device cuda
else
  echo "{\"rc\": null, \"skipped\": \"trl importable: $HAVE_TRL; SmolLM2 weights in $REAL: $([ -d "$REAL/smollm2-135m-instruct" ] && echo yes || echo no) (scripts/setup_real_models.sh)\"}" > "$OUT/real_vs_trl.step.json"
fi
if [ -d "$REAL/smollm2-135m-instruct" ]; then
  run_step step_profile "${GPU_CHECK_PROFILE_LIMIT_S:-90}" "$PY" benchmarks/step_profile.py --warmup 2 --steps 2 --trace --out "$OUT/step_profile" \
    ${GPU_CHECK_PROFILE_ARGS:-}
else
  echo "{\"rc\": null, \"skipped\": \"no SmolLM2 in $REAL (scripts/setup_real_models.sh)\"}" > "$OUT/step_profile.step.json"
fi
if [ "$HAVE_TRL" = 1 ]; then
  run_step smolvlm_8to1 100 "$PY" benchmarks/vs_trl.py --arch idefics3 --ratios 8 --repeats 1 --warmup 1 --steps 2 \
    --threads 4 --out "$OUT/smolvlm_8to1"
else
  echo '{"rc": null, "skipped": "trl does not import here"}' > "$OUT/smolvlm_8to1.step.json"
fi

MODELS="tiny-qwen2.5-vl"
[ -d "$REAL/smollm2-135m-instruct" ] && MODELS="smollm2-135m-instruct $MODELS"
run_step decode_cuda 90 "$PY" benchmarks/compiled_decode.py --device cuda --dtype bf16 --repeats 3 --new-tokens 32 \
  --group 8 --models $MODELS --out "$OUT/decode_cuda.json"

"$PY" - "$OUT" "$(( $(date +%s) - START ))" <<'EOF'
import json, sys
import xml.etree.ElementTree as ET
from pathlib import Path

out, wall = Path(sys.argv[1]), int(sys.argv[2])
result = {"versions": json.loads((out / "versions.json").read_text()), "wall_s": wall, "steps": {}}
for name, found in (("cuda_tests", None), ("real_vs_trl", "real_vs_trl/real_vs_trl.json"),
                    ("step_profile", "step_profile/step_profile.json"), ("smolvlm_8to1", "smolvlm_8to1/vs_trl.json"),
                    ("decode_cuda", "decode_cuda.json")):
    step = json.loads((out / f"{name}.step.json").read_text())
    if found and (out / found).exists():
        step["result"] = json.loads((out / found).read_text())
    log = out / f"{name}.log"
    if log.exists():
        step["log_tail"] = log.read_text(errors="replace")[-3000:]
    result["steps"][name] = step
xml = out / "cuda_tests.xml"
if xml.exists():
    tests = {}
    for case in ET.parse(xml).getroot().iter("testcase"):
        kind = next((c.tag for c in case if c.tag in ("failure", "error", "skipped")), "passed")
        detail = next((c.get("message", "") for c in case if c.tag in ("failure", "error", "skipped")), "")
        tests[f"{case.get('classname')}::{case.get('name')}"] = {"outcome": kind, "seconds": float(case.get("time", 0)),
                                                               "detail": detail[:500]}
    counts = {k: sum(t["outcome"] == k for t in tests.values()) for k in ("passed", "failure", "error", "skipped")}
    result["steps"]["cuda_tests"].update(counts=counts, tests=tests)
(out / "gpu_check.json").write_text(json.dumps(result, indent=1))
print(f"gpu_check: {out / 'gpu_check.json'} ({wall}s): " + ", ".join(
    f"{k} rc={v.get('rc')}" + (f" {v['counts']}" if "counts" in v else "") + (f" skipped: {v['skipped']}" if "skipped" in v else "")
    for k, v in result["steps"].items()))
ct = result["steps"]["cuda_tests"]  # the script's status: no cuda test failed (a deprecation notice of this machine's
counts = ct.get("counts", {})  # package versions fails pytest's status, not a test: its outcomes are in the JSON)
sys.exit(0 if ct.get("rc") == 0 or (counts and not counts["failure"] + counts["error"] and not ct["timed_out"]) else 1)
EOF
