"""TensorRT engine runner: engine.json checked first, then deserialise, then execute_async_v3.

GPU-only. Buffers, stream and timing events come from cuda-python (``cuda.bindings``); device time of
each call is measured with CUDA events around ``execute_async_v3`` (``last_device_time_s``), host
wall time by the Runner base (``last_latency_s``). The engine's optimisation profile that covers
every input's shape is selected per call; shapes outside every profile are refused with the
profiles named.

Engines take the image batch, and a variable-size bundle's engine also ``valid_hw`` [B, 2] int32:
``run(feeds)`` feeds every input by name, as every runner does (vitdeploy.runtime.base).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from ..engine import fingerprint as fp
from ..engine import portable
from ..engine.versions import import_tensorrt
from ..errors import DeviceError, UserError
from .base import Runner, RunnerInfo, TensorInfo


class TensorRTRunner(Runner):
    def __init__(self, engine_dir: str | Path, device: int = 0):
        self.engine_dir = Path(engine_dir)
        self._rt = None
        self._buffers: dict[str, tuple[int, int]] = {}  # name -> (device ptr, capacity bytes)
        self._stream = self._start = self._end = None
        record = fp.read_fingerprint(self.engine_dir)
        trt = import_tensorrt("running TensorRT engines")
        # 1) what needs no GPU: TensorRT version and CPU architecture
        fp.require_match(self.engine_dir, record, None, trt.__version__)
        plan_file = fp.verify_plan_file(self.engine_dir, record)
        # 2) a runtime (fails cleanly without a usable GPU), then the GPU itself
        self._logger = trt.Logger(trt.Logger.WARNING)
        try:
            runtime = trt.Runtime(self._logger)
        except TypeError:  # pybind11: factory returned nullptr - CUDA could not initialise
            raise DeviceError(f"TensorRT {trt.__version__} found no usable NVIDIA GPU; TensorRT engines run on the device they were built for") from None
        self.device = fp.query_device(device)
        fp.require_match(self.engine_dir, record, self.device, trt.__version__)
        refit_from = portable.refit_graph(self.engine_dir, record) if record.get("strip_weights") else None
        # 3) only now deserialise
        self._rt = fp.cudart()
        fp.cuda_check(self._rt.cudaSetDevice(device), "cudaSetDevice")
        if record.get("version_compatible"):
            runtime.engine_host_code_allowed = True  # a version-compatible plan carries its lean runtime (host code)
        self.engine = runtime.deserialize_cuda_engine(plan_file.read_bytes())
        if self.engine is None:
            raise DeviceError(f"TensorRT could not deserialise {plan_file}; rebuild on this device with `vitdeploy build-engine`")
        if refit_from is not None:  # a weight-stripped plan: its weights come from the bundle's graph, checked above
            portable.refit_engine(trt, self.engine, refit_from, self._logger)
        self.context = self.engine.create_execution_context()
        self._trt = trt
        self._runtime = runtime
        self.record = record
        self._bind_io(trt)
        self._stream = fp.cuda_check(self._rt.cudaStreamCreate(), "cudaStreamCreate")
        self._start = fp.cuda_check(self._rt.cudaEventCreate(), "cudaEventCreate")
        self._end = fp.cuda_check(self._rt.cudaEventCreate(), "cudaEventCreate")
        self.last_device_time_s = float("nan")
        self.info = RunnerInfo(
            backend="tensorrt",
            precision=str(record.get("precision", "fp32")),
            device=f"cuda:{device}",
            details={
                "engine": str(self.engine_dir),
                "tensorrt": trt.__version__,
                "gpu": self.device.gpu_name,
                "compute_capability": self.device.compute_capability,
                "precision_path": record.get("precision_path"),
                "profiles": self._profiles,
                "refitted_from": refit_from.name if refit_from is not None else None,
            },
        )

    def _bind_io(self, trt: Any) -> None:
        """Inputs, outputs, dtypes and each input's (min, opt, max) shape per optimisation profile."""
        names = [self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)]
        is_input = {n: self.engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT for n in names}
        inputs = [n for n in names if is_input[n]]
        self._outputs = [n for n in names if not is_input[n]]
        # the image input first ("images" in every vitdeploy graph), then the per-image extras (valid_hw)
        self._inputs = sorted(inputs, key=lambda n: n != "images")
        if not self._inputs:
            raise UserError(f"engine {self.engine_dir} has no input")
        self._dtypes = {n: np.dtype(trt.nptype(self.engine.get_tensor_dtype(n))) for n in names}
        self._input_profiles = {
            n: [[tuple(int(d) for d in dims) for dims in self.engine.get_tensor_profile_shape(n, i)]
                for i in range(self.engine.num_optimization_profiles)]
            for n in self._inputs
        }
        self._profiles = self._input_profiles[self._inputs[0]]  # the image input's, as engine.json records them
        self._active_profile = 0

    # -- Runner interface ---------------------------------------------------------------------
    def inputs(self) -> list[TensorInfo]:
        out = []
        for name in self._inputs:
            lo, _, hi = self._input_profiles[name][0]
            out.append(TensorInfo(name, self._dtypes[name].name, tuple(a if a == b else None for a, b in zip(lo, hi))))
        return out

    def outputs(self) -> list[str]:
        return list(self._outputs)

    def _profile_for(self, shapes: Mapping[str, tuple[int, ...]]) -> int:
        """The first optimisation profile that holds every input's shape."""
        for index in range(len(self._profiles)):
            if all(_within(shape, self._input_profiles[name][index]) for name, shape in shapes.items()):
                return index
        given = ", ".join(f"{name} {list(shape)}" for name, shape in shapes.items())
        ranges = " | ".join("; ".join(f"{name} {list(p[i][0])}..{list(p[i][2])}" for name, p in self._input_profiles.items())
                            for i in range(len(self._profiles)))
        raise UserError(f"input shapes {given} are outside every profile of {self.engine_dir} ({ranges}); "
                        "rebuild with a wider --batch/--resolution")

    def _buffer(self, name: str, nbytes: int) -> int:
        ptr, capacity = self._buffers.get(name, (0, 0))
        if capacity < nbytes:
            if ptr:
                self._rt.cudaFree(ptr)
            ptr = int(fp.cuda_check(self._rt.cudaMalloc(max(nbytes, 1)), "cudaMalloc"))
            self._buffers[name] = (ptr, nbytes)
        return ptr

    def input_names(self) -> list[str]:
        return list(self._inputs)

    def _execute(self, feeds: dict[str, np.ndarray], outputs: list[str] | None) -> dict[str, np.ndarray]:
        """Every input by name (images, and valid_hw for a variable-size engine) -> the outputs."""
        return self._copy_through(self._checked_feeds(feeds))

    def _checked_feeds(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        arrays = {}
        for name in self._inputs:
            value, want = np.ascontiguousarray(feeds[name]), self._dtypes[name]
            if value.dtype != want:
                # sizes given as Python or numpy ints of another width: exact when they fit (valid_hw is int32)
                ints = value.dtype.kind in "iu" and want.kind in "iu"
                if not (ints and (not value.size or np.iinfo(want).min <= value.min() <= value.max() <= np.iinfo(want).max)):
                    what = "raw uint8 pixels" if name == self._inputs[0] else f"{want} values"
                    raise UserError(f"engine input {name!r} takes {want}, got {value.dtype}; pass {what}")
                value = value.astype(want)
            arrays[name] = value
        rows = {name: int(a.shape[0]) for name, a in arrays.items() if a.ndim}
        if len(set(rows.values())) > 1:
            raise UserError("inputs disagree on the batch: " + ", ".join(f"{name} has {n} rows" for name, n in rows.items()))
        return arrays

    def _copy_through(self, arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        rt = self._rt
        profile = self._profile_for({name: tuple(a.shape) for name, a in arrays.items()})
        stream = int(self._stream)
        if profile != self._active_profile:
            self.context.set_optimization_profile_async(profile, stream)
            self._active_profile = profile
        h2d, d2h = rt.cudaMemcpyKind.cudaMemcpyHostToDevice, rt.cudaMemcpyKind.cudaMemcpyDeviceToHost
        for name, array in arrays.items():
            if not self.context.set_input_shape(name, tuple(array.shape)):
                raise UserError(f"TensorRT refused input shape {list(array.shape)} for {name!r}")
            ptr = self._buffer(name, array.nbytes)
            fp.cuda_check(rt.cudaMemcpyAsync(ptr, array.ctypes.data, array.nbytes, h2d, self._stream), "cudaMemcpyAsync")
            self.context.set_tensor_address(name, ptr)
        host: dict[str, np.ndarray] = {}
        for out in self._outputs:
            shape = tuple(int(d) for d in self.context.get_tensor_shape(out))
            host[out] = np.empty(shape, dtype=self._dtypes[out])
            self.context.set_tensor_address(out, self._buffer(out, host[out].nbytes))
        fp.cuda_check(rt.cudaEventRecord(self._start, self._stream), "cudaEventRecord")
        if not self.context.execute_async_v3(stream):
            raise DeviceError(f"TensorRT execute_async_v3 failed on {self.engine_dir}")
        fp.cuda_check(rt.cudaEventRecord(self._end, self._stream), "cudaEventRecord")
        for out, array in host.items():
            fp.cuda_check(rt.cudaMemcpyAsync(array.ctypes.data, self._buffers[out][0], array.nbytes, d2h, self._stream), "cudaMemcpyAsync")
        fp.cuda_check(rt.cudaStreamSynchronize(self._stream), "cudaStreamSynchronize")
        ms = fp.cuda_check(rt.cudaEventElapsedTime(self._start, self._end), "cudaEventElapsedTime")
        self.last_device_time_s = float(ms) / 1000.0
        return host

    def close(self) -> None:
        if self._rt is None:
            return
        for ptr, _ in self._buffers.values():
            self._rt.cudaFree(ptr)
        self._buffers.clear()
        for event in (self._start, self._end):
            if event is not None:
                self._rt.cudaEventDestroy(event)
        if self._stream is not None:
            self._rt.cudaStreamDestroy(self._stream)
        self._stream = self._start = self._end = None
        self.context = self.engine = None
        self._rt = None


def _within(shape: tuple[int, ...], profile: Sequence[tuple[int, ...]]) -> bool:
    lo, _, hi = profile
    return len(shape) == len(lo) and all(a <= s <= b for a, s, b in zip(lo, shape, hi))
