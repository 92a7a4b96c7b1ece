"""Export verification: ONNX Runtime against PyTorch on seeded uint8 images, sized by cost.

Every size the graph declares is checked (one size for a static graph; native, four patches smaller
and larger, and a non-square size for a dynamic one; see ``vitdeploy.evalsets``), on every output
both runners return, each against its own limit.

How many images, and in what batches
------------------------------------
A fixed 64 images per size costs 64 x 4 forward passes on each runtime, which for a DINOv2 at 518-574
pixels on a laptop CPU is minutes and gigabytes. So the plan comes from the cost model
(``vitdeploy.costs``), not from a constant:

* images per size: the requested count (``--check-images``, default 64), the same at every size,
  cut so that the whole verification stays within a compute budget of ``budget_gmacs``
  multiply-adds per runtime (200 GMAC: a few seconds of ORT and PyTorch on a quiet 2-core VM; the
  gates below need two images per size, every image beyond that buys little), but never below
  ``MIN_IMAGES`` (2). The plan depends only on the model and the sizes, never on the machine's speed
  or load, so the record is reproducible: the digits bundle keeps all 64 images, ViT-Tiny dynamic
  33, ViT-S/16 9, ViT-B/16 and DINOv2-S 2 per size.
* batch: as many images as the memory budget holds by the cost model's estimate of one forward pass
  (``vitdeploy.costs.memory_estimate``: attention scores, MLP, residual stream, input), at most 16.
* PyTorch runs first, every size in these bounded batches (:func:`reference_outputs`; the export
  then frees the PyTorch model before it simplifies and writes the graph), then ONNX Runtime, from
  the graph's file (external data is mapped from its data file), size by size with its CPU memory
  arena off, so what a size allocated goes back before the next; the two never hold their weights
  at the same time (issue 32: export memory that grows with the weights).

What the gates need
-------------------
* max |d| per output (fp32 parity, limit 1e-4; 1e-3 through an in-graph uint8 resize): an export
  fault (wrong op, table interpolation, preprocessing) moves every image, so one image per size
  shows it; random uint8 images cover the whole pixel range in one image.
* the batch axis: a fault that mixes samples (a wrong reshape of the batch dimension) needs at least
  two images in one call: hence ``MIN_IMAGES`` = 2, run as one batch.
* top-1 agreement on ``logits`` (must be 100%): catches an argmax flip; on random weights and random
  images it is nearly free of meaning (every image gets the same class), which is why the minimum is
  not raised for it. Accuracy on real labelled data is `vitdeploy check`'s job, not export's.
"""

from __future__ import annotations

import ctypes
import gc
import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from vitdeploy.bundle import Bundle
# the plan is shared with `vitdeploy check` (the same cost-model budget): it lives in the core
from vitdeploy.budget import (DEFAULT_BUDGET_GMACS, DEFAULT_MEMORY_BUDGET_MB, MAX_BATCH, MIN_IMAGES, SizePlan,  # noqa: F401
                              plan_verification)
from vitdeploy.preprocess import random_images

from .process_memory import worth_releasing
from .sources import LoadedModel

FP32_LIMIT = 1e-4
RESIZE_LIMIT = 1e-3  # in-graph uint8 resize: ORT's and torch's bilinear differ in rounding
CLASS_OUTPUTS = ("logits",)  # outputs whose top-1 class must agree


def output_limit(name: str, resize: bool) -> float:
    """max |d| allowed per output. Every fp32 output (logits, probs, embedding, patch grid, ...)
    equals PyTorch to 1e-4; an in-graph uint8 resize rounds differently, 1e-3."""
    return RESIZE_LIMIT if resize else FP32_LIMIT


def verification_sizes_for(bundle: Bundle) -> list[tuple[int, int]]:
    """The input sizes `check` also uses (vitdeploy.evalsets.random_sets): camera frames of
    another size for an in-graph resize, else the graph's declared sizes."""
    from vitdeploy.evalsets import verification_sizes

    pre = bundle.preprocessing
    if pre.get("in_graph_resize"):
        to = pre["in_graph_resize"]["to"]
        return [(to[0] * 3 // 2, to[1] * 5 // 4)]
    return verification_sizes(bundle)


@dataclass
class References:
    """PyTorch's outputs at every planned size, computed before the graph is loaded: the export then
    frees the PyTorch model, so verification holds one ONNX Runtime session and these arrays only."""

    plans: list[SizePlan]
    names: list[str]  # outputs PyTorch returns, in its order
    outputs: list[dict[str, np.ndarray]]  # per size: output name -> the images' outputs, in order
    torch_s: list[float]
    load_s: float
    resize: bool
    budget_gmacs: float
    memory_budget_mb: float
    requested: int


def reference_outputs(bundle: Bundle, variant: LoadedModel, count: int, log: Callable[[str], None],
                      budget_gmacs: float = DEFAULT_BUDGET_GMACS, memory_budget_mb: float = DEFAULT_MEMORY_BUDGET_MB) -> References:
    """PyTorch on the seeded images of the verification plan (``bundle`` needs only its manifest)."""
    from .torch_runner import TorchRunner

    pre = bundle.preprocessing
    resize = tuple(pre["in_graph_resize"]["to"]) if pre.get("in_graph_resize") else None
    plans = plan_verification(bundle.spec, verification_sizes_for(bundle), count, budget_gmacs, memory_budget_mb, resize)
    log("verification plan (cost model; budget {:g} GMAC per runtime, {:g} MiB per batch): {}".format(
        budget_gmacs, memory_budget_mb, ", ".join(f"{p.height}x{p.width} {p.images} img in batches of {p.batch}" for p in plans)))
    t0 = time.perf_counter()
    torch_runner = TorchRunner(variant, pre, resize_to=resize)
    load_s = time.perf_counter() - t0
    names = list(torch_runner.outputs())
    outputs, seconds = [], []
    for index, plan in enumerate(plans):
        images = _images(index, plan, pre)
        parts: dict[str, list[np.ndarray]] = {n: [] for n in names}
        t = time.perf_counter()
        for start in range(0, plan.images, plan.batch):
            out = torch_runner.infer(images[start:start + plan.batch])
            for n in names:
                parts[n].append(np.asarray(out[n]))
            del out
        seconds.append(time.perf_counter() - t)
        outputs.append({n: _join(parts.pop(n)) for n in names})
        del images
    del torch_runner
    release()
    return References(plans, names, outputs, seconds, load_s, resize is not None, budget_gmacs, memory_budget_mb, count)


def verify_export(bundle: Bundle, variant: LoadedModel | References, count: int, log: Callable[[str], None],
                  budget_gmacs: float = DEFAULT_BUDGET_GMACS, memory_budget_mb: float = DEFAULT_MEMORY_BUDGET_MB) -> dict[str, Any]:
    """ORT vs PyTorch on seeded uint8 images at every size the graph declares, on every output.

    ``variant``: the PyTorch model (its outputs are computed first, then it is no longer used), or
    the :class:`References` an export computed before it freed the model.
    """
    from vitdeploy.runtime.ort import OrtRunner

    started = time.perf_counter()
    refs = variant if isinstance(variant, References) else reference_outputs(bundle, variant, count, log, budget_gmacs, memory_budget_mb)
    pre = bundle.preprocessing
    t0 = time.perf_counter()
    # No CPU memory arena: the arena keeps the high-water mark of the largest size for the session's
    # life; without it each batch's activations go back to the allocator before the next size. The
    # session is made from the file, so a graph with external data maps its weights from there.
    ort_runner = OrtRunner(bundle.artifact_path("fp32"), memory_arena=False, spin=False)
    load_s = refs.load_s + time.perf_counter() - t0
    names, missing = _output_names(refs.names, ort_runner)

    results, failures = [], []
    if missing:
        failures.extend(missing)
    for index, plan in enumerate(refs.plans):
        row = _verify_size(index, plan, pre, refs, ort_runner, names)
        results.append(row)
        worst = ", ".join(f"{n} {o['max_abs']:.1e}" for n, o in row["outputs"].items())
        log(f"check {plan.height}x{plan.width}: {plan.images} images (batch {plan.batch}), PyTorch {row['torch_s']:.1f} s, "
            f"ORT {row['ort_s']:.1f} s; max |d| {worst} -> {'ok' if row['passed'] else 'FAIL'}")
        failures.extend(f"{plan.height}x{plan.width}: {f}" for f in row.pop("_failures"))
        release()
    ort_runner.close()
    del ort_runner
    release()
    seconds = time.perf_counter() - started + (sum(refs.torch_s) if isinstance(variant, References) else 0.0)
    log(f"verification: {sum(p.images for p in refs.plans)} images over {len(refs.plans)} size(s) in {seconds:.1f} s "
        f"(runners loaded in {load_s:.1f} s)")
    return {
        "passed": not failures,
        "failures": failures,
        "outputs": names,
        "sizes": results,
        "plan": {"requested_images": refs.requested, "min_images": MIN_IMAGES, "budget_gmacs_per_runtime": refs.budget_gmacs,
                 "memory_budget_mb": refs.memory_budget_mb, "sizes": [p.to_dict() for p in refs.plans]},
        "seconds": round(seconds, 2),
        "load_s": round(load_s, 2),
        "graph_sha256": bundle.artifact_sha256("fp32"),
    }


def _images(index: int, plan: SizePlan, pre: dict[str, Any]) -> np.ndarray:
    """The same seeded images as before sizing existed: seed 0 + size index, the first ``images``."""
    if pre.get("input") == "float-nchw":
        return np.random.default_rng(index).standard_normal((plan.images, 3, plan.height, plan.width)).astype(np.float32)
    return random_images(plan.images, plan.height, plan.width, seed=index)


def _join(parts: list[np.ndarray]) -> np.ndarray:
    batched = all(p.ndim >= 1 for p in parts)
    return np.concatenate(parts) if batched else np.stack(parts)


def _output_names(reference: list[str], ort_runner: Any) -> tuple[list[str], list[str]]:
    """Outputs both runners return; one only the graph (or only PyTorch) has cannot be verified."""
    ref, got = list(reference), list(ort_runner.outputs())
    names = [n for n in got if n in ref]
    missing = [f"graph output {n!r} has no PyTorch reference to compare with" for n in got if n not in ref]
    missing += [f"PyTorch output {n!r} is missing from the graph" for n in ref if n not in got]
    return names, missing


def _verify_size(index: int, plan: SizePlan, pre: dict[str, Any], refs: References, ort_runner: Any, names: list[str]) -> dict[str, Any]:
    images = _images(index, plan, pre)
    got: dict[str, list[np.ndarray]] = {n: [] for n in names}
    ort_s = 0.0
    for start in range(0, plan.images, plan.batch):
        chunk = images[start:start + plan.batch]
        t = time.perf_counter()
        out = ort_runner.infer(chunk)
        ort_s += time.perf_counter() - t
        for n in names:
            got[n].append(np.asarray(out[n]))
        del out
    del images
    outputs, failures = {}, []
    for n in names:
        entry = _compare(n, refs.outputs[index][n], _join(got.pop(n)), output_limit(n, refs.resize))
        outputs[n] = entry
        if not entry["passed"]:
            failures.append(entry["failure"])
    primary = outputs.get("logits") or (next(iter(outputs.values())) if outputs else {})
    row = {"height": plan.height, "width": plan.width, "images": plan.images, "batch": plan.batch, "seed": index,
           "torch_s": round(refs.torch_s[index], 3), "ort_s": round(ort_s, 3),
           # the primary output's numbers at the top level, as before outputs were listed
           "limit_max_abs": primary.get("limit_max_abs"),
           **{k: v for k, v in primary.items() if k not in ("passed", "failure", "limit_max_abs", "name")},
           "outputs": outputs, "passed": not failures, "_failures": failures}
    return row


def _compare(name: str, ref: np.ndarray, got: np.ndarray, limit: float) -> dict[str, Any]:
    from vitdeploy.compare import FP32_SPREAD_LIMIT, compare_outputs

    if ref.shape != got.shape:
        return {"name": name, "passed": False, "limit_max_abs": limit,
                "failure": f"output {name}: shape {list(got.shape)} from ONNX Runtime, {list(ref.shape)} from PyTorch"}
    if not np.issubdtype(ref.dtype, np.floating):
        equal = bool(np.array_equal(ref, got))
        return {"name": name, "exact": True, "max_abs": float(np.abs(ref.astype(np.int64) - got.astype(np.int64)).max()) if ref.size else 0.0,
                "limit_max_abs": 0.0, "passed": equal, "failure": None if equal else f"output {name}: integer values differ"}
    flat = (ref.reshape(len(ref), -1), got.reshape(len(got), -1)) if ref.ndim > 2 else (ref, got)
    stats = compare_outputs(name, flat[0], flat[1]).to_dict()
    if name not in CLASS_OUTPUTS:  # a class ranking means nothing for probabilities' twin or features
        stats.pop("top1_agreement", None)
        stats.pop("top5_agreement", None)
    # judged against the spread of PyTorch's outputs across the images too (vitdeploy.compare): on random
    # weights an absolute 1e-4 passes a graph that lost whole sub-layers
    over_spread = stats.get("max_abs_over_spread")
    ok = (stats["max_abs"] <= limit and (over_spread is None or over_spread <= FP32_SPREAD_LIMIT)
          and stats.get("top1_agreement", 1.0) == 1.0)
    failure = None
    if not ok:
        failure = f"output {name}: max |d| {stats['max_abs']:.2e} (limit {limit:g})"
        if over_spread is not None:
            failure += f", {over_spread:.2%} of PyTorch's spread across images (limit {FP32_SPREAD_LIMIT:.0%})"
        if "top1_agreement" in stats:
            failure += f", top-1 agreement {stats['top1_agreement']:.1%}"
    return {**stats, "limit_max_abs": limit, "limit_over_spread": FP32_SPREAD_LIMIT, "passed": ok, "failure": failure}


def release() -> None:
    """Give freed memory back to the OS between sizes (glibc keeps freed heap pages otherwise). Only
    for a process that holds much: a full collection walks every object (about 0.4 s with torch, timm
    and onnx loaded), which is what a ViT-L/H export needs and a small export pays for nothing."""
    if not worth_releasing():
        return
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to trim
        pass
