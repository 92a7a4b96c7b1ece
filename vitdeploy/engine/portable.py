"""Engines that travel: weight-stripped plans refitted on the device, version- and hardware-compatible plans.

- ``--strip-weights`` (TensorRT 10.0+): the builder sets ``BuilderFlag.STRIP_PLAN`` with
  ``BuilderFlag.REFIT_IDENTICAL``, so the plan holds no refittable weights and builds at the speed of a
  non-refittable engine, on the promise that the weights given at refit are the build's own. The weights
  are the bundle's ONNX graph (the one TensorRT parsed), which travels anyway: ``engine.json`` records
  its file and sha256, and the runtime refuses to refit from a graph whose sha256 differs, then refits
  with ``OnnxParserRefitter.refit_from_file`` + ``Refitter.refit_cuda_engine`` before the first call.
  ``REFIT_IDENTICAL`` rather than ``REFIT``: the weights *are* identical (same graph, same hash), and
  ``REFIT`` keeps refittable weights out of fusions for nothing (NvInfer.h, BuilderFlag::kREFIT_IDENTICAL:
  "the resulting engine will have the same performance as a non-refittable one").
- ``--version-compatible`` (8.6+): the plan runs on later TensorRT of the same major; it embeds the
  lean runtime, so the runtime sets ``engine_host_code_allowed`` before deserialising it.
- ``--hardware-compatible ampere+|same-cc`` (8.6+ / 10.9+): other GPUs of that level; plans still do
  not cross platforms (a Jetson plan does not run on x86: "Serialized engines are not portable across
  platforms", TensorRT support matrix).

Nothing here was run on a GPU: the API names are checked against the real bindings of every version the
tests install (tests/test_engine_bindings.py); refitting itself needs a device.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from types import ModuleType
from typing import Any

from ..errors import ConfigError, DeviceError, UserError
from .versions import Capabilities

# The TensorRT names the refit path calls (checked against the real bindings).
REFIT_API = (
    "Refitter",
    "Refitter.refit_cuda_engine",
    "Refitter.get_missing_weights",
    "OnnxParserRefitter",
    "OnnxParserRefitter.refit_from_file",
    "OnnxParserRefitter.num_errors",
    "OnnxParserRefitter.get_error",
)
STRIP_FLAGS = ("STRIP_PLAN", "REFIT_IDENTICAL")


def apply(plan: Any, options: Any, caps: Capabilities) -> Any:
    """``plan`` with the portability options validated against ``caps``, and what they imply noted."""
    notes = list(plan.notes)
    if getattr(options, "strip_weights", False):
        if not (caps.strip_plan and caps.refit_identical):
            raise ConfigError(f"--strip-weights needs TensorRT >= 10.0 (BuilderFlag.STRIP_PLAN + REFIT_IDENTICAL); TensorRT "
                              f"{caps.version} has no weight-stripped plans: drop --strip-weights")
        if plan.dla_core is not None:
            raise ConfigError("--strip-weights is for GPU engines: DLA loadables are not refitted; drop one of --strip-weights, --dla-core")
        notes.append(f"weight-stripped plan (STRIP_PLAN + REFIT_IDENTICAL): the runtime refits it from {Path(plan.onnx_path).name} "
                     "(sha256 in engine.json) before the first call; ship that graph with the engine")
        plan = replace(plan, strip_weights=True)
    if getattr(options, "profile_layers", False):
        plan = replace(plan, profile_layers=True)
        notes.append("built with ProfilingVerbosity.DETAILED so trtexec --exportLayerInfo names each layer's ONNX nodes, "
                     "tactic and formats (per-layer profile: `vitdeploy profile BUNDLE --layers`)")
    if plan.version_compatible:
        notes.append("version-compatible plan: runs on later TensorRT "
                     f"{caps.trt_version.major}.x; it embeds the lean runtime (the runtime allows engine host code to load it)")
    if plan.hardware_compatibility != "none":
        notes.append(f"hardware-compatible ({plan.hardware_compatibility}) plan: other GPUs of that level, same platform and "
                     "TensorRT only (serialized engines are not portable across platforms)")
    return replace(plan, notes=tuple(notes))


def recipe_flags(plan: Any) -> tuple[str, ...]:
    """BuilderFlag names the portability options add to a build."""
    return STRIP_FLAGS if plan.strip_weights else ()


def refit_source(plan: Any) -> dict[str, Any] | None:
    """What engine.json records for a stripped engine: the graph to refit from and its hash."""
    if not plan.strip_weights:
        return None
    sha = plan.parse_graph_sha256 if plan.parse_graph else plan.source_sha256
    return {"file": Path(plan.onnx_path).name, "sha256": sha, "mode": "identical",
            "api": "OnnxParserRefitter.refit_from_file + Refitter.refit_cuda_engine"}


def refit_graph(engine_dir: str | Path, record: dict[str, Any]) -> Path:
    """The ONNX graph a stripped engine refits from, after checking it is the one the build used.

    Looked for beside the bundle that holds ``engines/<target>/`` (the usual place), then in the engine
    folder itself (an engine shipped with its graph)."""
    from ..fileio import sha256_file

    source = record.get("refit") or {}
    name, want = source.get("file"), source.get("sha256")
    if not name or not want:
        raise UserError(f"engine {engine_dir} is weight-stripped but engine.json names no refit graph; rebuild the engine")
    engine_dir = Path(engine_dir)
    for candidate in (engine_dir.parent.parent / name, engine_dir / name):
        if candidate.is_file():
            if sha256_file(candidate) != want:
                raise UserError(f"{candidate} is not the graph engine {engine_dir} was stripped from (sha256 differs); "
                                "refitting other weights into a REFIT_IDENTICAL plan is undefined: rebuild the engine")
            return candidate
    raise UserError(f"engine {engine_dir} is weight-stripped and its weights ({name}) are not beside it; copy the bundle's "
                    f"{name} next to engines/ or into {engine_dir}")


def refit_engine(trt: ModuleType, engine: Any, graph: Path, logger: Any) -> None:
    """Fill a stripped engine with the weights of ``graph`` (TensorRT 10+); raise DeviceError on failure."""
    refitter = trt.Refitter(engine, logger)
    parser_refitter = trt.OnnxParserRefitter(refitter, logger)
    if not parser_refitter.refit_from_file(str(graph)):
        errors = [str(parser_refitter.get_error(i).desc()) for i in range(parser_refitter.num_errors)]
        raise DeviceError(f"TensorRT could not read the weights of {graph} for refitting: {'; '.join(errors) or 'no message'}")
    if not refitter.refit_cuda_engine():
        missing = refitter.get_missing_weights()
        raise DeviceError(f"TensorRT refit of {graph.name} failed" + (f"; missing weights: {', '.join(missing[:5])}" if missing else ""))


def trtexec_flags(plan: Any, caps: Capabilities) -> list[str]:
    """trtexec options for the portability choices (sampleOptions.cpp: --stripWeights 10.0+)."""
    if not plan.strip_weights:
        return []
    if not caps.trtexec_strip_weights:
        raise ValueError(f"trtexec {caps.version} has no --stripWeights")
    return ["--stripWeights"]  # refit with identical weights is its default (trtexec help, v10.16)


def trtexec_refit_line(engine_path: str | Path, graph: str | Path, caps: Capabilities) -> str | None:
    """The trtexec line that loads a stripped engine and refits it from the ONNX graph (10.14+)."""
    if not caps.trtexec_refit_from_onnx:
        return None
    return f"trtexec --loadEngine={engine_path} --refitFromOnnx={graph}"
