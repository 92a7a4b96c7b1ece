#!/usr/bin/env bash
# Install the Python bindings (only, ~1 MB each, no native libraries) of every TensorRT version
# vitdeploy drives, one folder per version, for the tests that check vitdeploy's TensorRT code
# against the real API of each version (tests/test_engine_bindings.py). Test tooling: a user's
# TensorRT comes from JetPack or `pip install tensorrt`, never from here.
#
#   usage: scripts/install_trt_bindings.sh DEST        (e.g. DEST=.venv/trt-bindings)
#   PYTHON=path/to/python selects the interpreter whose wheel tags pip matches (default: python3).
#
# Each version lands in DEST/<version>/tensorrt_bindings; the wheels all provide the module
# `tensorrt_bindings`, so they cannot share one site-packages. Idempotent: a version whose folder
# is complete is skipped, so a second run costs nothing.
set -euo pipefail

DEST=${1:?usage: $0 DEST}
PY=${PYTHON:-python3}

# name version - the bindings wheel of TensorRT 8.6 (JetPack 6.0), 10.3 (JetPack 6.1/6.2),
# 10.13 (JetPack 7.0/7.1), 10.16 (JetPack 7.2, latest 10.x) and 11.4 (strongly typed only; JetPack 7.2.2+)
WHEELS=(
  "tensorrt-bindings 8.6.1"
  "tensorrt-cu12-bindings 10.3.0"
  "tensorrt-cu12-bindings 10.13.3.9"
  "tensorrt-cu12-bindings 10.16.1.11"
  "tensorrt-cu12-bindings 11.4.0.106"
)

mkdir -p "$DEST"
for entry in "${WHEELS[@]}"; do
  read -r name version <<<"$entry"
  dir="$DEST/$version"
  if [ -f "$dir/.complete" ]; then
    continue
  fi
  tmp="$dir.partial"
  rm -rf "$tmp"
  "$PY" -m pip install --quiet --disable-pip-version-check --no-deps --no-compile --target "$tmp" "$name==$version"
  if ! grep -q "__version__ = \"$version\"" "$tmp/tensorrt_bindings/__init__.py"; then
    echo "install_trt_bindings: $name==$version did not install tensorrt_bindings $version" >&2
    exit 1
  fi
  touch "$tmp/.complete"
  rm -rf "$dir"
  mv "$tmp" "$dir"
  echo "installed $name $version into $dir"
done
