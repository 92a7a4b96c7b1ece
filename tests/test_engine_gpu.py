"""Real TensorRT engines on a real GPU: build, fingerprint, run, compare with ONNX Runtime.

Marked ``gpu``; skipped unless TensorRT, cuda-python and a CUDA device are all present. Nothing
here has run on this project's CI (no GPU there); see docs/TENSORRT.md for what was verified where.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner
from engine_fixtures import write_bundle

from vitdeploy.cli import main


def _gpu_ready() -> str | None:
    """None when a build can run here, else why not."""
    try:
        import tensorrt  # noqa: F401
    except ImportError:
        return "TensorRT is not installed"
    try:
        from vitdeploy.engine.fingerprint import query_device

        query_device()
    except Exception as exc:  # MissingDependencyError (cuda-python) or DeviceError (no GPU)
        return str(exc)
    return None


_REASON = _gpu_ready()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(_REASON is not None, reason=f"needs an NVIDIA GPU with TensorRT and cuda-python: {_REASON}")]


def _images(n, h, w, seed=0):
    return np.random.default_rng(seed).integers(0, 256, (n, h, w, 3), dtype=np.uint8)


@pytest.mark.parametrize("precision, atol", [("fp32", 2e-3), ("fp16", 2e-2)])
def test_build_run_and_match_onnxruntime(tmp_path, precision, atol):
    from vitdeploy.bundle import Bundle
    from vitdeploy.runtime.ort import OrtRunner
    from vitdeploy.runtime.tensorrt import TensorRTRunner

    bundle = write_bundle(tmp_path / "b", precisions=("fp32", "fp16"))
    res = CliRunner().invoke(main, ["build-engine", str(bundle.root), "--precision", precision, "--batch", "1:2:4", "--target", "t"])
    assert res.exit_code == 0, res.output
    engine_dir = bundle.root / "engines" / "t"
    record = json.loads((engine_dir / "engine.json").read_text())
    assert record["precision"] == precision and record["device"]["compute_capability"]
    assert Bundle.open(bundle.root).manifest["engines"]["t"]["plan_sha256"] == record["plan_sha256"]
    batch = _images(3, 32, 32)
    with TensorRTRunner(engine_dir) as trt_runner, OrtRunner(bundle.artifact_path(precision), providers=["CPUExecutionProvider"]) as ort_runner:
        got, want = trt_runner.infer(batch), ort_runner.infer(batch)
        assert trt_runner.last_device_time_s > 0
        for name in ("logits", "probs"):
            np.testing.assert_allclose(got[name], want[name], atol=atol, rtol=0)
        with pytest.raises(Exception, match="outside every profile"):
            trt_runner.infer(_images(5, 32, 32))


def test_dynamic_resolution_profiles_and_timing_cache(tmp_path):
    from vitdeploy.runtime.ort import OrtRunner
    from vitdeploy.runtime.tensorrt import TensorRTRunner

    bundle = write_bundle(tmp_path / "d", dynamic_hw=True)
    args = ["build-engine", str(bundle.root), "--precision", "fp32", "--batch", "1:2:4", "--resolution", "32:48:64",
            "--batch", "1", "--resolution", "32", "--timing-cache", str(tmp_path / "trt.cache"), "--target", "dyn"]
    assert CliRunner().invoke(main, args).exit_code == 0
    assert (tmp_path / "trt.cache.json").is_file()
    again = CliRunner().invoke(main, args)  # the keyed cache is accepted on the same GPU and version
    assert again.exit_code == 0, again.output
    with TensorRTRunner(bundle.root / "engines" / "dyn") as runner, OrtRunner(bundle.artifact_path("fp32"), providers=["CPUExecutionProvider"]) as ref:
        for n, size in ((1, 32), (2, 48), (4, 64)):
            batch = _images(n, size, size, seed=size)
            np.testing.assert_allclose(runner.infer(batch)["probs"], ref.infer(batch)["probs"], atol=2e-3)


def test_mismatched_fingerprint_is_refused_before_deserialising(tmp_path):
    from vitdeploy.errors import DeviceError
    from vitdeploy.runtime.tensorrt import TensorRTRunner

    bundle = write_bundle(tmp_path / "m")
    assert CliRunner().invoke(main, ["build-engine", str(bundle.root), "--precision", "fp32", "--batch", "1", "--target", "m"]).exit_code == 0
    engine_json = bundle.root / "engines" / "m" / "engine.json"
    record = json.loads(engine_json.read_text())
    record["device"]["compute_capability"] = "1.0"
    engine_json.write_text(json.dumps(record))
    with pytest.raises(DeviceError, match="rebuild on this device"):
        TensorRTRunner(engine_json.parent)


def test_variable_size_engine_runs_both_inputs_like_onnxruntime(tmp_path, export_cached):
    """A --variable-size bundle's engine (images + valid_hw) through the Classifier and `profile`."""
    import shutil

    from vitdeploy.bundle import Bundle
    from vitdeploy.runtime.classifier import Classifier

    src = export_cached("builtin:digits", variable_size=True, canvas=(48, 48))
    shutil.copytree(src.root, tmp_path / "v")
    res = CliRunner().invoke(main, ["build-engine", str(tmp_path / "v"), "--precision", "fp32", "--batch", "1:4:8", "--target", "var"])
    assert res.exit_code == 0, res.output
    bundle = Bundle.open(tmp_path / "v")
    rng = np.random.default_rng(2)
    images = [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in ((20, 36), (48, 48), (33, 17), (8, 40), (44, 12))]
    engine = Classifier.load(bundle, prefer=("tensorrt",))
    reference = Classifier.load(bundle, prefer=("onnxruntime",), providers=["CPUExecutionProvider"])
    assert engine.backend == "tensorrt"
    np.testing.assert_allclose(engine.probabilities(images), reference.probabilities(images), atol=2e-3)
    out = tmp_path / "prof"
    res = CliRunner().invoke(main, ["profile", str(bundle.root), "--backend", "tensorrt", "--fill", "1.0,0.5", "--batch", "4",
                                    "--iterations", "10", "--no-plot", "-o", str(out)])
    assert res.exit_code == 0, res.output


def test_weight_stripped_engine_is_small_and_refits_to_the_same_outputs(tmp_path):
    """--strip-weights: STRIP_PLAN + REFIT_IDENTICAL, refit from the bundle's graph before the first call."""
    import tensorrt as trt

    from vitdeploy.runtime.ort import OrtRunner
    from vitdeploy.runtime.tensorrt import TensorRTRunner

    if int(trt.__version__.split(".")[0]) < 10:
        pytest.skip("weight-stripped plans need TensorRT 10+")
    bundle = write_bundle(tmp_path / "b", precisions=("fp32",))
    runner = CliRunner()
    for target, extra in (("full", []), ("stripped", ["--strip-weights"])):
        res = runner.invoke(main, ["build-engine", str(bundle.root), "--precision", "fp32", "--batch", "1:2:4", "--target", target, *extra])
        assert res.exit_code == 0, res.output
    full, stripped = (json.loads((bundle.root / "engines" / t / "engine.json").read_text()) for t in ("full", "stripped"))
    assert stripped["strip_weights"] and stripped["refit"]["file"] == "model.onnx" and stripped["plan_bytes"] < full["plan_bytes"]
    batch = _images(3, 32, 32)
    with TensorRTRunner(bundle.root / "engines" / "stripped") as trt_runner, OrtRunner(bundle.artifact_path("fp32")) as ort_runner:
        assert trt_runner.info.details["refitted_from"] == "model.onnx"
        np.testing.assert_allclose(trt_runner.infer(batch)["logits"], ort_runner.infer(batch)["logits"], atol=2e-3, rtol=0)
