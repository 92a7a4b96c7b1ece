"""`vitdeploy build-engine` as one library call: plan, then report, print, or build.

Modes (the CLI picks one):

- ``lint``: only the parse lint of the graph the plan would compile, against the target TensorRT's
  parser rules (``parser_rules``, ``lint``); writes nothing;
- ``dla_report``: the DLA feasibility report of the planned graph and shape (no TensorRT, no GPU);
- ``dry_run``: validate the plan, write ``reports/engine-plan-<target>.json`` (plan, capabilities,
  the exact TensorRT calls, the trtexec line), no TensorRT needed: without ``trt_version`` (and none
  installed) it plans for ``PLAN_DEFAULT_TRT``, the newest TensorRT vitdeploy knows, and says so;
- ``print_trtexec`` alone: only print the equivalent trtexec command;
- otherwise build on this machine's GPU and write ``engines/<target>/model.plan`` + ``engine.json``
  (staged, then swapped in), and record the engine in the bundle's manifest.

Every mode but ``lint`` first settles the graph TensorRT will parse: the bundle's graph when the
target's parser reads it, else (TensorRT 8.x) that graph lowered to opset 17 by ``lowering``,
verified against it with ONNX Runtime and stored in the bundle; a graph with nodes the target cannot
parse and the lowering cannot rewrite is listed by a dry run and refused by a build, before TensorRT.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..bundle import Bundle
from ..errors import ConfigError, MissingDependencyError, UserError
from ..fileio import atomic_write_bytes, atomic_write_json, sha256_bytes, staged_directory
from ..weights import weights_record
from . import dla, fingerprint, knobs, portable, targets, timing_cache
from .builder import BuildRecipe, Ref, recipe
from .lint import LintReport, lint_file
from .parser_rules import ParserRules, rules_for
from .plan import PATH_LEGACY, EnginePlan, PlanOptions, make_plan
from .trtexec import trtexec_command
from .versions import Capabilities, TrtVersion, capabilities_for, capabilities_of, installed_version

# JetPack 6.1/6.2's TensorRT: the DLA report's default when no TensorRT is installed or named.
DLA_REPORT_DEFAULT_TRT = "10.3"
# A plan (--dry-run, --print-trtexec, --lint) with no TensorRT installed or named: the newest TensorRT
# whose API and ONNX parser vitdeploy knows (engine/versions.py, engine/parser_rules.py); the plan says so.
PLAN_DEFAULT_TRT = "11.4"


@dataclass
class BuildEngineRequest:
    bundle: str | Path
    options: PlanOptions = field(default_factory=PlanOptions)
    trt_version: str | None = None
    dry_run: bool = False
    print_trtexec: bool = False
    dla_report: bool = False
    lint: bool = False


@dataclass
class BuildEngineOutcome:
    lines: list[str]
    plan: EnginePlan | None = None
    written: list[Path] = field(default_factory=list)
    record: dict[str, Any] | None = None
    exit_code: int = 0
    lint: LintReport | None = None


def _no_tensorrt_message() -> str:
    return (
        "TensorRT is not installed here; engines are built on the target device (JetPack ships TensorRT; on a server: "
        "pip install tensorrt cuda-python). Here, plan with --dry-run --trt-version X (e.g. 10.3 for JetPack 6.1/6.2)"
    )


def _target_version(request: BuildEngineRequest, target: Any) -> BuildEngineRequest:
    """A Jetson target fixes the TensorRT to plan for; a --trt-version that disagrees is refused."""
    if target is None:
        return request
    wanted = TrtVersion.parse(target.trt_version)
    if request.trt_version:
        given = TrtVersion.parse(request.trt_version)
        if (given.major, given.minor) != (wanted.major, wanted.minor):
            raise UserError(f"--target {target.name} ships TensorRT {wanted} but --trt-version {given} was given; drop one of them")
        return request
    return replace(request, trt_version=target.trt_version)


def _capabilities(request: BuildEngineRequest, need_live: bool) -> tuple[Capabilities, Any]:
    """Capabilities of the named or installed TensorRT, and the live module when a build needs it."""
    installed = installed_version()
    if request.trt_version:
        wanted = TrtVersion.parse(request.trt_version)
        if need_live:
            if installed is None:
                raise MissingDependencyError(_no_tensorrt_message())
            if (installed.major, installed.minor) != (wanted.major, wanted.minor):
                raise UserError(f"--trt-version/--target means TensorRT {wanted} but TensorRT {installed} is installed; a build uses "
                                "the installed one (drop --trt-version, or build with the target's TensorRT)")
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


def run(request: BuildEngineRequest, log: Any = None) -> BuildEngineOutcome:
    """Plan, then lint / report / print / build. ``log`` gets progress lines as they happen."""
    bundle = Bundle.open(request.bundle)  # variable-size bundles too: profiles shape (images, valid_hw) from one batch range
    building = not (request.dry_run or request.dla_report or request.print_trtexec or request.lint)
    options = request.options
    target = targets.resolve(options.target) if targets.is_target_name(options.target) else None
    target_notes = targets.check_dla(target, options.dla_core) if target is not None else []
    if target is not None:
        targets.check_portability(target, options.hardware_compatibility)
    if target is not None and request.dla_report and target.module is not None and not target.dla_cores:
        raise ConfigError(f"{target.module.name} on JetPack {target.release.jetpack} has no usable DLA: every layer runs on the GPU; "
                          "--dla-report is for targets with DLA (see `vitdeploy targets`)")
    request = _target_version(request, target)
    default_note = None
    if not building and not request.dla_report and not request.trt_version and installed_version() is None:
        request = replace(request, trt_version=PLAN_DEFAULT_TRT)
        default_note = (f"no TensorRT installed here and none named: planned for TensorRT {PLAN_DEFAULT_TRT}, the newest release "
                        "vitdeploy knows (--trt-version X or --target NAME plans for another)")
    if request.dla_report and not options.batch and options.dla_core is None:
        options = replace(options, batch=("1",))  # the report is about static DLA shapes by default
    caps, trt = _capabilities(request, need_live=building)
    made: list[str] = []
    if not request.lint:
        made = _make_missing_fp16(bundle, options, log)
    from .fp8_target import parse_cc

    cc = parse_cc(target.module.compute_capability) if target is not None and target.module is not None else None
    plan = portable.apply(make_plan(bundle, options, caps, cc), options, caps)
    if target is not None:
        relevant = ("tensorrt", "compute_capability") + (("dla_cores",) if options.dla_core is not None or request.dla_report else ())
        target_notes += [f"not confirmed by a stored source: {u}" for u in target.unconfirmed(relevant)]
        plan = replace(plan, device_target=_target_record(target), notes=plan.notes + tuple(target_notes))
    if default_note:
        plan = replace(plan, notes=plan.notes + (default_note,))
    rules = rules_for(caps.version)
    if request.lint:
        linted = _lint_only(bundle, plan, rules)
        linted.lines[:0] = [default_note] if default_note else []
        return linted
    plan, report = parse_graph(bundle, plan, rules, log)
    if building and report.findings:
        first = (report.blocking or report.findings)[0]
        raise UserError(
            f"TensorRT {caps.version} cannot parse {Path(report.graph).name}: {len(report.findings)} node(s), e.g. {first.line()} "
            "(see build-engine --lint); nothing was built"
        )
    if request.dla_report:
        outcome = _dla_report(bundle, plan)
    elif not building:
        outcome = _plan_only(bundle, plan, caps, request, report)
    else:
        outcome = _build(bundle, plan, trt)
    outcome.lines[:0] = made
    outcome.lint = report
    return outcome


def _target_record(target: Any) -> dict[str, Any]:
    """What a plan (and engine.json) records of the Jetson target it was made for."""
    r, m = target.release, target.module
    return {"name": target.name, "jetpack": r.jetpack, "l4t": list(r.l4t), "cuda": r.cuda, "tensorrt": r.tensorrt,
            "module": m.key if m else None, "compute_capability": m.compute_capability if m else None,
            "dla_cores": target.dla_cores, "unconfirmed": target.unconfirmed()}


def _make_missing_fp16(bundle: Bundle, options: PlanOptions, log: Any) -> list[str]:
    """``--precision fp16`` on a bundle without its fp16 graph: make it with the fp16 pass, as
    trtexec users expect ``--fp16`` to just work (the legacy path builds the fp32 graph with flags)."""
    if options.precision != "fp16" or options.legacy_precision or bundle.bare_onnx is not None or "fp16" in bundle.precisions():
        return []
    if "fp32" not in bundle.precisions():
        return []  # make_plan says what is missing
    from ..lazy import available, install_hint

    if not available("onnxconverter_common"):  # the fp16 pass is ONNX-only: no torch needed
        raise MissingDependencyError(
            f"bundle {bundle.root} has no fp16 graph and making it needs onnxconverter-common: {install_hint('onnxconverter_common')}"
        )
    from ..exporters.fp16 import add_fp16_to_bundle

    line = f"bundle {bundle.root} has no fp16 graph: making model.fp16.onnx with the fp16 pass (LayerNorm/Softmax kept fp32)"
    if log:
        log(line)
    path = add_fp16_to_bundle(bundle, log=log)  # range pass + gate: a graph that fails is not written
    return [] if log else [line, f"  wrote {path}"]


def parse_graph(bundle: Bundle, plan: EnginePlan, rules: ParserRules, log: Any = None) -> tuple[EnginePlan, LintReport]:
    """The plan pointed at the graph the target's parser reads, and the lint of that graph.

    When the bundle graph has findings the lowering rewrites (8.x: opset, Gelu, LayerNormalization
    on 8.5), the lowered graph is made (or reused) and the plan's ``parse_graph`` names it; the
    returned lint is then the lowered graph's (empty when every finding was lowerable).
    """
    from .lowering import bundle_graph

    report = lint_file(plan.source, rules)
    if not report.findings or report.blocking or not rules.needs_lowering:
        return plan, report
    path, record = bundle_graph(bundle, plan.source, plan.source_precision, rules, log)
    lowered_report = lint_file(path, rules)
    rewrites = ", ".join(f"{what} x{n}" for what, n in record["rewrites"].items())
    note = (f"TensorRT {rules.key}'s parser cannot read {Path(plan.source).name} ({', '.join(report.by_rule())}); "
            f"it parses {path.name}: {rewrites}; verified against the bundle graph with ONNX Runtime")
    lowering = {k: v for k, v in record.items() if k != "verification"}
    lowering["verified"] = bool(record.get("verification", {}).get("passed"))
    plan = replace(plan, parse_graph=str(path), parse_graph_sha256=record["sha256"], lowering=lowering, notes=plan.notes + (note,))
    return plan, lowered_report


def _lint_only(bundle: Bundle, plan: EnginePlan, rules: ParserRules) -> BuildEngineOutcome:
    """The parse lint of the bundle graph the plan compiles, and of its lowered graph when one is stored."""
    from .lowering import lowered_name

    report = lint_file(plan.source, rules)
    lines = report.lines()
    exit_code = 1 if report.blocking else 0
    if report.findings and not report.blocking:
        lowered = Path(plan.source).parent / lowered_name(Path(plan.source).name, rules.key)
        known = (bundle.manifest.get("parser_graphs") or {}).get(f"{plan.source_precision}@trt{rules.key}") or {}
        fresh = bundle.bare_onnx is not None or known.get("source_sha256") == plan.source_sha256
        if lowered.is_file() and fresh:
            low = lint_file(lowered, rules)
            lines += [f"the stored lowered graph {lowered.name}:"] + ["  " + line for line in low.lines()]
            exit_code = 1 if low.findings else 0
        else:
            lines.append(f"every finding is rewritten by the lowering for TensorRT {rules.key}: build-engine (or --dry-run) writes "
                         f"{lowered.name}, verified with ONNX Runtime, and parses that")
    return BuildEngineOutcome(lines, plan, exit_code=exit_code, lint=report)


def describe_plan(plan: EnginePlan) -> list[str]:
    lines = [
        f"plan: TensorRT {plan.trt_version}, {plan.precision} via {plan.precision_path} from {Path(plan.source).name}"
        + (f" (flags {', '.join(plan.builder_flags)})" if plan.builder_flags else ""),
    ]
    if plan.device_target:
        t = plan.device_target
        dla_text = "" if t["module"] is None else f", DLA cores {t['dla_cores']}"
        lines.append(f"  target {t['name']}: JetPack {t['jetpack']} (Jetson Linux {'/'.join(t['l4t'])}, CUDA {t['cuda']}), "
                     f"TensorRT {t['tensorrt']}" + (f", SM {t['compute_capability']}" if t["compute_capability"] else "") + dla_text)
    if plan.parse_graph:
        lines.append(f"  TensorRT parses {Path(plan.parse_graph).name} (opset {plan.lowering['opset'][1]}, lowered from {Path(plan.source).name})"
                     if plan.lowering else f"  TensorRT parses {Path(plan.parse_graph).name}")
    for i, p in enumerate(plan.profiles):
        extra = "".join(f", {name} {':'.join('x'.join(str(d) for d in s[k]) for k in ('min', 'opt', 'max'))}"
                        for name, s in plan.input_shapes(p).items() if name != plan.input_name)
        lines.append(f"  profile {i}: {p.describe()}{extra}")
    words = knobs.description(plan)
    if words:
        lines.append("  " + ", ".join(words))
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


def _plan_only(bundle: Bundle, plan: EnginePlan, caps: Capabilities, request: BuildEngineRequest, lint: LintReport) -> BuildEngineOutcome:
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
            "parse_lint": lint.to_dict(),
        }
        path = _out_root(bundle) / "reports" / f"engine-plan-{target}.json"
        atomic_write_json(path, report)
        written.append(path)
        lines += describe_plan(plan)
        lines += lint.lines()
        lines.append(f"plan report: {path}")
    if request.print_trtexec:
        lines.append(f"# trtexec equivalent for TensorRT {caps.version}:")
        lines.append(cmd.text())
        lines += [f"# note: {n}" for n in cmd.notes]
    if plan.profile_layers:
        lines.append("# then, per layer on the device (vitdeploy profile BUNDLE --layers runs it and maps layers to blocks):")
        lines.append(_layer_command(plan, caps, engine_path).text())
    # A plan whose graph the target cannot parse is not a valid plan: report it, and say so in the exit code.
    return BuildEngineOutcome(lines, plan, written, exit_code=1 if lint.findings else 0)


def _layer_command(plan: EnginePlan, caps: Capabilities, engine_path: Path) -> Any:
    from .trtexec import TrtexecCommand, layer_profile_command

    shapes = {name: s["opt"] for name, s in plan.input_shapes(plan.profiles[0]).items()}
    refit = plan.onnx_path if plan.strip_weights else None
    return TrtexecCommand(layer_profile_command(engine_path, shapes, engine_path.parent.parent.parent / "reports", caps, refit_onnx=refit))


def _dla_report(bundle: Bundle, plan: EnginePlan) -> BuildEngineOutcome:
    profile = plan.profiles[0]
    shapes = plan.input_shapes(profile)
    shape = shapes[plan.input_name]["opt"]
    others = {name: s["opt"] for name, s in shapes.items() if name != plan.input_name}  # valid_hw [B, 2]
    lowered = plan.precision_path == PATH_LEGACY and bool(plan.builder_flags)
    report = dla.analyse(plan.onnx_path, shape, plan.precision, static_shapes=all(p.is_static for p in plan.profiles), flags_lower_fp32=lowered,
                         other_inputs=others)
    path = _out_root(bundle) / "reports" / f"dla-{plan.precision}.json"
    atomic_write_json(path, {**report.to_dict(), "profiles": plan.to_dict()["profiles"]})
    return BuildEngineOutcome(report.summary_lines() + [f"report: {path}"], plan, [path])


def _parsed_graph(plan: EnginePlan) -> dict[str, Any]:
    """What engine.json records about the graph TensorRT parsed (the lowered one on 8.x)."""
    if not plan.parse_graph:
        return {"file": Path(plan.source).name, "sha256": plan.source_sha256, "lowered": False}
    return {"file": Path(plan.parse_graph).name, "sha256": plan.parse_graph_sha256, "lowered": True,
            "from": Path(plan.source).name, "lowering": plan.lowering}


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
        extra={"target": target, "dla_layers": result.dla_layers, "trtexec": cmd.argv, "parsed_graph": _parsed_graph(plan),
               "weights": weights_record(bundle.manifest.get("source"))},  # random weights say so (vitdeploy.weights)
    )
    record = {
        "dir": f"engines/{target}",
        "plan_sha256": plan_sha,
        "source_sha256": plan.source_sha256,
        "source_precision": plan.source_precision,
        "parsed_graph": _parsed_graph(plan),
        "precision": plan.precision,
        "precision_path": plan.precision_path,
        "tensorrt": caps.version,
        "gpu_name": device.gpu_name,
        "compute_capability": device.compute_capability,
        "jetpack": device.jetpack,
        "profiles": fp["profiles"],
        "dla_core": plan.dla_core,
        "strip_weights": plan.strip_weights,
        "built_at": fp["built_at"],
    }

    def record_it() -> None:  # in the same signal-free step as the folder's swap
        if bundle.bare_onnx is None:
            bundle.record_engine(target, record)

    with staged_directory(engine_dir, then=record_it) as staging:
        atomic_write_bytes(staging / fingerprint.PLAN_FILE, result.plan_bytes)
        atomic_write_json(staging / fingerprint.FINGERPRINT_FILE, fp)
    lines = [
        f"engine: {engine_dir / fingerprint.PLAN_FILE} ({len(result.plan_bytes) / 1e6:.1f} MB, built in {result.seconds:.1f} s)",
        f"  for {device.gpu_name} (compute capability {device.compute_capability}) with TensorRT {caps.version}, "
        f"{plan.precision} via {plan.precision_path}",
    ]
    if result.dla_layers:
        d = result.dla_layers
        lines.append(f"  DLA: TensorRT places {d['dla_capable']} of {d['layers']} layers on DLA; {len(d['gpu_only'])} run on the GPU")
    if bundle.bare_onnx is not None:
        lines.append("  (bare ONNX input: the engine is not recorded in a manifest)")
    if plan.profile_layers and bundle.bare_onnx is None:  # the per-layer view: run trtexec here, or say what to run
        from ..profile.layer_report import LayerRequest, run as run_layers

        layered = run_layers(LayerRequest(bundle.root, engine=target))
        lines += ["  " + line for line in layered.lines]
    return BuildEngineOutcome(lines, plan, [engine_dir / fingerprint.PLAN_FILE, engine_dir / fingerprint.FINGERPRINT_FILE], record)
