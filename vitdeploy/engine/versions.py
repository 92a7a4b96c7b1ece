"""Which TensorRT this is, and what its API offers.

TensorRT changed its build API three times in the range vitdeploy supports (8.5/8.6 on JetPack 5.1/6.0,
10.x on JetPack 6.1+ and servers, 11.x on servers):

- 10.0 made explicit batch the default (``EXPLICIT_BATCH`` deprecated, removed in 11) and added
  strongly typed networks (``NetworkDefinitionCreationFlag.STRONGLY_TYPED``);
- 10.1 replaced ``OnnxParser.supports_model`` by ``supports_model_v2`` (the old one is gone in 11);
- 11.0 removed the weakly typed precision path: no ``BuilderFlag.FP16/INT8``, no
  ``IInt8EntropyCalibrator2``, networks are always strongly typed.

Every such difference is one row of ``_FEATURES``: the version range where it exists and the API name
that proves it. ``capabilities_for(version)`` answers from the number alone (for ``--trt-version``
and dry runs, no TensorRT needed); ``capabilities_of(trt)`` probes a live module. The tests run both
against the real Python bindings of 8.6.1, 10.3, 10.13, 10.16 and 11.4 and require them to agree.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from types import ModuleType
from typing import Any

from ..errors import UserError

# Majors vitdeploy knows how to drive. 9.x was an LLM-only preview release and never shipped on Jetson.
SUPPORTED_MAJORS = (8, 10, 11)


@dataclass(frozen=True, order=True)
class TrtVersion:
    major: int
    minor: int
    patch: int = 0
    build: int = 0

    @classmethod
    def parse(cls, text: str) -> "TrtVersion":
        match = re.fullmatch(r"\s*(\d+)\.(\d+)(?:\.(\d+))?(?:\.(\d+))?(?:[.+-]\w+)*\s*", str(text))
        if not match:
            raise UserError(f"TensorRT version {text!r} is not MAJOR.MINOR[.PATCH[.BUILD]] (e.g. 10.3 or 11.4.0)")
        major, minor, patch, build = (int(g) if g else 0 for g in match.groups())
        return cls(major, minor, patch, build)

    def __str__(self) -> str:
        parts = [self.major, self.minor, self.patch] + ([self.build] if self.build else [])
        return ".".join(str(p) for p in parts)

    @property
    def short(self) -> str:
        return f"{self.major}.{self.minor}"


# name -> (first version that has it, first version that no longer has it, API name that proves it).
# Bounds are (major, minor); None means open. The API name is a dotted path inside the tensorrt module.
_FEATURES: dict[str, tuple[tuple[int, int] | None, tuple[int, int] | None, str]] = {
    # Precision paths
    "strongly_typed": ((10, 0), None, "NetworkDefinitionCreationFlag.STRONGLY_TYPED"),
    "legacy_precision": (None, (11, 0), "BuilderFlag.FP16"),
    "int8_calibrator": (None, (11, 0), "IInt8EntropyCalibrator2"),
    # Network creation: EXPLICIT_BATCH is required before 10, a deprecated no-op in 10, gone in 11.
    "explicit_batch_flag": (None, (11, 0), "NetworkDefinitionCreationFlag.EXPLICIT_BATCH"),
    # ONNX parser support query
    "supports_model_v2": ((10, 1), None, "OnnxParser.supports_model_v2"),
    "supports_model_v1": (None, (11, 0), "OnnxParser.supports_model"),
    # Builder config knobs
    "builder_optimization_level": ((8, 6), None, "IBuilderConfig.builder_optimization_level"),
    "hardware_compatibility": ((8, 6), None, "HardwareCompatibilityLevel.AMPERE_PLUS"),
    "same_compute_capability": ((10, 9), None, "HardwareCompatibilityLevel.SAME_COMPUTE_CAPABILITY"),
    "version_compatible": ((8, 6), None, "BuilderFlag.VERSION_COMPATIBLE"),
    "platform_has_fast_fp16": (None, (11, 0), "Builder.platform_has_fast_fp16"),
    # Engines that travel: weight-stripped plans refitted from the ONNX weights on the device (10.0+),
    # version-compatible plans that carry their lean runtime unless it is excluded (8.6+).
    "strip_plan": ((10, 0), None, "BuilderFlag.STRIP_PLAN"),
    "refit_identical": ((10, 0), None, "BuilderFlag.REFIT_IDENTICAL"),
    "refit": (None, None, "BuilderFlag.REFIT"),
    "onnx_parser_refitter": ((10, 0), None, "OnnxParserRefitter"),
    "exclude_lean_runtime": ((8, 6), None, "BuilderFlag.EXCLUDE_LEAN_RUNTIME"),
    "engine_host_code": ((8, 6), None, "Runtime.engine_host_code_allowed"),
    # SerializationFlag.INCLUDE_REFIT (10.14 release notes): re-serialising a refitted stripped engine keeps it refittable
    "serialize_include_refit": ((10, 14), None, "SerializationFlag.INCLUDE_REFIT"),
    # Per-layer information of a built engine (what trtexec --exportLayerInfo writes)
    "engine_inspector": (None, None, "ICudaEngine.create_engine_inspector"),
}

# Facts about the trtexec of each version (not visible in the Python module).
_TRTEXEC: dict[str, tuple[tuple[int, int] | None, tuple[int, int] | None]] = {
    # --profile=N to give several optimisation profiles (trtexec 8.x builds exactly one)
    "trtexec_profiles": ((9, 0), None),
    # --stronglyTyped: a real flag in 10.x, a deprecated no-op in 11 (strong typing is the default)
    "trtexec_strongly_typed_flag": ((10, 0), (11, 0)),
    # --fp16/--int8/--best/--calib exist up to 10.x
    "trtexec_precision_flags": (None, (11, 0)),
    # --skipInference (8.6+); trtexec 8.5 has --buildOnly instead (sampleOptions.cpp, release/8.5 vs 8.6)
    "trtexec_skip_inference": ((8, 6), None),
    # --stripWeights (10.0+: sampleOptions.cpp v10.0.0..release/11.1; absent in v8.6.1), --refitFromOnnx (v10.14+)
    "trtexec_strip_weights": ((10, 0), None),
    "trtexec_refit_from_onnx": ((10, 14), None),
    # --noDataTransfers/--useSpinWait/--useCudaGraph/--separateProfileRun became deprecated no-ops (the defaults) in 11.0
    "trtexec_timing_defaults": ((11, 0), None),
}


def _in_range(version: TrtVersion, lo: tuple[int, int] | None, hi: tuple[int, int] | None) -> bool:
    key = (version.major, version.minor)
    return (lo is None or key >= lo) and (hi is None or key < hi)


@dataclass(frozen=True)
class Capabilities:
    """What one TensorRT version can do, as plain booleans (recorded in plans and reports)."""

    version: str
    strongly_typed: bool
    legacy_precision: bool
    int8_calibrator: bool
    explicit_batch_flag: bool
    supports_model_v2: bool
    supports_model_v1: bool
    builder_optimization_level: bool
    hardware_compatibility: bool
    same_compute_capability: bool
    version_compatible: bool
    platform_has_fast_fp16: bool
    trtexec_profiles: bool
    trtexec_strongly_typed_flag: bool
    trtexec_precision_flags: bool
    trtexec_skip_inference: bool = True
    strip_plan: bool = False
    refit_identical: bool = False
    refit: bool = True
    onnx_parser_refitter: bool = False
    exclude_lean_runtime: bool = False
    engine_host_code: bool = False
    serialize_include_refit: bool = False
    engine_inspector: bool = True
    trtexec_strip_weights: bool = False
    trtexec_refit_from_onnx: bool = False
    trtexec_timing_defaults: bool = False

    @property
    def trt_version(self) -> TrtVersion:
        return TrtVersion.parse(self.version)

    @property
    def always_strongly_typed(self) -> bool:
        """11+: every network is strongly typed; there is no flag to ask for it."""
        return self.strongly_typed and not self.legacy_precision

    @property
    def explicit_batch_required(self) -> bool:
        """Before 10 the ONNX parser needs an explicit-batch network, which is not the default."""
        return self.trt_version.major < 10

    @property
    def api_features(self) -> dict[str, bool]:
        return {name: getattr(self, name) for name in _FEATURES}

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def check_supported(version: TrtVersion) -> None:
    if version.major not in SUPPORTED_MAJORS or (version.major == 8 and version.minor < 5):
        raise UserError(
            f"TensorRT {version} is not supported; vitdeploy builds with TensorRT 8.5/8.6 (JetPack 5.1/6.0), "
            "10.x (JetPack 6.1+, servers) and 11.x"
        )


def capabilities_for(version: str | TrtVersion) -> Capabilities:
    """Capabilities from the version number alone (no TensorRT import)."""
    v = version if isinstance(version, TrtVersion) else TrtVersion.parse(version)
    check_supported(v)
    flags = {name: _in_range(v, lo, hi) for name, (lo, hi, _) in _FEATURES.items()}
    flags.update({name: _in_range(v, lo, hi) for name, (lo, hi) in _TRTEXEC.items()})
    return Capabilities(version=str(v), **flags)


def resolve(trt: ModuleType, path: str) -> Any:
    """``resolve(trt, "BuilderFlag.FP16")`` -> the object, or raise AttributeError naming the path."""
    obj: Any = trt
    for part in path.split("."):
        if not hasattr(obj, part):
            raise AttributeError(f"tensorrt {getattr(trt, '__version__', '?')} has no {path}")
        obj = getattr(obj, part)
    return obj


def has(trt: ModuleType, path: str) -> bool:
    try:
        resolve(trt, path)
    except AttributeError:
        return False
    return True


def capabilities_of(trt: ModuleType) -> Capabilities:
    """Capabilities probed on a live tensorrt module; trtexec facts follow its version number."""
    version = TrtVersion.parse(trt.__version__)
    check_supported(version)
    flags = {name: has(trt, path) for name, (_, _, path) in _FEATURES.items()}
    flags.update({name: _in_range(version, lo, hi) for name, (lo, hi) in _TRTEXEC.items()})
    return Capabilities(version=str(version), **flags)


def feature_api_names() -> dict[str, str]:
    """feature -> the API name that proves it (for tests and docs)."""
    return {name: path for name, (_, _, path) in _FEATURES.items()}


def import_tensorrt(purpose: str = "building TensorRT engines") -> ModuleType:
    """The installed tensorrt module, or one line saying what to install."""
    from ..lazy import require

    return require("tensorrt", purpose)


def installed_version() -> TrtVersion | None:
    """The installed TensorRT's version without failing when there is none."""
    from ..lazy import available

    if not available("tensorrt"):
        return None
    import tensorrt  # noqa: PLC0415 - only reached when it imports

    return TrtVersion.parse(tensorrt.__version__)
