"""Candidate recipes for ``vitdeploy calibrate``: the exhaustive ``--sweep`` and the default ladder.

``--sweep`` tries calibration methods x exclusion sets x smoothing and keeps the best in the gate.
Without ``--method`` and ``--sweep``, calibrate climbs a ladder instead (:func:`run_ladder`): the
recipes keeping the most layers in INT8 first; for each, the plain graph, then the smoothed graph
(:mod:`.smooth`: LayerNorm folding, then with the explicit Muls too), each with entropy, percentile,
minmax, and the first one inside the gate wins (usually the first tried). Smoothing comes before
excluding layers: it keeps every layer in INT8.

Ranges are calibrated once per method and graph (plain or smoothed: the expensive part) and reused
for every exclusion set, since calibrating every MatMul/Gemm/Conv input covers any subset of them. Each candidate graph is scored on
held-out labelled data in both executions (reference fake-quant and this CPU's int8 kernels: accuracy,
top-1 agreement with fp32) and timed on this CPU at batch 1.

Choice among the candidates that pass the gate (in the execution the target runs):

* ``tensorrt``: the most layers in INT8 (what makes a TensorRT engine fast; this CPU's latency does
  not predict a GPU's), then the highest agreement with fp32, then accuracy; a full tie goes to the
  earlier candidate (methods in the order given, so ``entropy`` first by default);
* ``cpu``: the fastest on this CPU, where candidates within 5% of the fastest count as equally fast
  (timing noise), then agreement, accuracy and INT8 coverage.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from vitdeploy.errors import InternalError, UserError
from vitdeploy.gate import Gate

from .evaluate import GATED_EXECUTION, EvalData, latency_ms, percent, score_graph
from .exclusions import Exclusions
from .qdq import METHODS, Recipe, compute_ranges, quantize_graph
from .smooth import DEFAULT_ALPHA, Smoothing, smooth_graph
from .sources import CalibrationSource

# Exclusion sets tried by the sweep (user exclusions are added to each).
PRESETS: dict[str, Exclusions] = {
    "none": Exclusions(),
    "head": Exclusions(roles=("head",)),
    "patch-embed+head": Exclusions(roles=("patch-embed", "head")),
    "attention-matmuls": Exclusions(roles=("attention-matmuls",)),
    "mlp-fc2": Exclusions(roles=("mlp-fc2",)),
}
LATENCY_TIE = 0.05
LATENCY_RUNS = 20


@dataclass
class Candidate:
    preset: str
    recipe: Recipe
    path: Path
    quantization: dict[str, Any]
    calibration: dict[str, Any]
    scores: dict[str, Any]
    latency_ms: float
    passed: bool
    failures: list[str] = field(default_factory=list)
    smoothing: dict[str, Any] | None = None  # the smoothing pass's record, when the recipe smooths

    @property
    def int8_layers(self) -> int:
        return int(self.quantization["placement"]["quantized_layers"])

    def row(self) -> dict[str, Any]:
        return {
            "method": self.recipe.method,
            "exclusions": self.preset,
            "smoothing": self.recipe.smoothing.to_dict() if self.recipe.smoothing is not None else None,
            "excluded_nodes": len(self.quantization["excluded_nodes"]),
            "int8_layers": self.int8_layers,
            **{execution: {k: self.scores[execution][k] for k in ("accuracy", "top1_agreement", "cosine_min", "cosine_p1")}
               for execution in ("reference", "this_cpu") if execution in self.scores},
            "latency_ms_batch1": None if self.latency_ms != self.latency_ms else round(self.latency_ms, 3),
            "passed": self.passed,
            "failures": self.failures,
        }


def merge(user: Exclusions, preset: Exclusions) -> Exclusions:
    def union(a: tuple[str, ...], b: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(dict.fromkeys(a + b))

    return Exclusions(union(user.op_types, preset.op_types), union(user.blocks, preset.blocks), union(user.roles, preset.roles),
                      union(user.nodes, preset.nodes))


class Trials:
    """Builds and scores candidate recipes over one calibration source; ranges are calibrated once
    per method (lazily) and reused by every exclusion set."""

    def __init__(self, fp32_path: Path, source: CalibrationSource, data: EvalData, fp32_logits: np.ndarray,
                 fp32_accuracy: float | None, target: str, manifest: dict[str, Any], workdir: Path, gate: Gate,
                 threads: int | None = None, measure_latency: bool = True,
                 log: Callable[[str], None] = lambda _m: None, progress: Callable[[int, int], None] | None = None):
        self.fp32_path, self.source, self.data = fp32_path, source, data
        self.fp32_logits, self.fp32_accuracy, self.target = fp32_logits, fp32_accuracy, target
        self.manifest, self.workdir, self.gate, self.threads = manifest, workdir, gate, threads
        self.measure_latency, self.log, self.progress = measure_latency, log, progress
        self.executions: tuple[str, ...] | None = None  # None: both; debug-precision scores the gated one only
        self.execution = GATED_EXECUTION[target]
        self.ranges: dict[tuple[str, Smoothing | None], tuple[Path, dict[str, Any]]] = {}
        self.graphs: dict[Smoothing, tuple[Path, dict[str, Any]] | str] = {}  # smoothed graph + record, or why not
        self.seen: set[tuple[Any, ...]] = set()
        self.candidates: list[Candidate] = []

    def graph(self, smoothing: Smoothing | None) -> tuple[Path, dict[str, Any] | None]:
        """The fp32 graph a recipe quantizes: the bundle's, or its smoothed copy (made once, verified
        function-preserving). Raises UserError/InternalError when this graph cannot be smoothed."""
        if smoothing is None:
            return self.fp32_path, None
        if smoothing not in self.graphs:
            path = self.workdir / f"smoothed-{smoothing.scope}-{smoothing.alpha:g}.onnx"
            try:
                record = smooth_graph(self.fp32_path, path, self.source, smoothing, self.manifest, self.threads)
            except (UserError, InternalError) as exc:
                self.graphs[smoothing] = str(exc)
                raise
            self.graphs[smoothing] = (path, record)
            self.log(f"smoothed ({smoothing.scope}, alpha {smoothing.alpha:g}): {record['layers_touched']} linear layers, "
                     f"{record['new_nodes']} Mul nodes added; fp32 unchanged to {record['verification']['max_rel_diff']:.1e} relative")
        entry = self.graphs[smoothing]
        if isinstance(entry, str):
            raise UserError(entry)
        return entry

    def _ranges(self, method: str, smoothing: Smoothing | None = None) -> tuple[Path, dict[str, Any]]:
        key = (method, smoothing)
        if key not in self.ranges:
            graph, _ = self.graph(smoothing)
            tag = f"-{smoothing.scope}-{smoothing.alpha:g}" if smoothing is not None else ""
            path = self.workdir / f"ranges-{method}{tag}.json"
            calibration = compute_ranges(graph, self.source, method, self.target, path, self.progress)
            self.log(f"calibrated {method}{' on the smoothed graph' if smoothing else ''} on {len(self.source)} images "
                     f"in {calibration['seconds']:.1f} s")
            self.ranges[key] = (path, calibration)
        return self.ranges[key]

    def run(self, preset: str, recipe: Recipe, strict: bool = True) -> Candidate | None:
        """Quantize, score and gate one recipe; None when it repeats an earlier one's layers (or, with
        ``strict=False``, when its smoothing does not apply to this graph)."""
        try:
            graph, smoothed = self.graph(recipe.smoothing)
        except (UserError, InternalError) as exc:
            if strict:
                raise
            if recipe.smoothing not in self.seen:
                self.seen.add(recipe.smoothing)
                self.log(f"  {recipe.smoothing_label}: skipped ({exc})")
            return None
        ranges, calibration = self._ranges(recipe.method, recipe.smoothing)
        tag = f"-{recipe.smoothing.scope}-{recipe.smoothing.alpha:g}" if recipe.smoothing is not None else ""
        safe = "".join(ch if ch.isalnum() or ch in "-+." else "_" for ch in preset)[:60]
        out = self.workdir / f"{len(self.candidates):03d}-{recipe.method}-{safe}{tag}.onnx"
        quantization = quantize_graph(graph, out, ranges, recipe, self.manifest)
        key = (recipe.method, recipe.smoothing, tuple(quantization["excluded_nodes"]))
        if key in self.seen:  # e.g. "head" on a graph whose head the user already excluded
            out.unlink()
            return None
        self.seen.add(key)
        result = score_graph(out, self.data, self.fp32_logits, self.threads, self.executions)
        passed, failures = self.gate.verdict(self.fp32_accuracy, result[self.execution])
        valid = self.data.valid_hw[:1] if self.data.valid_hw is not None else None
        latency = (latency_ms(out, self.data.images[:1], "all", runs=LATENCY_RUNS, threads=self.threads, valid_hw=valid)
                   if self.measure_latency else float("nan"))
        cand = Candidate(preset, recipe, out, quantization, calibration, result, latency, passed, failures, smoothed)
        self.candidates.append(cand)
        s = result[self.execution]
        self.log(f"  {recipe.method:10s} {preset:18s} {_smooth_tag(recipe):12s} int8 layers {cand.int8_layers:3d}  {_fmt(s['accuracy'])} acc  "
                 f"{percent(s['top1_agreement'])} agree  cos p1 {s['cosine_p1']:.4f} (worst {s['cosine_min']:.4f})  "
                 f"{'ok' if passed else 'below gate: ' + '; '.join(failures)}")
        return cand


def _smooth_tag(recipe: Recipe) -> str:
    if recipe.smoothing is None:
        return "plain"
    return f"smooth-{'ln' if recipe.smoothing.scope == 'layernorm' else recipe.smoothing.scope} {recipe.smoothing.alpha:g}"


# Smoothing a recipe may use, in the order the ladder tries them: none (the graph as exported), the
# LayerNorm folding (no new node), then the folding plus explicit Muls before attn.proj and mlp.fc2.
SMOOTHING_SCOPES = ("none", "layernorm", "all")


def smoothing_options(scopes: tuple[str, ...] = SMOOTHING_SCOPES, alpha: float = DEFAULT_ALPHA) -> tuple[Smoothing | None, ...]:
    return tuple(None if scope == "none" else Smoothing(alpha, scope) for scope in scopes)


def run_sweep(trials: Trials, user_exclusions: Exclusions = Exclusions(), methods: tuple[str, ...] = METHODS,
              presets: dict[str, Exclusions] | None = None, smoothings: tuple[Smoothing | None, ...] = (None,)) -> list[Candidate]:
    """Every method x every exclusion set x every smoothing."""
    for smoothing in smoothings:
        for method in methods:
            for name, preset in (presets or PRESETS).items():
                trials.run(name, Recipe(method, trials.target, merge(user_exclusions, preset), smoothing), strict=False)
    return trials.candidates


# The default `calibrate` (no --method): the most INT8 layers first; for each exclusion set the plain
# graph, then the smoothed ones, each with every method; the first recipe inside the gate wins. The
# common case costs one calibration.
LADDER_PRESETS = ("none", "head", "patch-embed+head", "mlp-fc2", "attention-matmuls")
LADDER_METHODS = ("entropy", "percentile", "minmax")


def run_ladder(trials: Trials, user_exclusions: Exclusions = Exclusions(), methods: tuple[str, ...] = LADDER_METHODS,
               smoothings: tuple[Smoothing | None, ...] = (None,)) -> Candidate | None:
    for name in LADDER_PRESETS:
        for smoothing in smoothings:
            for method in methods:
                cand = trials.run(name, Recipe(method, trials.target, merge(user_exclusions, PRESETS[name]), smoothing), strict=False)
                if cand is not None and cand.passed:
                    return cand
    return None


def choose(candidates: list[Candidate], target: str) -> Candidate | None:
    execution = GATED_EXECUTION[target]
    ok = [c for c in candidates if c.passed]
    if not ok:
        return None

    def quality(c: Candidate) -> tuple[float, float]:
        s = c.scores[execution]
        agreement = s["top1_agreement"] if s["top1_agreement"] is not None else s["cosine_p1"]  # embedding models: cosine
        return (agreement, s["accuracy"] if s["accuracy"] is not None else 0.0)

    if target == "tensorrt":
        # this CPU's latency says nothing about a GPU: full ties go to the earlier candidate
        # (methods in the order given, presets in PRESETS order), so the choice is reproducible
        return max(ok, key=lambda c: (c.int8_layers, *quality(c)))
    fastest = min(c.latency_ms for c in ok)
    tier = [c for c in ok if c.latency_ms <= fastest * (1 + LATENCY_TIE)]
    return max(tier, key=lambda c: (*quality(c), c.int8_layers, -c.latency_ms))


def choice_rule(target: str) -> str:
    if target == "tensorrt":
        return "within the gate (reference execution): most INT8 layers, then agreement, accuracy; ties to the earlier method"
    return f"within the gate (this CPU's int8 kernels): fastest (ties within {LATENCY_TIE:.0%}), then agreement, accuracy, INT8 layers"


def render_table(candidates: list[Candidate], best: Candidate | None, fp32_accuracy: float | None, fp32_latency: float, target: str) -> Any:
    """A rich Table of the sweep (the chosen row starred)."""
    from rich.table import Table

    execution = GATED_EXECUTION[target]
    title = f"INT8 sweep ({target} target; gate on the {'reference fake-quant' if execution == 'reference' else 'this CPU int8'} execution)"
    table = Table(title=title)
    cols = ("", "method", "excluded", "smoothing", "int8 layers", "acc (ref)", "agree (ref)", "cos p1 (ref)", "acc (cpu)", "agree (cpu)",
            "cos p1 (cpu)", "ms b1 (cpu)", "gate")
    for col in cols:
        table.add_column(col, justify="left" if col in ("", "method", "excluded", "smoothing", "gate") else "right")
    table.add_row("", "fp32", "-", "-", "0", _fmt(fp32_accuracy), "100.00%", "1.0000", _fmt(fp32_accuracy), "100.00%", "1.0000",
                  f"{fp32_latency:.2f}", "")
    for c in candidates:
        ref, cpu = c.scores["reference"], c.scores["this_cpu"]
        table.add_row("*" if c is best else "", c.recipe.method, c.preset, _smooth_tag(c.recipe), str(c.int8_layers),
                      _fmt(ref["accuracy"]), percent(ref["top1_agreement"]), f"{ref['cosine_p1']:.4f}",
                      _fmt(cpu["accuracy"]), percent(cpu["top1_agreement"]), f"{cpu['cosine_p1']:.4f}",
                      f"{c.latency_ms:.2f}", "ok" if c.passed else "; ".join(c.failures))
    return table


def _fmt(acc: float | None) -> str:
    return "n/a" if acc is None else f"{acc:.2%}"
