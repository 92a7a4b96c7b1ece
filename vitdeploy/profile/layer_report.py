"""`vitdeploy profile BUNDLE --layers`: which ViT block costs what inside a TensorRT engine.

Runs trtexec on the bundle's engine with per-layer export (``trtexec.layer_profile_command``) when a
trtexec is on this machine, or reads the files such a run wrote (``--layer-profile``, ``--layer-info``,
``--trtexec-log``); with neither, prints the command to run on the device and exits 1 (nothing measured).
Then: layers -> ONNX nodes -> modules (``layer_modules``), per block ms and share of the total, the cost
model's multiply-adds beside each and the achieved GFLOP/s, and the device state the numbers depend on
(nvpmodel mode and jetson_clocks on a Jetson, the device and options trtexec reported, its command line).
Writes reports/layers.json and reports/layers.csv atomically.
"""

from __future__ import annotations

import csv
import io
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from ..bundle import Bundle
from ..errors import UserError
from ..fileio import atomic_write_json, atomic_write_text
from . import layer_modules, layers

JETSON_TRTEXEC = Path("/usr/src/tensorrt/bin/trtexec")  # where JetPack installs it (not on PATH by default)


@dataclass
class LayerRequest:
    bundle: str | Path
    engine: Optional[str | Path] = None
    profile_file: Optional[str | Path] = None
    layer_info_file: Optional[str | Path] = None
    log_file: Optional[str | Path] = None
    batch: Optional[int] = None
    resolution: Optional[Tuple[int, int]] = None
    out_dir: Optional[str | Path] = None
    trtexec: Optional[str] = None
    timeout_s: float = 900.0


@dataclass
class LayerOutcome:
    lines: List[str]
    report: Optional[Dict[str, Any]] = None
    paths: Dict[str, Path] = field(default_factory=dict)
    exit_code: int = 0
    command: Optional[List[str]] = None


def find_trtexec(explicit: Optional[str] = None) -> Optional[str]:
    if explicit:
        return explicit if Path(explicit).is_file() or shutil.which(explicit) else None
    found = shutil.which("trtexec")
    if found:
        return found
    return str(JETSON_TRTEXEC) if JETSON_TRTEXEC.is_file() else None


def _engine_dir(bundle: Bundle, engine: Optional[str | Path]) -> Optional[Path]:
    if engine is not None:
        path = Path(engine)
        return path if path.is_absolute() or path.exists() else bundle.root / "engines" / str(engine)
    engines = sorted((bundle.root / "engines").glob("*/engine.json")) if bundle.bare_onnx is None else []
    if len(engines) == 1:
        return engines[0].parent
    if len(engines) > 1:
        raise UserError(f"the bundle has {len(engines)} engines ({', '.join(e.parent.name for e in engines)}); pick one with --engine NAME")
    return None


def _shapes(bundle: Bundle, record: Optional[Dict[str, Any]], req: LayerRequest) -> Tuple[int, int, int, Dict[str, Tuple[int, ...]]]:
    """Batch, H, W the profile runs at (the request's, else the engine's first profile's opt shape) and every input's shape."""
    spec = bundle.spec
    h, w = req.resolution or tuple(spec.image_size)  # type: ignore[misc]
    b = req.batch or 1
    inputs: Dict[str, Tuple[int, ...]] = {}
    if record and record.get("profiles") and not (req.batch or req.resolution):
        opt = record["profiles"][0]
        b, h, w = int(opt["batch"][1]), int(opt["height"][1]), int(opt["width"][1])
    layout = (record or {}).get("input", {}).get("layout", "NHWC")
    name = (record or {}).get("input", {}).get("name", "images")
    inputs[name] = (b, h, w, spec.in_chans) if layout == "NHWC" else (b, spec.in_chans, h, w)
    for extra in (record or {}).get("inputs", [])[1:]:
        inputs[extra["name"]] = (b,) + tuple(int(d) for d in extra["shape"][1:])
    return b, h, w, inputs


def _run_trtexec(exe: str, argv: List[str], out_dir: Path, timeout_s: float) -> Tuple[Path, Path, Path]:
    """Run trtexec writing into a temporary folder beside the reports, then move its files into place
    (an interrupted run leaves no half-written export behind)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".layers-", dir=out_dir))
    try:
        argv = [exe] + [a.replace(str(out_dir), str(tmp)) for a in argv[1:]]
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)
        except subprocess.TimeoutExpired:
            raise UserError(f"trtexec did not finish in {timeout_s:.0f} s; nothing was written") from None
        log_text = done.stdout + done.stderr
        if done.returncode != 0:
            last = [line for line in log_text.splitlines() if line.strip()][-1:] or ["no output"]
            raise UserError(f"trtexec exited {done.returncode}: {last[0][:300]}; nothing was written")
        (tmp / "layer-trtexec.log").write_text(log_text)
        finals = []
        for name in ("layer-profile.json", "layer-info.json", "layer-trtexec.log"):
            if not (tmp / name).is_file():
                raise UserError(f"trtexec wrote no {name}; nothing was written")
            os.replace(tmp / name, out_dir / name)
            finals.append(out_dir / name)
        return finals[0], finals[1], finals[2]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _graph(bundle: Bundle, record: Optional[Dict[str, Any]]) -> Tuple[Optional[Any], Optional[str]]:
    """The ONNX graph TensorRT parsed for this engine (the lowered one for 8.x) as a NodeGroups."""
    from ..lazy import require

    onnx = require("onnx", "mapping layers to modules")
    name = ((record or {}).get("parsed_graph") or {}).get("file")
    candidates = [bundle.root / name] if name and bundle.bare_onnx is None else []
    precision = (record or {}).get("source_precision", "fp32")
    try:
        candidates.append(Path(bundle.artifact_path(precision)))
    except UserError:
        pass
    for path in candidates:
        if path.is_file():
            model = onnx.load(str(path), load_external_data=False)
            module_outputs = bundle.graph.module_outputs if bundle.bare_onnx is None else None
            return layer_modules.NodeGroups.from_onnx(model, module_outputs), path.name
    return None, None


def run(req: LayerRequest) -> LayerOutcome:
    from ..engine.fingerprint import read_fingerprint
    from ..engine.trtexec import TrtexecCommand, layer_profile_command
    from ..engine.versions import capabilities_for

    bundle = Bundle.open(req.bundle)
    out_dir = Path(req.out_dir) if req.out_dir else bundle.reports_dir()
    engine_dir = _engine_dir(bundle, req.engine) if req.profile_file is None or req.engine else None
    record = read_fingerprint(engine_dir) if engine_dir is not None else None
    b, h, w, inputs = _shapes(bundle, record, req)
    command: Optional[List[str]] = None
    profile_file, info_file, log_file = req.profile_file, req.layer_info_file, req.log_file
    if profile_file is None:
        if record is None:
            raise UserError("no engine to profile: build one with `vitdeploy build-engine BUNDLE --profile-layers`, or give the "
                            "files a trtexec run wrote with --layer-profile FILE [--layer-info FILE]")
        caps = capabilities_for(record["tensorrt"])
        refit = (bundle.root / record["refit"]["file"]) if record.get("strip_weights") else None
        command = layer_profile_command(engine_dir / "model.plan", inputs, out_dir, caps, refit_onnx=refit)  # type: ignore[operator]
        exe = find_trtexec(req.trtexec)
        if exe is None:
            lines = ["trtexec is not on this machine (JetPack puts it in /usr/src/tensorrt/bin): nothing was measured.",
                     "Run this on the device, then give its files to `vitdeploy profile BUNDLE --layers --layer-profile "
                     f"{out_dir / 'layer-profile.json'} --layer-info {out_dir / 'layer-info.json'} --trtexec-log LOG`:",
                     TrtexecCommand(command).text()]
            return LayerOutcome(lines, exit_code=1, command=command)
        profile_file, info_file, log_file = _run_trtexec(exe, command, out_dir, req.timeout_s)

    profile = layers.load_profile(profile_file)
    info = layers.load_layer_info(info_file) if info_file else None
    log_text = layers.read_text(log_file) if log_file else (layers.read_text(profile_file) if profile.format.startswith("log") else "")
    run_info = layers.parse_trtexec_log(log_text) if log_text else {}
    graph, graph_file = _graph(bundle, record)
    attributions = layer_modules.attribute(profile, graph, info)
    coverage = layer_modules.name_coverage(attributions)
    if graph is not None and coverage < 0.75:
        raise UserError(f"only {100 * coverage:.0f}% of the ONNX node names in this profile's layers are nodes of {graph_file}: "
                        "the profile is not of this bundle's engine (profile the engine built from this bundle)")
    macs = layer_modules.group_macs(bundle.spec, h, w, b)
    result = layer_modules.per_module(attributions, macs)
    report = _report(bundle, engine_dir, record, profile, info, run_info, result, attributions, graph, graph_file, (b, h, w), command,
                     {"profile": str(profile_file), "layer_info": str(info_file) if info_file else None, "log": str(log_file) if log_file else None})
    paths = {"json": out_dir / "layers.json", "csv": out_dir / "layers.csv"}
    atomic_write_json(paths["json"], report)
    atomic_write_text(paths["csv"], _csv(result))
    return LayerOutcome(render(report), report, paths, 0, command)


def _report(bundle: Bundle, engine_dir: Optional[Path], record: Optional[Dict[str, Any]], profile: Any, info: Any,
            run_info: Dict[str, Any], result: Dict[str, Any], attributions: Any, graph: Any, graph_file: Optional[str], shape: Tuple[int, int, int],
            command: Optional[List[str]], files: Dict[str, Optional[str]]) -> Dict[str, Any]:
    from .tegrastats import jetson_power_state

    stated = profile.stated_total_ms if profile.stated_total_ms is not None else profile.implied_total_ms()
    return {
        "format": "vitdeploy-layers/1",
        "engine": str(engine_dir) if engine_dir else None,
        "tensorrt": run_info.get("tensorrt") or (record or {}).get("tensorrt"),
        "profile_format": profile.format,
        "runs": profile.runs,
        "files": files,
        "totals": {"layers_sum_ms": profile.total_ms, "file_total_ms": stated,
                   "difference": (abs(profile.total_ms - stated) / stated) if stated else None,
                   "per_inference_ms": profile.avg_ms, "file_per_inference_ms": profile.stated_avg_ms},
        "mapping": {"graph": graph_file, "evidence": graph.evidence if graph is not None else "layer names only",
                    "mapped_share": result["mapped_share"], "unmapped_ms": result["unmapped_ms"], "span_ms": result["span_ms"],
                    "reformat_ms": result["reformat_ms"], "layer_info_detailed": bool(info and info.detailed),
                    "names_found_in_graph": layer_modules.name_coverage(attributions)},
        "cost_model": {"batch": shape[0], "height": shape[1], "width": shape[2], "spec": bundle.spec.to_dict()},
        "rows": [{"group": r.group, "avg_ms": r.avg_ms, "share": r.share, "layers": r.layers, "macs": r.macs, "gflops": r.gflops}
                 for r in result["rows"]],
        "per_block_ms": result["per_block_ms"],
        "device_state": {"trtexec": {k: v for k, v in run_info.items() if k != "command"}, "jetson": jetson_power_state()},
        "trtexec_command": run_info.get("command") or (" ".join(command) if command else None),
    }


def _csv(result: Dict[str, Any]) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(["group", "avg_ms", "share", "layers", "macs", "gflops"])
    for r in result["rows"]:
        writer.writerow([r.group, f"{r.avg_ms:.6f}", f"{r.share:.6f}", r.layers, r.macs or "", f"{r.gflops:.3f}" if r.gflops else ""])
    return buf.getvalue()


def render(report: Dict[str, Any]) -> List[str]:
    t, m = report["totals"], report["mapping"]
    lines = [f"per-layer profile: TensorRT {report['tensorrt'] or '?'} ({report['profile_format']}, {report['runs'] or '?'} runs), "
             f"{t['per_inference_ms']:.4f} ms per inference over {len(report['rows'])} groups",
             f"  layers sum to {t['layers_sum_ms']:.3f} ms; the file states {t['file_total_ms']:.3f} ms"
             + (f" ({100 * t['difference']:.3f}% apart)" if t["difference"] is not None else "") if t["file_total_ms"] else
             f"  layers sum to {t['layers_sum_ms']:.3f} ms (the file states no total)",
             f"  {100 * m['mapped_share']:.1f}% of the time mapped to modules ({m['evidence']}"
             + (f", graph {m['graph']}" if m["graph"] else "") + ")"
             + (f"; {100 * m['span_ms'] / max(t['per_inference_ms'], 1e-12):.1f}% in layers fused across modules (span rows)" if m["span_ms"] else ""),
             f"  {'group':<26} {'ms':>9} {'share':>7} {'GMAC':>9} {'GFLOP/s':>9}"]
    for r in report["rows"]:
        gmac = f"{r['macs'] / 1e9:9.3f}" if r["macs"] else f"{'':>9}"
        gfl = f"{r['gflops']:9.1f}" if r["gflops"] else f"{'':>9}"
        lines.append(f"  {r['group'][:26]:<26} {r['avg_ms']:9.4f} {100 * r['share']:6.1f}% {gmac} {gfl}")
    c = report["cost_model"]
    lines.append(f"  MACs from the cost model at batch {c['batch']}, {c['height']}x{c['width']} (vitdeploy costs); GFLOP/s = 2 x MACs / time")
    state = report["device_state"]
    jet = state.get("jetson") or {}
    if jet:
        from .tegrastats import describe_power_state

        lines.append(f"  device: {describe_power_state(jet)}")
    if state.get("trtexec", {}).get("Selected Device"):
        lines.append(f"  device (trtexec): {state['trtexec']['Selected Device']}, compute capability {state['trtexec'].get('Compute Capability', '?')}")
    if report.get("trtexec_command"):
        lines.append(f"  trtexec: {report['trtexec_command']}")
    return lines
