"""``vitdeploy calibrate``: a bundle's fp32 graph -> ``model.int8.onnx`` (explicit Q/DQ), measured.

One library call for the CLI. The quantized graph is built and scored in a temporary folder and only
then copied into the bundle (temp file + rename) and recorded in the manifest, so a failure at any
step - bad data, a graph below the accuracy gate, Ctrl-C - leaves the bundle as it was.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from vitdeploy.bundle import ARTIFACT_FILES, Bundle
from vitdeploy.errors import CheckFailed, UserError
from vitdeploy.fileio import atomic_path, sha256_file
from vitdeploy.lazy import require

from .evaluate import GATED_EXECUTION, Gate, graph_logits, latency_ms, load_eval_data, score_graph
from .exclusions import Exclusions, resolve
from .qdq import METHODS, Recipe, check_sample_count, compute_ranges, quantize_graph
from .sources import open_source

DEFAULT_METHOD = "entropy"
DEFAULT_SAMPLES = 512


@dataclass
class CalibrateOptions:
    data: str | None = None  # calibration images; default: the bundled model's training split
    samples: int | None = DEFAULT_SAMPLES
    method: str = DEFAULT_METHOD
    exclusions: Exclusions = Exclusions()
    target: str = "tensorrt"
    eval_data: str | None = None  # labelled held-out images; default: the bundled model's test split
    eval_limit: int | None = None
    gate: Gate = Gate()
    sweep: bool = False
    sweep_methods: tuple[str, ...] = METHODS
    threads: int | None = None


def calibrate_bundle(
    path: str | Path,
    options: CalibrateOptions | None = None,
    log: Callable[[str], None] = lambda _m: None,
    progress: Callable[[int, int], None] | None = None,
    show_table: Callable[[Any], None] | None = None,
) -> dict[str, Any]:
    """Calibrate, quantize, score and record ``model.int8.onnx``; returns its manifest record."""
    opts = options or CalibrateOptions()
    Recipe(opts.method, opts.target)  # validate method/target before any work
    for method in opts.sweep_methods if opts.sweep else ():
        Recipe(method, opts.target)
    if opts.sweep and not opts.sweep_methods:
        raise UserError("--sweep-methods is empty; name at least one of entropy, minmax, percentile")
    bundle = Bundle.open(path)
    if bundle.bare_onnx is not None:
        raise UserError(f"{bundle.bare_onnx} is a bare ONNX file; calibrate writes model.int8.onnx into a bundle folder (export with -o DIR)")
    fp32 = bundle.artifact_path("fp32")
    ort = require("onnxruntime", "INT8 calibration")

    # unknown module names fail now, not after minutes of calibration
    resolve(require("onnx").load(str(fp32), load_external_data=False), bundle.manifest.get("graph") or {}, opts.exclusions)
    source = open_source(opts.data, bundle, opts.samples)
    methods = opts.sweep_methods if opts.sweep else (opts.method,)
    for method in methods:
        check_sample_count(source, method)
    if opts.samples and len(source) < opts.samples:
        log(f"{source.name} holds {len(source)} images (fewer than --samples {opts.samples}); using all of them")
    log(f"calibration data: {source.name}, {len(source)} images at {source.size[0]}x{source.size[1]} (sha256 {source.sha256[:12]})")
    data = load_eval_data(bundle, opts.eval_data, opts.eval_limit)
    if data is not None and data.name == source.name:
        log(f"warning: calibrating and scoring on the same images ({source.name}); the accuracy is not held-out")
    if opts.sweep and (data is None or data.labels is None):
        raise UserError("--sweep scores each recipe on labelled held-out images: pass --eval-data DIR/<class>/<image> "
                        "(or a bundle of the builtin digits model, which has its own test split)")

    start = time.perf_counter()
    execution = GATED_EXECUTION[opts.target]
    with tempfile.TemporaryDirectory(prefix="vitdeploy-int8.") as tmp:
        work = Path(tmp)
        fp32_logits = fp32_accuracy = None
        if data is not None:
            fp32_logits = graph_logits(fp32, data.images, "all", opts.threads)
            if data.labels is not None:
                fp32_accuracy = float((fp32_logits.argmax(1) == data.labels).mean())
        sweep_record = None
        if opts.sweep:
            from .sweep import choice_rule, choose, render_table, run_sweep

            candidates = run_sweep(fp32, source, data, fp32_logits, fp32_accuracy, opts.target, bundle.manifest, work,
                                   opts.gate, opts.exclusions, tuple(opts.sweep_methods), threads=opts.threads, log=log,
                                   progress=progress)
            best = choose(candidates, opts.target)
            fp32_ms = latency_ms(fp32, data.images[:1], "all", threads=opts.threads)
            if show_table is not None:
                show_table(render_table(candidates, best, fp32_accuracy, fp32_ms, opts.target))
            sweep_record = {"rule": choice_rule(opts.target), "fp32_latency_ms_batch1": round(fp32_ms, 3),
                            "candidates": [c.row() for c in candidates]}
            if best is None:
                raise CheckFailed(f"no recipe of the sweep passes the gate ({_gate_text(opts.gate)} in the {execution} execution); "
                                  "nothing was written - try more calibration images or --exclude-blocks")
            sweep_record["chosen"] = {"method": best.recipe.method, "exclusions": best.preset}
            recipe, graph, calibration, quantization, scores = best.recipe, best.path, best.calibration, best.quantization, best.scores
        else:
            recipe = Recipe(opts.method, opts.target, opts.exclusions)
            ranges = work / "ranges.json"
            calibration = compute_ranges(fp32, source, opts.method, opts.target, ranges, progress)
            log(f"calibrated ({opts.method}) in {calibration['seconds']:.1f} s")
            graph = work / "model.int8.onnx"
            quantization = quantize_graph(fp32, graph, ranges, recipe, bundle.manifest)
            scores = score_graph(graph, data, fp32_logits, opts.threads) if data is not None else None

        evaluation = _evaluation(data, fp32_accuracy, scores, opts.gate, execution)
        if evaluation and not evaluation["gate"]["passed"]:
            raise CheckFailed(f"INT8 graph below the gate: {'; '.join(evaluation['gate']['failures'])} "
                              f"({execution} execution on {data.name}); nothing was written - try --sweep or exclusions")
        record = {
            "precision": "int8",
            "target": opts.target,
            "format": "QDQ",
            **quantization["settings"],
            "method": recipe.method,
            "exclusions": {**recipe.exclusions.to_dict(), "nodes": quantization["excluded_nodes"], "by": quantization["excluded_by"]},
            "op_types_quantized": quantization["op_types_quantized"],
            "calibration": {**source.record(), **calibration},
            "evaluation": evaluation,
            "placement": quantization["placement"],
            "from_fp32_sha256": sha256_file(fp32),
            "onnxruntime_version": ort.__version__,
            "seconds": round(time.perf_counter() - start, 1),
        }
        if opts.target == "cpu":
            from .cpu_int8 import cpu_features

            record["calibrated_on_cpu"] = cpu_features()
        if sweep_record is not None:
            record["sweep"] = sweep_record
        dst = bundle.root / ARTIFACT_FILES["int8"]
        with atomic_path(dst) as tmp_dst:
            shutil.copyfile(graph, tmp_dst)
        bundle.add_artifact("int8", dst, record)
    return bundle.artifact_record("int8")


def _evaluation(data: Any, fp32_accuracy: float | None, scores: dict[str, Any] | None, gate: Gate, execution: str) -> dict[str, Any] | None:
    if data is None or scores is None:
        return None
    passed, failures = gate.verdict(fp32_accuracy, scores[execution])
    return {
        **data.record,
        "fp32_accuracy": fp32_accuracy,
        "reference": scores["reference"],
        "this_cpu": scores["this_cpu"],
        "gate": {**gate.to_dict(), "execution": execution, "passed": passed, "failures": failures},
    }


def _gate_text(gate: Gate) -> str:
    return f"accuracy drop <= {gate.max_drop_points:g} points, top-1 agreement >= {gate.min_agreement:.0%}"
