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
import logging
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

from vitdeploy.gate import Gate

from .evaluate import GATED_EXECUTION, fp32_accuracy_of, graph_outputs, load_eval_data, percent, score_graph
from .fp8 import FP8_METHODS, FP8_TYPE, Fp8Recipe, calibrated_tensors, collect_amax, find_sites, insert_qdq, inspect_fp8_placement
from .sources import open_source

logger = logging.getLogger(__name__)

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
    keep: tuple[str, ...] = ()  # node names left in float (a debug-precision recipe's keep_float.nodes)


def calibrate_fp8_bundle(path: str | Path, options: Fp8Options | None = None, log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Calibrate, quantize, gate and record ``model.fp8.onnx``; returns its manifest record."""
    log = log or logger.info
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

    fp32_ref = fp32_accuracy = None
    if data is not None:
        fp32_ref = graph_outputs(fp32, data.images, "all", opts.threads)
        fp32_accuracy = fp32_accuracy_of(fp32_ref, data.labels)

    with tempfile.TemporaryDirectory(prefix="vitdeploy-fp8.") as tmp:
        work = Path(tmp)
        graphs = Fp8Graphs(bundle, source, opts.attention, opts.data_max, opts.threads, work)
        unknown = sorted(set(opts.keep) - set(graphs.sites.linear) - set(graphs.sites.attention))
        if unknown:
            raise UserError(f"the recipe keeps {len(unknown)} node(s) in float that this graph has no FP8 site for (e.g. {unknown[0]}); "
                            "was it written for another bundle? re-run `vitdeploy debug-precision BUNDLE --precision fp8`")
        tried: list[dict[str, Any]] = []
        chosen = None
        for method in methods:
            recipe = Fp8Recipe(method, opts.attention)
            graph = work / f"fp8-{method}.onnx"
            amax, calib_seconds = graphs.amax(method)
            inserted, placement = graphs.build(method, graph, keep=frozenset(opts.keep))
            row: dict[str, Any] = {"method": method, "calibration_seconds": round(calib_seconds, 2)}
            scores = None
            if data is not None:
                scores = score_graph(graph, data, fp32_ref, opts.threads, executions=(execution,))
                passed, failures = opts.gate.verdict(fp32_accuracy, scores[execution])
                row.update({k: scores[execution][k] for k in ("accuracy", "top1_agreement", "cosine_p1")}, passed=passed, failures=failures)
                log(f"fp8 {method}: agreement {percent(scores[execution]['top1_agreement'])}, cosine p1 {scores[execution]['cosine_p1']:.4f}"
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
            "kept_float": sorted(opts.keep),
            "linear_layers": {"total": placement["linear_layers"], "fp8": placement["linear_fp8"]},
            "scales": inserted["scales"],
            "fp32_islands": {**{k: graphs.fp16_record.get(k) for k in ("kept_fp32_op_types", "preprocessing_nodes_fp32", "position_nodes_fp32")},
                             "range_pass": graphs.fp16_record.get("range_pass"), "range_images": graphs.range_images},
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


class Fp8Graphs:
    """What every FP8 graph of a bundle shares, made once: the sites (on the fp32 graph), the fp16 base
    graph with its fp32 islands, and the activation amax per method; then FP8 graphs of any subset of
    the sites (``keep``: node names left in float, as debug-precision asks)."""

    def __init__(self, bundle: Bundle, source: Any, attention: str, data_max: float | None, threads: int | None, work: Path):
        from vitdeploy.exporters.fp16 import convert_to_fp16
        from vitdeploy.exporters.fp16_range import DEFAULT_DATA_MAX, range_feeds
        from vitdeploy.exporters.mask_path import find_mask_path

        self.bundle, self.attention, self.threads, self.work = bundle, attention, threads, work
        fp32 = bundle.artifact_path("fp32")
        self.model32 = onnx_io.load(fp32)
        mask = find_mask_path(self.model32)
        from vitdeploy.exporters.position_nodes import position_linear_nodes

        skip = (*(mask.linear if mask is not None else ()), *position_linear_nodes(self.model32))
        self.sites = find_sites(self.model32, skip=skip)
        nodes32 = {n.name: n for n in self.model32.graph.node}
        self.tensor_of = {(name, 0): nodes32[name].input[0] for name in self.sites.linear}
        self.tensor_of.update({(name, i): nodes32[name].input[i] for name, inputs in self.sites.attention.items() for i in inputs})
        self.feeds = list(source.feeds(self.model32.graph.input[0].name, FEED_BATCH))
        limit = DEFAULT_DATA_MAX if data_max is None else float(data_max)
        range_data, self.range_images = range_feeds(bundle, source.name) if limit != float("inf") else (None, None)
        self.fp16_path = work / "fp16-base.onnx"
        self.fp16_record = convert_to_fp16(fp32, self.fp16_path, manifest=bundle.manifest, range_feeds=range_data, data_max=limit)
        self._amax: dict[str, tuple[dict[str, float], float]] = {}

    def amax(self, method: str) -> tuple[dict[str, float], float]:
        """(amax per calibrated tensor, seconds it took) for ``method``."""
        if method not in self._amax:
            recipe = Fp8Recipe(method, self.attention)
            t0 = time.perf_counter()
            tensors = calibrated_tensors(self.model32, self.sites, self.attention)
            self._amax[method] = (collect_amax(self.model32, self.feeds, tensors, method, recipe.percentile, self.threads), time.perf_counter() - t0)
        return self._amax[method]

    def build(self, method: str, out: Path, keep: frozenset = frozenset()) -> tuple[dict[str, Any], dict[str, Any]]:
        """Write the FP8 graph with every site but ``keep`` quantized; (insertion record, placement)."""
        from .fp8 import Sites

        amax, _ = self.amax(method)
        sites = Sites([n for n in self.sites.linear if n not in keep], {n: v for n, v in self.sites.attention.items() if n not in keep})
        model = onnx_io.load(self.fp16_path)
        onnx_io.infer_shapes(model, in_place=True)
        inserted = insert_qdq(model, sites, amax, self.tensor_of, self.attention)
        placement = inspect_fp8_placement(model)
        if placement["violations"]:
            raise InternalError("the FP8 graph breaks the ViT placement policy: " + "; ".join(placement["violations"][:5]))
        core = copy.deepcopy(self.bundle.manifest)
        core.setdefault("graph", {})["precision"] = PRECISION
        core["graph"]["quantization"] = {**Fp8Recipe(method, self.attention).to_dict(), "type": FP8_TYPE, "weights": "per-tensor",
                                         "kept_float": sorted(keep)}
        embed_manifest(model, core)
        onnx_io.save(model, out, manifest=self.bundle.manifest)
        return inserted, placement
