"""Legacy TensorRT (< 11) INT8 calibration fed from a CalibrationSource.

CPU: the batch re-cutting, and the calibrator's data flow over host buffers with a stand-in for the
``tensorrt`` module (only its base class and version are needed; the class is the engine builder's).
GPU: a real weakly typed INT8 build of the digits graph with TensorRT 8.5-10.x.
"""

from __future__ import annotations

import ctypes
import importlib
import sys
import types
from pathlib import Path

import numpy as np
import pytest

from vitdeploy.calibration.legacy_trt import equal_batches, make_entropy_calibrator
from vitdeploy.errors import UserError


def _images(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (n, 32, 32, 3), dtype=np.uint8)


def test_equal_batches_recut_and_drop_the_tail() -> None:
    data = _images(23)
    pieces = [data[:5], data[5:6], data[6:23]]
    out = list(equal_batches(pieces, (8, 32, 32, 3)))
    assert [b.shape for b in out] == [(8, 32, 32, 3)] * 2
    assert np.array_equal(np.concatenate(out), data[:16])
    with pytest.raises(UserError, match="uint8 \\[32, 32, 3\\]"):
        list(equal_batches([np.zeros((4, 28, 28, 3), np.uint8)], (2, 32, 32, 3)))


def test_importing_the_module_does_not_import_tensorrt() -> None:
    sys.modules.pop("vitdeploy.calibration.legacy_trt", None)
    before = {m for m in sys.modules if m.split(".")[0] in ("tensorrt", "pycuda", "cuda")}
    importlib.import_module("vitdeploy.calibration.legacy_trt")
    after = {m for m in sys.modules if m.split(".")[0] in ("tensorrt", "pycuda", "cuda")}
    assert after == before


class HostMemory:
    """Host buffers standing in for device memory."""

    def __init__(self) -> None:
        self.buffers: dict[int, ctypes.Array] = {}

    def alloc(self, nbytes: int) -> int:
        buf = ctypes.create_string_buffer(nbytes)
        self.buffers[ctypes.addressof(buf)] = buf
        return ctypes.addressof(buf)

    def upload(self, ptr: int, array: np.ndarray) -> None:
        ctypes.memmove(ptr, np.ascontiguousarray(array).ctypes.data, array.nbytes)

    def free(self, ptr: int) -> None:
        self.buffers.pop(ptr, None)


def _fake_trt(version: str) -> types.ModuleType:
    trt = types.ModuleType("tensorrt")
    trt.__version__ = version
    if int(version.split(".")[0]) < 11:
        class IInt8EntropyCalibrator2:  # the pybind11 base: its constructor must be called
            def __init__(self) -> None:
                self.base_initialised = True

        trt.IInt8EntropyCalibrator2 = IInt8EntropyCalibrator2
    return trt


def test_calibrator_feeds_the_source_and_keeps_the_cache(digits_bundle, tmp_path: Path) -> None:
    from vitdeploy.calibration.sources import open_source

    source = open_source("digits:train", digits_bundle, samples=20)
    trt = _fake_trt("10.3.0")
    cache = tmp_path / "calib.cache"
    cal = make_entropy_calibrator(trt, source, "images", (8, 32, 32, 3), cache, memory=HostMemory())
    assert isinstance(cal, trt.IInt8EntropyCalibrator2) and cal.base_initialised and cal.input_name == "images"
    fed = []
    while (ptrs := cal.get_batch(["images"])) is not None:
        fed.append(np.frombuffer(ctypes.string_at(ptrs[0], 8 * 32 * 32 * 3), np.uint8).reshape(8, 32, 32, 3))
    assert len(fed) == 2 and np.array_equal(np.concatenate(fed), source.images[:16])
    assert cal.read_calibration_cache() is None
    cal.write_calibration_cache(memoryview(b"TRT-cache"))
    assert cache.read_bytes() == b"TRT-cache" and cal.read_calibration_cache() == b"TRT-cache"


def test_tensorrt_11_has_no_implicit_calibration(tmp_path: Path) -> None:
    from vitdeploy.errors import ConfigError

    with pytest.raises(ConfigError, match="removed in 11"):
        make_entropy_calibrator(_fake_trt("11.0.0"), [_images(8)], "images", (8, 32, 32, 3), tmp_path / "c", memory=HostMemory())


def test_too_few_images_for_one_batch(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="empty"):
        make_entropy_calibrator(_fake_trt("10.3.0"), [_images(3)], "images", (8, 32, 32, 3), tmp_path / "c", memory=HostMemory())


@pytest.mark.gpu
def test_legacy_int8_engine_builds_on_the_gpu(digits_bundle, tmp_path: Path) -> None:
    """Weakly typed INT8 build (TensorRT 8.5-10.x) of the fp32 digits graph, calibrated from digits:train
    through device buffers; TensorRT writes its calibration cache and a second build reads it."""
    trt = pytest.importorskip("tensorrt")
    if int(trt.__version__.split(".")[0]) >= 11:
        pytest.skip("TensorRT >= 11 has no implicit INT8 calibration (the Q/DQ graph is the path)")
    from vitdeploy.calibration.sources import open_source

    source = open_source("digits:train", digits_bundle, samples=64)
    cache = tmp_path / "digits.calib"

    def build() -> bytes:
        logger = trt.Logger(trt.Logger.WARNING)
        builder = trt.Builder(logger)
        flags = 1 << int(trt.NetworkDefinitionCreationFlag.EXPLICIT_BATCH) if hasattr(trt.NetworkDefinitionCreationFlag, "EXPLICIT_BATCH") else 0
        network = builder.create_network(flags)
        parser = trt.OnnxParser(network, logger)
        assert parser.parse_from_file(str(digits_bundle.artifact_path("fp32"))), [parser.get_error(i).desc() for i in range(parser.num_errors)]
        config = builder.create_builder_config()
        config.set_flag(trt.BuilderFlag.INT8)
        profile = builder.create_optimization_profile()
        profile.set_shape("images", (1, 32, 32, 3), (8, 32, 32, 3), (8, 32, 32, 3))
        config.add_optimization_profile(profile)
        calib_profile = builder.create_optimization_profile()
        calib_profile.set_shape("images", (8, 32, 32, 3), (8, 32, 32, 3), (8, 32, 32, 3))
        config.set_calibration_profile(calib_profile)
        calibrator = make_entropy_calibrator(trt, source, "images", (8, 32, 32, 3), cache)
        config.int8_calibrator = calibrator
        plan = builder.build_serialized_network(network, config)
        calibrator.release()
        assert plan is not None, "TensorRT could not build the INT8 engine"
        return bytes(memoryview(plan))

    assert build() and cache.is_file() and cache.stat().st_size > 0
    written = cache.read_bytes()
    assert build() and cache.read_bytes() == written
