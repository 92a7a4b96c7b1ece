"""TensorRT engine runner: engine.json checked first, then deserialise, then execute_async_v3.

GPU-only. Buffers, stream and timing events come from cuda-python (``cuda.bindings``); device time of
each call is measured with CUDA events around ``execute_async_v3`` (``last_device_time_s``), host
wall time by the Runner base (``last_latency_s``). The engine's optimisation profile that covers the
batch's shape is selected per call; shapes outside every profile are refused with the profiles named.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ..engine import fingerprint as fp
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
        # 3) only now deserialise
        self._rt = fp.cudart()
        fp.cuda_check(self._rt.cudaSetDevice(device), "cudaSetDevice")
        self.engine = runtime.deserialize_cuda_engine(plan_file.read_bytes())
        if self.engine is None:
            raise DeviceError(f"TensorRT could not deserialise {plan_file}; rebuild on this device with `vitdeploy build-engine`")
        self.context = self.engine.create_execution_context()
        self._trt = trt
        self._runtime = runtime
        self.record = record
        names = [self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)]
        is_input = {n: self.engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT for n in names}
        self._inputs = [n for n in names if is_input[n]]
        self._outputs = [n for n in names if not is_input[n]]
        if len(self._inputs) != 1:
            raise UserError(f"engine {self.engine_dir} has {len(self._inputs)} inputs; vitdeploy engines take one image input")
        self._dtypes = {n: np.dtype(trt.nptype(self.engine.get_tensor_dtype(n))) for n in names}
        self._profiles = [
            [tuple(int(d) for d in dims) for dims in self.engine.get_tensor_profile_shape(self._inputs[0], i)]
            for i in range(self.engine.num_optimization_profiles)
        ]
        self._active_profile = 0
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
            },
        )

    # -- Runner interface ---------------------------------------------------------------------
    def inputs(self) -> list[TensorInfo]:
        name = self._inputs[0]
        lo, _, hi = self._profiles[0]
        shape = tuple(a if a == b else None for a, b in zip(lo, hi))
        return [TensorInfo(name, self._dtypes[name].name, shape)]

    def outputs(self) -> list[str]:
        return list(self._outputs)

    def _profile_for(self, shape: tuple[int, ...]) -> int:
        for index, (lo, _, hi) in enumerate(self._profiles):
            if len(shape) == len(lo) and all(a <= s <= b for a, s, b in zip(lo, shape, hi)):
                return index
        ranges = "; ".join(f"{list(lo)}..{list(hi)}" for lo, _, hi in self._profiles)
        raise UserError(f"input shape {list(shape)} is outside every profile of {self.engine_dir} ({ranges}); rebuild with a wider --batch/--resolution")

    def _buffer(self, name: str, nbytes: int) -> int:
        ptr, capacity = self._buffers.get(name, (0, 0))
        if capacity < nbytes:
            if ptr:
                self._rt.cudaFree(ptr)
            ptr = int(fp.cuda_check(self._rt.cudaMalloc(max(nbytes, 1)), "cudaMalloc"))
            self._buffers[name] = (ptr, nbytes)
        return ptr

    def _run(self, batch: np.ndarray) -> dict[str, np.ndarray]:
        rt, name = self._rt, self._inputs[0]
        batch = np.ascontiguousarray(batch)
        if batch.dtype != self._dtypes[name]:
            raise UserError(f"engine input {name!r} takes {self._dtypes[name]}, got {batch.dtype}; pass raw uint8 pixels")
        profile = self._profile_for(tuple(batch.shape))
        stream = int(self._stream)
        if profile != self._active_profile:
            self.context.set_optimization_profile_async(profile, stream)
            self._active_profile = profile
        if not self.context.set_input_shape(name, tuple(batch.shape)):
            raise UserError(f"TensorRT refused input shape {list(batch.shape)} for {name!r}")
        h2d, d2h = rt.cudaMemcpyKind.cudaMemcpyHostToDevice, rt.cudaMemcpyKind.cudaMemcpyDeviceToHost
        ptr = self._buffer(name, batch.nbytes)
        fp.cuda_check(rt.cudaMemcpyAsync(ptr, batch.ctypes.data, batch.nbytes, h2d, self._stream), "cudaMemcpyAsync")
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


def matching_engines(bundle_root: str | Path, trt_version: str | None, device: Any | None) -> list[tuple[Path, list[str]]]:
    """Every engine folder of a bundle with the reasons it cannot run here (empty list: it can)."""
    found = []
    for engine_json in sorted(Path(bundle_root).glob(f"engines/*/{fp.FINGERPRINT_FILE}")):
        try:
            record = fp.read_fingerprint(engine_json.parent)
        except UserError as exc:
            found.append((engine_json.parent, [str(exc)]))
            continue
        found.append((engine_json.parent, fp.mismatches(record, device, trt_version)))
    return found
