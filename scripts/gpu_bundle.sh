#!/usr/bin/env bash
# What a GPU machine with no network needs to run scripts/gpu_check.sh, packed into one folder (default .gpu/, ignored
# by git) to carry there; docs/benchmarks.md "On a GPU". Run here, where the package registries can be reached:
#   bash scripts/gpu_bundle.sh            # then on the GPU machine, in a copy of this checkout: bash .gpu/run.sh
# - site.tar.xz: the packages a stock CUDA PyTorch image lacks (KINDS of machine seen so far: Python 3.12, torch,
#   accelerate, no transformers >= the project's floor, no trl/datasets/diffusers/peft/av/decord/soundfile/jiwer), as
#   CPython 3.12 manylinux wheels unpacked into one xz archive (zip wheels compress per file; the archive is solid);
# - esp.tar.xz: espeak-ng (this Debian machine's binary with the libraries it links, English data only) behind a
#   wrapper that sets LD_LIBRARY_PATH for espeak-ng alone, so the Whisper and audio-LLM families have speech;
# - smollm2/: SmolLM2-135M-Instruct's config and tokenizer (scripts/setup_real_models.sh made them), without the
#   weights (538 MB); gpu_check.sh builds the model from the config with random weights (GPU_CHECK_SMOLLM2_SKELETON);
# - run.sh: unpacks the two archives, puts them on PYTHONPATH / PATH and runs scripts/gpu_check.sh.
# Options (environment): GPU_BUNDLE_DIR (.gpu), GPU_BUNDLE_PYTHON_VERSION (3.12: the GPU machine's python3).
set -euo pipefail
cd "$(dirname "$0")/.."
DEST=${GPU_BUNDLE_DIR:-.gpu}
PYV=${GPU_BUNDLE_PYTHON_VERSION:-3.12}
REAL=${MMGRPO_REAL_MODELS:-$HOME/.cache/mmgrpo/real}
PACKAGES=(transformers==5.24.0 trl==1.16.0 datasets==5.2.0 "dill<0.4.2" "multiprocess<0.70.20" diffusers==0.42.1
  peft==0.21.2 av decord==0.6.0 soundfile cffi pycparser soxr jiwer rapidfuzz qwen-vl-utils importlib_metadata)
rm -rf "$DEST" && mkdir -p "$DEST/wheels"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$PYV" --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux2010_x86_64 -d "$DEST/wheels" "${PACKAGES[@]}"
site=$(mktemp -d)
for w in "$DEST"/wheels/*.whl; do python3 -m zipfile -e "$w" "$site"; done
tar -C "$site" -cf - . | xz -T0 -9 > "$DEST/site.tar.xz"
rm -rf "$site" "$DEST/wheels"

exe=$(command -v espeak-ng) || { echo "gpu_bundle: espeak-ng is not installed here (apt-get install -y espeak-ng)"; exit 1; }
esp=$(mktemp -d)/esp && mkdir -p "$esp/bin" "$esp/lib"
cp "$exe" "$esp/bin/espeak-ng.real"
ldd "$exe" | awk '/=>/ {print $3}' | grep -vE 'lib(c|m|pthread|dl|rt)\.so|ld-linux' | xargs -I{} cp -L {} "$esp/lib/"
data=$(find /usr/lib /usr/share -maxdepth 3 -type d -name espeak-ng-data | head -1)
cp -r "$data" "$esp/" && find "$esp/espeak-ng-data" -maxdepth 1 -name '*_dict' ! -name en_dict -delete
cat > "$esp/bin/espeak-ng" <<'WRAP'
#!/bin/sh
d=$(cd "$(dirname "$0")/.." && pwd)
ESPEAK_DATA_PATH=$d LD_LIBRARY_PATH=$d/lib exec "$d/bin/espeak-ng.real" "$@"
WRAP
chmod +x "$esp/bin/espeak-ng"
tar -C "$(dirname "$esp")" -cJf "$DEST/esp.tar.xz" esp && rm -rf "$(dirname "$esp")"

if [ -f "$REAL/smollm2-135m-instruct/config.json" ]; then
  mkdir -p "$DEST/smollm2"
  find "$REAL/smollm2-135m-instruct" -maxdepth 1 -type f ! -name '*.safetensors' -exec cp {} "$DEST/smollm2/" \;
fi

cat > "$DEST/run.sh" <<'RUN'
#!/usr/bin/env bash
# On the GPU machine, from the checkout's root: unpack the bundle, then scripts/gpu_check.sh (its options pass through).
set -u
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p /tmp/gpu_bundle/site && tar -C /tmp/gpu_bundle/site -xJf "$here/site.tar.xz" && tar -C /tmp/gpu_bundle -xJf "$here/esp.tar.xz"
export PYTHONPATH=/tmp/gpu_bundle/site${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
if /tmp/gpu_bundle/esp/bin/espeak-ng -v en-us --stdout one > /dev/null 2>&1; then
  export PATH=/tmp/gpu_bundle/esp/bin:$PATH
else
  echo "gpu_bundle: espeak-ng does not run here: the speech families' tests will skip"
fi
[ -d "$here/smollm2" ] && export GPU_CHECK_SMOLLM2_SKELETON=${GPU_CHECK_SMOLLM2_SKELETON:-$here/smollm2}
exec bash scripts/gpu_check.sh
RUN
chmod +x "$DEST/run.sh"
du -sh "$DEST"/*
echo "gpu_bundle: $DEST ($(du -sh "$DEST" | cut -f1)); on the GPU machine: bash $DEST/run.sh"
