"""The gate an fp16 graph passes before it is written (export --precision fp16, convert, build-engine).

Like INT8's (calibration/evaluate.py), and with `vitdeploy check`'s defaults, so a graph this writes
is one `check` passes:

* numbers, always: seeded images (a variable-size bundle: rows of a padded mixed-size batch vs each
  image alone, exporters/variable_precision.py) through the fp32 and the fp16 graph; every output
  finite, and the 1st-percentile logit cosine >= the gate's (0.99);
* with labelled data (the bundle's own split, or ``--eval-data``/``--data`` when labelled): accuracy
  within the gate's drop of fp32, top-1 agreement and logit cosine as INT8's gate;
* overflow, statically: ONNX Runtime's CPU provider has no fp16 kernel for most ops, computes them
  in fp32 and drops the Cast pairs between them, so a tensor past 65504 that is inf on a GPU stays
  finite here (measured: the massive-residual digits variant scores 99.72% on the CPU with its
  stream in fp16). Every tensor the fp16 graph holds in fp16 is therefore looked up in the fp32
  graph on the same images: one beyond fp16's range fails the gate, with its name and value.

A failure raises CheckFailed with one line; the caller has not moved the graph into the bundle.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import numpy as np

from vitdeploy.bundle import Bundle
from vitdeploy.errors import CheckFailed, MissingDependencyError

from .fp16_range import input_size

# Seeded images asked for; the cost-model budget (vitdeploy/budget.py, as export's verification and
# `check`) decides how many run: all 32 for the digits model, 4 for a ViT-S/14 at 518x518.
GATE_IMAGES = 32
# the seeded record of a fresh conversion (max |d logit|, agreement), kept beside the gate's verdict:
# read from the gate's own seeded runs (the first SANITY_IMAGES of them), not run again
SANITY_IMAGES = 8
SANITY_SEED = 0


def gate_fp16(fp32_path: Path, fp16_path: Path, bundle: Bundle, eval_spec: str | None = None, threads: int | None = None,
              gate: Any = None, measured: dict[str, Any] | None = None, log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Score the fp16 candidate against ``gate`` (a vitdeploy.gate.Gate; default: `check`'s); raise CheckFailed
    (one line) when it fails. Returns the record (with ``sanity`` for a single-size graph). ``measured``: the
    range pass's max |x| of every fp32 tensor and the images it ran on ({"absmax", "images"}), which the
    overflow look-up reuses instead of running again."""
    from vitdeploy.calibration.evaluate import fp32_accuracy_of, graph_outputs, load_eval_data, scores
    from vitdeploy.gate import Gate

    from .fp16_range import image_budget

    gate = gate or Gate()
    record: dict[str, Any] = {"gate": gate.to_dict()}
    failures: list[str] = []
    if bundle.variable_size:
        from .variable_precision import variable_sanity

        sanity = variable_sanity(fp32_path, fp16_path, bundle)
        record["numbers"] = sanity
        if not sanity["finite"] or not sanity["edge_finite"]:
            failures.append("non-finite outputs" + ("" if sanity["finite"] else " on a padded mixed-size batch")
                            + ("" if sanity["edge_finite"] else " on edge valid_hw rows"))
        failures.extend(gate.rows_cosine_failures(sanity["outputs"]))
    else:
        from vitdeploy.preprocess import random_images

        plan = image_budget(bundle, GATE_IMAGES)
        images = random_images(plan.images, *input_size(bundle), seed=SANITY_SEED)
        reused = _range_pass_outputs(measured, len(images))
        ref, ref_s = (reused, []) if reused is not None else seeded_outputs(fp32_path, images, plan.batch, threads)
        got, got_s = seeded_outputs(fp16_path, images, plan.batch, threads)
        cut = f" (cost-model budget: {plan.images} of {GATE_IMAGES})" if plan.images < GATE_IMAGES else ""
        fp32 = "fp32 outputs from the range pass (the same images)" if reused is not None else f"fp32 graph {_per_step(ref_s)}"
        progress = f"fp16 gate: {plan.images} seeded images{cut} in batches of {plan.batch}: {fp32}, fp16 graph {_per_step(got_s)}"
        record["sanity"] = numeric_sanity(ref, got, input_size(bundle))
        if "logits" not in ref:
            record["numbers"] = _numbers_any_output(ref, got, failures, gate.min_cosine)
        else:
            numbers = {"images": plan.images, "seed": SANITY_SEED, **scores(got, None, ref)}
            numbers["finite"] = bool(all(np.isfinite(v).all() for v in got.values()))
            record["numbers"] = numbers
            if not numbers["finite"]:
                failures.append(f"non-finite outputs on {plan.images} seeded images")
            elif not numbers["cosine_p1"] >= gate.min_cosine:
                failures.append(f"logit cosine on seeded images (1st percentile) {numbers['cosine_p1']:.4f} < {gate.min_cosine:g}")
        record["numbers"].update({"budget": {"requested": GATE_IMAGES, "images": plan.images, "batch": plan.batch},
                                  "step_seconds": {"fp32": ref_s, "fp16": got_s}})
    labelled = None
    embedding_model = not _has_logits(fp32_path)  # its real-image gate is the embedding's cosine (no classes)
    if not failures:
        try:
            labelled = load_eval_data(bundle, eval_spec)
        except (ImportError, MissingDependencyError):
            if eval_spec is not None:
                raise
            labelled = None  # the default split needs scikit-learn (absent on a device): numbers only
    if labelled is not None and (labelled.labels is not None or embedding_model):
        alone = labelled.valid_hw is not None
        ref = graph_outputs(fp32_path, labelled.images, "all", threads, valid_hw=labelled.valid_hw, alone=alone)
        got = graph_outputs(fp16_path, labelled.images, "all", threads, valid_hw=labelled.valid_hw)
        fp32_acc = fp32_accuracy_of(ref, labelled.labels)
        task = scores(got, labelled.labels, ref)
        task["finite"] = bool(all(np.isfinite(v).all() for v in got.values()))
        passed, task_failures = gate.verdict(fp32_acc, task)
        if not task["finite"]:
            task_failures.insert(0, f"non-finite outputs on {labelled.name}")
        record["task"] = {**labelled.record, "fp32_accuracy": fp32_acc, **task}
        failures.extend(f"{f} on {labelled.name}" for f in task_failures)
    elif labelled is None:
        record["task"] = None  # no labelled data: numbers only (check --data gates accuracy later)
    if not failures:
        overflow = device_overflow(fp32_path, fp16_path, bundle, labelled, threads, measured)
        record["overflow"] = overflow
        if overflow["tensors"]:
            worst = overflow["tensors"][0]
            failures.append(f"{len(overflow['tensors'])} tensors held in fp16 exceed 65504 on {overflow['images']} images "
                            f"(largest {worst['tensor']}: {worst['max_abs']:.3g}) and would be inf on a GPU (ONNX Runtime's CPU "
                            "kernels compute them in fp32 and hide it)")
    record["passed"] = not failures
    record["failures"] = failures
    if not failures and log is not None and not bundle.variable_size:
        log(progress)  # a failure is one line: the error below
    if failures:
        raise CheckFailed(f"the fp16 graph fails the gate: {'; '.join(failures)}; nothing was written - keep more in fp32 "
                          "(--keep-fp32 OPS/MODULES, a lower --data-max) or find what must stay fp32 with "
                          "`vitdeploy debug-precision BUNDLE --precision fp16`")
    return record


OVERFLOW_IMAGES = 64


def device_overflow(fp32_path: Path, fp16_path: Path, bundle: Bundle, labelled: Any = None, threads: int | None = None,
                    measured: dict[str, Any] | None = None) -> dict[str, Any]:
    """The fp16-typed tensors of the candidate whose fp32 values (same tensor name in the fp32 graph)
    exceed fp16's range on seeded images and up to OVERFLOW_IMAGES labelled ones (both as many as the
    cost-model budget allows). Seeded noise the range pass ran already (``measured``) is not run again."""
    from vitdeploy.lazy import require

    from .fp16_range import NOISE_SEED, image_budget, range_feeds, tensor_absmax

    onnx = require("onnx", "the fp16 gate")
    fp32_model = onnx.load(str(fp32_path))
    produced = {o for n in fp32_model.graph.node for o in n.output}
    held = sorted(t for t in fp16_tensors(onnx.load(str(fp16_path))) if t in produced)
    known = dict((measured or {}).get("absmax") or {})
    seen = (measured or {}).get("images") or {}
    feeds: list[dict[str, np.ndarray]] = []
    count = 0
    if str(seen.get("source", "")).startswith("seeded uint8 noise") and seen.get("seed") == NOISE_SEED and all(t in known for t in held):
        count += int(seen["count"])  # the range pass ran these very images through this fp32 graph
    else:
        known = {}
        feeds, described = range_feeds(bundle, "__noise__", GATE_IMAGES)
        count += described["count"]
    if labelled is not None and len(labelled.images):
        plan = image_budget(bundle, OVERFLOW_IMAGES)
        take = labelled.images[: plan.images]
        for start in range(0, len(take), plan.batch):
            feed = {"images": take[start : start + plan.batch]}
            if labelled.valid_hw is not None:
                from vitdeploy.variable import VALID_INPUT

                feed[VALID_INPUT] = labelled.valid_hw[start : start + plan.batch]
            feeds.append(feed)
        count += len(take)
    absmax = {t: known.get(t, 0.0) for t in held}
    if held and feeds:
        for t, value in tensor_absmax(fp32_model, feeds, held, threads).items():
            absmax[t] = max(absmax[t], value)
    return {"images": count, "noise_seed": NOISE_SEED, "fp16_tensors": len(held), "tensors": overflowing(held, absmax)}


def fp16_tensors(model: Any) -> list[str]:
    """Names of the tensors a graph holds in fp16."""
    from vitdeploy.lazy import require

    from .onnx_types import tensor_elem_types

    fp16 = require("onnx").TensorProto.FLOAT16
    return [t for t, kind in tensor_elem_types(model).items() if kind == fp16]


def overflowing(tensors: Any, absmax: dict[str, float]) -> list[dict[str, Any]]:
    """The ``tensors`` whose measured fp32 max |x| is beyond fp16's range, largest first."""
    from .fp16_range import FP16_MAX

    over = [{"tensor": t, "max_abs": absmax[t]} for t in tensors if absmax.get(t, 0.0) > FP16_MAX]
    return sorted(over, key=lambda e: -e["max_abs"])


def seeded_outputs(path: Path, images: np.ndarray, batch: int, threads: int | None = None) -> tuple[dict[str, np.ndarray], list[float]]:
    """Every output of a graph on ``images`` (ONNX Runtime CPU, full optimisation as `check` runs it), in
    batches of ``batch``, each run stoppable by a signal (:mod:`.ort_interrupt`); and the seconds per batch."""
    import time

    from vitdeploy.runtime.ort import OrtRunner

    from . import ort_interrupt

    runner = OrtRunner(path, threads=threads, providers=["CPUExecutionProvider"])
    try:
        session = runner.session
        image_input = session.get_inputs()[0].name
        names = [o.name for o in session.get_outputs()]
        parts: dict[str, list[np.ndarray]] = {n: [] for n in names}
        steps: list[float] = []
        for start in range(0, len(images), batch):
            started = time.perf_counter()
            values = ort_interrupt.run(session, names, {image_input: images[start : start + batch]})
            steps.append(round(time.perf_counter() - started, 3))
            for name, value in zip(names, values):
                parts[name].append(np.asarray(value))
        return {n: np.concatenate(v) for n, v in parts.items()}, steps
    except KeyboardInterrupt as exc:  # free the session now (ort_interrupt.release)
        session = None
        runner.close()
        raise ort_interrupt.release(exc) from None
    finally:
        runner.close()


def _range_pass_outputs(measured: dict[str, Any] | None, count: int) -> dict[str, np.ndarray] | None:
    """The fp32 graph's outputs from the range pass when it ran the gate's very images (seeded noise, the
    same seed and count), so the gate need not run the fp32 graph again; else None."""
    from .fp16_range import NOISE_SEED

    seen = (measured or {}).get("images") or {}
    outputs = (measured or {}).get("outputs") or {}
    same = (str(seen.get("source", "")).startswith("seeded uint8 noise") and seen.get("seed") == NOISE_SEED == SANITY_SEED
            and seen.get("count") == count)
    return dict(outputs) if same and outputs and all(len(v) == count for v in outputs.values()) else None


def _per_step(steps: list[float]) -> str:
    if not steps:
        return "no batch"
    mean = sum(steps) / len(steps)
    return f"{mean:.1f} s per batch" if mean >= 1 else f"{mean:.2f} s per batch"


def _has_logits(path: Path) -> bool:
    from vitdeploy.lazy import require

    onnx = require("onnx")
    return "logits" in {o.name for o in onnx.load(str(path), load_external_data=False).graph.output}


def _numbers_any_output(ref: dict[str, np.ndarray], got: dict[str, np.ndarray], failures: list[str], min_cosine: float) -> dict[str, Any]:
    """A backbone graph (embedding / patch_grid, no logits): every output finite and close in cosine."""
    from vitdeploy.compare import cosine_percentile, cosine_rows

    count = len(next(iter(ref.values())))
    out: dict[str, Any] = {"images": count, "seed": SANITY_SEED, "outputs": {}}
    for name, value in ref.items():
        flat_ref, flat_got = value.reshape(len(value), -1), got[name].reshape(len(value), -1)
        finite = bool(np.isfinite(flat_got).all())
        cos = cosine_percentile(cosine_rows(flat_ref, flat_got)) if finite else float("nan")
        out["outputs"][name] = {"finite": finite, "cosine_p1": cos}
        if not finite:
            failures.append(f"non-finite {name} on {count} seeded images")
        elif not cos >= min_cosine:
            failures.append(f"{name} cosine on seeded images (1st percentile) {cos:.4f} < {min_cosine:g}")
    return out


def numeric_sanity(ref_all: dict[str, np.ndarray], got_all: dict[str, np.ndarray], size: tuple[int, int]) -> dict[str, Any]:
    """Max |d logit| and top-1 agreement of the fp16 graph on (up to SANITY_IMAGES of) the gate's seeded images.

    A quick record of what the conversion did to the numbers; task accuracy is `check`'s job.
    """
    name = "logits" if "logits" in ref_all else "embedding" if "embedding" in ref_all else next(iter(ref_all))  # a backbone graph
    ref, got = ref_all[name][:SANITY_IMAGES], got_all[name][:SANITY_IMAGES]
    return {
        "images": int(len(ref)),
        "seed": SANITY_SEED,
        "size": [int(size[0]), int(size[1])],
        "output": name,
        "max_abs_logit_diff": float(np.abs(ref.astype(np.float64) - got).max()),
        "top1_agreement": float((ref.reshape(len(ref), -1).argmax(1) == got.reshape(len(got), -1).argmax(1)).mean()),
    }
