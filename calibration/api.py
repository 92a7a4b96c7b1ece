"""``vitdeploy calibrate``: a bundle's fp32 graph -> ``model.int8.onnx`` (explicit Q/DQ), measured.

One library call for the CLI. The quantized graph is built and scored in a temporary folder and only
then copied into the bundle (temp file + rename) and recorded in the manifest, so a failure at any
step - bad data, a graph below the accuracy gate, Ctrl-C - leaves the bundle as it was.

A variable-size bundle (images + valid_hw) is calibrated on (images, valid_hw) pairs at mixed sizes,
scored on the invariance (rows of padded mixed-size batches vs the fp32 graph on each image alone,
per output) and checked for finite outputs on edge valid_hw rows before anything is written.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from vitdeploy import onnx_io
from vitdeploy.bundle import ARTIFACT_FILES, Bundle
from vitdeploy.errors import CheckFailed, UserError
from vitdeploy.fileio import hidden_dir, sha256_file, signals_deferred
from vitdeploy.gate import Gate
from vitdeploy.lazy import require

from .evaluate import GATED_EXECUTION, fp32_accuracy_of, graph_outputs, latency_ms, load_eval_data
from .exclusions import Exclusions, resolve
from .qdq import METHODS, MIN_SAMPLES, Recipe, check_sample_count, compute_ranges, quantize_graph
from .smooth import DEFAULT_ALPHA, SCOPES, Smoothing
from .sources import open_source

logger = logging.getLogger(__name__)

DEFAULT_METHOD = "entropy"
DEFAULT_SAMPLES = 512


@dataclass
class CalibrateOptions:
    data: str | None = None  # calibration images; default: the bundled model's training split
    samples: int | None = DEFAULT_SAMPLES
    method: str | None = None  # None: the ladder (entropy first), when there is data to gate on
    exclusions: Exclusions = Exclusions()
    target: str = "tensorrt"
    eval_data: str | None = None  # labelled held-out images; default: the bundled model's test split
    eval_limit: int | None = None
    gate: Gate = Gate()
    sweep: bool = False
    sweep_methods: tuple[str, ...] = METHODS
    threads: int | None = None
    # "auto": the ladder and the sweep try none, layernorm, all; a single recipe uses none.
    # "none" | "layernorm" | "all": only that (calibration/smooth.py)
    smoothing: str = "auto"
    smooth_alpha: float = DEFAULT_ALPHA
    recipe: Recipe | None = None  # --recipe FILE: exactly this recipe (method, target, exclusions, smoothing)


def calibrate_bundle(
    path: str | Path,
    options: CalibrateOptions | None = None,
    log: Callable[[str], None] = logger.info,
    progress: Callable[[int, int], None] | None = None,
    show_table: Callable[[Any], None] | None = None,
) -> dict[str, Any]:
    """Calibrate, quantize, score and record ``model.int8.onnx``; returns its manifest record."""
    opts = options or CalibrateOptions()
    if opts.recipe is not None:
        from dataclasses import replace

        opts = replace(opts, method=opts.recipe.method, target=opts.recipe.target, exclusions=opts.recipe.exclusions,
                       smoothing=opts.recipe.smoothing.scope if opts.recipe.smoothing else "none",
                       smooth_alpha=opts.recipe.smoothing.alpha if opts.recipe.smoothing else opts.smooth_alpha, sweep=False)
    if opts.smoothing not in ("auto", "none") + SCOPES:
        raise UserError(f"--smooth must be one of auto, none, {', '.join(SCOPES)}, got {opts.smoothing!r}")
    Smoothing(opts.smooth_alpha)  # validates alpha
    logger.debug("gate %s; method %s, target %s, smoothing %s (alpha %g), %s calibration images, %s", opts.gate,
                 opts.method or "the ladder", opts.target, opts.smoothing, opts.smooth_alpha, opts.samples,
                 "recipe file" if opts.recipe is not None else "sweep" if opts.sweep else "no sweep")
    single_smoothing = Smoothing(opts.smooth_alpha, opts.smoothing) if opts.smoothing in SCOPES else None
    Recipe(opts.method or DEFAULT_METHOD, opts.target)  # validate method/target before any work
    for method in opts.sweep_methods if opts.sweep else ():
        Recipe(method, opts.target)
    if opts.sweep and not opts.sweep_methods:
        raise UserError("--sweep-methods is empty; name at least one of entropy, minmax, percentile")
    bundle = Bundle.open(path)
    if bundle.bare_onnx is not None:
        raise UserError(f"{bundle.bare_onnx} is a bare ONNX file; calibrate writes model.int8.onnx into a bundle folder (export with -o DIR)")
    fp32 = bundle.artifact_path("fp32")
    ort = require("onnxruntime", "INT8 calibration")
    # before minutes of calibration, not after: the bundle takes files, and room for ORT's copy of the
    # graph beside the INT8 graph (about a quarter of the fp32 weights)
    onnx_io.ensure_room(fp32, bundle.root / ARTIFACT_FILES["int8"], 1.25)

    # unknown module names fail now, not after minutes of calibration
    resolve(require("onnx").load(str(fp32), load_external_data=False), bundle.manifest.get("graph") or {}, opts.exclusions)
    source = open_source(opts.data, bundle, opts.samples)
    if opts.samples and len(source) < opts.samples:
        log(f"{source.name} holds {len(source)} images (fewer than --samples {opts.samples}); using all of them")
    log(f"calibration data: {source.name}, {len(source)} images at {source.size[0]}x{source.size[1]} (sha256 {source.sha256[:12]})")
    data = load_eval_data(bundle, opts.eval_data, opts.eval_limit)
    if data is not None and data.name == source.name:
        log(f"warning: calibrating and scoring on the same images ({source.name}); the accuracy is not held-out")
    if opts.sweep and (data is None or data.labels is None):
        raise UserError("--sweep scores each recipe on labelled held-out images: pass --eval-data DIR/<class>/<image> "
                        "(or a bundle of the builtin digits model, which has its own test split)")
    # sweep: every recipe; ladder (no --method, data to gate on): the first recipe in the gate;
    # single: exactly the recipe asked for
    mode = "sweep" if opts.sweep else ("ladder" if opts.method is None and data is not None else "single")
    if mode == "sweep":
        methods = tuple(opts.sweep_methods)
    elif mode == "ladder":
        from .sweep import LADDER_METHODS

        methods = tuple(m for m in LADDER_METHODS if len(source) >= MIN_SAMPLES[m]) or (DEFAULT_METHOD,)
    else:
        methods = (opts.method or DEFAULT_METHOD,)
    for method in methods:
        check_sample_count(source, method)

    start = time.perf_counter()
    execution = GATED_EXECUTION[opts.target]
    # the candidates and ORT's files in the bundle (a killed run's are removed by the next command on it)
    with hidden_dir(bundle.root, "calibrate", "work") as work:
        selection: dict[str, Any] | None = None
        smoothed: dict[str, Any] | None = None
        if data is None:  # nothing to score on: the one recipe, recorded as not measured
            recipe = Recipe(methods[0], opts.target, opts.exclusions, single_smoothing)
            base = fp32
            if single_smoothing is not None:
                from .smooth import smooth_graph

                base = work / "smoothed.onnx"
                smoothed = smooth_graph(fp32, base, source, single_smoothing, bundle.manifest, opts.threads)
                log(f"smoothed {smoothed['layers_touched']} linear layers (alpha {single_smoothing.alpha:g}, {single_smoothing.scope})")
            ranges = work / "ranges.json"
            calibration = compute_ranges(base, source, recipe.method, opts.target, ranges, progress)
            log(f"calibrated ({recipe.method}) in {calibration['seconds']:.1f} s")
            graph = work / "model.int8.onnx"
            quantization = quantize_graph(base, graph, ranges, recipe, bundle.manifest)
            evaluation = None
        else:
            from .sweep import SMOOTHING_SCOPES, Trials, choice_rule, choose, render_table, run_ladder, run_sweep, smoothing_options

            scopes = SMOOTHING_SCOPES if opts.smoothing == "auto" else (opts.smoothing,)
            smoothings = smoothing_options(scopes, opts.smooth_alpha)

            # logits, and the embedding when the bundle exports one: the gate reads both
            # variable-size bundles: the reference is each image alone (the invariance), candidates run mixed batches
            fp32_ref = graph_outputs(fp32, data.images, "all", opts.threads, valid_hw=data.valid_hw, alone=data.valid_hw is not None)
            fp32_accuracy = fp32_accuracy_of(fp32_ref, data.labels)
            trials = Trials(fp32, source, data, fp32_ref, fp32_accuracy, opts.target, bundle.manifest, work, opts.gate,
                            threads=opts.threads, measure_latency=(mode == "sweep"), log=log, progress=progress)
            if mode == "sweep":
                run_sweep(trials, opts.exclusions, methods, smoothings=smoothings)
                best = choose(trials.candidates, opts.target)
                fp32_ms = latency_ms(fp32, data.images[:1], "all", threads=opts.threads,
                                     valid_hw=data.valid_hw[:1] if data.valid_hw is not None else None)
                if show_table is not None:
                    show_table(render_table(trials.candidates, best, fp32_accuracy, fp32_ms, opts.target))
                selection = {"mode": "sweep", "rule": choice_rule(opts.target), "fp32_latency_ms_batch1": round(fp32_ms, 3)}
            elif mode == "ladder":
                from .sweep import LADDER_PRESETS

                best = run_ladder(trials, opts.exclusions, methods, smoothings)
                selection = {"mode": "ladder", "rule": f"first inside the gate of: exclusions {', '.join(LADDER_PRESETS)} x smoothing "
                             f"{', '.join(scopes)} x methods {', '.join(methods)} (most INT8 layers first; smoothing before exclusions)"}
            else:
                cand = trials.run(opts.exclusions.label, Recipe(methods[0], opts.target, opts.exclusions, single_smoothing))
                best = cand if cand is not None and cand.passed else None
                selection = {"mode": "single"}
            selection["candidates"] = [c.row() for c in trials.candidates]
            if best is None:
                tried = trials.candidates[-1] if trials.candidates else None
                why = "; ".join(tried.failures) if tried else "no candidate"
                hint = {"single": "leave --method unset (calibrate then tries other methods, smoothing and exclusions), use --sweep, "
                                  "or find the layers to keep in float with `vitdeploy debug-precision BUNDLE --precision int8`",
                        "ladder": "use --sweep to see every recipe, `vitdeploy debug-precision BUNDLE --precision int8` to find "
                                  "the layers to keep in float, or more calibration images",
                        "sweep": "try more calibration images or --exclude-blocks"}[mode]
                raise CheckFailed(f"INT8 graph below the gate ({_gate_text(opts.gate)}, {execution} execution on {data.name}): "
                                  f"{why}; nothing was written - {hint}")
            selection["chosen"] = {"method": best.recipe.method, "exclusions": best.preset,
                                   "smoothing": best.recipe.smoothing.to_dict() if best.recipe.smoothing else None}
            if opts.recipe is not None:
                selection["recipe_file"] = True
            if len(trials.candidates) > 1:
                log(f"chose {best.recipe.method} / exclusions {best.preset} / smoothing {best.recipe.smoothing_label} "
                    f"({len(trials.candidates)} recipes tried)")
            recipe, graph, calibration, quantization = best.recipe, best.path, best.calibration, best.quantization
            smoothed = best.smoothing
            evaluation = _evaluation(data, fp32_accuracy, best.scores, opts.gate, execution)

        sanity = None
        if bundle.variable_size:
            # two-input graph: random mixed sizes vs each alone, and no NaN on edge valid_hw rows (one
            # patch, full canvas, clamped values) in the gated execution; refused before it is written
            from vitdeploy.exporters.variable_precision import gate_sanity, variable_sanity

            from .evaluate import EXECUTIONS

            sanity = variable_sanity(fp32, graph, bundle, "int8", optimization=EXECUTIONS[execution])
            gate_sanity(sanity, "int8", opts.gate)
            log(f"invariance: random mixed sizes vs each alone, max |dlogit| {sanity['max_abs_logit_diff']:.2e}, "
                f"logit cosine p1 {sanity['outputs']['logits']['cosine_p1']:.4f}; edge valid_hw rows finite")
        record = {
            "precision": "int8",
            "target": opts.target,
            "format": "QDQ",
            **quantization["settings"],
            "method": recipe.method,
            "exclusions": {**recipe.exclusions.to_dict(), "nodes": quantization["excluded_nodes"], "by": quantization["excluded_by"]},
            "op_types_quantized": quantization["op_types_quantized"],
            # SmoothQuant-style migration folded into the fp32 graph before calibration (None: plain graph)
            "smoothing": smoothed,
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
        if selection is not None:
            record["selection"] = selection
        if sanity is not None:
            record["sanity"] = sanity
        dst = bundle.root / ARTIFACT_FILES["int8"]
        with signals_deferred():  # the graph, its data file and the manifest's record land together
            onnx_io.copy(graph, dst)  # atomically, the data file renamed after dst
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
    return (f"accuracy drop <= {gate.max_drop_points:g} points, top-1 agreement >= {gate.min_agreement:.0%}, "
            f"logit (and embedding) cosine (1st percentile of images) >= {gate.min_cosine:g}; an embedding model: the cosine only")
