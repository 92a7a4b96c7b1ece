#!/usr/bin/env bash
# The environment `vitdeploy serve` runs Triton in (default: .venv-serve next to this repo).
#
#   bash scripts/install_serve_env.sh [VENV_DIR]       # create/refresh it (idempotent)
#
# Why a second environment: the Triton Inference Server that PyTriton (PyPI `nvidia-pytriton`)
# bundles runs the model through Triton's Python backend, whose stub process embeds the *same*
# Python the environment was made from, and that stub is built against the distribution's Python
# (Debian/Ubuntu's python3; a pyenv-built 3.11.7 fails in multiprocessing.resource_tracker with
# "'_thread.RLock' object has no attribute '_recursion_count'"). PyTriton also needs numpy < 2.
# Keeping both in their own environment leaves the main toolchain (torch, numpy 2) unpinned;
# `vitdeploy serve` in the main environment starts the server process with this one's python.
#
# The base interpreter is the system python3 (override: SERVE_BASE_PYTHON=/path/to/python3).
# vitdeploy goes in as an editable install of this checkout with its core dependencies and one ONNX
# Runtime build (no torch): the server needs the bundle runtime, not export. SERVE_ORT_EXTRA picks the
# build: `cpu` (default, PyPI's onnxruntime) or `gpu` (onnxruntime-gpu and TensorRT); never both, they
# install the same module (docs/INSTALL.md).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
VENV=${1:-$ROOT/.venv-serve}
BASE=${SERVE_BASE_PYTHON:-/usr/bin/python3}
ORT_EXTRA=${SERVE_ORT_EXTRA:-cpu}
case "$ORT_EXTRA" in
    cpu|gpu) ;;
    *) echo "serve env: SERVE_ORT_EXTRA must be cpu or gpu (the ONNX Runtime build), got '$ORT_EXTRA'" >&2; exit 1 ;;
esac

if [[ ! -x "$BASE" ]]; then
    echo "serve env: no system Python at $BASE; install python3 (apt-get install python3 python3-venv) or set SERVE_BASE_PYTHON" >&2
    exit 1
fi

# Debian splits venv/ensurepip into python3-venv (python3.X-venv on Ubuntu).
if ! "$BASE" -c "import ensurepip, venv" >/dev/null 2>&1; then
    pyver=$("$BASE" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
    pkgs=(python3-venv "python${pyver}-venv")
    if ! command -v apt-get >/dev/null 2>&1; then
        echo "serve env: $BASE has no venv/ensurepip module and this is not Debian/Ubuntu; install the venv module for it" >&2
        exit 1
    fi
    if [[ $(id -u) -eq 0 ]]; then
        SUDO=()
    elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
        SUDO=(sudo -n)
    else
        echo "serve env: $BASE lacks the venv module; run: sudo apt-get install -y python3-venv" >&2
        exit 1
    fi
    echo "serve env: installing python3-venv"
    export DEBIAN_FRONTEND=noninteractive
    "${SUDO[@]}" apt-get update -qq
    # python3.X-venv does not exist on every release; python3-venv alone is enough on Debian.
    "${SUDO[@]}" apt-get install -y -qq --no-install-recommends "${pkgs[@]}" >/dev/null 2>&1 \
        || "${SUDO[@]}" apt-get install -y -qq --no-install-recommends python3-venv >/dev/null
fi

if [[ -x "$VENV/bin/python" ]] && ! "$VENV/bin/python" -c "import sys; sys.exit(0 if sys.base_prefix == '$("$BASE" -c 'import sys; print(sys.base_prefix)')' else 1)"; then
    echo "serve env: $VENV was made from another Python; recreating it from $BASE"
    rm -rf "$VENV"
fi
test -x "$VENV/bin/python" || "$BASE" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
# The `serve` extra: nvidia-pytriton (Triton 2.x server + Python backend) and numpy < 2; with one ONNX Runtime build.
"$VENV/bin/python" -m pip install -q -e "$ROOT[serve,$ORT_EXTRA]"
"$VENV/bin/python" -c "import pytriton, numpy, onnxruntime, vitdeploy.serve.server; print('serve env: ready at $VENV (pytriton', __import__('importlib.metadata').metadata.version('nvidia-pytriton') + ', numpy', numpy.__version__ + ')')"
