"""`vitdeploy evaluate`: score every graph of a bundle (and the PyTorch reference) on labelled data
under declared conditions: clean, the shift suite, and other resolutions.

Design for speed: every scorer's session is created once and reused; each condition's images are
made once (pure numpy/Pillow, seeded) and fed to every scorer in large batches; statistics are
computed from the predictions afterwards, so strata cost nothing extra.
"""

from __future__ import annotations

import logging
import os
import platform
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from .. import __version__
from ..bundle import Bundle
from ..contract import InputContract
from ..data import default_data
from ..errors import UserError
from .runners import Scorer, check_precisions, engine_scorers, graph_scorer, reference_scorer, refuse_embedding_model
from .score import condition_stats, size_bins, size_strata
from .transforms import OCCLUSION_FILLS, Context, Transform, foreground_fraction, parse_suite

logger = logging.getLogger(__name__)

SCHEMA = "vitdeploy-evaluate/1"
CLEAN = "clean"


@dataclass
class EvaluateOptions:
    data: str | None = None  # default: the bundled model's own test split
    precisions: list[str] | None = None  # default: every graph in the bundle
    suite: str = "all"  # all | none | comma-separated transform names
    severities: tuple[str, ...] = ()  # "jpeg=90,50,10" overrides
    ladder: str = "default"  # each transform's severities: default (29 conditions) | fine (42)
    resolutions: list[tuple[int, int]] | None = None  # resolution sweep (besides the native size)
    max_drop_pt: float = 2.0  # flag: accuracy drop vs native (resolution) / agreement drop vs clean (shift), in points
    seed: int = 0
    batch: int = 64
    limit: int | None = None
    threads: int | None = None
    reference: bool = True
    occlusion_fill: str = "mean"
    skip_unreadable: bool = False


@dataclass
class Progress:
    """Hooks for a progress bar: ``begin(total)`` once, ``step(label)`` per scorer pass."""

    begin: Callable[[int], None] = lambda _n: None
    step: Callable[[str], None] = lambda _label: None


@dataclass
class _Condition:
    id: str
    transform: Transform | None
    severity: float | None
    applied_to: int
    seed: int
    note: str = ""

    def record(self) -> dict[str, Any]:
        out = {"id": self.id, "transform": self.transform.name if self.transform else CLEAN,
               "family": self.transform.group if self.transform else CLEAN, "severity": self.severity,
               "unit": self.transform.unit if self.transform else None, "applied_to": self.applied_to, "seed": self.seed}
        if self.note:
            out["note"] = self.note
        return out


@dataclass
class EvaluateResult:
    report: dict[str, Any]
    predictions: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)  # scorer -> condition -> preds


def evaluation_contract(bundle: Bundle) -> InputContract:
    """The bundle's input contract; data is brought to its ``source_size`` (the size fed, or for a canvas
    the model's native size, each image then fitted into the canvas as `predict` does)."""
    pre = bundle.preprocessing
    if pre.get("input", "uint8-nhwc") != "uint8-nhwc":
        raise UserError(f"this graph takes {pre.get('input')} input; evaluate feeds uint8 NHWC images (export with --input uint8-nhwc)")
    return InputContract.from_bundle(bundle)


def mean_rgb(preprocessing: dict[str, Any]) -> tuple[int, int, int]:
    """The normalisation mean as pixel values: what the model sees as zero input."""
    mean = preprocessing.get("mean") or [0.5, 0.5, 0.5]
    return tuple(int(round(float(m) * 255)) for m in mean)  # type: ignore[return-value]


def run_evaluate(path: str | Path, options: EvaluateOptions | None = None, progress: Progress | None = None,
                 log: Callable[[str], None] = logger.info) -> EvaluateResult:
    from ..data import open_labelled
    from ..images import to_channel_order

    opts = options or EvaluateOptions()
    prog = progress or Progress()
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    t0 = time.perf_counter()
    timing: dict[str, float] = {}
    if opts.batch < 1:
        raise UserError(f"--batch must be >= 1, got {opts.batch}")
    if opts.occlusion_fill not in OCCLUSION_FILLS:
        raise UserError(f"unknown occlusion fill {opts.occlusion_fill!r}; use {', '.join(OCCLUSION_FILLS)}")
    if not opts.max_drop_pt > 0:
        raise UserError(f"--max-drop must be > 0 points, got {opts.max_drop_pt}")
    bundle = Bundle.open(path)
    refuse_embedding_model(bundle, "evaluate")
    suite = parse_suite(opts.suite, opts.severities, opts.ladder)  # bad names/severities fail before anything loads
    precisions = check_precisions(bundle, opts.precisions)
    contract = evaluation_contract(bundle)
    size = contract.source_size
    resolutions = _check_resolutions(bundle, contract, opts.resolutions, size)
    data_spec = opts.data or default_data(bundle)
    if not data_spec:
        raise UserError("no labelled data: pass --data digits:test, a folder DIR/<class>/<image>, or a .npz with images + labels")
    pre = bundle.preprocessing

    t = time.perf_counter()
    data = open_labelled(data_spec, size, pre, bundle.labels or None, opts.limit, opts.skip_unreadable)
    timing["data_s"] = time.perf_counter() - t
    log(f"data: {data.source}: {len(data)} images at {size[0]}x{size[1]}" +
        (f" ({len(data.unreadable)} unreadable, left out and named in the report)" if data.unreadable else ""))

    t = time.perf_counter()
    threads = opts.threads or scorer_threads(len(precisions) + (1 if opts.reference else 0))
    scorers = [graph_scorer(bundle, contract, p, bundle.artifact_path(p), threads, opts.batch) for p in precisions]
    engines, engines_skipped = engine_scorers(bundle, contract, opts.batch)
    scorers += engines
    reference, reference_note = (None, "not requested (--no-reference)")
    if opts.reference:
        reference, reference_note = reference_scorer(bundle, contract, threads, opts.batch)
    if reference is not None:
        scorers.append(reference)
    elif opts.reference:
        log(f"reference: {reference_note}")
    timing["load_s"] = time.perf_counter() - t
    agree_with = reference.id if reference is not None else scorers[0].id

    ctx = Context(seed=opts.seed, patch=tuple(bundle.spec.patch_size), mean_rgb=mean_rgb(pre), occlusion_fill=opts.occlusion_fill)
    clean = data.images
    fractions = foreground_fraction(clean, ctx.background_tol)
    separable = int((~np.isnan(fractions)).sum())
    bins = size_bins(fractions)
    strata = size_strata(fractions, bins)

    conditions = _conditions(suite, len(clean), separable, opts.seed)
    runnable = [c for c in conditions if not c.note.startswith("skipped")]
    prog.begin(len(runnable) * len(scorers) + len(resolutions) * (len(precisions) + (1 if reference is not None else 0)))

    def make_feeds(cond: _Condition) -> dict[str, np.ndarray]:
        images = clean if cond.transform is None else cond.transform.apply(clean, cond.severity, ctx)
        return contract.feeds_for(to_channel_order(images, pre))  # one set of feeds for every scorer

    # Scorers run side by side when each is pinned to fewer threads than the machine has (--threads 1
    # on 2 cores: two scorers at once); ONNX Runtime and PyTorch release the GIL while they compute.
    workers = scorer_workers(threads, len(scorers))
    preds, infer_s, transform_s = _predict(scorers, runnable, make_feeds, workers, prog)
    timing["transforms_s"] = transform_s
    timing["inference_s"] = dict(infer_s)  # per scorer; they overlap when workers > 1
    timing["workers"] = workers
    timing["threads_per_scorer"] = threads

    results: dict[str, dict[str, Any]] = {}
    flags: list[str] = []
    for scorer in scorers:
        results[scorer.id] = _scorer_results(scorer, runnable, preds, agree_with, data, strata, bins["names"], opts.max_drop_pt, flags)

    t = time.perf_counter()
    sweep = ResolutionSweep(bundle, contract, data_spec, opts, precisions, size, reference is not None, prog, log)
    resolution = sweep.run(resolutions, results)
    timing["resolution_s"] = time.perf_counter() - t
    flags.extend(f"{row['runner']} at {row['height']}x{row['width']}: {row['flag']}" for row in resolution.get("rows", []) if row.get("flag"))

    for scorer in scorers:
        scorer.runner.close()
    timing["total_s"] = time.perf_counter() - t0
    report = {
        "schema": SCHEMA,
        "created": started,
        "vitdeploy_version": __version__,
        "bundle": {"path": str(bundle.bare_onnx or bundle.root), "name": bundle.name, "source": bundle.manifest.get("source"),
                   "resolution": bundle.resolution, "precisions": bundle.precisions(), "input": contract.describe(),
                   "graphs": {p: bundle.artifact_sha256(p) for p in precisions}},
        "data": data.record(),
        "options": {**asdict(opts), "resolutions": [list(r) for r in resolutions]},
        "machine": {"platform": platform.platform(), "python": platform.python_version(),
                    # other processes share the cores: the load explains slow runs better than any statistic
                    "loadavg": list(os.getloadavg()) if hasattr(os, "getloadavg") else None},
        "reference": {"available": reference is not None, "id": reference.id if reference else None,
                      "note": reference_note, "agreement_with": agree_with},
        "scorers": [s.record() for s in scorers] + engines_skipped,
        "engines": {"scored": [s.id for s in engines], "skipped": len(engines_skipped),
                    "note": None if (engines or engines_skipped) else "the bundle has no TensorRT engine (vitdeploy build-engine)"},
        "transforms": [{**t.describe(), "severities": list(levels),
                        **({"fill": opts.occlusion_fill, "fill_rgb": list(fill_rgb(opts.occlusion_fill, ctx))} if t.group == "occlusion" else {})}
                       for t, levels in suite],
        "strata": {"size": bins, "separable_background": separable, "small_stratum": 30,
                   "class_rule": "per class = images whose label is that class"},
        "conditions": [c.record() for c in conditions],
        "results": results,
        "resolution": resolution,
        "flags": flags,
        "statistics": {"interval": "95% Wilson score interval", "drop_pt": "clean accuracy minus accuracy under the condition, "
                       "same scorer, percentage points", "agreement": f"share of images where the top-1 class equals {agree_with}'s "
                       "under the same perturbation", "agreement_drop_pt": "clean agreement minus agreement under the condition"},
        "timing": timing,
        "wall_s": timing["total_s"],
    }
    return EvaluateResult(report, preds)


def _conditions(suite: list[tuple[Transform, Sequence[float]]], count: int, separable: int, seed: int) -> list[_Condition]:
    """Clean, then every transform at every severity; a background transform on images whose background
    is not separable is kept as skipped (the report says why)."""
    conditions = [_Condition(CLEAN, None, None, count, seed)]
    for transform, levels in suite:
        for level in levels:
            cond = _Condition(f"{transform.name}@{level:g}", transform, level, count, seed)
            if transform.needs_background:
                cond.applied_to = separable
                if separable == 0:
                    cond.note = "skipped: no image has a separable background (see the transform's rule)"
            conditions.append(cond)
    return conditions


def _predict(scorers: list[Scorer], conditions: list[_Condition], make_feeds: Callable[[_Condition], dict[str, np.ndarray]],
             workers: int, prog: Progress) -> tuple[dict[str, dict[str, np.ndarray]], dict[str, float], float]:
    """Top-1 predictions of every scorer under every condition: (scorer -> condition -> preds, inference
    seconds per scorer, seconds spent making the conditions' feeds)."""
    import threading
    from collections import deque
    from concurrent.futures import Future, ThreadPoolExecutor

    preds: dict[str, dict[str, np.ndarray]] = {s.id: {} for s in scorers}
    infer_s = {s.id: 0.0 for s in scorers}
    transform_s = 0.0
    # one batch at a time per scorer: a TensorRT context and its buffers serve one call at once
    busy = {s.id: threading.Lock() for s in scorers}

    def run_one(scorer: Scorer, cond_id: str, feeds: dict[str, np.ndarray]) -> None:
        with busy[scorer.id]:
            t1 = time.perf_counter()
            preds[scorer.id][cond_id] = scorer.predict(feeds)
            infer_s[scorer.id] += time.perf_counter() - t1

    def settle(cond_id: str, futures: list[tuple[Scorer, Future]]) -> None:
        for scorer, future in futures:
            future.result()  # re-raises a scorer's error here
            prog.step(f"{cond_id} · {scorer.id}")

    # One condition ahead: the next condition's images are made while the scorers work on this one,
    # and a worker that finishes early takes the next condition's first task instead of waiting for
    # the slowest scorer (no barrier per condition); two conditions' images at most are held.
    in_flight: deque[tuple[str, list[tuple[Scorer, Future]]]] = deque()
    with ThreadPoolExecutor(max_workers=workers) as pool:
        for cond in conditions:
            t = time.perf_counter()
            feeds = make_feeds(cond)
            transform_s += time.perf_counter() - t
            in_flight.append((cond.id, [(scorer, pool.submit(run_one, scorer, cond.id, feeds)) for scorer in scorers]))
            if len(in_flight) > 1:
                settle(*in_flight.popleft())
        while in_flight:
            settle(*in_flight.popleft())
    return preds, infer_s, transform_s


def _scorer_results(scorer: Scorer, conditions: list[_Condition], preds: dict[str, dict[str, np.ndarray]], agree_with: str, data: Any,
                    strata: np.ndarray, size_names: list[str], max_drop_pt: float, flags: list[str]) -> dict[str, Any]:
    """One scorer's statistics per condition (against clean, and agreement with ``agree_with``); a graph
    whose agreement falls more than ``max_drop_pt`` below clean is flagged (appended to ``flags``)."""
    ref_preds = preds[agree_with] if scorer.id != agree_with else None
    clean_stats = condition_stats(preds[scorer.id][CLEAN], data.labels, data.classes, strata, size_names, None,
                                  ref_preds[CLEAN] if ref_preds else None)
    clean_stats["drop_pt"] = 0.0
    out = {CLEAN: clean_stats}
    for cond in conditions[1:]:
        stats = condition_stats(preds[scorer.id][cond.id], data.labels, data.classes, strata, size_names, clean_stats,
                                ref_preds[cond.id] if ref_preds else None, clean_stats.get("agreement"))
        if scorer.kind != "reference" and stats.get("agreement_drop_pt", 0.0) > max_drop_pt:
            stats["flag"] = (f"agreement with {agree_with} falls {stats['agreement_drop_pt']:.1f} pt below clean "
                             f"(> {max_drop_pt:g}): this graph diverges under {cond.id}")
            flags.append(f"{scorer.id}: {stats['flag']}")
        out[cond.id] = stats
    return out


def _cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def scorer_threads(scorers: int) -> int:
    """Threads per scorer when --threads is not given: the CPUs shared out over the scorers (at least
    one each), so that they run side by side. Measured on the 2-CPU VM with the digits bundle's 4
    scorers (docs/BENCHMARKS.md): one thread each, two at a time, 47-59 s; every CPU each, one at a
    time, 75-79 s; small ViTs keep more cores busy as separate sessions than as one session's pool."""
    return max(1, _cpus() // max(1, scorers))


def scorer_workers(threads: int | None, scorers: int) -> int:
    """How many scorers may run at once: the CPUs this process may use over each scorer's threads
    (one at a time when a scorer already uses every CPU, the ONNX Runtime default)."""
    cpus = _cpus()
    if not threads:
        return 1
    return max(1, min(scorers, cpus // int(threads)))


def fill_rgb(fill: str, ctx: Context) -> tuple[int, ...]:
    return {"mean": ctx.mean_rgb, "gray": (128, 128, 128), "black": (0, 0, 0), "white": (255, 255, 255)}.get(fill, ())


def _check_resolutions(bundle: Bundle, contract: InputContract, resolutions: Sequence[tuple[int, int]] | None,
                       native: tuple[int, int]) -> list[tuple[int, int]]:
    if not resolutions:
        return []
    out: list[tuple[int, int]] = []
    for h, w in resolutions:
        bundle.spec.grid(int(h), int(w))  # one line naming the nearest sizes the patch tiles
        if contract.mixes_sizes:
            contract.check_size(int(h), int(w))  # a canvas holds the size as it is (whole patches within it)
        if (h, w) not in out:
            out.append((int(h), int(w)))
    if contract.in_graph_resize is not None:
        raise UserError("this bundle resizes every input to its model resolution inside the graph, so its accuracy does not "
                        "depend on the input size; export with --dynamic-resolution to compare resolutions")
    if any(not contract.accepts(*r) for r in out):
        from ..lazy import available

        if not available("vitdeploy.exporters.variants"):
            raise UserError("the bundle's graph is static; other resolutions are re-exported, which needs vitdeploy's exporters: "
                            "pip install 'vitdeploy[export]' (or export with --dynamic-resolution)")
    return out


@dataclass
class ResolutionSweep:
    """Clean accuracy at other sizes, against the native size's, for every graph and the reference."""

    bundle: Bundle
    contract: InputContract
    data_spec: str
    opts: EvaluateOptions
    precisions: list[str]
    native: tuple[int, int]
    with_reference: bool
    prog: Progress
    log: Callable[[str], None]

    def rule(self) -> str:
        pre, res = self.bundle.preprocessing, self.bundle.resolution
        interp = res.get("pos_embed_interpolation", {})
        placed = ("placed as they are in the canvas (valid_hw = the size)" if self.contract.mixes_sizes else
                  "resampled inside the dynamic graph" if res.get("mode") == "dynamic" else
                  "re-exported offline as static variants (cached under variants/HxW)")
        return (f"images: the source images brought to each size by the manifest's host-resize rule "
                f"({(pre.get('host_resize') or {}).get('mode', 'stretch')}, {(pre.get('host_resize') or {}).get('interpolation', 'bilinear')}, Pillow); "
                f"position table: {interp.get('description') or interp or 'the bundle convention'}, {placed}")

    def scorers_at(self, h: int, w: int) -> tuple[InputContract, list[Scorer]]:
        sized = self.contract.at_size(h, w)
        scorers: list[Scorer] = []
        for p in self.precisions:
            if self.contract.accepts(h, w):  # the bundle's own graph takes the size (dynamic, canvas, the native size)
                path = self.bundle.artifact_path(p)
            else:
                from vitdeploy.exporters.variants import graph_for

                path = Path(graph_for(self.bundle, p, h, w, log=self.log))
            scorers.append(graph_scorer(self.bundle, sized, p, path, self.opts.threads, self.opts.batch))
        if self.with_reference:
            ref, _note = reference_scorer(self.bundle, sized, self.opts.threads, self.opts.batch, resolution=(h, w))
            if ref is not None:
                scorers.append(ref)
        return sized, scorers

    def run(self, resolutions: list[tuple[int, int]], results: dict[str, Any]) -> dict[str, Any]:
        if not resolutions:
            return {}
        from ..data import open_labelled
        from ..images import to_channel_order
        from .score import accuracy_entry

        opts, pre = self.opts, self.bundle.preprocessing
        rows = []
        for h, w in resolutions:
            data = open_labelled(self.data_spec, (h, w), pre, self.bundle.labels or None, opts.limit, opts.skip_unreadable)
            sized, scorers = self.scorers_at(h, w)
            feeds = sized.feeds_for(to_channel_order(data.images, pre))
            for scorer in scorers:
                hit = scorer.predict(feeds) == data.labels
                native_acc = results.get(scorer.id, {}).get(CLEAN, {}).get("accuracy")
                entry = accuracy_entry(int(hit.sum()), len(hit))
                row = {"runner": scorer.id, "precision": scorer.precision, "height": h, "width": w,
                       "graph": scorer.details.get("graph") or scorer.details.get("model"), **entry}
                if native_acc is not None:
                    row["drop_pt"] = (native_acc - entry["accuracy"]) * 100.0
                    if row["drop_pt"] > opts.max_drop_pt:
                        row["flag"] = (f"accuracy {row['drop_pt']:.1f} pt below the native {self.native[0]}x{self.native[1]} "
                                       f"(> {opts.max_drop_pt:g})")
                rows.append(row)
                scorer.runner.close()
                self.prog.step(f"{h}x{w} · {scorer.id}")
        return {"native": list(self.native), "rule": self.rule(), "threshold_pt": opts.max_drop_pt, "rows": rows}
