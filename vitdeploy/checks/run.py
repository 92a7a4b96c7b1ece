"""Run every check on every artifact of a bundle and collect one report.

One path for every input contract (vitdeploy.contract): the contract's sets (vitdeploy.checks.sets)
are fed to the PyTorch reference (its per-image mode for a canvas) and to every graph of the bundle in
every execution it is scored in, then to every TensorRT engine that runs on this machine; each is
scored by vitdeploy.checks.score, with the protocol evidence and localisation where they apply.
"""

from __future__ import annotations

import logging
import platform
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from .. import __version__
from .. import precisions as registry
from ..bundle import Bundle
from ..compare import accuracy
from ..contract import InputContract
from ..errors import UserError
from ..gate import Gate
from ..fileio import atomic_write_json, sha256_cached, signals_deferred
from .localise import localise
from .protocol import protocol_evidence
from .score import Reference, batch_consistency, score, summary
from .sets import FINITE, IMAGES, REPORT_FIELDS, CheckSet, check_sets

logger = logging.getLogger(__name__)


@dataclass
class CheckOptions:
    precisions: tuple[str, ...] | None = None  # default: every graph the bundle holds
    data: str | None = None  # labelled real images; default: the bundled model's own test split
    random_count: int = 64
    seed: int = 0
    batch: int = 16
    limit: int | None = None  # at most this many real images
    gate: Gate = Gate()  # the thresholds, and which apply to which precision (vitdeploy.gate)
    localise: str = "on-failure"  # "on-failure" | "always" | "never"
    threads: int | None = None
    write_report: bool = True


def executions(bundle: Bundle, precision: str) -> list[tuple[str, str, bool]]:
    """(execution name, ORT optimization level, gated?) for one precision's graph.

    An int8 Q/DQ graph is scored twice: in reference semantics (Q/DQ as fake-quant in float, what
    TensorRT computes) and as this CPU executes it (ORT fuses Q/DQ into integer kernels, which
    saturate on AVX2 CPUs without VNNI). Only the one matching the graph's target is gated.
    """
    if precision == "cpu":
        return [("onnxruntime (fused attention)", "all", True)]
    if precision == "fp8":  # E4M3 Q/DQ: ONNX Runtime's CPU runs them exactly, no FP8 kernels to fuse them into
        return [("reference (fake-quant)", "basic", True)]
    if precision != "int8":
        return [("onnxruntime", "all", True)]
    int8 = bundle.artifact("int8")
    target = int8.get("target", "tensorrt") if int8 else "tensorrt"  # absent: a graph made for TensorRT
    return [("reference (fake-quant)", "basic", target != "cpu"), ("this CPU (int8 kernels)", "all", target == "cpu")]


def cpu_graph(bundle: Bundle) -> list[str]:
    """["cpu"] when the bundle holds the fused CPU graph (`convert --target cpu`): scored by default."""
    record = bundle.artifact("cpu") if bundle.bare_onnx is None else None
    return ["cpu"] if record and (bundle.root / record.file).is_file() else []


def placement(bundle: Bundle, precision: str) -> dict[str, Any]:
    """The ViT precision policy holds in the graph: no Q/DQ feeding LayerNorm/Softmax, per-channel
    weights (int8); preprocessing, LayerNorm and Softmax in fp32, and a variable-size graph's valid_hw
    mask path kept off reduced precision (fp16/int8; exporters/mask_path.py)."""
    try:
        from vitdeploy.calibration.inspect import bundle_placement
    except ImportError as exc:  # calibration's optional dependencies
        return {"available": False, "reason": str(exc)}
    return bundle_placement(bundle, precision)


def run_check(path: str | Path, options: CheckOptions | None = None, log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Every check on every artifact of the bundle at ``path``; progress lines go to ``log`` (default: this module's logger)."""
    from ..runtime.select import onnxruntime_runner

    log = log or logger.info
    opts = options or CheckOptions()
    bundle = Bundle.open(path)
    contract = InputContract.from_bundle(bundle)
    precisions = list(opts.precisions or bundle.precisions() + cpu_graph(bundle))
    for p in precisions:
        bundle.artifact_path(p)  # one clear line for a graph the bundle lacks

    try:
        from vitdeploy.exporters.torch_runner import TorchRunner
    except ImportError as exc:
        raise UserError(f"check compares with PyTorch, which is not importable ({exc}); pip install 'vitdeploy[export]'") from None
    if bundle.embedding_model:
        log(f"{bundle.kind()}: parity with PyTorch on its outputs and the protocol checks; label-based metrics "
            "(label order, accuracy, top-1) do not apply and are skipped")
    reference = TorchRunner.from_bundle(bundle, threads=opts.threads)
    alone = ", each image alone at its own size" if reference.per_image else ""
    log(f"reference: PyTorch {reference.info.details['torch']} on {bundle.manifest['source']['kind']}:{bundle.manifest['source']['name']}{alone}")

    sets = check_sets(bundle, contract, opts, log)
    judged = [s for s in sets if s.judged != FINITE]
    logger.debug("gate %s; sets %s", opts.gate, ", ".join(f"{s.name} ({len(s.images)} {s.judged})" for s in sets))
    started = time.perf_counter()
    ref_out = {s.name: reference.run_batched(s.feeds, opts.batch) for s in judged}
    logger.debug("PyTorch reference on %d sets in %.1f s", len(judged), time.perf_counter() - started)
    ref_acc = {s.name: accuracy(ref_out[s.name]["logits"], s.labels) for s in judged if s.labels is not None and "logits" in ref_out[s.name]}
    for name, acc in ref_acc.items():
        log(f"PyTorch fp32 accuracy on {name}: {acc:.2%}")
    against = Reference(sets, ref_out, ref_acc, opts)
    merge = None
    if bundle.manifest.get("token_merge") and bundle.bare_onnx is None:  # issue 40: the merge's price vs the unmerged model
        from vitdeploy.exporters.token_merge_price import merge_price

        merge = merge_price(bundle, judged, ref_out, opts.batch, opts.threads, log)

    artifacts, failures = [], []
    for precision in precisions:
        graph = bundle.artifact_path(precision)
        record = bundle.artifact(precision)
        data = record.data if record else None  # a large graph's external data file
        # artifact_path has verified the graph and its external data file against the manifest (sha256 of both)
        # a backend variant computes in its precision (model.cpu.onnx: fp32): those gates, against PyTorch as well
        computes_in = registry.computes_in(precision)
        policy = placement(bundle, precision) if registry.get(computes_in).reduced else None
        for execution, level, gated in executions(bundle, precision):
            started = time.perf_counter()
            runner = onnxruntime_runner(bundle, contract, computes_in, threads=opts.threads, optimization=level, graph=graph).runner
            entry = score(against, computes_in, execution, runner, gated)
            entry["precision"] = precision
            entry.update({"file": graph.name, "sha256": sha256_cached(graph),  # what was measured, not what is claimed
                          **({"data": {**data.to_dict(), "sha256": sha256_cached(bundle.root / data.file)}}
                             if data else {}),  # a large graph's external data file, measured too
                          "providers": runner.info.details.get("providers"), "optimization": level})
            entry["batch_consistency"] = batch_consistency(runner, contract.take(sets[0].feeds, 0, 4))
            runner.close()
            if policy is not None:
                entry["placement"] = policy
                if policy.get("violations"):
                    entry["failed_gates"].extend(f"precision policy: {v}" for v in policy["violations"])
                    entry["passed"] = False
            want_localise = opts.localise == "always" or (opts.localise == "on-failure" and not entry["passed"])
            # the fused graph's attention is one node per block: no taps inside it to localise against
            if want_localise and gated and precision != "cpu":
                entry["localisation"] = _localise(reference, graph, bundle, sets, precision, opts)
            artifacts.append(entry)
            logger.debug("%s / %s (ORT optimization %s, %s): %d criteria in %.1f s", precision, execution, level,
                         "gated" if gated else "reported only", len(entry["gates"]), time.perf_counter() - started)
            verdict = "pass" if entry["passed"] else ("FAIL" if gated else "reported")
            note = summary(entry)
            log(f"{precision} / {execution}: {note + ' -> ' if note else ''}{verdict}")
            if gated and not entry["passed"]:
                failures.extend(f"{precision} ({execution}): {g}" for g in entry["failed_gates"])
                loc = entry.get("localisation", {})
                if loc.get("first_divergence"):
                    failures.append(f"{precision}: first divergence at PyTorch module {loc['first_divergence']}")

    for entry in engine_entries(bundle, contract, against):
        artifacts.append(entry)
        if entry.get("gated") and not entry["passed"]:
            failures.extend(f"tensorrt {entry['execution']}: {g}" for g in entry["failed_gates"])

    protocol = protocol_evidence(bundle, contract, _protocol_probe(sets), reference.loaded.preprocessing,
                                 None if bundle.manifest["source"].get("labels_from") == "labels file" else reference.loaded.labels)
    if not protocol["passed"]:
        pre, grid, lab = protocol.get("preprocessing", {}), protocol.get("patch_grid", {}), protocol["labels"]
        if pre.get("passed") is False:
            failures.append(f"preprocessing: {pre['diagnosis']}")
        if grid.get("passed") is False:
            failures.append(f"patch grid: tokens do not map back to the same pixels ({grid})")
        failures.extend(f"labels: {p}" for p in lab["problems"])
    reference.close()

    report = {
        **REPORT_FIELDS[contract.kind](bundle, contract, sets, artifacts, ref_acc, opts),
        "bundle": str(bundle.root if bundle.bare_onnx is None else bundle.bare_onnx),
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "versions": _versions(),
        "options": asdict(opts),
        "inputs": [s.record() for s in sets],
        "reference": {"backend": "torch", "precision": "fp32", "accuracy": ref_acc,
                      **({"mode": reference.info.details["reference"]} if reference.per_image else {})},
        "artifacts": artifacts,
        "protocol": protocol,
        **({"token_merge": merge} if merge else {}),
        "failures": failures,
        "passed": not failures,
    }
    if opts.write_report and bundle.bare_onnx is None:
        with signals_deferred():  # the report and the manifest's record of it land together
            atomic_write_json(bundle.reports_dir() / "check.json", report)
            bundle.set_record("check", {"passed": report["passed"], "created": report["created"], "report": "reports/check.json",
                                        "graphs": {a["precision"]: a["sha256"] for a in artifacts if a.get("sha256")}})
    return report


def _localise(reference: Any, graph: Path, bundle: Bundle, sets: list[CheckSet], precision: str, opts: CheckOptions) -> dict[str, Any]:
    """Per-module agreement on a real set (else the first), for sets whose images are whole: a padded
    canvas row's module tensors hold its padding's tokens, which PyTorch alone never sees."""
    whole = [s for s in sets if s.judged == IMAGES]
    if not whole:
        return {"available": False, "reason": "module outputs are compared on whole images; the rows of a canvas batch hold padded tokens"}
    probe = next((s for s in whole if s.real), whole[0]).images[:8]
    return localise(reference, graph, bundle.graph.module_outputs or {}, probe,
                    opts.gate.module_min_cosine(precision), precision)


def _protocol_probe(sets: list[CheckSet]) -> dict[str, np.ndarray]:
    """Up to 8 rows of each set that shares the first set's input size (the graph's taps take one batch)."""
    first = sets[0]
    alike = [s for s in sets if s.judged == first.judged and s.images.shape[1:] == first.images.shape[1:]]
    return {name: np.concatenate([s.feeds[name][:8] for s in alike]) for name in first.feeds}


def engine_entries(bundle: Bundle, contract: InputContract, against: Reference) -> list[dict[str, Any]]:
    """TensorRT engines, scored like the ONNX graphs where TensorRT and their GPU exist.

    An engine is judged by the task gates whatever its precision: TensorRT may pick TF32 or fused
    kernels for an fp32 graph, so the fp32 |dlogit| gate of ONNX Runtime does not apply. A set is fed
    where the engine's profile holds its size. Elsewhere the entry says why it was skipped (engines
    are checked on their target).
    """
    from ..runtime.select import engines_here

    sets, opts = against.sets, against.opts
    entries = []
    sizes = sorted({tuple(int(v) for v in s.images.shape[1:3]) for s in sets})
    for run in engines_here(bundle, contract, sizes):
        entry, record = run.entry, run.entry.record
        base = {"precision": entry.precision, "backend": "tensorrt", "execution": entry.target, "gated": False, "passed": None}
        if run.runner is None:
            entries.append({**base, "skipped": run.skipped})
            continue
        # each set where a profile of the engine holds its size; the calls within every such profile's rows
        held = []
        for s in sets:
            index = entry.profile_for(*s.images.shape[1:3])
            narrowed = entry.narrow(contract, index) if index is not None else contract
            if (index is not None or not entry.profiles) and narrowed.accepts(*s.images.shape[1:3]):
                held.append((s, narrowed))
        if not held:
            entries.append({**base, "skipped": f"no input set fits the engine's profiles ({entry.describe_profiles()})"})
            run.runner.close()
            continue
        max_rows = min(narrowed.max_rows(opts.batch) for _, narrowed in held)
        min_rows = max(narrowed.min_rows for _, narrowed in held)
        scored = score(against, "int8" if entry.precision == "int8" else "fp16", entry.target, run.runner, True, [s for s, _ in held],
                       batch=max(1, min(opts.batch, max_rows)), min_rows=min_rows)
        scored.update({"precision": entry.precision, "backend": "tensorrt", "engine": record.get("dir") or f"engines/{entry.dir.name}",
                       "source_sha256": record.get("source_sha256") or entry.fingerprint.get("source_sha256")})
        run.runner.close()
        entries.append(scored)
    return entries


def _versions() -> dict[str, str]:
    import onnxruntime
    import torch

    return {"vitdeploy": __version__, "onnxruntime": onnxruntime.__version__, "torch": torch.__version__,
            "numpy": np.__version__, "python": platform.python_version(), "machine": platform.machine()}
