#!/usr/bin/env bash
# Creates .venv-colocate: the training environment of `rollout.vllm_mode: colocate` (vLLM inside the training process,
# docs/scale.md). vLLM pins its own torch and transformers, so the colocated trainer runs on vLLM's: this environment
# sees .venv-vllm's packages through a .pth file (nothing of it is copied or changed), and gets mmgrpo and mmgrpo's
# other dependencies installed on top, every package .venv-vllm already has held at .venv-vllm's version (pip -c):
# torch, torchvision and transformers included. Run scripts/setup_vllm.sh first. Idempotent: re-installs only when
# this script, pyproject.toml or .venv-vllm changed since the last successful install.
# Then: .venv-colocate/bin/mmgrpo train CONFIG rollout.engine=vllm rollout.vllm_mode=colocate
set -euo pipefail
cd "$(dirname "$0")/.."
VLLM_VENV=${MMGRPO_VLLM_VENV:-.venv-vllm}
VENV=${MMGRPO_COLOCATE_VENV:-.venv-colocate}
if [ ! -f "$VLLM_VENV/.mmgrpo-vllm-installed" ]; then
  echo "setup_colocate: $VLLM_VENV is not ready; run scripts/setup_vllm.sh first" >&2
  exit 1
fi
stamp="$VENV/.mmgrpo-colocate-installed"
want=$(cat "$0" pyproject.toml "$VLLM_VENV/.mmgrpo-vllm-installed" | sha256sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
# the same interpreter as .venv-vllm's (its compiled packages are built for that Python)
base=$("$VLLM_VENV/bin/python" -c "import sys; print(sys._base_executable)")
[ -x "$VENV/bin/python" ] || "$base" -m venv "$VENV"
vllm_site=$(cd "$VLLM_VENV" && "$PWD/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
site=$("$VENV/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
# after this environment's own site-packages on sys.path: what is installed here wins, vLLM's stack fills the rest
echo "$vllm_site" > "$site/mmgrpo-vllm-site.pth"
# every package of .venv-vllm pinned at its version (name==version lines only; vLLM's own torch build is 2.13.0)
constraints="$VENV/vllm-constraints.txt"
"$VLLM_VENV/bin/python" -m pip list --format=freeze --disable-pip-version-check \
  | grep -E '^[A-Za-z0-9_.-]+==' | grep -v -E '^(pip|setuptools|wheel)==' > "$constraints"
"$VENV/bin/python" -m pip install --quiet --upgrade pip
"$VENV/bin/python" -m pip install --quiet -c "$constraints" -e .
# the colocated trainer imports mmgrpo and vllm in one process, on vLLM's torch
"$VENV/bin/python" -c "
import torch, transformers, vllm, accelerate, peft, mmgrpo.trainer
print('setup_colocate: vllm', vllm.__version__, 'torch', torch.__version__, 'transformers', transformers.__version__)"
echo "$want" > "$stamp"
