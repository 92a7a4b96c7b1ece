"""``vitdeploy debug-precision``: which parts of a ViT must stay in higher precision, in ViT terms.

Like Polygraphy's ``debug precision`` (bisects the layers kept in higher precision until a check
passes; github.com/NVIDIA/TensorRT tools/Polygraphy) and ModelOpt's per-layer sensitivity, on
labelled data with the gate's own metrics, and with units a ViT engineer names
(:mod:`.precision_units`: ``blocks.N``, roles, ``MODULE/ROLE`` cells):

1. baseline: the whole graph in reduced precision with the chosen recipe (INT8: method, smoothing,
   target; FP16: the default policy with its range pass);
2. one at a time: each cell, block and role ALONE in reduced precision (everything else fp32), scored
   against fp32; its damage is the share of the gate's tolerance it uses (1.0: fails alone);
3. the keep-set: cells (fp16: cells and blocks) ranked worst first; bisection over prefixes of that
   ranking for the shortest
   one whose graph passes (keeping more in higher precision is assumed not to hurt), then each kept
   cell, least damaging first, is dropped again if the graph still passes without it;
4. the recipe (:mod:`.recipe_file`) that ``calibrate --recipe`` / ``convert --keep-fp32`` reproduce,
   a table and a PNG of the damage per block and role (:mod:`.precision_report`).
"""

from __future__ import annotations

import logging
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable


from vitdeploy import precisions
from vitdeploy.bundle import Bundle
from vitdeploy.errors import CheckFailed, InternalError, UserError
from vitdeploy.gate import Gate
from vitdeploy.lazy import require

from .evaluate import GATED_EXECUTION, fp32_accuracy_of, graph_outputs, load_eval_data, scores
from .exclusions import Exclusions
from .precision_units import Trial, Unit, compact_keep, damage, fp16_units, int8_units

logger = logging.getLogger(__name__)

PRECISIONS = precisions.REDUCED


@dataclass
class DebugOptions:
    precision: str = "int8"
    data: str | None = None  # calibration (int8) / range (fp16) images; default: the digits training split
    samples: int = 512
    eval_data: str | None = None  # labelled images the gate scores on; default: the digits test split
    eval_limit: int | None = None
    method: str = "entropy"
    smoothing: str = "none"  # int8: none | layernorm | all
    smooth_alpha: float = 0.5
    target: str = "tensorrt"
    keep_fp32: tuple[str, ...] = ()  # fp16: what the base policy keeps already
    data_max: float | None = None  # fp16 range pass threshold (None: the default)
    gate: Gate = Gate()
    threads: int | None = None
    recipe_path: str | None = None  # default: BUNDLE/reports/precision-recipe-<precision>.json


class Int8Trials:
    """Q/DQ graphs of a node subset, scored in the target's gated execution (calibrate's Trials)."""

    def __init__(self, bundle: Bundle, opts: DebugOptions, work: Path, log: Callable[[str], None]):
        from .qdq import Recipe, check_sample_count
        from .smooth import Smoothing
        from .sources import open_source
        from .sweep import Trials

        self.bundle, self.opts, self.log = bundle, opts, log
        fp32 = bundle.artifact_path("fp32")
        source = open_source(opts.data, bundle, opts.samples)
        check_sample_count(source, opts.method)
        self.data = _labelled_data(bundle, opts)
        ref = graph_outputs(fp32, self.data.images, "all", opts.threads, valid_hw=self.data.valid_hw, alone=self.data.valid_hw is not None)
        self.fp32_accuracy = fp32_accuracy_of(ref, self.data.labels)
        self.trials = Trials(fp32, source, self.data, ref, self.fp32_accuracy, opts.target, bundle.manifest, work, opts.gate,
                             threads=opts.threads, measure_latency=False)
        self.trials.executions = (GATED_EXECUTION[opts.target],)
        self.smoothing = Smoothing(opts.smooth_alpha, opts.smoothing) if opts.smoothing != "none" else None
        self.recipe = lambda exclusions: Recipe(opts.method, opts.target, exclusions, self.smoothing)
        onnx = require("onnx")
        graph, _ = self.trials.graph(self.smoothing)
        self.model = onnx.load(str(graph), load_external_data=False)
        self.units = int8_units(self.model, bundle.manifest.get("graph") or {})
        self.all_nodes = frozenset().union(*(u.nodes for u in self.units["cells"]))
        self.cache: dict[frozenset, Trial] = {}
        self.source_record = source.record()

    def reduced(self, nodes: frozenset, label: str) -> Trial:
        """``nodes`` in INT8, every other linear layer in float."""
        key = frozenset(nodes)
        if key not in self.cache:
            cand = self.trials.run(label, self.recipe(Exclusions(nodes=tuple(sorted(self.all_nodes - key)))))
            if cand is None:  # Trials saw these layers already under another label
                cand = next(c for c in reversed(self.trials.candidates) if frozenset(c.quantization["excluded_nodes"]) == self.all_nodes - key)
            s = cand.scores[self.trials.execution]
            self.cache[key] = Trial(label, cand.passed, cand.failures, s, damage(self.opts.gate, self.fp32_accuracy, s), cand.int8_layers)
        trial = self.cache[key]
        return Trial(label, trial.passed, trial.failures, trial.scores, trial.damage, trial.reduced_layers, trial.overflow)

    def keep(self, kept: list[Unit]) -> Trial:
        return self.reduced(self.all_nodes - frozenset().union(*(u.nodes for u in kept)) if kept else self.all_nodes,
                            "keep " + (", ".join(u.name for u in kept) or "nothing"))

    def recipe_fields(self, kept: list[Unit]) -> dict[str, Any]:
        return {"method": self.opts.method, "target": self.opts.target,
                "smoothing": self.smoothing.to_dict() if self.smoothing is not None else None,
                "keep_fp32": {"op_types": [], "blocks": compact_keep(kept, self.units["cells"]), "roles": []},
                "calibration": self.source_record}


class Fp16Trials:
    """fp16 graphs with a node subset in fp16 (or a keep-set on top of the default policy), scored
    with ONNX Runtime and the static overflow check of the fp16 gate."""

    def __init__(self, bundle: Bundle, opts: DebugOptions, work: Path, log: Callable[[str], None]):
        from vitdeploy.exporters.fp16_range import DEFAULT_DATA_MAX, range_feeds, tensor_absmax

        self.bundle, self.opts, self.log, self.work = bundle, opts, log, work
        onnx = require("onnx")
        self.fp32 = bundle.artifact_path("fp32")
        self.model = onnx.load(str(self.fp32))
        self.data = _labelled_data(bundle, opts)
        self.ref = graph_outputs(self.fp32, self.data.images, "all", opts.threads, valid_hw=self.data.valid_hw,
                                 alone=self.data.valid_hw is not None)
        self.fp32_accuracy = fp32_accuracy_of(self.ref, self.data.labels)
        self.units = fp16_units(self.model, bundle.manifest.get("graph") or {})
        self.feeds, self.range_record = range_feeds(bundle, opts.data)
        self.data_max = DEFAULT_DATA_MAX if opts.data_max is None else opts.data_max
        # fp32 max |x| of every float tensor on the scored images: what fp16 would overflow on a GPU
        from vitdeploy.exporters.fp16 import tensor_elem_types

        kinds = tensor_elem_types(self.model)
        floats = [o for n in self.model.graph.node for o in n.output if kinds.get(o) == onnx.TensorProto.FLOAT]
        scored = [{"images": self.data.images[i : i + 4], **({"valid_hw": self.data.valid_hw[i : i + 4]} if self.data.valid_hw is not None else {})}
                  for i in range(0, min(len(self.data.images), 64), 4)]
        self.absmax = tensor_absmax(self.model, scored, floats, opts.threads)
        self.all_nodes = frozenset(n.name for n in self.model.graph.node)
        self.count = 0
        self.cache: dict[Any, Trial] = {}

    def _score(self, label: str, **convert: Any) -> Trial:
        from vitdeploy.exporters.fp16 import convert_to_fp16
        from vitdeploy.exporters.fp16_gate import fp16_tensors, overflowing

        self.count += 1
        path = self.work / f"fp16-{self.count}.onnx"
        try:
            record = convert_to_fp16(self.fp32, path, manifest=self.bundle.manifest, **convert)
        except InternalError as exc:  # e.g. every linear layer kept: not an fp16 graph (convert refuses it too)
            return Trial(label, False, [str(exc)], {"accuracy": None, "top1_agreement": 1.0, "cosine_p1": 1.0}, 0.0, 0, empty=True)
        got = graph_outputs(path, self.data.images, "all", self.opts.threads, valid_hw=self.data.valid_hw)
        s = scores(got, self.data.labels, self.ref)
        passed, failures = self.opts.gate.verdict(self.fp32_accuracy, s)
        over = overflowing(fp16_tensors(require("onnx").load(str(path))), self.absmax)
        if over:
            passed = False
            failures.append(f"{len(over)} fp16 tensors past 65504 (largest {over[0]['tensor']}: {over[0]['max_abs']:.3g})")
        path.unlink()
        placement = record["placement"]
        return Trial(label, passed, failures, s, damage(self.opts.gate, self.fp32_accuracy, s, len(over)), placement["linear_ops_fp16"], over)

    def reduced(self, nodes: frozenset, label: str) -> Trial:
        key = ("alone", frozenset(nodes))
        if key not in self.cache:
            self.cache[key] = self._score(label, keep_fp32_ops=self.opts.keep_fp32, keep_nodes=sorted(self.all_nodes - frozenset(nodes)))
        return self.cache[key]

    def keep(self, kept: list[Unit]) -> Trial:
        key = ("keep", tuple(sorted(u.name for u in kept)))
        if key not in self.cache:
            self.cache[key] = self._score("keep " + (", ".join(u.name for u in kept) or "nothing"),
                                          keep_fp32_ops=tuple(self.opts.keep_fp32) + tuple(u.name for u in kept),
                                          range_feeds=self.feeds, data_max=self.data_max)
        return self.cache[key]

    def recipe_fields(self, kept: list[Unit]) -> dict[str, Any]:
        return {"keep_fp32": list(self.opts.keep_fp32) + [u.name for u in kept], "data_max": self.data_max,
                "range_images": self.range_record}


def _labelled_data(bundle: Bundle, opts: DebugOptions) -> Any:
    data = load_eval_data(bundle, opts.eval_data, opts.eval_limit)
    if data is None:
        raise UserError("debug-precision scores each trial on labelled held-out images: pass --eval-data DIR/<class>/<image> "
                        "(or a .npz with images + labels; the digits bundle has its own test split)")
    return data


def search_keep(trials: Any, ranked: list[Unit], log: Callable[[str], None]) -> tuple[list[Unit], Trial, list[Trial]]:
    """Shortest passing prefix of ``ranked`` by bisection, then drop what is not needed."""
    steps: list[Trial] = []

    def passes(kept: list[Unit]) -> Trial:
        trial = trials.keep(kept)
        if all(t is not trial and t.label != trial.label for t in steps):
            log(f"  {trial.label[:90]:90s} {'passes' if trial.passed else 'fails'} (damage {trial.damage:.2f})")
        steps.append(trial)
        return trial

    # keeping everything is the fp32 graph: it passes, as does any prefix that leaves nothing in the
    # reduced precision (`empty`), which bounds the search from the fp32 side but is never the answer
    lo, hi = 0, len(ranked)
    best: Trial | None = None
    while hi - lo > 1:
        mid = (lo + hi) // 2
        trial = passes(ranked[:mid])
        if trial.passed or trial.empty:
            hi, best = mid, (trial if trial.passed else None)
        else:
            lo = mid
    kept = list(ranked[:hi])
    if best is None:
        best = passes(kept)
        if not best.passed:
            raise CheckFailed(f"even with {', '.join(u.name for u in kept)} in higher precision the graph fails the gate "
                              f"({'; '.join(best.failures)}); nothing was written")
    for unit in sorted(kept, key=lambda u: ranked.index(u), reverse=True):  # least damaging first
        if len(kept) == 1:
            break
        trial = passes([u for u in kept if u is not unit])
        if trial.passed:
            kept = [u for u in kept if u is not unit]
            best = trial
    return kept, best, steps


def debug_precision(path: str | Path, options: DebugOptions | None = None, log: Callable[[str], None] = logger.info) -> dict[str, Any]:
    """Rank, search, and write the recipe, the JSON report and the PNG; returns the report."""
    from .precision_report import write_outputs

    opts = options or DebugOptions()
    if opts.precision not in PRECISIONS:
        raise UserError(f"--precision must be {precisions.listing(PRECISIONS, 'or')}, got {opts.precision!r}")
    bundle = Bundle.open(path)
    if bundle.bare_onnx is not None:
        raise UserError(f"{bundle.bare_onnx} is a bare ONNX file; debug-precision writes its recipe and reports into a bundle folder")
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="vitdeploy-debug-precision.") as tmp:
        if opts.precision == "fp8":
            from .fp8_debug import Fp8Trials

            trials = Fp8Trials(bundle, opts, Path(tmp), log, _labelled_data(bundle, opts))
        else:
            trials = (Int8Trials if opts.precision == "int8" else Fp16Trials)(bundle, opts, Path(tmp), log)
        units = trials.units
        log(f"{len(units['cells'])} cells, {len(units['blocks'])} blocks, {len(units['roles'])} roles on "
            f"{trials.data.name} ({len(trials.data.images)} images)")
        baseline = trials.keep([])
        log(f"baseline (everything in {opts.precision}): {'passes' if baseline.passed else 'fails: ' + '; '.join(baseline.failures)}")
        ranking: dict[str, list[tuple[Unit, Trial]]] = {}
        for kind in ("cells", "blocks", "roles"):
            ranking[kind] = []
            for unit in units[kind]:
                trial = trials.reduced(unit.nodes, unit.name)
                ranking[kind].append((unit, trial))
            ranking[kind].sort(key=lambda item: -item[1].damage)
        top = ranking["blocks"][:1] + ranking["roles"][:1] + ranking["cells"][:1]
        log("worst alone: " + "; ".join(f"{u.name} (damage {t.damage:.2f})" for u, t in top))
        # INT8: cells (a block is the union of its cells); fp16: cells and whole blocks, since what a block
        # computes outside its linear layers (the residual Adds, the token assembly) can overflow too
        pool = ranking["cells"] if opts.precision == "int8" else ranking["cells"] + ranking["blocks"]
        ordered = [u for u, _ in sorted(pool, key=lambda item: -item[1].damage)]
        if baseline.passed:
            kept, final, steps = [], baseline, []
        else:
            kept, final, steps = search_keep(trials, ordered, log)
        recipe = {"precision": opts.precision, **trials.recipe_fields(kept),
                  "found_by": {"bundle_fp32_sha256": bundle.artifact_sha256("fp32"), "gate": opts.gate.to_dict(),
                               "eval": trials.data.record, "baseline": baseline.row(), "result": final.row(),
                               "rule": "cells ranked by damage alone; shortest passing prefix by bisection; unneeded cells dropped"}}
        report = {"precision": opts.precision, "bundle": str(bundle.root), "eval": trials.data.record,
                  "fp32_accuracy": trials.fp32_accuracy, "gate": opts.gate.to_dict(), "baseline": baseline.row(),
                  "ranking": {kind: [{"unit": u.name, "kind": u.kind, "layers": u.layers, **t.row()} for u, t in items]
                              for kind, items in ranking.items()},
                  "search": [t.row() for t in steps], "kept": [u.name for u in kept], "result": final.row(),
                  "seconds": round(time.perf_counter() - start, 1)}
        report.update(write_outputs(bundle, report, recipe, opts.recipe_path))
    return report
