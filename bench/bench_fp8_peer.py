"""FP8 (E4M3) beside NVIDIA ModelOpt's ONNX PTQ in fp8 mode (issue 39, item 5).

Bundles: the shipped digits model and the outlier and massive-residual stress variants
(calibration/stress_models.py), exported by vitdeploy (bench_precision_variants.bundles). For each:

* vitdeploy's ``calibrate --precision fp8`` pass through the library (:func:`calibrate_fp8_bundle`,
  the default ladder max -> percentile, its gate on digits:test), with the attention matmuls in FP8
  and left in float;
* ModelOpt ``python -m modelopt.onnx.quantization --quantize_mode fp8`` on the same fp32 graph and the
  same 512 digits:train images (the seeded subset ``calibrate`` takes): its default calibration
  (entropy) and ``max`` with the rest in fp16 (its default), the default with ``--disable_mha_qdq``
  (attention matmuls unquantized), and the default with the rest in fp32 (``--modelopt-variants``);
  run from a separate venv (``--modelopt-python``), ``--calibration_eps cpu``;

every graph scored on digits:test (360 images) against the bundle's fp32 graph in reference semantics
(ONNX Runtime CPU, "basic" optimisation: the Q/DQ pairs stay, i.e. fake-quant; ORT's CPU kernels run
E4M3 Q/DQ at opset 19+). FP8 layers: MatMul/Gemm/Conv whose weight (input 1) comes through a
DequantizeLinear of a float8 tensor; "linear" when that weight traces back to a constant, "attention"
otherwise (both inputs activations). Time to quantize: wall seconds of the whole call, same machine,
same process run (vitdeploy's includes its fp16 base graph, range pass and gate on digits:test;
ModelOpt's includes its interpreter start and imports; the JSON also keeps the time ModelOpt logs for
its quantization, "FP8 quantization completed in N seconds").

    .venv/bin/python bench/bench_fp8_peer.py --work /tmp/bfp8 --json bfp8.json \\
        --modelopt-python /work/modelopt-venv/bin/python
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_precision_variants import SAMPLES, bundles, log, score, test_split  # noqa: E402

from vitdeploy.bundle import Bundle  # noqa: E402
from vitdeploy.runtime.ort import OrtRunner  # noqa: E402

KINDS = ("digits", "outliers", "massive")
FLOAT8 = {17, 18, 19, 20}  # onnx.TensorProto FLOAT8E4M3FN, FLOAT8E4M3FNUZ, FLOAT8E5M2, FLOAT8E5M2FNUZ
SCORED = ("accuracy", "top1_agreement", "cosine_p1", "finite", "passed", "linear_fp8", "attention_fp8", "refused")
PASS_THROUGH = {"Transpose", "Reshape", "Cast", "Identity", "Squeeze", "Unsqueeze", "Flatten"}


def fp8_layers(path: Path) -> dict[str, int]:
    """Counts of MatMul/Gemm/Conv nodes (linear: constant weight; attention: activation x activation)
    and how many of each take their input 1 through a float8 DequantizeLinear; plus Q/DQ node counts."""
    import onnx

    model = onnx.load(str(path))
    graph = model.graph
    producer = {o: n for n in graph.node for o in n.output}
    inits = {i.name: i.data_type for i in graph.initializer}
    infos = {v.name: v.type.tensor_type.elem_type for v in list(graph.value_info) + list(graph.input) + list(graph.output)}

    def elem(tensor: str) -> int | None:
        if tensor in inits:
            return inits[tensor]
        node = producer.get(tensor)
        if node is not None and node.op_type == "QuantizeLinear":
            if len(node.input) > 2 and node.input[2]:
                return elem(node.input[2])
            for a in node.attribute:
                if a.name == "output_dtype":
                    return a.i
        if node is not None and node.op_type == "Constant":
            return next((a.t.data_type for a in node.attribute if a.name == "value"), None)
        return infos.get(tensor)

    def through_fp8_dq(tensor: str) -> bool:
        for _ in range(4):
            node = producer.get(tensor)
            if node is None:
                return False
            if node.op_type == "DequantizeLinear":
                return elem(node.input[0]) in FLOAT8
            if node.op_type not in PASS_THROUGH:
                return False
            tensor = node.input[0]
        return False

    def constant(tensor: str) -> bool:
        for _ in range(6):
            if tensor in inits:
                return True
            node = producer.get(tensor)
            if node is None:
                return False
            if node.op_type == "Constant":
                return True
            if node.op_type not in PASS_THROUGH | {"QuantizeLinear", "DequantizeLinear"}:
                return False
            tensor = node.input[0]
        return False

    out = {"linear": 0, "linear_fp8": 0, "attention": 0, "attention_fp8": 0,
           "quantize_linear": sum(n.op_type == "QuantizeLinear" for n in graph.node),
           "dequantize_linear": sum(n.op_type == "DequantizeLinear" for n in graph.node)}
    for node in graph.node:
        if node.op_type not in ("MatMul", "Gemm", "Conv") or len(node.input) < 2:
            continue
        role = "linear" if constant(node.input[1]) else "attention"
        out[role] += 1
        fp8 = through_fp8_dq(node.input[1]) and (role == "linear" or through_fp8_dq(node.input[0]))
        out[f"{role}_fp8"] += int(fp8)
    return out


def gated(path: Path, ref: np.ndarray, labels: np.ndarray) -> dict[str, Any]:
    from vitdeploy.gate import Gate

    s = score(path, ref, labels)  # "basic": reference semantics
    passed, _ = Gate().verdict(float((ref.argmax(1) == labels).mean()), {**s, "cosine_min": s["cosine_p1"]})
    return {**s, "passed": passed, **fp8_layers(path)}


def vitdeploy_rows(bundle: Bundle, work: Path, ref: np.ndarray, labels: np.ndarray) -> list[dict[str, Any]]:
    from vitdeploy.calibration.fp8_api import Fp8Options, calibrate_fp8_bundle
    from vitdeploy.errors import CheckFailed

    rows = []
    for attention in ("fp8", "float"):
        name = f"vitdeploy fp8 (attention {attention})"
        copy = work / f"{bundle.root.name}-vd-fp8-{attention}"
        shutil.rmtree(copy, ignore_errors=True)
        shutil.copytree(bundle.root, copy, ignore=shutil.ignore_patterns("model.fp8.onnx*", "model.int8.onnx*", "model.fp16.onnx*"))
        start = time.perf_counter()
        try:
            record = calibrate_fp8_bundle(copy, Fp8Options(data="digits:train", eval_data="digits:test", samples=SAMPLES,
                                                           attention=attention, threads=1), log=log)
        except CheckFailed as exc:
            rows.append({"graph": name, "refused": str(exc).split(";")[0][:200], "seconds": round(time.perf_counter() - start, 1)})
            continue
        seconds = round(time.perf_counter() - start, 1)
        chosen = next(c for c in record["selection"]["candidates"] if c["method"] == record["method"])
        range_nodes = len(((record["fp32_islands"] or {}).get("range_pass") or {}).get("nodes") or [])
        rows.append({"graph": f"{name}, {record['method']}", "path": str(copy / "model.fp8.onnx"),
                     **gated(copy / "model.fp8.onnx", ref, labels), "seconds": seconds,
                     "calibration_seconds": chosen.get("calibration_seconds"), "recipes_tried": len(record["selection"]["candidates"]),
                     "range_pass_nodes": range_nodes, "calibration_sha256": record["calibration"].get("sha256", "")[:12]})
    return rows


def modelopt_rows(bundle: Bundle, work: Path, python: str | None, variants: list[str],
                  ref: np.ndarray, labels: np.ndarray) -> list[dict[str, Any]]:
    """``variants``: METHOD:HIGH[:no-mha] each (METHOD "default" omits --calibration_method; no-mha adds
    --disable_mha_qdq, ModelOpt's counterpart of attention left in float)."""
    if not python:
        return []
    from vitdeploy.calibration.sources import open_source

    calib = work / f"{bundle.root.name}-calib512.npz"
    source = open_source("digits:train", bundle, SAMPLES)
    np.savez(calib, images=source.images)
    rows = []
    for variant in variants:
        method, high, *flags = variant.split(":")
        no_mha = "no-mha" in flags
        label = f"ModelOpt fp8 {method}{', --disable_mha_qdq' if no_mha else ''} (rest {high})"
        out = work / f"{bundle.root.name}-modelopt-fp8-{method}-{high}{'-nomha' if no_mha else ''}.onnx"
        out.unlink(missing_ok=True)
        cmd = [python, "-m", "modelopt.onnx.quantization", "--onnx_path", str(bundle.artifact_path("fp32")), "--quantize_mode", "fp8",
               "--calibration_data_path", str(calib), "--calibration_eps", "cpu", "--output_path", str(out),
               "--high_precision_dtype", high]
        if method != "default":
            cmd += ["--calibration_method", method]
        if no_mha:
            cmd.append("--disable_mha_qdq")
        start = time.perf_counter()
        done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
        seconds = round(time.perf_counter() - start, 1)
        (work / f"{out.stem}.log").write_text(done.stdout + "\n--- stderr\n" + done.stderr)
        if done.returncode != 0 or not out.is_file():
            tail = [ln for ln in (done.stderr or done.stdout).strip().splitlines() if ln.strip()]
            rows.append({"graph": label, "refused": f"ModelOpt failed: {tail[-1][:200] if tail else done.returncode}", "seconds": seconds})
            continue
        try:
            scored = gated(out, ref, labels)
        except Exception as exc:  # what ORT's CPU provider cannot run, reported as it failed
            rows.append({"graph": label, "refused": f"ORT CPU cannot run it: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}",
                         "seconds": seconds, **fp8_layers(out)})
            continue
        reported = re.search(r"quantization completed in ([0-9.]+) seconds", done.stdout + done.stderr)
        rows.append({"graph": label, "path": str(out), **scored, "seconds": seconds,
                     "modelopt_reported_seconds": float(reported.group(1)) if reported else None,
                     "calibration_images": len(source), "calibration_sha256": source.sha256[:12]})
    return rows


def versions(python: str | None) -> dict[str, str]:
    import onnx
    import onnxruntime

    out = {"onnxruntime (scoring)": onnxruntime.__version__, "onnx (scoring)": onnx.__version__}
    if python:
        code = ("import importlib.metadata as m\n"
                "def v(*names):\n"
                "    for n in names:\n"
                "        try: return m.version(n)\n"
                "        except m.PackageNotFoundError: pass\n"
                "print(v('nvidia-modelopt'), v('onnxruntime-gpu', 'onnxruntime'), v('onnx'))")
        got = subprocess.run([python, "-c", code], capture_output=True, text=True).stdout.split()
        if len(got) == 3:
            out.update({"nvidia-modelopt": got[0], "onnxruntime (ModelOpt venv)": got[1], "onnx (ModelOpt venv)": got[2]})
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--work", type=Path, default=Path("/tmp/vitdeploy-bench-fp8-peer"))
    p.add_argument("--modelopt-python", default=None, help="python of a venv with nvidia-modelopt[onnx] (the peer rows)")
    p.add_argument("--kinds", default=",".join(KINDS))
    p.add_argument("--modelopt-variants", default="default:fp16,max:fp16,default:fp16:no-mha,default:fp32",
                   help="METHOD:HIGH[:no-mha], comma-separated ('default' omits --calibration_method; HIGH: --high_precision_dtype)")
    p.add_argument("--skip-vitdeploy", action="store_true")
    p.add_argument("--json", type=Path)
    p.add_argument("--merge", type=Path, nargs="+", help="print one table from these --json files (time: the range over the runs) and exit")
    args = p.parse_args()
    if args.merge:
        print(markdown(*[json.loads(f.read_text()) for f in args.merge]))
        return 0
    args.work.mkdir(parents=True, exist_ok=True)
    kinds = tuple(args.kinds.split(","))
    result: dict[str, Any] = {"load_average_at_start": list(os.getloadavg()), "samples": SAMPLES, "versions": versions(args.modelopt_python),
                              "bundles": {}}
    images, labels = test_split()
    for kind, bundle in bundles(args.work, kinds).items():
        log(f"== {kind}")
        ref = OrtRunner(bundle.artifact_path("fp32"), threads=1, providers=["CPUExecutionProvider"]).infer(images)["logits"]
        rows = [{"graph": "fp32", **score(bundle.artifact_path("fp32"), ref, labels, "all"), **fp8_layers(bundle.artifact_path("fp32"))}]
        if not args.skip_vitdeploy:
            rows += vitdeploy_rows(bundle, args.work, ref, labels)
        rows += modelopt_rows(bundle, args.work, args.modelopt_python, args.modelopt_variants.split(","), ref, labels)
        result["bundles"][kind] = rows
        for r in rows:
            log("  " + json.dumps({k: v for k, v in r.items() if k != "path"}))
    result["load_average_at_end"] = list(os.getloadavg())
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    print(markdown(result))
    return 0


def span(values: list[float]) -> str:
    return "" if not values else (f"{min(values):.1f}" if min(values) == max(values) else f"{min(values):.1f}-{max(values):.1f}")


def markdown(*results: dict[str, Any]) -> str:
    """The table of one run, or of several: scores from the first (the runs' scores are compared), time as the range."""
    lines = ["| bundle | graph | accuracy | top-1 agreement | logit cos p1 | linear layers FP8 | attention matmuls FP8 | gate | quantize s |",
             "|---|---|---:|---:|---:|---:|---:|---|---:|"]
    first = results[0]
    for kind, rows in first["bundles"].items():
        for i, r in enumerate(rows):
            same = [other["bundles"][kind][i] for other in results]
            if any(o["graph"] != r["graph"] or {k: o.get(k) for k in SCORED} != {k: r.get(k) for k in SCORED} for o in same):
                log(f"{kind} / {r['graph']}: the runs' scores differ; the table shows the first run's")
            times = [o["seconds"] for o in same if "seconds" in o]
            secs = span(times)
            logged = [o["modelopt_reported_seconds"] for o in same if o.get("modelopt_reported_seconds") is not None]
            if logged:
                secs += f" (its log: {span(logged)})"
            if "refused" in r:
                lines.append(f"| {kind} | {r['graph']} | {r['refused']} | | | | | | {secs} |")
                continue
            gate = "" if "passed" not in r else ("pass" if r["passed"] else "**fail**")
            lines.append(f"| {kind} | {r['graph']} | {r['accuracy']:.2%} | {r['top1_agreement']:.2%} | {r['cosine_p1']:.4f} | "
                         f"{r['linear_fp8']}/{r['linear']} | {r['attention_fp8']}/{r['attention']} | {gate} | {secs} |")
    return "\n".join(lines)

if __name__ == "__main__":
    raise SystemExit(main())
