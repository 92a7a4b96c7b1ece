"""vitdeploy.runtime.select: one resolver (bundle + precision + backend + device -> runner, with the reason
for each backend passed over) and vitdeploy.runtime.engines: the one place an engine profile is matched
to a shape. TensorRT's GPU-only pieces are replaced, as in tests/test_runtime_classifier.py."""

from __future__ import annotations

import json

import pytest

from synthetic_bundle import fake_engine, make_bundle
from vitdeploy.contract import InputContract
from vitdeploy.errors import DeviceError, IntegrityError, UserError
from vitdeploy.runtime import select
from vitdeploy.runtime.engines import find_engines


@pytest.fixture
def h200(monkeypatch):
    """This machine as an H200 with TensorRT 10.3 (the GPU-only queries replaced)."""
    from vitdeploy.engine import fingerprint, versions

    monkeypatch.setattr(versions, "import_tensorrt", lambda purpose="": object())
    monkeypatch.setattr(versions, "installed_version", lambda: versions.TrtVersion.parse("10.3.0"))
    monkeypatch.setattr(fingerprint, "query_device", lambda index=0: fingerprint.DeviceInfo("NVIDIA H200", "9.0"))


def test_backends_passed_over_say_why_and_one_backend_asked_for_is_its_own_error(tmp_path):
    bundle = make_bundle(tmp_path / "b")
    chosen = select.select_runner(bundle)
    assert chosen.backend == "onnxruntime" and chosen.precision == "fp32" and chosen.thread_safe
    assert chosen.passed_over == [f"tensorrt: the bundle has no TensorRT engine (build one on this device with `vitdeploy build-engine {bundle.root}`)"]
    assert chosen.backend_reason.endswith("onnxruntime fp32 on cpu (CPUExecutionProvider); model.onnx")
    assert chosen.contract.input_names == ("images",) and chosen.artifact == bundle.artifact_path("fp32")
    chosen.runner.close()
    with pytest.raises(DeviceError, match="no TensorRT engine"):
        select.select_runner(bundle, prefer=("tensorrt",))
    with pytest.raises(UserError, match="unknown backend openvino"):
        select.select_runner(bundle, prefer=("openvino",))
    with pytest.raises(UserError, match="precision must be one of"):
        select.select_runner(bundle, precision="int4")
    assert select.ort_providers("cpu") == ["CPUExecutionProvider"] and select.ort_providers("auto") is None
    with pytest.raises(UserError, match="unknown device 'tpu'"):
        select.ort_providers("tpu")


def test_a_graph_the_manifest_does_not_vouch_for_is_refused_never_passed_over(tmp_path):
    bundle = make_bundle(tmp_path / "b")
    graph = bundle.artifact_path("fp32")
    graph.write_bytes(graph.read_bytes() + b"\0")
    with pytest.raises(IntegrityError, match="not the fp32 graph this bundle's manifest vouches for"):
        select.select_runner(bundle, prefer=("tensorrt", "onnxruntime"))


def test_a_graph_whose_inputs_are_not_the_manifests_is_one_line(tmp_path):
    bundle = make_bundle(tmp_path / "b")
    variable = InputContract.from_manifest({**bundle.preprocessing, "variable_size": {"canvas": [16, 16], "host_policy": "fit-within"}},
                                           bundle.resolution, bundle.spec)
    with pytest.raises(UserError, match=r"takes inputs \(images\) but the bundle's manifest describes \(images, valid_hw\)"):
        select.onnxruntime_runner(bundle, variable)


def test_the_engine_that_fits_this_device_and_shape_comes_with_its_profile(tmp_path, monkeypatch, h200):
    bundle = make_bundle(tmp_path / "b", fp16=True)
    fake_engine(bundle, "orin-trt10.3.0-fp16", "fp16")  # built for compute capability 8.7
    fake_engine(bundle, "h200-trt10.3.0-fp32", "fp32", gpu="NVIDIA H200", cc="9.0", batch=(2, 4, 8))
    opened = []
    monkeypatch.setattr(select, "open_engine", lambda entry: opened.append(entry.target) or _StandIn(bundle))
    chosen = select.tensorrt_runner(bundle)
    assert opened == ["h200-trt10.3.0-fp32"] and chosen.backend == "tensorrt" and not chosen.thread_safe
    assert (chosen.contract.batch, chosen.contract.heights, chosen.contract.widths) == ((2, 8), (16, 16), (16, 16))
    runs = {r.entry.target: r for r in select.engines_here(bundle, InputContract.from_bundle(bundle))}
    assert runs["h200-trt10.3.0-fp32"].runner is not None and runs["h200-trt10.3.0-fp32"].contract.min_rows == 2
    assert "compute capability 8.7" in runs["orin-trt10.3.0-fp16"].skipped
    runs = select.engines_here(bundle, InputContract.from_bundle(bundle), sizes=[(32, 32)])
    assert all("no optimisation profile of the engine takes 32x32" in r.skipped for r in runs if r.entry.target.startswith("h200"))


def test_one_place_matches_engine_profiles(tmp_path):
    bundle = make_bundle(tmp_path / "b")
    fake_engine(bundle, "small", "fp32", batch=(1, 4, 8), hw=16)
    engine_json = bundle.root / "engines" / "small" / "engine.json"
    record = json.loads(engine_json.read_text())
    record["profiles"].append({"batch": [16, 16, 32], "height": [16, 24, 32], "width": [16, 24, 32]})
    engine_json.write_text(json.dumps(record))
    (entry,) = find_engines(bundle)
    assert entry.profile_for(16, 16) == 0 and entry.profile_for(24, 32) == 1 and entry.profile_for(40, 16) is None
    assert entry.profile_for(16, 16, batch=16) == 1 and entry.profile_for(16, 16, batch=9) is None
    assert entry.describe_profiles() == "batch 1..8, 16..16 x 16..16; batch 16..32, 16..32 x 16..32"


def test_without_tensorrt_every_engine_is_skipped_with_the_reason(tmp_path):
    from vitdeploy.lazy import available

    if available("tensorrt"):
        pytest.skip("TensorRT is importable here")
    bundle = make_bundle(tmp_path / "b")
    fake_engine(bundle, "e", "fp32")
    (run,) = select.engines_here(bundle, InputContract.from_bundle(bundle), purpose="profiled")
    assert run.runner is None and run.skipped == "TensorRT is not installed on this machine (engines are profiled on their target GPU)"


class _StandIn:
    """The TensorRT runner's interface over the bundle's graph on ONNX Runtime."""

    def __init__(self, bundle):
        from vitdeploy.runtime.ort import OrtRunner

        self.ort = OrtRunner(bundle.artifact_path("fp32"))
        self.info = self.ort.info

    def input_names(self):
        return self.ort.input_names()

    def run(self, feeds, outputs=None):
        return self.ort.run(feeds, outputs)

    def close(self):
        self.ort.close()
