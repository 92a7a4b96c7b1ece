"""``vitdeploy calibrate --precision fp8``: a bundle's fp32 graph -> ``model.fp8.onnx``, gated as INT8.

The steps: the fp16 graph with its fp32 islands (``exporters/fp16.py``, the range pass on the
range images), activation amax on the calibration images through the fp32 graph
(:func:`.fp8.collect_amax`), E4M3 Q/DQ at the ViT placement (:mod:`.fp8`), the placement check, then
the accuracy, agreement and cosine gate against fp32 on held-out data (the same :class:`.evaluate.Gate`
the INT8 path uses, in ONNX Runtime's reference execution). Everything is built in a temporary
folder; a graph below the gate is never written (CheckFailed), and the graph, its data file and the
manifest record land together.

Without ``--method`` the ladder tries ``max`` then ``percentile`` and keeps the first in the gate.
Variable-size bundles are refused (one line): their mask path and invariance gate are INT8/FP16 only.
"""

from __future__ import annotations

import copy
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from vitdeploy import onnx_io
from vitdeploy.bundle import ARTIFACT_FILES, Bundle, embed_manifest
from vitdeploy.errors import CheckFailed, InternalError, UserError
from vitdeploy.fileio import sha256_file, signals_deferred
from vitdeploy.lazy import require

from .evaluate import GATED_EXECUTION, Gate, graph_outputs, load_eval_data, score_graph
from .fp8 import FP8_METHODS, FP8_TYPE, Fp8Recipe, calibrated_tensors, collect_amax, find_sites, insert_qdq, inspect_fp8_placement
from .sources import open_source

PRECISION = "fp8"
DEFAULT_SAMPLES = 512
FEED_BATCH = 16


@dataclass
class Fp8Options:
    data: str | None = None  # calibration images; default: the bundled model's training split
    samples: int | None = DEFAULT_SAMPLES
    method: str | None = None  # None: the ladder (max, then percentile) when there is data to gate on
    attention: str = "fp8"  # "fp8" | "float" (calibration/fp8.py)
    eval_data: str | None = None
    eval_limit: int | None = None
    gate: Gate = Gate()
    data_max: float | None = None  # the fp16 range pass threshold (None: its default; inf: off)
    threads: int | None = None


def calibrate_fp8_bundle(path: str | Path, options: Fp8Options | None = None, log: Callable[[str], None] = lambda _m: None) -> dict[str, Any]:
    """Calibrate, quantize, gate and record ``model.fp8.onnx``; returns its manifest record."""
    opts = options or Fp8Options()
    Fp8Recipe(opts.method or FP8_METHODS[0], opts.attention)  # bad options fail before any work
    bundle = Bundle.open(path)
    if bundle.bare_onnx is not None:
        raise UserError(f"{bundle.bare_onnx} is a bare ONNX file; calibrate writes model.fp8.onnx into a bundle folder (export with -o DIR)")
    if bundle.variable_size:
        raise UserError("FP8 calibration does not cover variable-size bundles (images + valid_hw) yet; use --precision int8 or fp16")
    onnx = require("onnx", "FP8 calibration")
    ort = require("onnxruntime", "FP8 calibration")
    fp32 = bundle.artifact_path("fp32")
    source = open_source(opts.data, bundle, opts.samples)
    log(f"calibration data: {source.name}, {len(source)} images (sha256 {source.sha256[:12]})")
    data = load_eval_data(bundle, opts.eval_data, opts.eval_limit)
    methods = (opts.method,) if opts.method else (FP8_METHODS if data is not None else FP8_METHODS[:1])
    start = time.perf_counter()
    execution = GATED_EXECUTION["tensorrt"]

    from vitdeploy.exporters.fp16 import convert_to_fp16
    from vitdeploy.exporters.fp16_range import DEFAULT_DATA_MAX, range_feeds
    from vitdeploy.exporters.mask_path import find_mask_path

    model32 = onnx_io.load(fp32)
    mask = find_mask_path(model32)
    sites = find_sites(model32, skip=mask.linear if mask is not None else ())
    nodes32 = {n.name: n for n in model32.graph.node}
    tensor_of = {(name, 0): nodes32[name].input[0] for name in sites.linear}
    tensor_of.update({(name, i): nodes32[name].input[i] for name, inputs in sites.attention.items() for i in inputs})
    input_name = model32.graph.input[0].name
    feeds = list(source.feeds(input_name, FEED_BATCH))
    limit = DEFAULT_DATA_MAX if opts.data_max is None else float(opts.data_max)
    fp32_ref = fp32_accuracy = None
    if data is not None:
        fp32_ref = graph_outputs(fp32, data.images, "all", opts.threads)
        fp32_accuracy = float((fp32_ref["logits"].argmax(1) == data.labels).mean()) if data.labels is not None else None

    with tempfile.TemporaryDirectory(prefix="vitdeploy-fp8.") as tmp:
        work = Path(tmp)
        fp16_path = work / "fp16.onnx"
        range_data, range_images = range_feeds(bundle, opts.data) if limit != float("inf") else (None, None)
        fp16_record = convert_to_fp16(fp32, fp16_path, manifest=bundle.manifest, range_feeds=range_data, data_max=limit)
        tensors = calibrated_tensors(model32, sites, opts.attention)
        tried: list[dict[str, Any]] = []
        chosen = None
        amax_cache: dict[str, dict[str, float]] = {}
        for method in methods:
            recipe = Fp8Recipe(method, opts.attention)
            t0 = time.perf_counter()
            amax = amax_cache.setdefault(method, collect_amax(model32, feeds, tensors, method, recipe.percentile, opts.threads))
            calib_seconds = time.perf_counter() - t0
            graph = work / f"fp8-{method}.onnx"
            model = onnx_io.load(fp16_path)
            onnx_io.infer_shapes(model, in_place=True)
            inserted = insert_qdq(model, sites, amax, tensor_of, opts.attention)
            placement = inspect_fp8_placement(model)
            if placement["violations"]:
                raise InternalError("the FP8 graph breaks the ViT placement policy: " + "; ".join(placement["violations"][:5]))
            core = copy.deepcopy(bundle.manifest)
            core.setdefault("graph", {})["precision"] = PRECISION
            core["graph"]["quantization"] = {**recipe.to_dict(), "type": FP8_TYPE, "weights": "per-tensor"}
            embed_manifest(model, core)
            onnx_io.save(model, graph, manifest=bundle.manifest)
            del model
            row: dict[str, Any] = {"method": method, "calibration_seconds": round(calib_seconds, 2)}
            scores = None
            if data is not None:
                scores = score_graph(graph, data, fp32_ref, opts.threads, executions=(execution,))
                passed, failures = opts.gate.verdict(fp32_accuracy, scores[execution])
                row.update({k: scores[execution][k] for k in ("accuracy", "top1_agreement", "cosine_p1")}, passed=passed, failures=failures)
                log(f"fp8 {method}: agreement {scores[execution]['top1_agreement']:.2%}, cosine p1 {scores[execution]['cosine_p1']:.4f}"
                    + ("" if passed else f" - {'; '.join(failures)}"))
            tried.append(row)
            if data is None or row["passed"]:
                chosen = (recipe, graph, amax, inserted, placement, scores)
                break
        if chosen is None:
            raise CheckFailed(f"FP8 graph below the gate ({execution} execution on {data.name}): {'; '.join(tried[-1]['failures'])}; "
                              "nothing was written - find the layers to keep in float with "
                              "`vitdeploy debug-precision BUNDLE --precision fp8`, or use more calibration images")
        recipe, graph, amax, inserted, placement, scores = chosen
        evaluation = None
        if data is not None:
            passed, failures = opts.gate.verdict(fp32_accuracy, scores[execution])
            evaluation = {**data.record, "fp32_accuracy": fp32_accuracy, execution: scores[execution],
                          "gate": {**opts.gate.to_dict(), "execution": execution, "passed": passed, "failures": failures}}
        record = {
            "precision": PRECISION,
            "target": "tensorrt",
            "format": "QDQ",
            "type": FP8_TYPE,
            "method": recipe.method,
            **({"percentile": recipe.percentile} if recipe.method == "percentile" else {}),
            "activations": "per-tensor, scale amax/448 (calibrated on the fp32 graph)",
            "weights": "per-tensor, scale max|W|/448, stored as float8e4m3fn",
            "attention": {"placement": opts.attention, "softmax_scale": "1/448 (fixed)" if opts.attention == "fp8" else None,
                          "matmuls": placement["attention_matmuls"], "fp8": placement["attention_fp8"]},
            "layers_fp8": placement["fp8_layers"],
            "linear_layers": {"total": placement["linear_layers"], "fp8": placement["linear_fp8"]},
            "scales": inserted["scales"],
            "fp32_islands": {**{k: fp16_record.get(k) for k in ("kept_fp32_op_types", "preprocessing_nodes_fp32", "position_nodes_fp32")},
                             "range_pass": fp16_record.get("range_pass"), "range_images": range_images},
            "calibration": {**source.record(), "method": recipe.method, "tensors": len(amax)},
            "evaluation": evaluation,
            "selection": {"mode": "single" if opts.method else "ladder", "candidates": tried},
            "from_fp32_sha256": sha256_file(fp32),
            "onnxruntime_version": ort.__version__,
            "onnx_version": onnx.__version__,
            "verified": "ONNX Runtime CPU, reference semantics (no GPU run)",
            "seconds": round(time.perf_counter() - start, 1),
        }
        dst = bundle.root / ARTIFACT_FILES[PRECISION]
        with signals_deferred():
            onnx_io.copy(graph, dst)
            bundle.add_artifact(PRECISION, dst, record)
    return bundle.artifact_record(PRECISION)
