"""Shared fixtures: bundles exported once per session, and the `gpu` marker's skip rule."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any, Callable

import pytest


def _has_gpu() -> bool:
    if shutil.which("nvidia-smi") is None:
        return False
    try:
        return subprocess.run(["nvidia-smi", "-L"], capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


HAS_GPU = _has_gpu()


def pytest_configure(config: pytest.Config) -> None:
    # Under pytest-xdist (`make test`: one worker per core) each worker's ONNX Runtime sessions take
    # one thread unless a test asks for more; the CLI subprocesses the tests start inherit it.
    if os.environ.get("PYTEST_XDIST_WORKER"):
        os.environ.setdefault("VITDEPLOY_ORT_THREADS", "1")
    # The reference models in these tests are small: one torch thread beats two on this 2-core
    # machine, where ONNX Runtime's spinning pool and torch's OpenMP pool otherwise contend
    # (measured: the digits model at batch 16 took 20 ms on one thread, 250 ms on two under load).
    try:
        import torch
    except ImportError:
        return
    torch.set_num_threads(1)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if HAS_GPU:
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU (none on this machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def export_cached(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Any]:
    """export(source, **options) once per distinct call in the session; returns the Bundle.

    Tests must not modify the returned bundle: copy it first (see ``copy_bundle``).
    """
    from vitdeploy.exporters import ExportOptions, export

    cache: dict[str, Any] = {}
    root = tmp_path_factory.mktemp("exports")

    def run(source: str, **options: Any) -> Any:
        key = json.dumps([source, options], sort_keys=True, default=str)
        if key not in cache:
            out = root / f"bundle{len(cache)}"
            cache[key] = export(source, out, ExportOptions(**options))
        return cache[key]

    return run


@pytest.fixture(scope="session")
def stub_cache(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the gcc-built TensorRT stand-in libraries are kept (tests/trt_stubs), across sessions when
    pytest's cache is on."""
    cache = getattr(request.config, "cache", None)
    return Path(cache.mkdir("trt-stubs")) if cache is not None else tmp_path_factory.mktemp("trt-stubs")


@pytest.fixture(scope="session")
def digits_bundle(export_cached: Callable[..., Any]) -> Any:
    """The bundled trained digits model, exported (fp32), verified against PyTorch on 64 images."""
    return export_cached("builtin:digits")


@pytest.fixture
def copy_bundle(tmp_path: Path) -> Callable[[Any], Path]:
    """Copy a session bundle into this test's tmp dir so the test may change it."""

    def run(bundle: Any, name: str = "bundle") -> Path:
        dst = tmp_path / name
        shutil.copytree(bundle.root, dst)
        return dst

    return run
