"""fp32 vs fp16 vs int8 on ONNX Runtime (CPU), side by side in one run; plus the digits accuracies.

Latency (issue 5): ViT-S/16 at 224 (timm, random init: weights don't change the arithmetic), exported
by vitdeploy, then converted to fp16 (``add_fp16_to_bundle``) and calibrated to int8 twice: the
TensorRT graph (symmetric S8S8) and the CPU graph (U8S8, 7-bit weights). Every graph runs with ORT's
"all" optimizations (how this CPU would deploy it: int8 Q/DQ fused into integer kernels), at batch 1
and 8. The calls are interleaved round-robin (graph A, B, C, D, A, B, ...) so drift and the other
processes of a shared machine fall on every graph alike; the table reports medians and p90.

Accuracy: the bundled digits model (``builtin:digits``) on its held-out test split: fp32, fp16, and
int8 in reference semantics (fake-quant, "basic") and on this CPU's int8 kernels ("all"), each
calibrated with the defaults of ``vitdeploy calibrate``.

    .venv/bin/python bench/bench_precision.py                       # ~3 min on 2 cores (1 ORT thread)
    .venv/bin/python bench/bench_precision.py --threads 2 --runs 40 --json precision.json --work /tmp/bp
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

from vitdeploy.bundle import Bundle
from vitdeploy.runtime.ort import OrtRunner


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def ensure_export(work: Path, source: str, name: str) -> Bundle:
    target = work / name
    if (target / "manifest.json").is_file():
        return Bundle.open(target)
    from vitdeploy.exporters import ExportOptions, export

    log(f"exporting {source} to {target} ...")
    # the ViT-S latency graphs: random weights (they don't change the arithmetic; no hub needed)
    return export(source, target, ExportOptions(check_images=4, random_init=source.split(":", 1)[0] in ("timm", "hf")))


def ensure_precisions(bundle: Bundle, calib: str | None, samples: int, method: str | None) -> dict[str, Path]:
    """fp16 and the two int8 graphs next to the fp32 one (int8 graphs kept under distinct names)."""
    import shutil

    from vitdeploy.calibration.api import CalibrateOptions, calibrate_bundle
    from vitdeploy.exporters.fp16 import add_fp16_to_bundle

    root = bundle.root
    if "fp16" not in bundle.precisions():
        log("fp16 pass ...")
        add_fp16_to_bundle(bundle)
    paths = {"fp32": root / "model.onnx", "fp16": root / "model.fp16.onnx"}
    for target in ("tensorrt", "cpu"):
        keep = root / f"int8-{target}.onnx"
        if not keep.is_file():
            log(f"int8 ({target}) ...")
            calibrate_bundle(root, CalibrateOptions(data=calib, samples=samples, method=method, target=target))
            shutil.copyfile(root / "model.int8.onnx", keep)
        paths[f"int8 ({target} graph)"] = keep
    return paths


def latency_table(paths: dict[str, Path], size: int, batches: list[int], runs: int, warmup: int, threads: int) -> list[dict]:
    rng = np.random.default_rng(0)
    rows = []
    for batch in batches:
        images = rng.integers(0, 256, (batch, size, size, 3), dtype=np.uint8)
        runners = {name: OrtRunner(p, optimization="all", threads=threads, providers=["CPUExecutionProvider"]) for name, p in paths.items()}
        for runner in runners.values():
            for _ in range(warmup):
                runner.infer(images)
        samples: dict[str, list[float]] = {name: [] for name in runners}
        for _ in range(runs):  # round-robin: every graph sees the same machine state
            for name, runner in runners.items():
                start = time.perf_counter()
                runner.infer(images)
                samples[name].append(time.perf_counter() - start)
        fp32_median = float(np.median(samples["fp32"]))
        for name, times in samples.items():
            ms = np.asarray(times) * 1000.0
            rows.append({"graph": name, "batch": batch, "median_ms": float(np.median(ms)), "p90_ms": float(np.percentile(ms, 90)),
                         "per_image_ms": float(np.median(ms)) / batch, "vs_fp32": float(np.median(times)) / fp32_median})
        for runner in runners.values():
            runner.close()
    return rows


def digits_accuracies(work: Path, method: str | None) -> dict:
    import shutil

    from vitdeploy.builtin import load_digits_split
    from vitdeploy.calibration.api import CalibrateOptions, calibrate_bundle
    from vitdeploy.exporters.fp16 import add_fp16_to_bundle

    bundle = ensure_export(work, "builtin:digits", "digits")
    if "fp16" not in bundle.precisions():
        add_fp16_to_bundle(bundle)
    out = {}
    for target in ("tensorrt", "cpu"):
        record = calibrate_bundle(bundle.root, CalibrateOptions(method=method, target=target))
        shutil.copyfile(bundle.root / "model.int8.onnx", bundle.root / f"int8-{target}.onnx")
        ev = record["evaluation"]
        out[f"int8 ({target} graph)"] = {"method": record["method"], "exclusions": record["selection"]["chosen"]["exclusions"],
                                         "reference": ev["reference"]["accuracy"], "this_cpu": ev["this_cpu"]["accuracy"],
                                         "cosine_reference": ev["reference"]["cosine_min"], "cosine_this_cpu": ev["this_cpu"]["cosine_min"],
                                         "agreement_reference": ev["reference"]["top1_agreement"],
                                         "agreement_this_cpu": ev["this_cpu"]["top1_agreement"],
                                         "calibration": {k: record["calibration"][k] for k in ("source", "count", "sha256")}}
    images, labels = load_digits_split("test")
    for precision in ("fp32", "fp16"):
        runner = OrtRunner(Bundle.open(bundle.root).artifact_path(precision), providers=["CPUExecutionProvider"])
        logits = np.concatenate([runner.infer(images[i : i + 64])["logits"] for i in range(0, len(images), 64)])
        out[precision] = float((logits.argmax(1) == labels).mean())
    out["test_images"] = int(len(labels))
    return out


def machine() -> dict:
    import onnxruntime

    from vitdeploy.calibration.cpu_int8 import cpu_features

    return {"cpu": cpu_features(), "cores": os.cpu_count(), "python": platform.python_version(),
            "onnxruntime": onnxruntime.__version__, "load_average_at_start": list(os.getloadavg())}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--source", default="timm:vit_small_patch16_224")
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--batches", default="1,8")
    p.add_argument("--runs", type=int, default=30, help="timed calls per graph and batch (interleaved)")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--threads", type=int, default=1, help="ORT intra-op threads (1: stable on a shared machine)")
    p.add_argument("--calib-samples", type=int, default=64, help="random images calibrating the ViT-S int8 graphs (latency only)")
    p.add_argument("--method", default=None, help="calibration method of every int8 graph (default: calibrate's own: entropy, "
                   "and on the digits model the first recipe of its ladder inside the gate)")
    p.add_argument("--work", type=Path, default=Path("/tmp/vitdeploy-bench-precision"))
    p.add_argument("--skip-digits", action="store_true")
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)

    info = machine()
    bundle = ensure_export(args.work, args.source, args.source.replace(":", "_"))
    calib = args.work / f"calib-{args.size}.npy"
    if not calib.is_file():
        np.save(calib, np.random.default_rng(1).integers(0, 256, (args.calib_samples, args.size, args.size, 3), dtype=np.uint8))
    paths = ensure_precisions(bundle, str(calib), args.calib_samples, args.method)
    log(f"timing {len(paths)} graphs x batches {args.batches}, {args.runs} interleaved runs each ...")
    rows = latency_table(paths, args.size, [int(b) for b in args.batches.split(",")], args.runs, args.warmup, args.threads)
    accuracy = None if args.skip_digits else digits_accuracies(args.work, args.method)
    info["load_average_at_end"] = list(os.getloadavg())

    print(f"\nONNX Runtime {info['onnxruntime']} CPU, {args.threads} threads, {args.source} at {args.size}x{args.size}, "
          f"optimization 'all', {args.runs} interleaved runs ({info['cpu']['model']}, {info['cores']} cores)\n")
    print("| graph | batch | median ms | p90 ms | ms / image | vs fp32 |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['graph']} | {r['batch']} | {r['median_ms']:.1f} | {r['p90_ms']:.1f} | {r['per_image_ms']:.1f} | {r['vs_fp32']:.2f}x |")
    if accuracy:
        print(f"\ndigits test split ({accuracy['test_images']} images):\n")
        print("| graph | recipe | accuracy (reference, fake-quant) | accuracy (this CPU) | top-1 agreement ref / CPU | worst logit cosine ref / CPU |")
        print("|---|---|---:|---:|---:|---:|")
        print(f"| fp32 | - | {accuracy['fp32']:.2%} | {accuracy['fp32']:.2%} | - | - |")
        print(f"| fp16 | - | {accuracy['fp16']:.2%} | {accuracy['fp16']:.2%} | - | - |")
        for key in ("int8 (tensorrt graph)", "int8 (cpu graph)"):
            a = accuracy[key]
            print(f"| {key} | {a['method']}, exclusions {a['exclusions']} | {a['reference']:.2%} | {a['this_cpu']:.2%} | "
                  f"{a['agreement_reference']:.2%} / {a['agreement_this_cpu']:.2%} | {a['cosine_reference']:.4f} / {a['cosine_this_cpu']:.4f} |")
    print(f"\nCPU: {info['cpu']}\nload average start {info['load_average_at_start']} end {info['load_average_at_end']}")
    if args.json:
        args.json.write_text(json.dumps({"machine": info, "latency": rows, "digits": accuracy, "args": {k: str(v) for k, v in vars(args).items()}}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
