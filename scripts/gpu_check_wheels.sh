#!/usr/bin/env bash
# Download, here (with internet), the small pure-Python wheels scripts/gpu_check.sh carries to a GPU
# host that has PyTorch but no internet. Only py3-none-any wheels: the host's own binary packages
# (torch, torchvision, numpy, onnx, onnxruntime, safetensors, pillow, matplotlib) are used as they are.
#
#   bash scripts/gpu_check_wheels.sh [DEST]        # default DEST: .gpu-wheels (git-ignored)
#
# Versions are the ones this checkout is tested with (read from .venv when it exists, else the newest).
# Env: PYTHON (the pip to use; default .venv/bin/python or python3), GPU_PYTHON_VERSION (the GPU host's
# Python, for requires-python; default 3.12, what NVIDIA's PyTorch images ship), MAX_MIB (default 64).
set -euo pipefail
cd "$(dirname "$0")/.."
DEST="${1:-.gpu-wheels}"
PY="${PYTHON:-}"
if [ -z "$PY" ]; then
  if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
GPU_PY="${GPU_PYTHON_VERSION:-3.12}"
MAX_MIB="${MAX_MIB:-64}"

# What vitdeploy (core + export + the gpu tests) imports that a PyTorch image may lack, pure Python only.
PACKAGES=(
  click rich markdown-it-py mdurl pygments threadpoolctl colorama
  onnxscript onnx-ir onnxslim onnxconverter-common
  timm huggingface-hub filelock fsspec tqdm packaging
  pytest pluggy iniconfig
  setuptools
)

specs=()
for name in "${PACKAGES[@]}"; do
  version="$("$PY" -c "import importlib.metadata as m, sys
try: print(m.version(sys.argv[1]))
except m.PackageNotFoundError: pass" "$name" 2>/dev/null || true)"
  specs+=("${name}${version:+==$version}")
done

mkdir -p "$DEST.tmp"
trap 'rm -rf "$DEST.tmp"' EXIT
"$PY" -m pip download --quiet --no-deps --only-binary=:all: --implementation py --abi none --platform any \
  --python-version "$GPU_PY" -d "$DEST.tmp" "${specs[@]}"
size_kib=$(du -sk "$DEST.tmp" | cut -f1)
if [ "$size_kib" -gt $((MAX_MIB * 1024)) ]; then
  echo "error: the wheels take $((size_kib / 1024)) MiB, over the ${MAX_MIB} MiB a GPU host may be sent; trim PACKAGES" >&2
  exit 1
fi
rm -rf "$DEST"
mv "$DEST.tmp" "$DEST"
trap - EXIT
echo "$(ls "$DEST"/*.whl | wc -l) wheels, $((size_kib / 1024)) MiB in $DEST; carry it with the checkout and run scripts/gpu_check.sh there"
