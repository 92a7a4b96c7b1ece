"""`vitdeploy check` for variable-size bundles (images in a canvas + valid_hw), every precision.

The reference is PyTorch running each image ALONE at its own size (the position table resampled
offline to that grid with the bundle's declared rule). Every graph the bundle holds (fp32, fp16,
int8; int8 in both executions, gated on the one its target runs, as for single-size graphs) runs
each set as padded batches of mixed sizes with seeded noise in the padding, so each row is scored
against its image alone - the invariance - at the graph's own precision:

- numbers: seeded random images of mixed whole-patch sizes (canvas, one patch, portrait, landscape,
  the native size, random);
- task: the labelled set with every image rescaled to a seeded random size and aspect ratio
  (0.5-1.5x the native side, aspect 1:3 to 3:1) and fitted by the bundle's host policy;
- edge rows: valid_hw of one patch, the full canvas, and values the graph clamps (0, negative,
  beyond the canvas, int32 extremes): no output may be NaN or inf.

Gates, per output (logits and probs):

- fp32: max |d| <= --fp32-max-abs and 100% top-1 agreement on both sets, accuracy no lower than
  PyTorch alone;
- fp16 / int8, check's reduced-precision gates: the 1st-percentile row cosine >= --cosine-min per
  output, top-1 agreement >= --top1-min and accuracy drop <= --max-accuracy-drop on the labelled
  set; random images are gated only when there is no labelled set (as for single-size graphs), and
  the precision policy is read back from the graph (fp16: the valid_hw mask path in fp32; int8: no
  Q/DQ on it; exporters/mask_path.py).

The report is written to reports/check.json like every check report, with ``kind`` saying which.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Dict, List, Sequence, Tuple

import numpy as np

from .. import __version__
from ..bundle import Bundle
from ..compare import Gate, accuracy, compare_outputs, parity_gates
from ..errors import UserError
from ..fileio import atomic_write_json, sha256_cached
from ..variable import RESCALE_RULE, mixed_size_images, size_summary  # noqa: F401 - the sets check scores

KIND = "variable-size"
OUTPUTS = ("logits", "probs")
def check_variable(bundle: Bundle, opts: Any, log: Callable[[str], None]) -> Dict[str, Any]:
    from ..data import open_labelled
    from ..images import to_channel_order
    from ..variable import edge_valid_hw, mixed_sizes, padded_batch
    from ..data import default_data

    try:
        from vitdeploy.exporters.api import loaded_for_bundle
        from vitdeploy.exporters.regrid import regrid_static
        from vitdeploy.exporters.torch_runner import TorchRunner
        from vitdeploy.posembed import PosEmbedInterpolation
    except ImportError as exc:
        raise UserError(f"check compares with PyTorch, which is not importable ({exc}); pip install 'vitdeploy[export]'") from None
    precisions = list(opts.precisions or bundle.precisions())
    for precision in precisions:
        bundle.artifact_path(precision)  # one clear line for a graph the bundle lacks
    contract = bundle.variable_size
    canvas, patch = tuple(contract["canvas"]), tuple(contract["round_to"])
    native = tuple(bundle.spec.image_size)
    loaded = loaded_for_bundle(bundle, resolution=native)
    rule = PosEmbedInterpolation.from_dict({k: v for k, v in bundle.resolution["pos_embed_interpolation"].items() if k != "description"})
    log(f"reference: PyTorch on {bundle.manifest['source']['kind']}:{bundle.manifest['source']['name']}, each image alone at its own size")
    runners: Dict[Tuple[int, int], Any] = {}

    def alone(images: Sequence[np.ndarray]) -> Dict[str, np.ndarray]:
        rows = []
        for img in images:
            size = (int(img.shape[0]), int(img.shape[1]))
            if size not in runners:
                runners[size] = TorchRunner(regrid_static(loaded, size[0], size[1], rule), bundle.preprocessing, threads=opts.threads)
            rows.append(runners[size].infer(img[None]))
        return {name: np.concatenate([r[name] for r in rows]) for name in OUTPUTS}

    sets: List[Dict[str, Any]] = []
    sizes = mixed_sizes(canvas, patch, native, max(6, min(opts.random_count, 16)), seed=opts.seed)
    rng = np.random.default_rng(opts.seed)
    crops = [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in sizes]
    batch, valid = padded_batch(crops, canvas, seed=opts.seed + 1)
    sets.append({"name": "numbers", "what": f"{len(sizes)} random images of mixed sizes", "images": batch, "valid": valid,
                 "labels": None, "ref": alone(crops), "sizes": [list(s) for s in sizes]})
    data = opts.data or default_data(bundle)
    labelled_info: Dict[str, Any] = {}
    if data:
        labelled = open_labelled(data, native, bundle.preprocessing, classes=bundle.labels, limit=opts.limit)
        policy = contract.get("host_policy", "fit-within")
        fitted = [to_channel_order(img, bundle.preprocessing) for img in mixed_size_images(labelled.images, bundle.preprocessing, opts.seed, policy)]
        batch, valid = padded_batch(fitted, canvas, seed=opts.seed + 2)
        ref = alone(fitted)
        labels = np.asarray(labelled.labels)
        labelled_info = {"data": labelled.record(), "policy": policy, "rescale": RESCALE_RULE, **size_summary(fitted),
                         "reference_accuracy": accuracy(ref["logits"], labels)}
        sets.append({"name": "task", "what": f"{len(fitted)} images of {data}", "images": batch, "valid": valid, "labels": labels, "ref": ref})
        log(f"task set: {len(fitted)} images of {data} at {labelled_info['distinct_sizes']} sizes "
            f"({labelled_info['smallest'][0]}x{labelled_info['smallest'][1]} to {labelled_info['largest'][0]}x{labelled_info['largest'][1]}, "
            f"policy {policy}); PyTorch alone {labelled_info['reference_accuracy']:.2%}")
    edge = edge_valid_hw(canvas, patch)
    edge_images = np.random.default_rng(opts.seed + 3).integers(0, 256, (len(edge), canvas[0], canvas[1], 3), dtype=np.uint8)

    artifacts, failures = [], []
    for precision in precisions:
        placement = _placement(bundle, precision) if precision != "fp32" else None
        for execution, level, gated in _executions(bundle, precision):
            entry = _score(bundle, precision, execution, level, gated, sets, (edge_images, edge), opts)
            if placement is not None:
                entry["placement"] = placement
                for violation in placement.get("violations") or ():
                    entry["failed_gates"].append(f"precision policy: {violation}")
                entry["passed"] = not entry["failed_gates"]
            artifacts.append(entry)
            log(f"{precision} / {execution}: {_summary(entry)} -> {'pass' if entry['passed'] else ('FAIL' if gated else 'reported')}")
            if gated and not entry["passed"]:
                failures.extend(f"{precision} ({execution}): {g}" for g in entry["failed_gates"])

    first = next((a for a in artifacts if a["precision"] == "fp32"), artifacts[0] if artifacts else None)
    numbers = {"sizes": sets[0]["sizes"], "canvas": list(canvas), "limit_max_abs": opts.fp32_max_abs,
               "reference": "PyTorch, each image alone at its own size"}
    if first is not None:
        numbers.update({"precision": first["precision"], **first["numbers"]["logits"], "passed": first["numbers"]["passed"]})
    task: Dict[str, Any] = dict(labelled_info)
    if labelled_info and first is not None:
        got = first["task"]
        task.update({"precision": first["precision"], "accuracy": got["accuracy"], "accuracy_drop": got["accuracy_drop"],
                     **{k: got["logits"][k] for k in ("max_abs", "top1_agreement", "cosine_min", "cosine_p1")}})
    report = {
        "kind": KIND,
        "bundle": str(bundle.root),
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "vitdeploy": __version__,
        "canvas": list(canvas),
        "rule": contract["rule"],
        "numbers": numbers,
        "task": task,
        "edge_valid_hw": edge.tolist(),
        "artifacts": artifacts,
        "failures": failures,
        "passed": not failures,
    }
    if opts.write_report and bundle.bare_onnx is None:
        atomic_write_json(bundle.root / "reports" / "check.json", report)
        bundle.set_record("check", {"passed": report["passed"], "created": report["created"], "report": "reports/check.json",
                                    "graphs": {a["precision"]: a["sha256"] for a in artifacts if a.get("sha256")}})
    return report


def _executions(bundle: Bundle, precision: str) -> List[Tuple[str, str, bool]]:
    from .run import _executions as executions

    return executions(bundle, precision)


def _placement(bundle: Bundle, precision: str) -> Dict[str, Any]:
    from .run import _placement as placement

    return placement(bundle, precision)


def _score(bundle: Bundle, precision: str, execution: str, level: str, gated: bool, sets: List[Dict[str, Any]],
           edge: Tuple[np.ndarray, np.ndarray], opts: Any) -> Dict[str, Any]:
    """One graph in one execution on every set: per-output statistics, gates, finiteness."""
    from ..runtime.ort import OrtRunner
    from ..variable import run_padded_graph

    path = bundle.artifact_path(precision)
    runner = OrtRunner(path, precision=precision, optimization=level, threads=opts.threads)
    names = [i.name for i in runner.session.get_inputs()]
    if names != ["images", "valid_hw"]:
        raise UserError(f"{path} takes {names}; a variable-size graph takes (images, valid_hw): re-export the bundle")
    gates: List[Gate] = []
    entry: Dict[str, Any] = {"precision": precision, "backend": "onnxruntime", "execution": execution, "gated": gated,
                             "file": path.name, "sha256": sha256_cached(path), "optimization": level,
                             "providers": runner.info.details.get("providers")}
    has_task = any(s["labels"] is not None for s in sets)
    nonfinite = 0
    for s in sets:
        got = run_padded_graph(runner.session, s["images"], s["valid"], OUTPUTS, batch=opts.batch)
        nonfinite += sum(int((~np.isfinite(got[n])).sum()) for n in OUTPUTS)
        row: Dict[str, Any] = {"what": s["what"]}
        set_gates: List[Gate] = []
        for name in OUTPUTS:
            stats = compare_outputs(name, s["ref"][name], got[name])
            row[name] = {k: v for k, v in stats.to_dict().items() if k != "name"}
            if precision == "fp32":
                set_gates.extend(parity_gates(name, stats, opts.fp32_max_abs, f" on {s['name']} (rows vs alone)"))
            elif s["labels"] is not None or not has_task:
                set_gates.append(Gate(f"{name} cosine (1st percentile of rows) on {s['name']}", stats.cosine_p1, opts.cosine_min, ">="))
        top1 = row["logits"]["top1_agreement"]
        if precision == "fp32":
            set_gates.append(Gate(f"top-1 agreement on {s['name']} (rows vs alone)", top1, 1.0, ">="))
        elif s["labels"] is not None:
            set_gates.append(Gate(f"top-1 agreement on {s['name']} (rows vs alone)", top1, opts.top1_min, ">="))
        if s["labels"] is not None:
            row["accuracy"] = accuracy(got["logits"], s["labels"])
            row["accuracy_drop"] = accuracy(s["ref"]["logits"], s["labels"]) - row["accuracy"]
            limit = 0.0 if precision == "fp32" else opts.accuracy_drop_max
            set_gates.append(Gate(f"accuracy drop on {s['name']}", row["accuracy_drop"], limit, "<="))
        row["passed"] = all(g.passed for g in set_gates)
        gates.extend(set_gates)
        entry[s["name"]] = row
    edge_images, edge_valid = edge
    edge_out = run_padded_graph(runner.session, edge_images, edge_valid, OUTPUTS)
    edge_bad = sum(int((~np.isfinite(edge_out[n])).sum()) for n in OUTPUTS)
    entry["edge"] = {"rows": int(len(edge_valid)), "nonfinite": edge_bad}
    gates.append(Gate("non-finite output values (mixed batches and edge valid_hw rows)", nonfinite + edge_bad, 0, "<="))
    runner.close()
    entry["gates"] = [g.to_dict() for g in gates]
    entry["failed_gates"] = [g.describe() for g in gates if not g.passed]
    entry["passed"] = not entry["failed_gates"]
    return entry


def _summary(entry: Dict[str, Any]) -> str:
    numbers = entry["numbers"]
    text = (f"random rows vs alone: max |dlogit| {numbers['logits']['max_abs']:.1e}, "
            f"cosine p1 logits {numbers['logits']['cosine_p1']:.5f} / probs {numbers['probs']['cosine_p1']:.5f}")
    task = entry.get("task")
    if task:
        text += (f"; task: accuracy {task['accuracy']:.2%}, agreement {task['logits']['top1_agreement']:.1%}, "
                 f"cosine p1 {task['logits']['cosine_p1']:.4f}, max |dlogit| {task['logits']['max_abs']:.1e}")
    if entry["edge"]["nonfinite"]:
        text += f"; {entry['edge']['nonfinite']} non-finite values on edge valid_hw rows"
    return text


def print_variable_report(report: Dict[str, Any], echo: Callable[[str], None]) -> None:
    numbers, task = report["numbers"], report["task"]
    echo(f"vitdeploy check (variable size, canvas {report['canvas'][0]}x{report['canvas'][1]}): {report['bundle']}")
    echo(f"  rule: {report['rule']}")
    echo(f"  numbers: {len(numbers['sizes'])} random images of mixed sizes padded into one batch, each row vs the image alone "
         "(PyTorch at its own size); edge valid_hw rows: one patch, the full canvas, values the graph clamps")
    if task:
        echo(f"  task: {task['data']['count']} images of {task['data']['source']} at {task['distinct_sizes']} sizes "
             f"(policy {task['policy']}), PyTorch alone {task['reference_accuracy']:.2%}")
    for entry in report.get("artifacts", []):
        verdict = "pass" if entry["passed"] else ("FAIL" if entry["gated"] else "reported, not gated")
        echo(f"  {entry['precision']} / {entry['execution']}: {_summary(entry)} -> {verdict}")
    echo("PASS" if report["passed"] else "FAIL: " + "; ".join(report["failures"]))
