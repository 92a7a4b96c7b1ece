"""Precision on ViTs that fail like real ones (issue 27), with NVIDIA ModelOpt's ONNX PTQ as the peer.

Bundles: the shipped digits model and three function-preserving variants of it
(calibration/stress_models.py: LayerNorm-output outliers K=64, 2 channels per norm1/norm2; a massive
residual stream x 8192; a planted fault in blocks.2, K=512), exported by vitdeploy. For each:

* fp32 accuracy on digits:test (360 images);
* fp16: the default policy (range pass on digits:train, gate on digits:test) and the same without the
  range pass (``data_max=inf``): accuracy and agreement with fp32, linear layers left in fp16, or the
  gate's refusal;
* INT8 per recipe, each calibrated on the same 512 digits:train images (the seeded subset of
  ``calibrate``): entropy / percentile / minmax on the plain graph, entropy on the smoothed graphs
  (layernorm, all; alpha 0.5), and the default ``calibrate`` ladder's choice; scored in reference
  semantics (ORT fake-quant, what TensorRT computes): accuracy, top-1 agreement, logit cosine p1,
  INT8 layer count, gate verdict;
* ModelOpt 0.47 ``python -m modelopt.onnx.quantization --quantize_mode int8`` (entropy and max; what
  it does not quantize in fp16, its default, and in fp32) on the same fp32 graph and the same 512
  images (run from a separate venv, ``--modelopt-python``; ``--calibration_eps cpu``), scored the
  same way;
* CPU latency (ORT "all", 1 thread, batch 1 and 8): every graph of a bundle timed round-robin in one
  process, ``--rounds`` times; the table gives the range of the per-round medians.

    .venv/bin/python bench/bench_precision_variants.py --work /tmp/bpv --json bpv.json \\
        --modelopt-python /work/wt/modelopt-venv/bin/python
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from vitdeploy.bundle import Bundle
from vitdeploy.runtime.ort import OrtRunner

KINDS = ("digits", "outliers", "massive", "block-fault")
SAMPLES = 512


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def bundles(work: Path, kinds: tuple[str, ...] = KINDS) -> dict[str, Bundle]:
    from vitdeploy.calibration.stress_models import digits_variant, write_reference_checkpoint
    from vitdeploy.exporters import ExportOptions, export

    out = {}
    for kind in kinds:
        root = work / kind
        if not (root / "manifest.json").is_file():
            source = "builtin:digits"
            if kind != "digits":
                model, config, record = digits_variant(kind)
                source = f"ref:{write_reference_checkpoint(model, config, record, work / 'checkpoints' / f'{kind}.safetensors')}"
            log(f"exporting {source} ...")
            export(source, root, ExportOptions(check_images=16))
        out[kind] = Bundle.open(root)
    return out


def test_split() -> tuple[np.ndarray, np.ndarray]:
    from vitdeploy.builtin import load_digits_split

    return load_digits_split("test")


def score(path: Path, ref: np.ndarray, labels: np.ndarray, optimization: str = "basic") -> dict[str, Any]:
    from vitdeploy.calibration.evaluate import scores

    runner = OrtRunner(path, optimization=optimization, threads=1, providers=["CPUExecutionProvider"])
    logits = np.concatenate([runner.infer(x)["logits"] for x in np.array_split(test_split()[0], 4)])
    runner.close()
    s = scores(logits, labels, ref)
    s["finite"] = bool(np.isfinite(logits).all())
    return {k: s[k] for k in ("accuracy", "top1_agreement", "cosine_p1", "finite")}


def fp16_rows(bundle: Bundle, work: Path, ref: np.ndarray, labels: np.ndarray) -> list[dict[str, Any]]:
    from vitdeploy.errors import CheckFailed
    from vitdeploy.exporters.fp16 import add_fp16_to_bundle

    rows = []
    for name, data_max in (("fp16 (range pass + gate)", None), ("fp16 without the range pass", float("inf"))):
        copy = work / f"{bundle.root.name}-{'range' if data_max is None else 'norange'}"
        shutil.rmtree(copy, ignore_errors=True)
        shutil.copytree(bundle.root, copy)
        target = Bundle.open(copy)
        try:
            path = add_fp16_to_bundle(target, data="digits:train", eval_data="digits:test", data_max=data_max)
        except CheckFailed as exc:
            rows.append({"graph": name, "refused": str(exc).split(";")[0]})
            continue
        record = Bundle.open(copy).artifact_record("fp16")
        rows.append({"graph": name, "path": str(path), **score(path, ref, labels, "all"),
                     "fp16_linear": f"{record['placement']['linear_ops_fp16']}/{record['placement']['linear_ops']}",
                     "range_pass_nodes": len((record.get("range_pass") or {}).get("nodes") or [])})
    return rows


def int8_rows(bundle: Bundle, work: Path, ref: np.ndarray, labels: np.ndarray) -> list[dict[str, Any]]:
    from vitdeploy.calibration.api import CalibrateOptions, calibrate_bundle
    from vitdeploy.calibration.evaluate import graph_outputs, load_eval_data
    from vitdeploy.gate import Gate
    from vitdeploy.calibration.qdq import Recipe
    from vitdeploy.calibration.smooth import Smoothing
    from vitdeploy.calibration.sources import open_source
    from vitdeploy.calibration.sweep import Trials
    from vitdeploy.errors import CheckFailed

    rows = []
    source = open_source("digits:train", bundle, SAMPLES)
    data = load_eval_data(bundle, "digits:test")
    fp32 = bundle.artifact_path("fp32")
    fp32_ref = graph_outputs(fp32, data.images, "all", 1)
    fp32_acc = float((fp32_ref["logits"].argmax(1) == data.labels).mean())
    keep = work / f"{bundle.root.name}-int8"
    keep.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        trials = Trials(fp32, source, data, fp32_ref, fp32_acc, "tensorrt", bundle.manifest, Path(tmp), Gate(), threads=1,
                        measure_latency=False)
        recipes = [("int8 entropy", Recipe("entropy")), ("int8 percentile", Recipe("percentile")), ("int8 minmax", Recipe("minmax")),
                   ("int8 entropy + smoothing (layernorm)", Recipe("entropy", smoothing=Smoothing(0.5, "layernorm"))),
                   ("int8 entropy + smoothing (all)", Recipe("entropy", smoothing=Smoothing(0.5, "all")))]
        for name, recipe in recipes:
            start = time.perf_counter()
            cand = trials.run(name, recipe)
            path = keep / f"{name.replace(' ', '_').replace('(', '').replace(')', '').replace('+', 'plus')}.onnx"
            shutil.copyfile(cand.path, path)
            s = cand.scores["reference"]
            rows.append({"graph": name, "path": str(path), "accuracy": s["accuracy"], "top1_agreement": s["top1_agreement"],
                         "cosine_p1": s["cosine_p1"], "int8_layers": cand.int8_layers, "passed": cand.passed,
                         "seconds": round(time.perf_counter() - start, 1)})
    copy = work / f"{bundle.root.name}-ladder"
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(bundle.root, copy)
    start = time.perf_counter()
    try:
        record = calibrate_bundle(copy, CalibrateOptions(data="digits:train", eval_data="digits:test", samples=SAMPLES, threads=1))
        chosen = record["selection"]["chosen"]
        smooth = chosen.get("smoothing")
        label = f"{chosen['method']}, exclusions {chosen['exclusions']}, smoothing {smooth['scope'] if smooth else 'none'}"
        rows.append({"graph": f"int8 calibrate default ({label})", "path": str(copy / "model.int8.onnx"),
                     **score(copy / "model.int8.onnx", ref, labels), "int8_layers": record["placement"]["quantized_layers"],
                     "passed": True, "recipes_tried": len(record["selection"]["candidates"]), "seconds": round(time.perf_counter() - start, 1)})
    except CheckFailed as exc:
        rows.append({"graph": "int8 calibrate default", "refused": str(exc)[:160], "seconds": round(time.perf_counter() - start, 1)})
    return rows


def modelopt_rows(bundle: Bundle, work: Path, python: str | None, ref: np.ndarray, labels: np.ndarray) -> list[dict[str, Any]]:
    if not python:
        return []
    from vitdeploy.calibration.sources import open_source

    from vitdeploy.gate import Gate

    calib = work / f"{bundle.root.name}-calib512.npz"
    source = open_source("digits:train", bundle, SAMPLES)
    np.savez(calib, images=source.images)
    rows = []
    # ModelOpt's default keeps what it does not quantize in fp16 (--high_precision_dtype fp16); fp32 isolates its INT8
    for method, high in (("entropy", "fp16"), ("max", "fp16"), ("entropy", "fp32"), ("max", "fp32")):
        out = work / f"{bundle.root.name}-modelopt-{method}-{high}.onnx"
        start = time.perf_counter()
        cmd = [python, "-m", "modelopt.onnx.quantization", "--onnx_path", str(bundle.artifact_path("fp32")), "--quantize_mode", "int8",
               "--calibration_method", method, "--calibration_data_path", str(calib), "--calibration_eps", "cpu", "--output_path", str(out),
               "--high_precision_dtype", high]
        done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
        seconds = round(time.perf_counter() - start, 1)
        if done.returncode != 0 or not out.is_file():
            rows.append({"graph": f"ModelOpt int8 {method} (rest {high})", "refused": (done.stderr or done.stdout).strip().splitlines()[-1][:160]})
            continue
        s = score(out, ref, labels)
        passed, _ = Gate().verdict(float((ref.argmax(1) == labels).mean()), {**s, "cosine_min": s["cosine_p1"]})
        rows.append({"graph": f"ModelOpt 0.47 int8 {method} (rest {high})", "path": str(out), **s, "int8_layers": _qdq_layers(out), "passed": passed,
                     "calibration_images": len(source), "calibration_sha256": source.sha256[:12], "seconds": seconds})
    return rows


def _qdq_layers(path: Path) -> int:
    import onnx

    model = onnx.load(str(path))
    producer = {o: n for n in model.graph.node for o in n.output}
    linear = [n for n in model.graph.node if n.op_type in ("MatMul", "Gemm", "Conv")]
    return sum(1 for n in linear if all(producer.get(i) is not None and producer[i].op_type == "DequantizeLinear" for i in n.input[:2]))


def latencies(paths: dict[str, Path], rounds: int, runs: int) -> dict[str, dict[str, list[float]]]:
    """{graph: {"b1": [median per round], "b8": [...]}}; graphs interleaved round-robin."""
    rng = np.random.default_rng(0)
    out: dict[str, dict[str, list[float]]] = {name: {"b1": [], "b8": []} for name in paths}
    runners = {name: OrtRunner(p, optimization="all", threads=1, providers=["CPUExecutionProvider"]) for name, p in paths.items()}
    for batch in (1, 8):
        images = rng.integers(0, 256, (batch, 32, 32, 3), dtype=np.uint8)
        for r in runners.values():
            for _ in range(5):
                r.infer(images)
        for _ in range(rounds):
            times: dict[str, list[float]] = {name: [] for name in runners}
            for _ in range(runs):
                for name, r in runners.items():
                    start = time.perf_counter()
                    r.infer(images)
                    times[name].append(time.perf_counter() - start)
            for name, t in times.items():
                out[name][f"b{batch}"].append(round(float(np.median(t)) * 1000, 3))
    for r in runners.values():
        r.close()
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--work", type=Path, default=Path("/tmp/vitdeploy-bench-precision-variants"))
    p.add_argument("--modelopt-python", default=None, help="python of a venv with nvidia-modelopt[onnx] (the peer row)")
    p.add_argument("--kinds", default=",".join(KINDS))
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--runs", type=int, default=100)
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    load_start = list(os.getloadavg())
    images, labels = test_split()
    result: dict[str, Any] = {"load_average_at_start": load_start, "samples": SAMPLES, "bundles": {}}
    for kind, bundle in bundles(args.work).items():
        if kind not in args.kinds.split(","):
            continue
        log(f"== {kind}")
        ref = OrtRunner(bundle.artifact_path("fp32"), threads=1, providers=["CPUExecutionProvider"]).infer(images)["logits"]
        rows = [{"graph": "fp32", "path": str(bundle.artifact_path("fp32")), **score(bundle.artifact_path("fp32"), ref, labels, "all")}]
        rows += fp16_rows(bundle, args.work, ref, labels)
        rows += int8_rows(bundle, args.work, ref, labels)
        rows += modelopt_rows(bundle, args.work, args.modelopt_python, ref, labels)
        timed = latencies({r["graph"]: Path(r["path"]) for r in rows if "path" in r}, args.rounds, args.runs)
        for r in rows:
            if r["graph"] in timed:
                r["ms_b1"], r["ms_b8"] = timed[r["graph"]]["b1"], timed[r["graph"]]["b8"]
        result["bundles"][kind] = rows
        for r in rows:
            log("  " + json.dumps({k: v for k, v in r.items() if k != "path"}))
    result["load_average_at_end"] = list(os.getloadavg())
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    print(markdown(result))
    return 0


def markdown(result: dict[str, Any]) -> str:
    lines = ["| bundle | graph | accuracy | agreement | cos p1 | INT8 / fp16 layers | gate | CPU ms b1 | CPU ms b8 |",
             "|---|---|---:|---:|---:|---:|---|---:|---:|"]

    def rng(values: list[float] | None) -> str:
        return "" if not values else f"{min(values):.3f}-{max(values):.3f}"

    for kind, rows in result["bundles"].items():
        for r in rows:
            if "refused" in r:
                lines.append(f"| {kind} | {r['graph']} | refused | | | | {r['refused']} | | |")
                continue
            layers = r.get("int8_layers", r.get("fp16_linear", ""))
            gate = "" if "passed" not in r else ("pass" if r["passed"] else "fail")
            lines.append(f"| {kind} | {r['graph']} | {r['accuracy']:.2%} | {r['top1_agreement']:.2%} | {r['cosine_p1']:.4f} | {layers} | "
                         f"{gate} | {rng(r.get('ms_b1'))} | {rng(r.get('ms_b8'))} |")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
