#!/usr/bin/env bash
# One GPU verification pass (issue 14), on a GPU host that has PyTorch but no internet.
#
#   bash scripts/gpu_check_wheels.sh            # here, with internet: small pure-Python wheels -> .gpu-wheels/
#   # copy the checkout (with .gpu-wheels/) to the GPU host, then there:
#   bash scripts/gpu_check.sh [OUT_DIR]          # default OUT_DIR: gpu-check/ ; ~4-6 min on an H100/H200
#
# 1. a venv (.venv-gpu) whose .pth names the host's site-packages, so the host's own torch, CUDA,
#    numpy, onnx and onnxruntime are used as they are; into it, with no index: the carried wheels the
#    host lacks (--no-deps --no-build-isolation) and this checkout (-e);
# 2. the versions the host really has;
# 3. the `gpu`-marked tests;
# 4. the torch-CUDA sweep beside bare PyTorch loops in the same run (bench/bench_torch_gpu.py:
#    ViT-S/16 and ViT-B/16 at 224/384, batch 1/8/64, eager / cuda-graph / compile);
# 5. where TensorRT is installed: an fp16 engine for ViT-B/16 and a tensorrt-vs-torch profile.
# Everything lands in OUT_DIR/report.md (and the logs and JSON beside it). Exit 0 only when every step
# ran and the acceptance checks hold.
#
# Env: PYTHON (the host's Python with torch; default python3), WHEELS (default .gpu-wheels),
#      GPU_VENV (default .venv-gpu), QUICK=1 (ViT-B/16 at 224 only: a ~2 min smoke pass),
#      INSTALL_ONLY=1 (steps 1-2 only, no GPU needed: prepare and check the venv ahead).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-gpu-check}"
HOST_PY="${PYTHON:-python3}"
WHEELS="${WHEELS:-.gpu-wheels}"
VENV="${GPU_VENV:-.venv-gpu}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
REPORT="$OUT/report.md"
STATUS=0
START=$(date +%s)

say() { printf '%s\n' "$*" | tee -a "$REPORT"; }
fail() { say "**FAILED**: $*"; STATUS=1; }

: > "$REPORT"
say "# vitdeploy GPU check"
say ""
say "- started: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname)"
say "- checkout: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' (with local changes)')"

# -- 0. the host: torch and a GPU ---------------------------------------------------------------
if ! "$HOST_PY" -c "import torch" 2>/dev/null; then
  say "error: $HOST_PY cannot import torch; run on a host with PyTorch (or set PYTHON=/path/to/python)"
  exit 2
fi
if [ "${INSTALL_ONLY:-0}" != "1" ] && ! "$HOST_PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  say "error: torch on this host sees no CUDA GPU; the GPU check needs one (the CPU suite is \`make test\`)"
  exit 2
fi

# -- 1. the venv beside the host's torch ----------------------------------------------------------
if [ ! -x "$VENV/bin/python" ]; then
  "$HOST_PY" -m venv "$VENV" 2>/dev/null || "$HOST_PY" -m venv --without-pip "$VENV" || { say "error: cannot create $VENV"; exit 2; }
fi
PY="$VENV/bin/python"
if "$PY" -m pip --version >/dev/null 2>&1; then PIP=("$PY" -m pip); else PIP=("$HOST_PY" -m pip --python "$PY"); fi
PURELIB="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
# The host's package folders (where torch lives first), after the venv's own: carried wheels shadow
# nothing the host has, because only missing ones are installed below.
"$HOST_PY" - > "$PURELIB/_vitdeploy_host_site.pth" <<'PYEOF'
import os, site, sysconfig, torch
dirs = [os.path.dirname(os.path.dirname(torch.__file__))]
dirs += site.getsitepackages() + [site.getusersitepackages(), sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]]
print("\n".join(d for d in dict.fromkeys(dirs) if os.path.isdir(d)))
PYEOF
missing_wheels=()
if compgen -G "$WHEELS/*.whl" >/dev/null; then
  for whl in "$WHEELS"/*.whl; do
    dist="$(basename "$whl" | cut -d- -f1)"
    # missing on the host, or setuptools older than the build backend needs (a Python 3.11 venv
    # bundles setuptools 65, which cannot build an editable wheel without the `wheel` package)
    if ! "$PY" -c "import importlib.metadata as m, sys
v = m.version(sys.argv[1])
sys.exit(1 if sys.argv[1] == 'setuptools' and int(v.split('.')[0]) < 68 else 0)" "$dist" 2>/dev/null; then
      missing_wheels+=("$whl")
    fi
  done
fi
if [ "${#missing_wheels[@]}" -gt 0 ]; then
  "${PIP[@]}" install -q --no-index --no-deps --no-build-isolation "${missing_wheels[@]}" >"$OUT/install.log" 2>&1 \
    || { say "error: installing the carried wheels failed (see $OUT/install.log)"; exit 2; }
fi
"${PIP[@]}" install -q --no-index --no-deps --no-build-isolation -e . >>"$OUT/install.log" 2>&1 \
  || { say "error: installing vitdeploy from the checkout failed (see $OUT/install.log; setuptools>=68 must be importable)"; exit 2; }
say "- installed into $VENV: vitdeploy (editable) + ${#missing_wheels[@]} carried wheel(s) the host lacked"

# -- 2. versions ----------------------------------------------------------------------------------
say ""
say "## Versions on this host"
"$PY" - <<'PYEOF' | tee -a "$REPORT"
import importlib, importlib.metadata as md, platform
import torch
if torch.cuda.is_available():
    print(f"- GPU: {torch.cuda.get_device_name(0)} (compute capability {'.'.join(map(str, torch.cuda.get_device_capability(0)))}), "
          f"torch built for CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}")
else:
    print("- GPU: none visible to torch")
print(f"- Python {platform.python_version()} on {platform.machine()}")
for name in ("torch", "torchvision", "numpy", "onnx", "onnxruntime", "onnxruntime-gpu", "timm", "transformers", "onnxscript",
             "onnxslim", "safetensors", "tensorrt", "cuda-python", "nvidia-ml-py", "vitdeploy"):
    try:
        print(f"- {name} {md.version(name)}")
    except md.PackageNotFoundError:
        pass
missing = []
for module in ("vitdeploy", "click", "rich", "numpy", "onnx", "onnxruntime", "safetensors", "PIL", "matplotlib", "timm", "onnxscript", "pytest"):
    try:
        importlib.import_module(module)
    except Exception as exc:
        missing.append(f"{module} ({type(exc).__name__}: {exc})")
if missing:
    print("- **cannot import**: " + "; ".join(missing) + " -- carry the wheel (scripts/gpu_check_wheels.sh) or install it on the host")
PYEOF
if grep -q "cannot import" "$REPORT"; then STATUS=1; fi
if [ "${INSTALL_ONLY:-0}" = "1" ]; then
  say "- INSTALL_ONLY=1: stopping after the install and version steps"
  exit "$STATUS"
fi

# -- 3. the gpu tests -----------------------------------------------------------------------------
say ""
say "## gpu-marked tests"
mapfile -t gpu_tests < <(grep -l "mark.gpu" tests/test_*.py)
timeout 240 "$PY" -m pytest -q -m gpu -p no:cacheprovider "${gpu_tests[@]}" >"$OUT/gpu-tests.log" 2>&1
rc=$?
say "- \`pytest -m gpu ${gpu_tests[*]}\`: $(tail -n 1 "$OUT/gpu-tests.log") (exit $rc; log: gpu-tests.log)"
[ "$rc" -eq 0 ] || fail "gpu tests (exit $rc)"

# -- 4. torch-CUDA sweep beside bare PyTorch -------------------------------------------------------
say ""
say "## PyTorch on the GPU: vitdeploy profile cells vs bare PyTorch loops (same run)"
bench_args=(--work "$OUT/work" --json "$OUT/torch_gpu.json" --markdown "$OUT/torch_gpu.md")
if [ "${QUICK:-0}" = "1" ]; then
  bench_args+=(--models vit_base_patch16_224 --resolutions 224 --iterations 50)
fi
timeout 420 "$PY" bench/bench_torch_gpu.py "${bench_args[@]}" >"$OUT/torch_gpu.log" 2>&1
rc=$?
if [ -f "$OUT/torch_gpu.md" ]; then cat "$OUT/torch_gpu.md" >> "$REPORT"; fi
say "- command: \`python bench/bench_torch_gpu.py ${bench_args[*]}\` (exit $rc; log: torch_gpu.log)"
[ "$rc" -eq 0 ] || fail "torch GPU sweep (exit $rc)"
if grep -q "DOES NOT HOLD" "$OUT/torch_gpu.md" 2>/dev/null; then fail "an acceptance check does not hold (see the table)"; fi

# -- 5. TensorRT, where it exists ------------------------------------------------------------------
say ""
say "## TensorRT"
BUNDLE="$OUT/work/timm_vit_base_patch16_224"
if ! "$PY" -c "import tensorrt" 2>/dev/null; then
  say "- TensorRT is not installed on this host: the engine path was not run"
elif [ ! -f "$BUNDLE/manifest.json" ]; then
  fail "no ViT-B/16 bundle from step 4 to build an engine from"
else
  VD="$VENV/bin/vitdeploy"
  timeout 240 "$VD" build-engine "$BUNDLE" --precision fp16 --batch 1:8:64 --resolution 224:224:224 --target gpu-check >"$OUT/trt-build.log" 2>&1
  rc=$?
  say "- \`vitdeploy build-engine BUNDLE --precision fp16 --batch 1:8:64 --resolution 224:224:224\`: exit $rc (log: trt-build.log)"
  if [ "$rc" -eq 0 ]; then
    timeout 180 "$VD" profile "$BUNDLE" --backend tensorrt,torch --torch-mode cuda-graph --precision fp16 --resolutions 224 \
      --batch 1,8,64 --iterations 100 --no-plot -o "$OUT/trt-profile" >"$OUT/trt-profile.log" 2>&1
    rc=$?
    say "- \`vitdeploy profile BUNDLE --backend tensorrt,torch --torch-mode cuda-graph --precision fp16 --resolutions 224 --batch 1,8,64\`: exit $rc"
    if [ -f "$OUT/trt-profile/profile.json" ]; then
      "$PY" - "$OUT/trt-profile/profile.json" <<'PYEOF' | tee -a "$REPORT"
import json, sys
cells = json.load(open(sys.argv[1]))["cells"]
print("\n| backend | size | batch | p50 ms | device p50 ms | img/s | gpu_mem_mb | status |\n|---|---|---|---|---|---|---|---|")
f = lambda v, s: "-" if v is None else format(v, s)
for c in cells:
    name = c["backend"] + (f" {c['torch_mode']}" if c.get("torch_mode") else "")
    print(f"| {name} | {c['height']} | {c['batch']} | {f(c.get('p50_ms'), '.3f')} | {f(c.get('device_p50_ms'), '.3f')} | "
          f"{f(c.get('throughput_ips'), '.0f')} | {f(c.get('gpu_mem_mb'), '.0f')} | {c['status']} {c.get('note') or ''} |")
PYEOF
    fi
  fi
  [ "$rc" -eq 0 ] || fail "TensorRT step (exit $rc)"
fi

say ""
say "- finished in $(( $(date +%s) - START )) s; overall: $([ "$STATUS" -eq 0 ] && echo PASS || echo FAIL)"
echo "report: $REPORT"
exit "$STATUS"
