"""Apply an EnginePlan to a live TensorRT builder: the only module here that calls TensorRT's builder.

The plan is first turned into a ``BuildRecipe``: pure data naming every TensorRT enum and
IBuilderConfig member the build will use, for the version at hand (``recipe``). ``build`` then
executes the recipe on the real objects. Every TensorRT name the build touches goes through ``_api``
and must be listed in ``USED_API`` or the recipe, so the tests can check, against the real Python
bindings of each supported TensorRT version, that every one of them exists there.

TensorRT subclasses (the INT8 entropy calibrator) are created inside factory functions, so importing
this module never touches TensorRT.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Iterable, Iterator, Protocol

import numpy as np

from .. import precisions
from ..errors import CheckFailed, ConfigError, DeviceError, UserError
from ..fileio import atomic_write_bytes
from . import knobs
from .knobs import Ref, Step  # noqa: F401 - re-exported (service, tests)
from .plan import PATH_LEGACY, EnginePlan
from .versions import Capabilities, capabilities_of, resolve

# Members of TensorRT classes the build and the runtime call, beyond what a recipe names.
USED_API = (
    "Logger",
    "Logger.WARNING",
    "Builder",
    "Builder.create_network",
    "Builder.create_builder_config",
    "Builder.create_optimization_profile",
    "Builder.build_serialized_network",
    "INetworkDefinition.num_layers",
    "INetworkDefinition.get_layer",
    "OnnxParser",
    "OnnxParser.parse_from_file",
    "OnnxParser.num_errors",
    "OnnxParser.get_error",
    "IOptimizationProfile.set_shape",
    "IBuilderConfig.add_optimization_profile",
    "IBuilderConfig.create_timing_cache",
    "IBuilderConfig.set_timing_cache",
    "IBuilderConfig.get_timing_cache",
    "IBuilderConfig.can_run_on_DLA",
    "ITimingCache.serialize",
)
# supports_model_v2 (10.1+) reports unsupported node ranges through these.
SUPPORT_V2_API = ("OnnxParser.num_subgraphs", "OnnxParser.is_subgraph_supported", "OnnxParser.get_subgraph_nodes")
# What the TensorRT runner (vitdeploy.runtime.tensorrt) calls.
RUNTIME_API = (
    "Logger",
    "Logger.WARNING",
    "Runtime",
    "Runtime.deserialize_cuda_engine",
    "ICudaEngine.create_execution_context",
    "ICudaEngine.num_io_tensors",
    "ICudaEngine.get_tensor_name",
    "ICudaEngine.get_tensor_mode",
    "ICudaEngine.get_tensor_dtype",
    "ICudaEngine.get_tensor_profile_shape",
    "ICudaEngine.num_optimization_profiles",
    "IExecutionContext.set_optimization_profile_async",
    "IExecutionContext.set_input_shape",
    "IExecutionContext.get_tensor_shape",
    "IExecutionContext.set_tensor_address",
    "IExecutionContext.execute_async_v3",
    "TensorIOMode.INPUT",
    "nptype",
)
# A version-compatible plan embeds the lean runtime: the runtime must allow host code to load it (8.6+).
RUNTIME_VERSION_COMPAT_API = ("Runtime.engine_host_code_allowed",)
LEGACY_CALIBRATION_API = (
    "IInt8EntropyCalibrator2",
    "IBuilderConfig.int8_calibrator",
    "IBuilderConfig.set_calibration_profile",
)


@dataclass(frozen=True)
class BuildRecipe:
    network_flags: tuple[Ref, ...]
    config_steps: tuple[Step, ...]
    profiles: tuple[dict[str, tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]], ...]
    support_query: str  # OnnxParser member that lists unsupported nodes
    calibrator: bool = False
    notes: tuple[str, ...] = field(default=())

    def api_names(self) -> list[str]:
        """Every dotted tensorrt name this recipe needs, plus the fixed ones the build uses."""
        names = list(USED_API)
        names += [ref.path for ref in self.network_flags]
        for step in self.config_steps:
            names.append(f"IBuilderConfig.{step.member}")
            names += [a.path for a in step.args if isinstance(a, Ref)]
        names.append(f"OnnxParser.{self.support_query}")
        if self.support_query == "supports_model_v2":
            names += list(SUPPORT_V2_API)
        if self.calibrator:
            names += list(LEGACY_CALIBRATION_API)
        return sorted(set(names))


def recipe(plan: EnginePlan, caps: Capabilities) -> BuildRecipe:
    """The TensorRT calls that realise ``plan`` on the TensorRT version ``caps`` describes."""
    flags: list[Ref] = []
    if caps.explicit_batch_required:
        flags.append(Ref("NetworkDefinitionCreationFlag.EXPLICIT_BATCH"))
    if plan.precision_path == "strongly-typed":
        if not caps.strongly_typed:
            raise ConfigError(f"TensorRT {caps.version} has no strongly typed networks; this plan was made for {plan.trt_version}")
        if not caps.always_strongly_typed:  # 11+: always on, the flag is deprecated and ignored
            flags.append(Ref("NetworkDefinitionCreationFlag.STRONGLY_TYPED"))
    elif not caps.legacy_precision:
        raise ConfigError(
            f"TensorRT {caps.version} has no FP16/INT8 builder flags (removed in 11); build the strongly typed graph instead"
        )

    steps = knobs.builder_steps(plan, caps, tuple(plan.builder_flags))

    # one set_shape per graph input per profile: the images and, for variable-size bundles, valid_hw [B, 2]
    profiles = tuple(
        {name: tuple(s[k] for k in ("min", "opt", "max")) for name, s in plan.input_shapes(p).items()}  # type: ignore[misc]
        for p in plan.profiles
    )
    calibrator = plan.precision_path == PATH_LEGACY and precisions.get(plan.precision).legacy_needs_calibration
    if calibrator and not caps.int8_calibrator:
        raise ConfigError(f"TensorRT {caps.version} has no implicit INT8 calibration (removed in 11)")
    query = "supports_model_v2" if caps.supports_model_v2 else "supports_model"
    return BuildRecipe(tuple(flags), tuple(steps), profiles, query, calibrator)  # type: ignore[arg-type]


# -- applying a recipe ----------------------------------------------------------------------------
_DECLARED = frozenset(USED_API + SUPPORT_V2_API + LEGACY_CALIBRATION_API + ("OnnxParser.supports_model", "OnnxParser.supports_model_v2"))


def _api(obj: Any, name: str) -> Any:
    """``obj.<member>`` for a declared ``Class.member`` name (keeps the checked list honest)."""
    if name not in _DECLARED:
        raise AssertionError(f"{name} is used but not declared in vitdeploy.engine.builder")
    return getattr(obj, name.rsplit(".", 1)[-1])


def _api_set(obj: Any, name: str, value: Any) -> None:
    _api(obj, name)  # declared and present
    setattr(obj, name.rsplit(".", 1)[-1], value)


def apply_config(trt: ModuleType, config: Any, steps: Iterable[Step]) -> None:
    for step in steps:
        args = [resolve(trt, a.path) if isinstance(a, Ref) else a for a in step.args]
        if step.assign:
            setattr(config, step.member, args[0])
        else:
            getattr(config, step.member)(*args)


def network_flags(trt: ModuleType, refs: Iterable[Ref]) -> int:
    value = 0
    for ref in refs:
        value |= 1 << int(resolve(trt, ref.path))
    return value


def create_builder(trt: ModuleType, logger: Any) -> Any:
    """trt.Builder, or one clear line when there is no usable GPU (TensorRT returns a null builder)."""
    try:
        return _api(trt, "Builder")(logger)
    except TypeError:  # pybind11: "factory function returned nullptr" - CUDA could not initialise
        raise DeviceError(
            f"TensorRT {trt.__version__} found no usable NVIDIA GPU (CUDA initialisation failed); "
            "engines are built on the target device: run build-engine there, or use --dry-run/--print-trtexec here"
        ) from None


def add_profiles(builder: Any, config: Any, rec: BuildRecipe) -> list[Any]:
    """One optimisation profile per recipe profile, with ``set_shape(name, min, opt, max)`` for every
    graph input (images, and valid_hw for variable-size graphs), added to ``config``; returns them.
    TensorRT rejects a build whose profiles leave a dynamic input unshaped, so every input is set."""
    made = []
    for shapes in rec.profiles:
        profile = _api(builder, "Builder.create_optimization_profile")()
        for name, (lo, opt, hi) in shapes.items():
            _api(profile, "IOptimizationProfile.set_shape")(name, lo, opt, hi)
        _api(config, "IBuilderConfig.add_optimization_profile")(profile)
        made.append(profile)
    return made


@dataclass
class BuildResult:
    plan_bytes: bytes
    timing_cache: bytes | None
    seconds: float
    dla_layers: dict[str, Any] | None = None


def build(
    plan: EnginePlan,
    trt: ModuleType,
    timing_cache: bytes | None = None,
    calibration_batches: Iterable[np.ndarray] | None = None,
    logger: Any = None,
    builder: Any = None,
) -> BuildResult:
    """Compile ``plan`` with the live ``trt`` module; needs a GPU."""
    caps = capabilities_of(trt)
    rec = recipe(plan, caps)
    logger = logger or _api(trt, "Logger")(_api(trt.Logger, "Logger.WARNING"))
    builder = builder or create_builder(trt, logger)
    network = _api(builder, "Builder.create_network")(network_flags(trt, rec.network_flags))
    parser = _api(trt, "OnnxParser")(network, logger)
    if not _api(parser, "OnnxParser.parse_from_file")(str(plan.onnx_path)):
        errors = [str(_api(parser, "OnnxParser.get_error")(i).desc()) for i in range(_api(parser, "OnnxParser.num_errors"))]
        unsupported = _unsupported_nodes(trt, builder, logger, rec, plan.onnx_path)
        raise CheckFailed(
            f"TensorRT {trt.__version__} cannot parse {plan.onnx_path}: {'; '.join(errors) or 'no parser message'}"
            + (f" (unsupported: {unsupported})" if unsupported else "")
        )

    config = _api(builder, "Builder.create_builder_config")()
    apply_config(trt, config, rec.config_steps)
    add_profiles(builder, config, rec)

    calibrator = None
    if rec.calibrator:
        if calibration_batches is None:
            calibration_batches = iter(())  # a complete cache needs no data; TensorRT reads it first
        calibrator = make_entropy_calibrator(trt, calibration_batches, (plan.calibration or {}).get("cache"))
        _api_set(config, "IBuilderConfig.int8_calibrator", calibrator)
        if calibrator.batch_shape is not None:
            calib = _api(builder, "Builder.create_optimization_profile")()
            shape = calibrator.batch_shape
            _api(calib, "IOptimizationProfile.set_shape")(plan.input_name, shape, shape, shape)
            _api(config, "IBuilderConfig.set_calibration_profile")(calib)

    cache = _api(config, "IBuilderConfig.create_timing_cache")(timing_cache or b"")
    if not _api(config, "IBuilderConfig.set_timing_cache")(cache, False):
        raise UserError("TensorRT refused the timing cache (its header names another device or version); give another --timing-cache")

    dla_layers = None
    if plan.dla_core is not None:
        can_run = _api(config, "IBuilderConfig.can_run_on_DLA")
        layers = [_api(network, "INetworkDefinition.get_layer")(i) for i in range(_api(network, "INetworkDefinition.num_layers"))]
        on_gpu = [layer.name for layer in layers if not can_run(layer)]
        dla_layers = {"layers": len(layers), "dla_capable": len(layers) - len(on_gpu), "gpu_only": on_gpu}

    start = time.perf_counter()
    serialized = _api(builder, "Builder.build_serialized_network")(network, config)
    seconds = time.perf_counter() - start
    if serialized is None:
        raise CheckFailed(f"TensorRT {trt.__version__} failed to build the engine from {plan.onnx_path}; its log above says why")
    new_cache = None
    if timing_cache is not None:
        new_cache = bytes(memoryview(_api(_api(config, "IBuilderConfig.get_timing_cache")(), "ITimingCache.serialize")()))
    return BuildResult(bytes(memoryview(serialized)), new_cache, seconds, dla_layers)


def _unsupported_nodes(trt: ModuleType, builder: Any, logger: Any, rec: BuildRecipe, source: str) -> str:
    """Ask the parser which node ranges it cannot take (supports_model_v2 on 10.1+, supports_model before)."""
    network = _api(builder, "Builder.create_network")(network_flags(trt, rec.network_flags))
    parser = _api(trt, "OnnxParser")(network, logger)
    data = Path(source).read_bytes()
    try:
        if rec.support_query == "supports_model_v2":
            if _api(parser, "OnnxParser.supports_model_v2")(data, str(source)):
                return ""
            supported = _api(parser, "OnnxParser.is_subgraph_supported")
            nodes = _api(parser, "OnnxParser.get_subgraph_nodes")
            ranges = [list(nodes(i)) for i in range(_api(parser, "OnnxParser.num_subgraphs")) if not supported(i)]
        else:
            ok, subgraphs = _api(parser, "OnnxParser.supports_model")(data, str(source))
            if ok:
                return ""
            ranges = [list(nodes) for nodes, supported in subgraphs if not supported]
    except Exception:  # a diagnostic only: never hide the parse error behind it
        return ""
    return "; ".join(f"nodes {r[0]}..{r[-1]}" for r in ranges if r)


# -- legacy INT8 calibration ----------------------------------------------------------------------
class DeviceMemory(Protocol):
    def alloc(self, nbytes: int) -> int: ...
    def upload(self, ptr: int, array: np.ndarray) -> None: ...
    def free(self, ptr: int) -> None: ...


class CudaMemory:
    """Device buffers through cuda-python (cuda.bindings)."""

    def __init__(self) -> None:
        from .fingerprint import cudart

        self.rt = cudart()

    def alloc(self, nbytes: int) -> int:
        from .fingerprint import cuda_check

        return int(cuda_check(self.rt.cudaMalloc(nbytes), "cudaMalloc"))

    def upload(self, ptr: int, array: np.ndarray) -> None:
        from .fingerprint import cuda_check

        host = np.ascontiguousarray(array)
        kind = self.rt.cudaMemcpyKind.cudaMemcpyHostToDevice
        cuda_check(self.rt.cudaMemcpy(ptr, host.ctypes.data, host.nbytes, kind), "cudaMemcpy")

    def free(self, ptr: int) -> None:
        self.rt.cudaFree(ptr)


def make_entropy_calibrator(
    trt: ModuleType,
    batches: Iterable[np.ndarray],
    cache_path: str | Path | None,
    memory: DeviceMemory | None = None,
) -> Any:
    """An ``IInt8EntropyCalibrator2`` feeding uint8 NHWC batches; reads/writes TensorRT's cache file.

    The class is defined here, not at module level, so that importing vitdeploy never needs TensorRT.
    ``batches`` is any iterable of equally shaped uint8 arrays (the calibration sources of
    vitdeploy.calibration, or ``npy_batches``). ``memory`` defaults to CUDA device buffers.
    """
    caps = capabilities_of(trt)
    if not caps.int8_calibrator:
        raise ConfigError(
            f"TensorRT {caps.version} has no IInt8EntropyCalibrator2 (implicit INT8 calibration was removed in 11); "
            "calibrate into a Q/DQ graph with `vitdeploy calibrate` and build it strongly typed"
        )
    base = _api(trt, "IInt8EntropyCalibrator2")
    source: Iterator[np.ndarray] = iter(batches)
    first = next(source, None)
    cache = Path(cache_path) if cache_path else None
    if first is None and not (cache and cache.is_file()):
        raise UserError("the calibration data is empty and there is no calibration cache; give --calib-data")

    class EntropyCalibrator(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            base.__init__(self)  # pybind11 trampolines need the base constructor called explicitly
            self._pending = first
            self._source = source
            self._memory = memory
            self._ptr: int | None = None
            self._nbytes = 0
            self.batch_shape = tuple(int(d) for d in first.shape) if first is not None else None
            self.batches_fed = 0

        def get_batch_size(self) -> int:
            # Explicit-batch networks take the batch from the calibration profile; TensorRT
            # multiplies by this value only for implicit batch, so it must be 1.
            return 1

        def get_batch(self, names: list[str]) -> list[int] | None:
            batch = self._pending if self._pending is not None else next(self._source, None)
            self._pending = None
            if batch is None:
                return None  # tells TensorRT the data is exhausted
            batch = np.ascontiguousarray(batch)
            if batch.dtype != np.uint8 or tuple(batch.shape) != self.batch_shape:
                raise UserError(f"calibration batch {self.batches_fed} is {batch.dtype}{list(batch.shape)}; expected uint8{list(self.batch_shape)}")
            if self._memory is None:
                self._memory = CudaMemory()
            if self._ptr is None:
                self._nbytes = batch.nbytes
                self._ptr = self._memory.alloc(self._nbytes)
            self._memory.upload(self._ptr, batch)
            self.batches_fed += 1
            return [int(self._ptr)] * len(names)

        def read_calibration_cache(self) -> bytes | None:
            if cache is not None and cache.is_file():
                return cache.read_bytes()
            return None

        def write_calibration_cache(self, data: Any) -> None:
            if cache is not None:
                atomic_write_bytes(cache, bytes(memoryview(data)))

        def release(self) -> None:
            if self._ptr is not None and self._memory is not None:
                self._memory.free(self._ptr)
                self._ptr = None

    return EntropyCalibrator()


def npy_batches(path: str | Path, batch: int, height: int, width: int, channels: int = 3) -> Iterator[np.ndarray]:
    """Equal uint8 NHWC batches from a .npy array (loaded without pickle; a short tail is dropped)."""
    path = Path(path)
    try:
        data = np.load(path, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise UserError(f"--calib-data {path} is not a readable .npy array ({exc})") from None
    want = (height, width, channels)
    if data.dtype != np.uint8 or data.ndim != 4 or tuple(data.shape[1:]) != want:
        raise UserError(f"--calib-data {path} is {data.dtype}{list(data.shape)}; expected uint8 [N,{height},{width},{channels}] images")
    if data.shape[0] < batch:
        raise UserError(f"--calib-data {path} has {data.shape[0]} images, fewer than one batch of {batch}")
    for start in range(0, data.shape[0] - batch + 1, batch):
        yield np.ascontiguousarray(data[start : start + batch])
