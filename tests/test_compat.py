"""Versions users have (issue 14): the graph vitdeploy exports survives the tools people run on it.

Run by the main suite and, with the versions of an NVIDIA PyTorch image (constraints-compat.txt),
by the compatibility lane (`make test-compat`, part of `make test`), where
``VITDEPLOY_COMPAT_LANE=1`` also checks that the lane really runs those versions.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def raw_digits(export_cached):
    """The digits model exported dynamic and unsimplified, as the profile tests' fixture was when it
    failed on the issue's image: onnxslim happens to drop the redundant entries, the raw export did not."""
    return export_cached("builtin:digits", dynamic_resolution=True, simplify=False, check=False)


@pytest.fixture(params=["simplified", "raw"])
def bundle(request, digits_bundle, raw_digits):
    return digits_bundle if request.param == "simplified" else raw_digits


@pytest.mark.slow
def test_exported_graph_declares_no_initializer_value_info(bundle):
    """The dynamo exporter repeats every weight in value_info; the copy goes stale when a tool
    rewrites a weight (onnxruntime 1.30's Gemm -> MatMul transposes the head in place), so the
    exporter drops it."""
    import onnx

    model = onnx.load(str(bundle.artifact_path("fp32")))
    weights = {init.name for init in model.graph.initializer}
    assert weights and not [v.name for v in model.graph.value_info if v.name in weights]
    assert len(model.graph.value_info) > 0  # activations keep their shapes (the profile and lint read them)
    onnx.checker.check_model(model)
    onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True)


def test_onnxruntime_dynamic_quantization_of_the_exported_graph(bundle, tmp_path: Path):
    """The call that failed on the issue's NVIDIA image (onnxruntime 1.30.0, onnx 1.23.1) with
    "Inferred shape and existing shape differ in dimension 0: (64) vs (10)" for the digits head."""
    import onnxruntime as ort
    from onnxruntime.quantization import QuantType, quantize_dynamic

    out = tmp_path / "model.dyn-int8.onnx"
    quantize_dynamic(str(bundle.artifact_path("fp32")), str(out), weight_type=QuantType.QInt8)
    pixels = np.random.default_rng(0).integers(0, 256, (32, 32, 32, 3), dtype=np.uint8)
    fp32 = ort.InferenceSession(str(bundle.artifact_path("fp32")), providers=["CPUExecutionProvider"])
    int8 = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    want = fp32.run(["probs"], {"images": pixels})[0]
    got = int8.run(["probs"], {"images": pixels})[0]
    assert got.shape == want.shape == (32, 10)
    assert np.abs(got - want).max() < 0.2 and (got.argmax(1) == want.argmax(1)).mean() >= 0.8


def _compat_pins() -> dict[str, str]:
    """name -> version from constraints-compat.txt, for this interpreter (markers evaluated)."""
    from packaging.requirements import Requirement

    pins = {}
    for line in (REPO / "constraints-compat.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        req = Requirement(line)
        if req.marker is None or req.marker.evaluate():
            (spec,) = req.specifier
            pins[req.name] = spec.version
    return pins


@pytest.mark.skipif(os.environ.get("VITDEPLOY_COMPAT_LANE") != "1", reason="only in the compatibility lane (make test-compat)")
def test_the_lane_runs_the_versions_it_claims():
    from importlib.metadata import version

    pins = _compat_pins()
    assert {"onnxruntime", "onnx", "timm", "transformers", "numpy"} <= set(pins)
    assert {name: version(name) for name in pins} == pins


def test_compat_constraints_name_the_issue_versions():
    pins = _compat_pins()
    assert pins["onnxruntime"] == "1.30.0" and pins["onnx"] == "1.23.1"
    assert pins["timm"] == "1.0.29" and pins["transformers"].startswith("5.17")
    assert pins["numpy"].startswith("2.5" if __import__("sys").version_info >= (3, 12) else "2.4")
