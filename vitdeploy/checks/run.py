"""Run every check on every artifact of a bundle and collect one report."""

from __future__ import annotations

import platform
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from .. import __version__
from ..bundle import Bundle
from ..compare import Gate, accuracy, compare_outputs, parity_gates
from ..errors import UserError
from ..fileio import atomic_write_json, sha256_cached
from ..data import default_data
from ..evalsets import EvalSet, random_sets, real_set
from .localise import localise
from .protocol import protocol_evidence


@dataclass
class CheckOptions:
    precisions: tuple[str, ...] | None = None  # default: every graph the bundle holds
    data: str | None = None  # labelled real images; default: the bundled model's own test split
    random_count: int = 64
    seed: int = 0
    batch: int = 16
    limit: int | None = None  # at most this many real images
    fp32_max_abs: float = 1e-4
    cosine_min: float = 0.99
    # fp32 feature outputs (embedding, patch_grid): worst per-image cosine with PyTorch
    fp32_feature_cosine_min: float = 0.9999
    top1_min: float = 0.99
    accuracy_drop_max: float = 0.01  # 1 point
    localise: str = "on-failure"  # "on-failure" | "always" | "never"
    threads: int | None = None
    write_report: bool = True


def _executions(bundle: Bundle, precision: str) -> list[tuple[str, str, bool]]:
    """(execution name, ORT optimization level, gated?) for one precision's graph.

    An int8 Q/DQ graph is scored twice: in reference semantics (Q/DQ as fake-quant in float, what
    TensorRT computes) and as this CPU executes it (ORT fuses Q/DQ into integer kernels, which
    saturate on AVX2 CPUs without VNNI). Only the one matching the graph's target is gated.
    """
    if precision == "cpu":
        return [("onnxruntime (fused attention)", "all", True)]
    if precision != "int8":
        return [("onnxruntime", "all", True)]
    target = bundle.artifact_record("int8").get("target", "tensorrt")
    return [("reference (fake-quant)", "basic", target != "cpu"), ("this CPU (int8 kernels)", "all", target == "cpu")]


def _cpu_graph(bundle: Bundle) -> list[str]:
    """["cpu"] when the bundle holds the fused CPU graph (`convert --target cpu`): scored by default."""
    record = bundle.manifest.get("artifacts", {}).get("cpu") if bundle.bare_onnx is None else None
    return ["cpu"] if record and (bundle.root / record["file"]).is_file() else []


def run_check(path: str | Path, options: CheckOptions | None = None, log: Callable[[str], None] = lambda _m: None) -> dict[str, Any]:
    from ..runtime.ort import OrtRunner

    opts = options or CheckOptions()
    bundle = Bundle.open(path)
    if bundle.preprocessing.get("variable_size"):  # (images, valid_hw) graphs: invariance + mixed-size task check
        from .variable import check_variable

        return check_variable(bundle, opts, log)
    precisions = list(opts.precisions or bundle.precisions() + _cpu_graph(bundle))
    for p in precisions:
        bundle.artifact_path(p)  # one clear line for a graph the bundle lacks

    try:
        from vitdeploy.exporters.torch_runner import TorchRunner
    except ImportError as exc:
        raise UserError(f"check compares with PyTorch, which is not importable ({exc}); pip install 'vitdeploy[export]'") from None
    reference = TorchRunner.from_bundle(bundle, threads=opts.threads)
    log(f"reference: PyTorch {reference.info.details['torch']} on {bundle.manifest['source']['kind']}:{bundle.manifest['source']['name']}")

    sets: list[EvalSet] = random_sets(bundle, opts.random_count, opts.seed)
    data = opts.data or default_data(bundle)
    if data:
        sets.append(real_set(bundle, data, opts.limit))
    ref_out = {s.name: reference.infer_batched(s.images, opts.batch) for s in sets}
    ref_acc = {s.name: accuracy(ref_out[s.name]["logits"], s.labels) for s in sets if s.labels is not None and "logits" in ref_out[s.name]}
    for name, acc in ref_acc.items():
        log(f"PyTorch fp32 accuracy on {name}: {acc:.2%}")

    artifacts, failures = [], []
    for precision in precisions:
        graph = bundle.artifact_path(precision)
        record = bundle.artifact_record(precision)
        # artifact_path has verified the graph and its external data file against the manifest (sha256 of both)
        placement = _placement(bundle, precision) if precision not in ("fp32", "cpu") else None
        # the fused CPU graph (model.cpu.onnx) computes in fp32: the fp32 gates, against PyTorch as well
        computes_in = "fp32" if precision == "cpu" else precision
        for execution, level, gated in _executions(bundle, precision):
            runner = OrtRunner(graph, precision=computes_in, optimization=level, threads=opts.threads)
            entry = _score(computes_in, execution, runner, sets, ref_out, ref_acc, opts, gated)
            entry["precision"] = precision
            entry.update({"file": graph.name, "sha256": sha256_cached(graph),  # what was measured, not what is claimed
                          **({"data": {**record["data"], "sha256": sha256_cached(bundle.root / record["data"]["file"])}}
                             if record.get("data") else {}),  # a large graph's external data file, measured too
                          "providers": runner.info.details.get("providers"), "optimization": level})
            entry["batch_consistency"] = _batch_consistency(runner, sets[0].images[:4])
            if placement is not None:
                entry["placement"] = placement
                if placement.get("violations"):
                    entry["failed_gates"].extend(f"precision policy: {v}" for v in placement["violations"])
                    entry["passed"] = False
            want_localise = opts.localise == "always" or (opts.localise == "on-failure" and not entry["passed"])
            # the fused graph's attention is one node per block: no taps inside it to localise against
            if want_localise and gated and precision != "cpu":
                limit = 0.9999 if precision == "fp32" else opts.cosine_min
                probe = next((s for s in sets if s.real), sets[0]).images[:8]
                entry["localisation"] = localise(reference, graph, bundle.manifest.get("graph", {}).get("module_outputs", {}),
                                                 probe, limit, precision)
            artifacts.append(entry)
            verdict = "pass" if entry["passed"] else ("FAIL" if gated else "reported")
            log(f"{precision} / {execution}: {verdict}")
            if gated and not entry["passed"]:
                failures.extend(f"{precision} ({execution}): {g}" for g in entry["failed_gates"])
                loc = entry.get("localisation", {})
                if loc.get("first_divergence"):
                    failures.append(f"{precision}: first divergence at PyTorch module {loc['first_divergence']}")

    for entry in _engine_entries(bundle, sets, ref_out, ref_acc, opts):
        artifacts.append(entry)
        if entry.get("gated") and not entry["passed"]:
            failures.extend(f"tensorrt {entry['execution']}: {g}" for g in entry["failed_gates"])

    probe_sets = [s for s in sets if s.images.shape[1:3] == sets[0].images.shape[1:3]]
    probe = np.concatenate([s.images[:8] for s in probe_sets])
    source_pre = reference.loaded.preprocessing
    labels_from_file = bundle.manifest["source"].get("labels_from") == "labels file"
    protocol = protocol_evidence(bundle, probe, source_pre, None if labels_from_file else reference.loaded.labels)
    if not protocol["passed"]:
        pre, grid, lab = protocol.get("preprocessing", {}), protocol.get("patch_grid", {}), protocol["labels"]
        if pre.get("passed") is False:
            failures.append(f"preprocessing: {pre['diagnosis']}")
        if grid.get("passed") is False:
            failures.append(f"patch grid: tokens do not map back to the same pixels ({grid})")
        failures.extend(f"labels: {p}" for p in lab["problems"])

    report = {
        "bundle": str(bundle.root if bundle.bare_onnx is None else bundle.bare_onnx),
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "versions": _versions(),
        "options": asdict(opts),
        "inputs": [{"name": s.name, "real": s.real, "count": int(len(s.images)), "height": int(s.images.shape[1]),
                    "width": int(s.images.shape[2]), "labelled": s.labels is not None, **s.meta} for s in sets],
        "reference": {"backend": "torch", "precision": "fp32", "accuracy": ref_acc},
        "artifacts": artifacts,
        "protocol": protocol,
        "failures": failures,
        "passed": not failures,
    }
    if opts.write_report and bundle.bare_onnx is None:
        atomic_write_json(bundle.reports_dir() / "check.json", report)
        bundle.set_record("check", {"passed": report["passed"], "created": report["created"], "report": "reports/check.json",
                                    "graphs": {a["precision"]: a["sha256"] for a in artifacts if a.get("sha256")}})
    return report


FEATURE_OUTPUTS = ("embedding", "patch_grid")


def _score(precision: str, execution: str, runner: Any, sets: list[EvalSet], ref_out: dict, ref_acc: dict,
           opts: CheckOptions, gated: bool) -> dict[str, Any]:
    rows, gates, structural = [], [], []
    for s in sets:
        out = runner.infer_batched(s.images, opts.batch)
        ref = ref_out[s.name]
        row: dict[str, Any] = {"set": s.name, "real": s.real}
        # every output PyTorch gives must come out of the graph with the same shape (a head of another size,
        # a renamed output): named here instead of a shape error inside the comparison
        for name in [n for n in ref if n in out and np.shape(out[n]) != np.shape(ref[n])] + [n for n in ref if n not in out]:
            got = f"shape {list(np.shape(out[name]))}" if name in out else "no such output"
            structural.append(f"output {name} on {s.name}: {got} from the graph, shape {list(np.shape(ref[name]))} from PyTorch")
            ref = {k: v for k, v in ref.items() if k != name}
        judged_here = precision == "fp32" or s.real or not any(x.real for x in sets)
        if "logits" in ref and "logits" in out:
            stats = compare_outputs("logits", ref["logits"], out["logits"])
            row["logits"] = stats.to_dict()
            if "probs" in ref and "probs" in out:
                row["probs"] = compare_outputs("probs", ref["probs"], out["probs"]).to_dict()
            if s.labels is not None:
                row["accuracy"] = accuracy(out["logits"], s.labels)
                row["accuracy_drop"] = ref_acc[s.name] - row["accuracy"]
            if precision == "fp32":  # the absolute limit and the share of the reference's spread across images
                gates.extend(parity_gates("logit", stats, opts.fp32_max_abs, f" on {s.name}"))
            elif judged_here:
                # reduced precision is judged by task gates on real images (random ones when there are none)
                gates.append(Gate(f"cosine (1st percentile of images) on {s.name}", stats.cosine_p1, opts.cosine_min, ">="))
                if s.real:
                    gates.append(Gate(f"top-1 agreement on {s.name}", stats.top1_agreement, opts.top1_min, ">="))
            if s.labels is not None and precision != "fp32":
                gates.append(Gate(f"accuracy drop on {s.name}", row["accuracy_drop"], opts.accuracy_drop_max, "<="))
        # The feature outputs the graph declares: max |d| and the worst per-image cosine (fp32), the
        # 1st-percentile per-image cosine (reduced precision), as for the logits.
        for name in FEATURE_OUTPUTS:
            if name not in ref or name not in out:
                continue
            feat = compare_outputs(name, ref[name], out[name])
            row[name] = {k: v for k, v in feat.to_dict().items() if k not in ("top1_agreement", "top5_agreement")}
            if precision == "fp32":
                gates.extend(parity_gates(name, feat, opts.fp32_max_abs, f" on {s.name}"))
                gates.append(Gate(f"{name} cosine (worst image) on {s.name}", feat.cosine_min, opts.fp32_feature_cosine_min, ">="))
            elif judged_here:
                gates.append(Gate(f"{name} cosine (1st percentile of images) on {s.name}", feat.cosine_p1, opts.cosine_min, ">="))
        rows.append(row)
    failed = structural + [g.describe() for g in gates if not g.passed]
    return {"precision": precision, "backend": "onnxruntime", "execution": execution, "gated": gated, "sets": rows,
            "gates": [g.to_dict() for g in gates], "failed_gates": failed, "passed": not failed}


def _placement(bundle: Bundle, precision: str) -> dict[str, Any]:
    """The ViT precision policy holds in the graph: no Q/DQ feeding LayerNorm/Softmax, per-channel
    weights (int8); preprocessing, LayerNorm and Softmax in fp32 (fp16)."""
    try:
        from vitdeploy.calibration.inspect import bundle_placement
    except ImportError as exc:  # calibration's optional dependencies
        return {"available": False, "reason": str(exc)}
    return bundle_placement(bundle, precision)


def _batch_consistency(runner: Any, images: np.ndarray) -> dict[str, Any]:
    """The same images one at a time and as one batch give the same logits (dynamic batch axis)."""
    first = runner.infer(images)
    name = "logits" if "logits" in first else next(iter(first))  # a backbone graph: its embedding
    batched = first[name]
    single = np.concatenate([runner.infer(images[i:i + 1])[name] for i in range(len(images))])
    return {"images": int(len(images)), "output": name, "max_abs": float(np.abs(batched.astype(np.float64) - single).max())}


def _engine_entries(bundle: Bundle, sets: list[EvalSet], ref_out: dict, ref_acc: dict, opts: CheckOptions) -> list[dict[str, Any]]:
    """TensorRT engines, scored like the ONNX graphs where TensorRT and their GPU exist.

    An engine is judged by the task gates whatever its precision: TensorRT may pick TF32 or fused
    kernels for an fp32 graph, so the fp32 |dlogit| gate of ONNX Runtime does not apply.
    Elsewhere the entry says why it was skipped (engines are checked on the target).
    """
    from ..errors import VitDeployError
    from ..lazy import available

    entries = []
    for target, record in (bundle.manifest.get("engines") or {}).items():
        base = {"precision": record.get("precision", "?"), "backend": "tensorrt", "execution": target, "gated": False, "passed": None}
        if not available("tensorrt"):
            entries.append({**base, "skipped": "TensorRT is not installed on this machine (engines are checked on the target)"})
            continue
        from ..runtime.tensorrt import TensorRTRunner

        try:
            runner = TensorRTRunner(bundle.root / record.get("dir", f"engines/{target}"))
        except VitDeployError as exc:
            entries.append({**base, "skipped": str(exc)})
            continue
        profiles = record.get("profiles") or []
        max_batch = max((int(p["batch"][2]) for p in profiles if isinstance(p, dict) and "batch" in p), default=opts.batch)

        def fits(s: EvalSet) -> bool:  # the H/W of some optimisation profile covers this set
            h, w = s.images.shape[1:3]
            return not profiles or any(p["height"][0] <= h <= p["height"][2] and p["width"][0] <= w <= p["width"][2]
                                       for p in profiles if isinstance(p, dict) and "height" in p)

        engine_sets = [s for s in sets if fits(s)]
        if not engine_sets:
            entries.append({**base, "skipped": f"no input set fits the engine's profiles {profiles}"})
            runner.close()
            continue
        engine_opts = CheckOptions(**{**asdict(opts), "batch": max(1, min(opts.batch, max_batch))})
        entry = _score("int8" if base["precision"] == "int8" else "fp16", target, runner, engine_sets, ref_out, ref_acc, engine_opts, True)
        entry.update({"precision": base["precision"], "backend": "tensorrt", "engine": record.get("dir"),
                      "source_sha256": record.get("source_sha256")})
        runner.close()
        entries.append(entry)
    return entries


def _versions() -> dict[str, str]:
    import onnxruntime
    import torch

    return {"vitdeploy": __version__, "onnxruntime": onnxruntime.__version__, "torch": torch.__version__,
            "numpy": np.__version__, "python": platform.python_version(), "machine": platform.machine()}
