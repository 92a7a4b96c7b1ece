"""Calibration data for TensorRT's legacy implicit-INT8 path (TensorRT < 11 only).

TensorRT 8.5-10.x can still build weakly typed INT8 engines with an ``IInt8EntropyCalibrator2``
that reads calibration batches through device buffers and keeps a calibration cache file; 11
removed it (strongly typed networks take their INT8 from the Q/DQ graph that `calibrate` writes).

The calibrator class itself lives in :mod:`vitdeploy.engine.builder` (created inside a factory, so
importing vitdeploy never touches TensorRT). This module feeds it the same CalibrationSource the Q/DQ
path uses: equal batches at the engine's calibration shape, and device memory through cuda-python
or, where that is what the device has (older JetPacks), pycuda. Nothing here imports tensorrt,
cuda-python or pycuda at import time.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any, Iterable, Iterator, Sequence

import numpy as np

from vitdeploy.errors import DeviceError, UserError
from vitdeploy.lazy import available


def equal_batches(batches: Iterable[np.ndarray], input_shape: Sequence[int]) -> Iterator[np.ndarray]:
    """Re-cut a stream of uint8 NHWC batches into batches of exactly ``input_shape`` (N, H, W, C).

    TensorRT's calibration profile has one shape, so every batch must match it; a short tail is
    dropped (never padded with repeats, which would weight those images twice).
    """
    shape = tuple(int(d) for d in input_shape)
    if len(shape) != 4 or min(shape) <= 0:
        raise UserError(f"calibration input shape must be a positive (N, H, W, C), got {list(input_shape)}")
    n = shape[0]
    pending: list[np.ndarray] = []
    held = 0
    for batch in batches:
        batch = np.asarray(batch)
        if batch.dtype != np.uint8 or tuple(batch.shape[1:]) != shape[1:]:
            raise UserError(f"calibration images are {batch.dtype} {list(batch.shape[1:])}; the engine's input takes uint8 {list(shape[1:])}")
        pending.append(batch)
        held += len(batch)
        while held >= n:
            joined = np.concatenate(pending) if len(pending) > 1 else pending[0]
            yield np.ascontiguousarray(joined[:n])
            rest = joined[n:]
            pending, held = ([rest] if len(rest) else []), len(rest)


class PycudaMemory:
    """Device buffers through pycuda (JetPack images that ship pycuda rather than cuda-python)."""

    def __init__(self) -> None:
        import pycuda.autoinit  # noqa: F401 - creates the CUDA context pycuda allocates in
        import pycuda.driver as driver

        self.driver = driver
        self._held: dict[int, Any] = {}

    def alloc(self, nbytes: int) -> int:
        buf = self.driver.mem_alloc(nbytes)
        self._held[int(buf)] = buf  # keep the DeviceAllocation alive while TensorRT holds the pointer
        return int(buf)

    def upload(self, ptr: int, array: np.ndarray) -> None:
        self.driver.memcpy_htod(ptr, np.ascontiguousarray(array))

    def free(self, ptr: int) -> None:
        buf = self._held.pop(ptr, None)
        if buf is not None:
            buf.free()


class LazyDeviceMemory:
    """Picks cuda-python, else pycuda, at the first allocation: a complete calibration cache lets
    TensorRT build without ever asking for a batch, and then no device buffer is made."""

    def __init__(self) -> None:
        self._impl: Any = None
        self.backend: str | None = None

    def _get(self) -> Any:
        if self._impl is None:
            if available("cuda.bindings.runtime") or available("cuda.cudart"):
                from vitdeploy.engine.builder import CudaMemory

                self._impl, self.backend = CudaMemory(), "cuda-python"
            elif available("pycuda.driver"):
                self._impl, self.backend = PycudaMemory(), "pycuda"
            else:
                raise DeviceError("calibration needs device buffers: pip install cuda-python (or pycuda on JetPack images that ship it)")
        return self._impl

    def alloc(self, nbytes: int) -> int:
        return self._get().alloc(nbytes)

    def upload(self, ptr: int, array: np.ndarray) -> None:
        self._get().upload(ptr, array)

    def free(self, ptr: int) -> None:
        self._get().free(ptr)


def make_entropy_calibrator(
    trt: ModuleType,
    batches: Iterable[np.ndarray],
    input_name: str,
    input_shape: Sequence[int],
    cache_path: str | Path | None,
    memory: Any = None,
) -> Any:
    """An ``IInt8EntropyCalibrator2`` for the network input ``input_name`` at ``input_shape``.

    ``batches``: uint8 NHWC batches of any size (a CalibrationSource, or its ``.batches()``), re-cut
    to ``input_shape``; ``cache_path``: TensorRT's calibration cache, read when present (TensorRT
    then skips the data) and written after calibration. Raises ConfigError on TensorRT >= 11.
    """
    from vitdeploy.engine.builder import make_entropy_calibrator as engine_calibrator

    if hasattr(batches, "batches") and callable(batches.batches):
        batches = batches.batches()
    calibrator = engine_calibrator(trt, equal_batches(batches, input_shape), cache_path, memory or LazyDeviceMemory())
    calibrator.input_name = input_name  # the builder sets the calibration profile on this input
    return calibrator
