"""`vitdeploy build-engine` as one library call: plan, then report, print, or build.

Modes (the CLI picks one):

- ``dla_report``: the DLA feasibility report of the planned graph and shape (no TensorRT, no GPU);
- ``dry_run``: validate the plan, write ``reports/engine-plan-<target>.json`` (plan, capabilities,
  the exact TensorRT calls, the trtexec line), no TensorRT needed when ``trt_version`` is given;
- ``print_trtexec`` alone: only print the equivalent trtexec command;
- otherwise build on this machine's GPU and write ``engines/<target>/model.plan`` + ``engine.json``
  (staged, then swapped in), and record the engine in the bundle's manifest.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..bundle import Bundle
from ..errors import MissingDependencyError, UserError
from ..fileio import atomic_write_bytes, atomic_write_json, sha256_bytes, staged_directory
from . import dla, fingerprint, timing_cache
from .builder import BuildRecipe, Ref, recipe
from .plan import PATH_LEGACY, EnginePlan, PlanOptions, make_plan
from .trtexec import trtexec_command
from .versions import Capabilities, TrtVersion, capabilities_for, capabilities_of, installed_version

# JetPack 6.1/6.2's TensorRT: the DLA report's default when no TensorRT is installed or named.
DLA_REPORT_DEFAULT_TRT = "10.3"


@dataclass
class BuildEngineRequest:
    bundle: str | Path
    options: PlanOptions = field(default_factory=PlanOptions)
    trt_version: str | None = None
    dry_run: bool = False
    print_trtexec: bool = False
    dla_report: bool = False


@dataclass
class BuildEngineOutcome:
    lines: list[str]
    plan: EnginePlan | None = None
    written: list[Path] = field(default_factory=list)
    record: dict[str, Any] | None = None


def _no_tensorrt_message() -> str:
    return (
        "TensorRT is not installed here; engines are built on the target device (JetPack ships TensorRT; on a server: "
        "pip install tensorrt cuda-python). Here, plan with --dry-run --trt-version X (e.g. 10.3 for JetPack 6.1/6.2)"
    )


def _capabilities(request: BuildEngineRequest, need_live: bool) -> tuple[Capabilities, Any]:
    """Capabilities of the named or installed TensorRT, and the live module when a build needs it."""
    installed = installed_version()
    if request.trt_version:
        wanted = TrtVersion.parse(request.trt_version)
        if need_live:
            if installed is None:
                raise MissingDependencyError(_no_tensorrt_message())
            if (installed.major, installed.minor) != (wanted.major, wanted.minor):
                raise UserError(f"--trt-version {wanted} but TensorRT {installed} is installed; a build uses the installed one (drop --trt-version)")
        else:
            return capabilities_for(wanted), None
    if installed is None:
        if need_live:
            raise MissingDependencyError(_no_tensorrt_message())
        if request.dla_report:
            return capabilities_for(DLA_REPORT_DEFAULT_TRT), None
        raise UserError("no TensorRT installed here to plan for: give --trt-version (e.g. 10.3 for JetPack 6.1/6.2, 11.4 for servers)")
    from .versions import import_tensorrt

    trt = import_tensorrt()
    return capabilities_of(trt), trt


def _out_root(bundle: Bundle) -> Path:
    return bundle.root if bundle.bare_onnx is None else bundle.bare_onnx.parent


def run(request: BuildEngineRequest) -> BuildEngineOutcome:
    bundle = Bundle.open(request.bundle)
    building = not (request.dry_run or request.dla_report or request.print_trtexec)
    options = request.options
    if request.dla_report and not options.batch and options.dla_core is None:
        options = replace(options, batch=("1",))  # the report is about static DLA shapes by default
    caps, trt = _capabilities(request, need_live=building)
    plan = make_plan(bundle, options, caps)
    if request.dla_report:
        return _dla_report(bundle, plan)
    if not building:
        return _plan_only(bundle, plan, caps, request)
    return _build(bundle, plan, trt)


def describe_plan(plan: EnginePlan) -> list[str]:
    lines = [
        f"plan: TensorRT {plan.trt_version}, {plan.precision} via {plan.precision_path} from {Path(plan.source).name}"
        + (f" (flags {', '.join(plan.builder_flags)})" if plan.builder_flags else ""),
    ]
    for i, p in enumerate(plan.profiles):
        lines.append(f"  profile {i}: {p.describe()}")
    knobs = []
    if plan.workspace_bytes:
        knobs.append(f"workspace {plan.workspace_bytes / (1 << 20):.0f} MiB")
    if plan.optimization_level is not None:
        knobs.append(f"opt level {plan.optimization_level}")
    if plan.timing_cache:
        knobs.append(f"timing cache {plan.timing_cache}")
    if plan.hardware_compatibility != "none":
        knobs.append(f"hardware-compat {plan.hardware_compatibility}")
    if plan.version_compatible:
        knobs.append("version-compatible")
    if plan.dla_core is not None:
        knobs.append(f"DLA core {plan.dla_core}" + (" with GPU fallback" if plan.gpu_fallback else " without GPU fallback"))
    if knobs:
        lines.append("  " + ", ".join(knobs))
    lines += [f"  note: {n}" for n in plan.notes]
    return lines


def recipe_as_data(rec: BuildRecipe) -> dict[str, Any]:
    def show(arg: Any) -> Any:
        return f"trt.{arg.path}" if isinstance(arg, Ref) else arg

    return {
        "network_flags": [f"trt.{r.path}" for r in rec.network_flags],
        "config": [
            f"config.{s.member} = {show(s.args[0])}" if s.assign else f"config.{s.member}({', '.join(str(show(a)) for a in s.args)})"
            for s in rec.config_steps
        ],
        "profiles": [{name: [list(s) for s in shapes] for name, shapes in p.items()} for p in rec.profiles],
        "int8_calibrator": rec.calibrator,
        "onnx_support_query": f"OnnxParser.{rec.support_query}",
        "tensorrt_api": rec.api_names(),
    }


def _plan_only(bundle: Bundle, plan: EnginePlan, caps: Capabilities, request: BuildEngineRequest) -> BuildEngineOutcome:
    target = plan.target or plan.default_target()
    engine_path = _out_root(bundle) / "engines" / target / fingerprint.PLAN_FILE
    cmd = trtexec_command(plan, caps, engine_path)
    lines: list[str] = []
    written: list[Path] = []
    if request.dry_run:
        report = {
            "format": "vitdeploy-engine-plan/1",
            "target": target,
            "plan": plan.to_dict(),
            "capabilities": caps.to_dict(),
            "tensorrt_calls": recipe_as_data(recipe(plan, caps)),
            "trtexec": {"argv": cmd.argv, "notes": cmd.notes},
        }
        path = _out_root(bundle) / "reports" / f"engine-plan-{target}.json"
        atomic_write_json(path, report)
        written.append(path)
        lines += describe_plan(plan)
        lines.append(f"plan report: {path}")
    if request.print_trtexec:
        lines.append(f"# trtexec equivalent for TensorRT {caps.version}:")
        lines.append(cmd.text())
        lines += [f"# note: {n}" for n in cmd.notes]
    return BuildEngineOutcome(lines, plan, written)


def _dla_report(bundle: Bundle, plan: EnginePlan) -> BuildEngineOutcome:
    profile = plan.profiles[0]
    shape = profile.shapes(plan.layout)["opt"]
    lowered = plan.precision_path == PATH_LEGACY and bool(plan.builder_flags)
    report = dla.analyse(plan.source, shape, plan.precision, static_shapes=all(p.is_static for p in plan.profiles), flags_lower_fp32=lowered)
    path = _out_root(bundle) / "reports" / f"dla-{plan.precision}.json"
    atomic_write_json(path, {**report.to_dict(), "profiles": plan.to_dict()["profiles"]})
    return BuildEngineOutcome(report.summary_lines() + [f"report: {path}"], plan, [path])


def _build(bundle: Bundle, plan: EnginePlan, trt: Any) -> BuildEngineOutcome:
    from .builder import build, create_builder, npy_batches

    logger = trt.Logger(trt.Logger.WARNING)
    builder = create_builder(trt, logger)  # no usable GPU: one clear line, before anything else
    try:
        device = fingerprint.query_device()
    except MissingDependencyError as exc:
        raise MissingDependencyError(f"{exc} (cuda-python describes the GPU for engine.json)") from None
    caps = capabilities_of(trt)
    target = plan.target or plan.default_target(device.slug)
    plan = plan.with_target(target)

    cache_bytes = timing_cache.load(plan.timing_cache, device, caps.version) if plan.timing_cache else None
    batches = None
    if plan.calibration and plan.calibration.get("data"):
        p0 = plan.profiles[0]
        batches = npy_batches(plan.calibration["data"], plan.calibration["batch"], p0.height[1], p0.width[1], plan.channels)
    result = build(plan, trt, cache_bytes, batches, logger=logger, builder=builder)

    cache_sha = None
    if plan.timing_cache and result.timing_cache is not None:
        cache_sha = timing_cache.save(plan.timing_cache, result.timing_cache, device, caps.version)
    engine_dir = _out_root(bundle) / "engines" / target
    plan_sha = sha256_bytes(result.plan_bytes)
    cmd = trtexec_command(plan, caps, engine_dir / fingerprint.PLAN_FILE)
    fp = fingerprint.make_fingerprint(
        plan, device, caps.version, plan_sha, len(result.plan_bytes), result.seconds, cache_sha,
        extra={"target": target, "dla_layers": result.dla_layers, "trtexec": cmd.argv},
    )
    with staged_directory(engine_dir) as staging:
        atomic_write_bytes(staging / fingerprint.PLAN_FILE, result.plan_bytes)
        atomic_write_json(staging / fingerprint.FINGERPRINT_FILE, fp)
    record = {
        "dir": f"engines/{target}",
        "plan_sha256": plan_sha,
        "source_sha256": plan.source_sha256,
        "source_precision": plan.source_precision,
        "precision": plan.precision,
        "precision_path": plan.precision_path,
        "tensorrt": caps.version,
        "gpu_name": device.gpu_name,
        "compute_capability": device.compute_capability,
        "jetpack": device.jetpack,
        "profiles": fp["profiles"],
        "dla_core": plan.dla_core,
        "built_at": fp["built_at"],
    }
    lines = [
        f"engine: {engine_dir / fingerprint.PLAN_FILE} ({len(result.plan_bytes) / 1e6:.1f} MB, built in {result.seconds:.1f} s)",
        f"  for {device.gpu_name} (compute capability {device.compute_capability}) with TensorRT {caps.version}, "
        f"{plan.precision} via {plan.precision_path}",
    ]
    if result.dla_layers:
        d = result.dla_layers
        lines.append(f"  DLA: TensorRT places {d['dla_capable']} of {d['layers']} layers on DLA; {len(d['gpu_only'])} run on the GPU")
    if bundle.bare_onnx is None:
        bundle.manifest.setdefault("engines", {})[target] = record
        bundle.save()
    else:
        lines.append("  (bare ONNX input: the engine is not recorded in a manifest)")
    return BuildEngineOutcome(lines, plan, [engine_dir / fingerprint.PLAN_FILE, engine_dir / fingerprint.FINGERPRINT_FILE], record)
