"""The trtexec command line that builds what a plan describes, for a given TensorRT version.

Flag names and their availability were checked against trtexec's own option parser and help text
(NVIDIA/TensorRT ``samples/common/sampleOptions.cpp`` at tags v8.6.1, v10.3.0, v10.16 and v11.1):

- ``--minShapes/--optShapes/--maxShapes=name:AxBxCxD[,name2:ExF]``: every version, every input of the
  profile in one comma-separated spec (variable-size bundles: ``images:...,valid_hw:Bx2``); several
  profiles need ``--profile=N`` before each set (9.x and later; trtexec 8.x builds one profile).
- ``--stronglyTyped``: 10.x; in 11 it is a deprecated no-op (strong typing is the default), so omitted.
- ``--fp16``, ``--int8``, ``--calib=<file>``: up to 10.x; removed in 11.
- ``--memPoolSize=workspace:<size>`` (MiB when no suffix), ``--builderOptimizationLevel=N`` (8.6+),
  ``--timingCacheFile=<file>``, ``--hardwareCompatibilityLevel=none|ampere+|sameComputeCapability``
  (8.6+; the last 10.9+), ``--versionCompatible`` (8.6+), ``--useDLACore=N``, ``--allowGPUFallback``,
  ``--saveEngine=<file>``, ``--skipInference`` (build only; 8.6+: trtexec 8.5 calls it ``--buildOnly``,
  read from ``release/8.5`` and ``release/8.6`` of ``samples/common/sampleOptions.cpp``).
- ``--stripWeights`` (10.0+; refit with identical weights by default) and ``--refitFromOnnx`` (10.14+), read
  from ``sampleOptions.cpp`` at v10.0.0 .. v10.16 and release/11.1 (absent at v8.6.1 / v10.13.0 respectively).
- ``--onnx`` names the graph TensorRT parses: for 8.x the bundle graph lowered to opset 17
  (``EnginePlan.onnx_path``, see ``lowering``).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from pathlib import Path

from .. import precisions
from . import knobs, portable
from .plan import PATH_LEGACY, PATH_STRONGLY_TYPED, EnginePlan
from .versions import Capabilities


@dataclass
class TrtexecCommand:
    argv: list[str]
    notes: list[str] = field(default_factory=list)

    def text(self, multiline: bool = True) -> str:
        quoted = [shlex.quote(a) for a in self.argv]
        if not multiline:
            return " ".join(quoted)
        return " \\\n    ".join(quoted)


def _dims(shape: tuple[int, ...]) -> str:
    return "x".join(str(d) for d in shape)


def trtexec_command(plan: EnginePlan, caps: Capabilities, engine_path: str | Path | None = None) -> TrtexecCommand:
    """The trtexec invocation equivalent to ``plan`` for the TensorRT ``caps`` describe."""
    argv = ["trtexec", f"--onnx={plan.onnx_path}"]
    notes: list[str] = []

    profiles = list(plan.profiles)
    if len(profiles) > 1 and not caps.trtexec_profiles:
        notes.append(
            f"trtexec {caps.trt_version.short} builds a single optimisation profile; this line builds profile 0 of "
            f"{len(profiles)} (vitdeploy build-engine builds them all)"
        )
        profiles = profiles[:1]
    for index, profile in enumerate(profiles):
        if len(profiles) > 1:
            argv.append(f"--profile={index}")
        # every input of the profile in one flag, as trtexec reads it: --minShapes=images:1x48x48x3,valid_hw:1x2
        shapes = plan.input_shapes(profile)
        for key, flag in (("min", "--minShapes"), ("opt", "--optShapes"), ("max", "--maxShapes")):
            argv.append(f"{flag}=" + ",".join(f"{name}:{_dims(s[key])}" for name, s in shapes.items()))

    if plan.precision_path == PATH_STRONGLY_TYPED:
        if caps.trtexec_strongly_typed_flag:
            argv.append("--stronglyTyped")
        # 11.x: strongly typed is the only mode; no flag.
    else:
        if not caps.trtexec_precision_flags:
            raise ValueError(f"plan path {plan.precision_path} cannot be expressed for trtexec {caps.version}")
        entry = precisions.get(plan.precision)
        argv += entry.trtexec_flags((caps.trt_version.major, caps.trt_version.minor))
        if plan.precision_path == PATH_LEGACY and entry.legacy_needs_calibration:
            cache = (plan.calibration or {}).get("cache")
            if cache:
                argv.append(f"--calib={cache}")
                notes.append("trtexec only reads a calibration cache; write it first with vitdeploy's calibrator (build-engine --legacy-precision --calib-data ...)")
            else:
                notes.append("trtexec cannot run the entropy calibrator: without --calib it uses placeholder INT8 scales; build with vitdeploy or give --calib-cache")

    argv += knobs.trtexec_flags(plan, caps)  # workspace, opt level, timing cache, compatibility, strip, DLA ...
    if engine_path is None:
        engine_path = f"engines/{plan.target or plan.default_target()}/model.plan"
    argv.append(f"--saveEngine={engine_path}")
    # trtexec 8.5 names it --buildOnly; 8.6 renamed it --skipInference (the old name warns, then is gone)
    argv.append("--skipInference" if caps.trtexec_skip_inference else "--buildOnly")
    for extra in plan.extra_inputs:
        notes.append(
            f"timing the engine with trtexec --loadEngine: give {extra.name} values with --loadInputs={extra.name}:FILE (raw "
            f"{extra.dtype}, [batch, {', '.join(str(d) for d in extra.dims)}]); trtexec's random {extra.dtype} data is clamped by the "
            "graph to [1 patch, canvas] and times no chosen fill (vitdeploy profile --fill does)"
        )
    if plan.strip_weights:
        refit = portable.trtexec_refit_line(engine_path, plan.onnx_path, caps)
        notes.append(f"weight-stripped: refit on the device with `{refit}`" if refit else
                     f"weight-stripped: trtexec {caps.version} has no --refitFromOnnx (10.14+); vitdeploy's runtime refits it")
    return TrtexecCommand(argv, notes)


def layer_profile_command(engine_path: str | Path, shapes: dict[str, tuple[int, ...]], out_dir: str | Path, caps: Capabilities,
                          refit_onnx: str | Path | None = None, warmup_ms: int = 500, duration_s: int = 10) -> list[str]:
    """trtexec per-layer profile of a built engine: --exportProfile (per-layer times) and --exportLayerInfo
    (per-layer ONNX origins; detailed only when the engine was built with ProfilingVerbosity.DETAILED, i.e.
    ``build-engine --profile-layers``). 10.x times on the device without host copies, spinning, through a CUDA
    graph and in a separate profiling run; 11.x does all of that by default and deprecates the flags
    (sampleOptions.cpp, release/11.0 and release/11.1)."""
    out = Path(out_dir)
    argv = ["trtexec", f"--loadEngine={engine_path}",
            "--shapes=" + ",".join(f"{name}:{_dims(shape)}" for name, shape in shapes.items()),
            f"--warmUp={warmup_ms}", f"--duration={duration_s}", "--dumpProfile",
            f"--exportProfile={out / 'layer-profile.json'}", f"--exportLayerInfo={out / 'layer-info.json'}",
            "--profilingVerbosity=detailed"]
    if not caps.trtexec_timing_defaults:
        argv += ["--separateProfileRun", "--noDataTransfers", "--useSpinWait", "--useCudaGraph"]
    if refit_onnx is not None:
        if not caps.trtexec_refit_from_onnx:
            raise ValueError(f"trtexec {caps.version} cannot refit a weight-stripped engine (--refitFromOnnx is 10.14+)")
        argv.append(f"--refitFromOnnx={refit_onnx}")
    return argv
