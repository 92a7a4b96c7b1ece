"""`vitdeploy evaluate`: score every graph of a bundle (and the PyTorch reference) on labelled data
under declared conditions: clean, the shift suite, and other resolutions.

Design for speed: every scorer's session is created once and reused; each condition's images are
made once (pure numpy/Pillow, seeded) and fed to every scorer in large batches; statistics are
computed from the predictions afterwards, so strata cost nothing extra.
"""

from __future__ import annotations

import os
import platform
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from .. import __version__
from ..bundle import Bundle
from ..data import default_data
from ..errors import UserError
from .runners import Scorer, check_precisions, engine_scorers, graph_scorer, reference_scorer
from .score import condition_stats, size_bins, size_strata
from .transforms import OCCLUSION_FILLS, Context, Transform, foreground_fraction, parse_suite

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
               "family": self.transform.family if self.transform else CLEAN, "severity": self.severity,
               "unit": self.transform.unit if self.transform else None, "applied_to": self.applied_to, "seed": self.seed}
        if self.note:
            out["note"] = self.note
        return out


@dataclass
class EvaluateResult:
    report: dict[str, Any]
    predictions: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)  # scorer -> condition -> preds


def input_size(bundle: Bundle) -> tuple[int, int]:
    from ..images import model_input_size

    pre = bundle.preprocessing
    if pre.get("input", "uint8-nhwc") != "uint8-nhwc":
        raise UserError(f"this graph takes {pre.get('input')} input; evaluate feeds uint8 NHWC images (export with --input uint8-nhwc)")
    return model_input_size(pre, bundle.resolution, bundle.spec.patch_size)


def mean_rgb(preprocessing: dict[str, Any]) -> tuple[int, int, int]:
    """The normalisation mean as pixel values: what the model sees as zero input."""
    mean = preprocessing.get("mean") or [0.5, 0.5, 0.5]
    return tuple(int(round(float(m) * 255)) for m in mean)  # type: ignore[return-value]


def run_evaluate(path: str | Path, options: EvaluateOptions | None = None, progress: Progress | None = None,
                 log: Callable[[str], None] = lambda _m: None) -> EvaluateResult:
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
    suite = parse_suite(opts.suite, opts.severities, opts.ladder)  # bad names/severities fail before anything loads
    precisions = check_precisions(bundle, opts.precisions)
    size = input_size(bundle)
    resolutions = _check_resolutions(bundle, opts.resolutions, size)
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
    scorers = [graph_scorer(bundle, p, bundle.artifact_path(p), threads, opts.batch) for p in precisions]
    engines, engines_skipped = engine_scorers(bundle, opts.batch, size)
    scorers += engines
    reference, reference_note = (None, "not requested (--no-reference)")
    if opts.reference:
        reference, reference_note = reference_scorer(bundle, threads, opts.batch)
    if reference is not None:
        scorers.append(reference)
    elif opts.reference:
        log(f"reference: {reference_note}")
    timing["load_s"] = time.perf_counter() - t
    agree_with = reference.id if reference is not None else scorers[0].id

    ctx = Context(seed=opts.seed, patch=tuple(bundle.spec.patch_size), mean_rgb=mean_rgb(pre), occlusion_fill=opts.occlusion_fill)
    clean = data.images
    labels = data.labels
    fractions = foreground_fraction(clean, ctx.background_tol)
    separable = int((~np.isnan(fractions)).sum())
    bins = size_bins(fractions)
    strata = size_strata(fractions, bins)

    conditions = [_Condition(CLEAN, None, None, len(clean), opts.seed)]
    for transform, levels in suite:
        for level in levels:
            cond = _Condition(f"{transform.name}@{level:g}", transform, level, len(clean), opts.seed)
            if transform.needs_background:
                cond.applied_to = separable
                if separable == 0:
                    cond.note = "skipped: no image has a separable background (see the transform's rule)"
            conditions.append(cond)
    runnable = [c for c in conditions if not c.note.startswith("skipped")]
    prog.begin(len(runnable) * len(scorers) + len(resolutions) * (len(precisions) + (1 if reference is not None else 0)))

    preds: dict[str, dict[str, np.ndarray]] = {s.id: {} for s in scorers}
    infer_s = {s.id: 0.0 for s in scorers}
    transform_s = 0.0
    # Scorers run side by side when each is pinned to fewer threads than the machine has (--threads 1
    # on 2 cores: two scorers at once); ONNX Runtime and PyTorch release the GIL while they compute.
    workers = scorer_workers(threads, len(scorers))

    import threading

    # one batch at a time per scorer: a TensorRT context and its buffers serve one call at once
    busy = {s.id: threading.Lock() for s in scorers}

    def run_one(scorer: Scorer, cond_id: str, batch: np.ndarray) -> None:
        with busy[scorer.id]:
            t1 = time.perf_counter()
            preds[scorer.id][cond_id] = scorer.predict(batch)
            infer_s[scorer.id] += time.perf_counter() - t1

    from collections import deque
    from concurrent.futures import Future, ThreadPoolExecutor

    def settle(cond_id: str, futures: list[tuple[Scorer, Future]]) -> None:
        for scorer, future in futures:
            future.result()  # re-raises a scorer's error here
            prog.step(f"{cond_id} · {scorer.id}")

    # One condition ahead: the next condition's images are made while the scorers work on this one,
    # and a worker that finishes early takes the next condition's first task instead of waiting for
    # the slowest scorer (no barrier per condition); two conditions' images at most are held.
    in_flight: deque[tuple[str, list[tuple[Scorer, Future]]]] = deque()
    with ThreadPoolExecutor(max_workers=workers) as pool:
        for cond in runnable:
            t = time.perf_counter()
            images = clean if cond.transform is None else cond.transform.apply(clean, cond.severity, ctx)
            batch = to_channel_order(images, pre)
            transform_s += time.perf_counter() - t
            in_flight.append((cond.id, [(scorer, pool.submit(run_one, scorer, cond.id, batch)) for scorer in scorers]))
            if len(in_flight) > 1:
                settle(*in_flight.popleft())
        while in_flight:
            settle(*in_flight.popleft())
    timing["transforms_s"] = transform_s
    timing["inference_s"] = dict(infer_s)  # per scorer; they overlap when workers > 1
    timing["workers"] = workers
    timing["threads_per_scorer"] = threads

    results: dict[str, dict[str, Any]] = {}
    flags: list[str] = []
    size_names = bins["names"]
    for scorer in scorers:
        ref_preds = preds[agree_with] if scorer.id != agree_with else None
        clean_stats = condition_stats(preds[scorer.id][CLEAN], labels, data.classes, strata, size_names, None,
                                      ref_preds[CLEAN] if ref_preds else None)
        clean_stats["drop_pt"] = 0.0
        out = {CLEAN: clean_stats}
        for cond in runnable[1:]:
            stats = condition_stats(preds[scorer.id][cond.id], labels, data.classes, strata, size_names, clean_stats,
                                    ref_preds[cond.id] if ref_preds else None, clean_stats.get("agreement"))
            if scorer.kind != "reference" and stats.get("agreement_drop_pt", 0.0) > opts.max_drop_pt:
                stats["flag"] = (f"agreement with {agree_with} falls {stats['agreement_drop_pt']:.1f} pt below clean "
                                 f"(> {opts.max_drop_pt:g}): this graph diverges under {cond.id}")
                flags.append(f"{scorer.id}: {stats['flag']}")
            out[cond.id] = stats
        results[scorer.id] = out

    t = time.perf_counter()
    resolution = _resolution_sweep(bundle, data_spec, opts, precisions, resolutions, size, results, reference is not None, prog, log)
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
                   "resolution": bundle.resolution, "precisions": bundle.precisions(),
                   "graphs": {p: bundle.artifact_record(p).get("sha256") for p in precisions}},
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
                        **({"fill": opts.occlusion_fill, "fill_rgb": list(fill_rgb(opts.occlusion_fill, ctx))} if t.family == "occlusion" else {})}
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


def _check_resolutions(bundle: Bundle, resolutions: Sequence[tuple[int, int]] | None, native: tuple[int, int]) -> list[tuple[int, int]]:
    if not resolutions:
        return []
    out: list[tuple[int, int]] = []
    for h, w in resolutions:
        bundle.spec.grid(int(h), int(w))  # one line naming the nearest sizes the patch tiles
        if (h, w) not in out:
            out.append((int(h), int(w)))
    pre = bundle.preprocessing
    if pre.get("in_graph_resize"):
        raise UserError("this bundle resizes every input to its model resolution inside the graph, so its accuracy does not "
                        "depend on the input size; export with --dynamic-resolution to compare resolutions")
    if bundle.resolution.get("mode") != "dynamic" and any(r != native for r in out):
        from ..lazy import available

        if not available("vitdeploy.exporters.variants"):
            raise UserError("the bundle's graph is static; other resolutions are re-exported, which needs vitdeploy's exporters: "
                            "pip install 'vitdeploy[export]' (or export with --dynamic-resolution)")
    return out


def _resolution_sweep(bundle: Bundle, data_spec: str, opts: EvaluateOptions, precisions: list[str],
                      resolutions: list[tuple[int, int]], native: tuple[int, int], results: dict[str, Any],
                      with_reference: bool, prog: Progress, log: Callable[[str], None]) -> dict[str, Any]:
    """Clean accuracy at each size, against the native size's, for every graph and the reference."""
    if not resolutions:
        return {}
    from ..data import open_labelled
    from ..images import to_channel_order

    pre = bundle.preprocessing
    res = bundle.resolution
    interp = res.get("pos_embed_interpolation", {})
    rule = (f"images: the source images brought to each size by the manifest's host-resize rule "
            f"({(pre.get('host_resize') or {}).get('mode', 'stretch')}, {(pre.get('host_resize') or {}).get('interpolation', 'bilinear')}, Pillow); "
            f"position table: {interp.get('description') or interp or 'the bundle convention'}, "
            + ("resampled inside the dynamic graph" if res.get("mode") == "dynamic" else
               "re-exported offline as static variants (cached under variants/HxW)"))
    rows = []
    for h, w in resolutions:
        data = open_labelled(data_spec, (h, w), pre, bundle.labels or None, opts.limit, opts.skip_unreadable)
        batch = to_channel_order(data.images, pre)
        scorers: list[Scorer] = []
        for p in precisions:
            if res.get("mode") == "dynamic" or (h, w) == native:
                path = bundle.artifact_path(p)
            else:
                from vitdeploy.exporters.variants import graph_for

                path = Path(graph_for(bundle, p, h, w, log=log))
            scorers.append(graph_scorer(bundle, p, path, opts.threads, opts.batch))
        if with_reference:
            ref, _note = reference_scorer(bundle, opts.threads, opts.batch, resolution=(h, w))
            if ref is not None:
                scorers.append(ref)
        for scorer in scorers:
            pred = scorer.predict(batch)
            hit = pred == data.labels
            native_acc = results.get(scorer.id, {}).get(CLEAN, {}).get("accuracy")
            from .score import accuracy_entry

            entry = accuracy_entry(int(hit.sum()), len(hit))
            row = {"runner": scorer.id, "precision": scorer.precision, "height": h, "width": w,
                   "graph": scorer.details.get("graph") or scorer.details.get("model"), **entry}
            if native_acc is not None:
                row["drop_pt"] = (native_acc - entry["accuracy"]) * 100.0
                if row["drop_pt"] > opts.max_drop_pt:
                    row["flag"] = f"accuracy {row['drop_pt']:.1f} pt below the native {native[0]}x{native[1]} (> {opts.max_drop_pt:g})"
            rows.append(row)
            scorer.runner.close()
            prog.step(f"{h}x{w} · {scorer.id}")
    return {"native": list(native), "rule": rule, "threshold_pt": opts.max_drop_pt, "rows": rows}


# -- occlusion maps ------------------------------------------------------------------------------
@dataclass
class OcclusionOptions:
    patch: int | None = None  # default: two model patches
    stride: int | None = None  # default: one model patch
    fill: str = "border"  # erase to the background estimate (the image's border median colour)
    precision: str = "fp32"
    limit: int | None = None
    batch: int = 256
    threads: int | None = None
    overlays: int = 32  # images drawn in the PNG
    skip_unreadable: bool = False


def run_occlusion_map(path: str | Path, inputs: Sequence[str], out_dir: str | Path | None = None,
                      options: OcclusionOptions | None = None, progress: Progress | None = None) -> dict[str, Any]:
    """Occlusion sensitivity maps from the deployed graph for image files or one labelled source.

    Writes ``occlusion.npy`` (maps [N, H, W] float32), ``occlusion_targets.npy``, ``occlusion.png``
    (overlays) and ``occlusion.json`` (the rule, what was compared, per-image clean target
    probability and mean sensitivity on foreground vs background where separable)."""
    from ..data import open_labelled
    from ..fileio import atomic_path, atomic_write_json
    from ..images import load_images, to_channel_order
    from .occlusion import occlusion_maps, occlusion_rule, write_overlays
    from .transforms import background_mask

    opts = options or OcclusionOptions()
    prog = progress or Progress()
    bundle = Bundle.open(path)
    if opts.fill not in OCCLUSION_FILLS:
        raise UserError(f"unknown occlusion fill {opts.fill!r}; use {', '.join(OCCLUSION_FILLS)}")
    precision = check_precisions(bundle, [opts.precision])[0]
    size = input_size(bundle)
    pre = bundle.preprocessing
    ph = int(bundle.spec.patch_size[0])
    patch = int(opts.patch or 2 * ph)
    stride = int(opts.stride or ph)
    if not inputs:
        raise UserError("no images for the occlusion map: give image files or one data source (digits:test, DIR, .npz)")
    files: list[str] | None = None
    single = inputs[0] if len(inputs) == 1 else None
    if single is not None and (single.startswith("digits:") or Path(single).is_dir() or Path(single).suffix.lower() == ".npz"):
        data = open_labelled(single, size, pre, bundle.labels or None, opts.limit, opts.skip_unreadable)
        images, targets, source = data.images, data.labels, data.source
        names = [f"#{i} label {bundle.labels[t] if bundle.labels else t}" for i, t in enumerate(targets)]
        files = data.files
    else:
        rgb = load_images(list(inputs), {**pre, "channel_order": "rgb"}, size)
        images, targets, source = rgb, None, "files"
        files = [str(p) for p in inputs]
        names = [Path(p).name[:18] for p in inputs]
    ctx = Context(patch=tuple(bundle.spec.patch_size), mean_rgb=mean_rgb(pre), occlusion_fill=opts.fill)
    scorer = graph_scorer(bundle, precision, bundle.artifact_path(precision), opts.threads, opts.batch)
    prog.begin(len(images))
    result = occlusion_maps(scorer.probs, images, targets, patch, stride, ctx, to_graph=lambda x: to_channel_order(x, pre),
                            on_image=lambda k: [prog.step("occlusion map") for _ in range(k)])
    scorer.runner.close()
    maps = result["maps"]
    mask, separable = background_mask(images)
    per_image = []
    for i in range(len(images)):
        entry: dict[str, Any] = {"index": i, "name": names[i] if files is None else files[i], "target": int(result["targets"][i]),
                                 "clean_prob": float(result["clean_prob"][i]), "mean_sensitivity": float(maps[i].mean())}
        if separable[i] and (~mask[i]).any() and mask[i].any():
            entry["foreground_mean"] = float(maps[i][~mask[i]].mean())
            entry["background_mean"] = float(maps[i][mask[i]].mean())
        per_image.append(entry)
    both = [e for e in per_image if "foreground_mean" in e]
    out = Path(out_dir) if out_dir is not None else bundle.reports_dir() / "occlusion"
    out.mkdir(parents=True, exist_ok=True)
    for name, array in (("occlusion.npy", maps), ("occlusion_signed.npy", result["signed"]), ("occlusion_targets.npy", result["targets"])):
        with atomic_path(out / name, suffix=".npy") as tmp:
            with open(tmp, "wb") as fh:
                np.save(fh, array)
    label = (lambda t: bundle.labels[t] if bundle.labels and t < len(bundle.labels) else str(t))
    titles = [f"{names[i]} -> {label(int(result['targets'][i]))} p={result['clean_prob'][i]:.2f}" for i in range(len(images))]
    shown = min(len(images), opts.overlays)
    write_overlays(images[:shown], maps[:shown], titles[:shown], out / "occlusion.png")
    fill = list(fill_colour_of(opts.fill, ctx, images))
    report = {
        "schema": "vitdeploy-occlusion/1",
        "bundle": str(bundle.root), "graph": bundle.artifact_path(precision).name, "precision": precision,
        "source": source, "count": int(len(images)), "size": list(size),
        "rule": occlusion_rule(patch, stride, opts.fill, fill),
        "patch": patch, "stride": stride, "fill": opts.fill, "fill_rgb": fill,
        "positions_per_image": int(len(result["tops"]) * len(result["lefts"])),
        "compared": "target-class probability of the deployed graph on the clean image vs the occluded image",
        "caveat": "occluders are out-of-distribution inputs; the map is this graph's response to this occluder, not a causal attribution",
        "foreground_rule": "foreground/background by the background rule of the transforms (border median colour +- 16)",
        "foreground_above_background": (sum(e["foreground_mean"] > e["background_mean"] for e in both) / len(both)) if both else None,
        "images_with_separable_background": len(both),
        "files": {"maps": "occlusion.npy", "signed": "occlusion_signed.npy", "targets": "occlusion_targets.npy", "overlay": "occlusion.png"},
        "images": per_image,
    }
    atomic_write_json(out / "occlusion.json", report)
    report["out_dir"] = str(out)
    return report


def fill_colour_of(fill: str, ctx: Context, images: np.ndarray) -> list[int]:
    from .transforms import fill_colour

    if fill == "border":
        return []  # per image: the border median colour (the rule text says so)
    colours = fill_colour(Context(patch=ctx.patch, mean_rgb=ctx.mean_rgb, occlusion_fill=fill), images[:1])
    return [int(v) for v in colours[0]]
