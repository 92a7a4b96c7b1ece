#!/usr/bin/env bash
# The main job on the bundled digits ViT: export -> inspect -> convert/calibrate -> check -> profile
# -> TensorRT engine (built where TensorRT runs; elsewhere a dry run and the trtexec line)
# -> embed (predict, Python app, Triton repository) -> the bundle's report page. `make demo` runs this after installing.
set -euo pipefail
B=${1:-demo-bundle}
# beside the bundle, not in it: export replaces a bundle only while it holds nothing but its own files,
# so a second `make demo` re-exports into the same folder
IMAGES="$B-images"
TRITON="$B-triton"
step() { printf '\n\033[1m== %s ==\033[0m\n' "$*"; }

step "1/9 export the bundled digits ViT: uint8 NHWC in, preprocessing, labels and spec bound in, checked against PyTorch"
vitdeploy export builtin:digits -o "$B" --precision fp32,fp16

step "2/9 inspect what the bundle carries (and what it costs)"
vitdeploy inspect "$B"
vitdeploy costs "$B" --resolutions 16,32,48,64

step "3/9 calibrate INT8 (explicit Q/DQ) on the digits train split, scored on the held-out test split"
vitdeploy calibrate "$B"

step "4/9 check every graph against PyTorch: numbers, accuracy on the test split, protocol"
vitdeploy check "$B"

step "4b/9 evaluate: is each graph fit for shifted conditions? (JPEG, occlusion, background; 120 test images) and an occlusion map"
vitdeploy evaluate "$B" --suite jpeg,occlusion,background-solid --limit 120 --threads 1
vitdeploy evaluate "$B" --occlusion-map digits:test --limit 16 --threads 1

step "5/9 profile latency and throughput against the cost model (static graph: other sizes are re-exported)"
vitdeploy profile "$B" --resolutions 24,32,48 --batch 1,8 --precision fp32,int8 --backend ort,torch --threads 1 --iterations 50 --rounds 10

step "6/9 TensorRT engine"
if python -c "import tensorrt" >/dev/null 2>&1; then
  vitdeploy build-engine "$B" --precision best --batch 1:8:32
else
  echo "TensorRT is not installed here: engines are built on the target GPU. Dry run and trtexec lines:"
  vitdeploy build-engine "$B" --precision int8 --dry-run --print-trtexec --trt-version 10.3
  vitdeploy build-engine "$B" --precision int8 --dry-run --print-trtexec --trt-version 11.4
  vitdeploy build-engine "$B" --precision fp16 --dla-report
fi

step "7/9 embed: classify image files (PNG digits from the test split), from the CLI and a Python app"
mkdir -p "$IMAGES"
python - "$IMAGES" <<'PY'
import sys
from pathlib import Path
from PIL import Image
from vitdeploy.builtin import get_builtin
images, labels = get_builtin("digits").load_split("test")
for i in range(4):
    Image.fromarray(images[i]).save(Path(sys.argv[1]) / f"digit{i}_label{labels[i]}.png")
PY
vitdeploy predict "$B" "$IMAGES"/*.png --top-k 2
python examples/python/classify.py "$B" "$IMAGES"/*.png --top-k 1

step "8/9 a Triton model repository for the bundle"
vitdeploy triton-repo "$B" "$TRITON" --backend onnxruntime --dynamic-batching --kind cpu
find "$TRITON" -maxdepth 3 | sort

step "9/9 one page for the whole bundle: identity, contract, cost, evidence, precision, robustness, latency, engines"
vitdeploy report "$B"
echo
echo "done: $B holds the graphs, reports/check.json, evaluate.json, profile.{csv,json,png} and MODEL_CARD.md"
echo "open the report (offline, one file): $(cd "$B" && pwd)/reports/index.html"
