"""Two-input TensorRT engines (a variable-size bundle's images + valid_hw) on the CPU: the runner's
feeding (profile per call over every input, dtypes, copies in and out) against stand-ins for the
engine, its execution context and cuda-python, which copy real bytes through host memory; and the
Classifier and `profile` paths that use it, with the GPU-only runner replaced. No real engine runs
here: `tests/test_engine_gpu.py` (marked gpu) is where one does."""

from __future__ import annotations

import ctypes
import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from vitdeploy.errors import UserError
from vitdeploy.runtime.base import TensorInfo
from vitdeploy.runtime.tensorrt import TensorRTRunner

FAKE_TRT = SimpleNamespace(TensorIOMode=SimpleNamespace(INPUT="input", OUTPUT="output"), nptype=np.dtype)


class HostCudart:
    """cuda-python's calls the runner makes, on host memory: (error, value) tuples, real copies."""

    class cudaMemcpyKind:  # noqa: N801 - cuda-python's name
        cudaMemcpyHostToDevice = 1
        cudaMemcpyDeviceToHost = 2

    def __init__(self):
        self.blocks = {}

    def cudaMalloc(self, nbytes):  # noqa: N802
        block = ctypes.create_string_buffer(nbytes)
        self.blocks[ctypes.addressof(block)] = block
        return (0, ctypes.addressof(block))

    def cudaFree(self, ptr):  # noqa: N802
        self.blocks.pop(ptr, None)
        return (0,)

    def cudaMemcpyAsync(self, dst, src, nbytes, kind, stream):  # noqa: N802
        ctypes.memmove(dst, src, nbytes)
        return (0,)

    def cudaEventRecord(self, event, stream):  # noqa: N802
        return (0,)

    def cudaStreamSynchronize(self, stream):  # noqa: N802
        return (0,)

    def cudaEventElapsedTime(self, start, end):  # noqa: N802
        return (0, 0.25)


def _view(ptr, dtype, shape):
    count = int(np.prod(shape))
    raw = (ctypes.c_byte * (count * np.dtype(dtype).itemsize)).from_address(ptr)
    return np.frombuffer(raw, dtype=dtype, count=count).reshape(shape)


class FakeEngine:
    """valid_hw listed before images (the runner must order them), two profiles on both inputs."""

    tensors = {"valid_hw": ("input", np.int32), "images": ("input", np.uint8), "score": ("output", np.float32)}
    profiles = {"images": [((1, 8, 8, 3), (2, 8, 8, 3), (2, 8, 8, 3)), ((3, 8, 8, 3), (4, 8, 8, 3), (8, 8, 8, 3))],
                "valid_hw": [((1, 2), (2, 2), (2, 2)), ((3, 2), (4, 2), (8, 2))]}
    num_optimization_profiles = 2

    @property
    def num_io_tensors(self):
        return len(self.tensors)

    def get_tensor_name(self, i):
        return list(self.tensors)[i]

    def get_tensor_mode(self, name):
        return self.tensors[name][0]

    def get_tensor_dtype(self, name):
        return self.tensors[name][1]

    def get_tensor_profile_shape(self, name, index):
        return self.profiles[name][index]


class FakeContext:
    """The engine's arithmetic: score = sum of the image's pixels + 1000 x valid_h + valid_w,
    read from and written to the addresses the runner bound."""

    def __init__(self):
        self.shapes, self.addresses, self.profiles = {}, {}, []

    def set_optimization_profile_async(self, index, stream):
        self.profiles.append(index)

    def set_input_shape(self, name, shape):
        self.shapes[name] = tuple(shape)
        return True

    def get_tensor_shape(self, name):
        return (self.shapes["images"][0],)

    def set_tensor_address(self, name, ptr):
        self.addresses[name] = ptr

    def execute_async_v3(self, stream):
        images = _view(self.addresses["images"], np.uint8, self.shapes["images"])
        valid = _view(self.addresses["valid_hw"], np.int32, self.shapes["valid_hw"])
        score = _view(self.addresses["score"], np.float32, (len(images),))
        score[:] = images.reshape(len(images), -1).sum(axis=1) + 1000 * valid[:, 0] + valid[:, 1]
        return True


def make_runner() -> TensorRTRunner:
    """The runner as __init__ leaves it after deserialising, with stand-ins for the GPU pieces."""
    runner = TensorRTRunner.__new__(TensorRTRunner)
    runner.engine_dir = Path("engines/stand-in")
    runner.info = SimpleNamespace(backend="tensorrt")
    runner.engine, runner.context, runner._rt = FakeEngine(), FakeContext(), HostCudart()
    runner._buffers, runner._stream, runner._start, runner._end = {}, 7, object(), object()
    runner._bind_io(FAKE_TRT)
    return runner


def expected_score(images, valid):
    return images.reshape(len(images), -1).sum(axis=1).astype(np.float32) + 1000 * valid[:, 0] + valid[:, 1]


def test_both_inputs_are_fed_and_the_profile_holds_every_input():
    runner = make_runner()
    assert [i.name for i in runner.inputs()] == ["images", "valid_hw"]  # the image input first
    assert runner.inputs()[1] == TensorInfo("valid_hw", "int32", (None, 2))
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (3, 8, 8, 3), dtype=np.uint8)
    valid = [[8, 4], [4, 8], [8, 8]]  # Python ints: converted exactly to the engine's int32
    out = runner.run({"images": images, "valid_hw": valid})
    np.testing.assert_array_equal(out["score"], expected_score(images, np.array(valid)))
    assert runner.context.profiles == [1]  # batch 3 is in the second profile only
    two = runner.run({"images": images[:2], "valid_hw": np.array(valid[:2], dtype=np.int64)}, outputs=("score",))
    np.testing.assert_array_equal(two["score"], expected_score(images[:2], np.array(valid[:2])))
    assert runner.context.profiles == [1, 0]
    assert runner.last_device_time_s == pytest.approx(0.25e-3)


def test_both_inputs_go_by_name_and_a_missing_or_unknown_one_is_named():
    """One way to feed two inputs (run by name, as profile's cells now do instead of fixed_inputs);
    the one-input convenience says what is missing, an input the engine lacks is named."""
    images = np.full((4, 8, 8, 3), 2, dtype=np.uint8)
    valid = np.array([[8, 8], [8, 4], [4, 4], [4, 8]], dtype=np.int32)
    np.testing.assert_array_equal(make_runner().run({"images": images, "valid_hw": valid})["score"], expected_score(images, valid))
    with pytest.raises(UserError, match=r"takes inputs \(images, valid_hw\); feed them by name with run"):
        make_runner().infer(images)
    with pytest.raises(UserError, match=r"takes inputs \(images, valid_hw\), got \(images, mask\)"):
        make_runner().run({"images": images, "mask": valid})


@pytest.mark.parametrize("feeds, message", [
    ({"images": np.zeros((3, 8, 8, 3), np.uint8), "valid_hw": np.zeros((2, 2), np.int32)}, "inputs disagree on the batch"),
    ({"images": np.zeros((2, 8, 8, 3), np.uint8), "valid_hw": np.zeros((2, 2), np.float32)}, "takes int32, got float32"),
    ({"images": np.zeros((2, 8, 8, 3), np.float32), "valid_hw": np.zeros((2, 2), np.int32)}, "pass raw uint8 pixels"),
    ({"images": np.zeros((2, 8, 8, 3), np.uint8), "valid_hw": np.full((2, 2), 2**40)}, "takes int32, got int64"),
    ({"images": np.zeros((9, 8, 8, 3), np.uint8), "valid_hw": np.zeros((9, 2), np.int32)}, "outside every profile"),
    ({"images": np.zeros((2, 8, 8, 3), np.uint8)}, r"takes inputs \(images, valid_hw\), got \(images\)"),
])
def test_bad_feeds_are_refused_in_one_line(feeds, message):
    with pytest.raises(UserError, match=message):
        make_runner().run(feeds)


class OrtAsEngine:
    """Stands in for the TensorRT runner of a variable-size engine: the bundle's graph on ORT behind
    the same two-input interface, recording each call's batch."""

    def __init__(self, path):
        from vitdeploy.runtime.ort import OrtRunner

        self.ort = OrtRunner(path)
        self.info, self.batches = self.ort.info, []

    def inputs(self):
        return [TensorInfo("images", "uint8", (None, 48, 48, 3)), TensorInfo("valid_hw", "int32", (None, 2))]

    def input_names(self):
        return [i.name for i in self.inputs()]

    def run(self, feeds, outputs=None):
        assert feeds["valid_hw"].dtype == np.int32 and len(feeds["valid_hw"]) == len(feeds["images"])
        self.batches.append(len(feeds["images"]))
        return self.ort.run(feeds, outputs)

    def run_batched(self, feeds, batch, outputs=None, min_rows=1):
        from vitdeploy.runtime.base import Runner

        return Runner.run_batched(self, feeds, batch, outputs, min_rows)

    def close(self):
        pass


@pytest.fixture
def variable_engine_bundle(export_cached, tmp_path):
    """The digits variable-size bundle (48x48 canvas) with an engine record for an H200, batch 2-8."""
    from synthetic_bundle import fake_engine

    from vitdeploy.bundle import Bundle

    src = export_cached("builtin:digits", variable_size=True, canvas=(48, 48))
    shutil.copytree(src.root, tmp_path / "b")
    bundle = Bundle.open(tmp_path / "b")
    fake_engine(bundle, "h200-trt10.3.0-fp32", "fp32", gpu="NVIDIA H200", cc="9.0", batch=(2, 4, 8), hw=48)
    return Bundle.open(tmp_path / "b")


@pytest.mark.slow
def test_the_variable_size_classifier_runs_a_two_input_engine(variable_engine_bundle, monkeypatch):
    from vitdeploy.engine import fingerprint, versions
    from vitdeploy.runtime import select
    from vitdeploy.runtime.classifier import Classifier

    bundle = variable_engine_bundle
    monkeypatch.setattr(versions, "import_tensorrt", lambda purpose="": object())
    monkeypatch.setattr(versions, "installed_version", lambda: versions.TrtVersion.parse("10.3.0"))
    monkeypatch.setattr(fingerprint, "query_device", lambda index=0: fingerprint.DeviceInfo("NVIDIA H200", "9.0"))
    made = []
    monkeypatch.setattr(select, "open_engine", lambda entry: made.append(entry.target) or OrtAsEngine(bundle.artifact_path("fp32")))

    clf = Classifier.load(bundle)  # tensorrt first, as for fixed-size bundles
    assert made == ["h200-trt10.3.0-fp32"] and clf.backend == "tensorrt"
    assert (clf.min_batch, clf.max_batch) == (2, 8) and "variable-size" in clf.backend_reason
    rng = np.random.default_rng(1)
    images = [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in ((20, 36), (48, 48), (33, 17), (8, 40), (44, 12))]
    reference = Classifier.load(bundle, prefer=("onnxruntime",))
    assert reference.backend == "onnxruntime"
    np.testing.assert_allclose(clf.probabilities(images), reference.probabilities(images), atol=1e-6)
    one = clf.probabilities(images[:1])  # under the profile's minimum: padded to 2, cut back to 1
    assert one.shape == (1, 10) and clf.runner.batches == [5, 2]
    np.testing.assert_allclose(one, reference.probabilities(images[:1]), atol=1e-6)
    # no engine fits this device: ORT, with the reason; TensorRT alone: the reason as the error
    monkeypatch.setattr(fingerprint, "query_device", lambda index=0: fingerprint.DeviceInfo("Orin", "8.7"))
    fallback = Classifier.load(bundle)
    assert fallback.backend == "onnxruntime" and "rebuild on this device" in fallback.backend_reason
    from vitdeploy.errors import DeviceError

    with pytest.raises(DeviceError, match="rebuild on this device"):
        Classifier.load(bundle, prefer=("tensorrt",))


def test_profile_times_variable_cells_on_the_engine_with_their_valid_hw(variable_engine_bundle, monkeypatch):
    from vitdeploy.contract import InputContract
    from vitdeploy.profile import cells, plan, sweep
    from vitdeploy.runtime import tensorrt

    made = {}

    def runner(engine_dir):
        made.update(engine_dir=Path(engine_dir))
        return "runner"

    monkeypatch.setattr(tensorrt, "TensorRTRunner", runner)
    monkeypatch.setattr(plan, "cuda_visible", lambda: True)  # the GPU this sweep would run on
    bundle = variable_engine_bundle
    config = sweep.SweepConfig(batches=[4], backends=["tensorrt"], fills=[0.5])
    planned = sweep.plan_cells(bundle, config)
    assert [(c.backend, c.batch, c.fill, c.skip_reason) for c in planned] == [("tensorrt", 4, 0.5, None)]
    contract = InputContract.from_bundle(bundle)
    cell = cells.cell_runner(bundle, contract, planned[0], config, threads=1)
    assert cell.what == "engines/h200-trt10.3.0-fp32" and cell.make() == "runner"
    assert made["engine_dir"] == bundle.root / "engines" / "h200-trt10.3.0-fp32"
    # the cell is timed on (images, valid_hw) feeds: the canvas, and the valid sizes drawn for its fill
    stand_in = SimpleNamespace(inputs=lambda: [TensorInfo("images", "uint8", (None, 48, 48, 3)), TensorInfo("valid_hw", "int32", (None, 2))])
    feeds = cell.feeds(stand_in)
    assert feeds["images"].shape == (4, 48, 48, 3) and feeds["images"].dtype == np.uint8
    np.testing.assert_array_equal(feeds["valid_hw"], plan.cell_valid_hw(contract, planned[0], config.seed))


@pytest.mark.slow
def test_check_scores_a_variable_size_engine_where_it_runs(variable_engine_bundle, monkeypatch):
    """`check` on a variable-size bundle feeds its engine the same mixed-size sets as its graphs (profile
    rows 2..8, a chunk under the minimum padded and cut back) and gates it; elsewhere it says why not."""
    from vitdeploy.checks import CheckOptions, run_check
    from vitdeploy.engine import fingerprint, versions
    from vitdeploy.runtime import select

    bundle = variable_engine_bundle
    monkeypatch.setattr(versions, "import_tensorrt", lambda purpose="": object())
    monkeypatch.setattr(versions, "installed_version", lambda: versions.TrtVersion.parse("10.3.0"))
    monkeypatch.setattr(fingerprint, "query_device", lambda index=0: fingerprint.DeviceInfo("NVIDIA H200", "9.0"))
    engines = []
    monkeypatch.setattr(select, "open_engine", lambda entry: engines.append(OrtAsEngine(bundle.artifact_path("fp32"))) or engines[-1])
    options = CheckOptions(random_count=8, limit=57, batch=8, threads=1, write_report=False)
    report = run_check(bundle.root, options)
    assert report["kind"] == "variable-size" and report["passed"], report["failures"]
    engine = next(a for a in report["artifacts"] if a["backend"] == "tensorrt")
    assert engine["gated"] and engine["passed"] and engine["execution"] == "h200-trt10.3.0-fp32"
    assert [row["set"] for row in engine["sets"]] == ["numbers", "task"] and engine["edge"]["nonfinite"] == 0
    gates = {g["name"] for g in engine["gates"]}
    assert {"logits cosine (1st percentile of rows) on task", "top-1 agreement on task (rows vs alone)", "accuracy drop on task",
            "non-finite output values (mixed batches and edge valid_hw rows)"} <= gates
    calls = engines[0].batches
    assert min(calls) >= 2 and max(calls) <= 8 and sum(1 for c in calls if c == 2) >= 1  # 57 = 7 x 8 + 1: the last padded to 2
    graph = next(a for a in report["artifacts"] if a["backend"] == "onnxruntime")
    task = {row["set"]: row for row in engine["sets"]}["task"]
    assert task["accuracy"] == {row["set"]: row for row in graph["sets"]}["task"]["accuracy"]  # the engine stand-in is the graph
    # no engine fits this device: skipped with the reason, and the report still passes on the graphs
    monkeypatch.setattr(fingerprint, "query_device", lambda index=0: fingerprint.DeviceInfo("Orin", "8.7"))
    skipped = next(a for a in run_check(bundle.root, options)["artifacts"] if a["backend"] == "tensorrt")
    assert skipped["passed"] is None and "compute capability 9.0" in skipped["skipped"]
