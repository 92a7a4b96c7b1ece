"""vitdeploy.runtime.classifier: backend choice, inputs, batching, threads, and no torch at import."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from synthetic_bundle import LABELS, expected_probs, fake_engine, half_red, make_bundle
from vitdeploy.errors import DeviceError, UserError
from vitdeploy.runtime import classifier as clf_mod
from vitdeploy.runtime import select
from vitdeploy.runtime.classifier import Classifier, Top, top_k_of
from vitdeploy.runtime.ort import OrtRunner

SIDES = ["top", "bottom", "left", "right"]


def sample_images(size=16):
    """One image per class: the four half-red images and a uniform gray."""
    return np.stack([half_red(size, size, s) for s in SIDES] + [np.full((size, size, 3), 128, np.uint8)])


@pytest.fixture(scope="module")
def bundles(tmp_path_factory):
    root = tmp_path_factory.mktemp("clf")
    return {
        "static": make_bundle(root / "static"),
        "dynamic": make_bundle(root / "dynamic", mode="dynamic"),
        "resize": make_bundle(root / "resize", in_graph_resize=True),
        "bgr": make_bundle(root / "bgr", channel_order="bgr"),
        "fp16": make_bundle(root / "fp16", fp16=True),
    }


# -- answers -----------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["static", "dynamic", "resize"])
def test_classify_arrays_gives_the_graph_answer(bundles, kind):
    with Classifier.load(bundles[kind], prefer=("onnxruntime",)) as clf:
        imgs = sample_images()
        tops = clf.classify(imgs, top_k=2)
        assert [t[0].label for t in tops] == LABELS
        assert all(isinstance(t[0], Top) and len(t) == 2 and t[0].prob >= t[1].prob for t in tops)
        np.testing.assert_allclose(clf.probabilities(imgs), expected_probs(imgs), atol=1e-6)
        # a single HWC image, and a list of them, give the same rows
        assert clf.classify(imgs[2], top_k=1) == [tops[2][:1]]
        assert clf.classify(list(imgs[:2]), top_k=2) == tops[:2]


def test_a_bare_onnx_file_is_enough(bundles):
    """A vitdeploy ONNX carries its manifest core: labels, preprocessing and size come with it."""
    clf = Classifier.load(bundles["static"].root / "model.onnx")
    assert clf.backend == "onnxruntime" and clf.labels == LABELS and clf.input_size == (16, 16)
    assert [t[0].label for t in clf.classify(sample_images(), 1)] == LABELS


def test_bgr_bundle_takes_bgr_arrays_and_rgb_files(bundles, tmp_path):
    clf = Classifier.load(bundles["bgr"], prefer=("onnxruntime",))
    imgs = sample_images()
    assert [t[0].label for t in clf.classify(imgs[..., ::-1].copy(), 1)] == LABELS  # arrays: graph order
    path = tmp_path / "top.png"
    Image.fromarray(half_red(30, 20, "top")).save(path)  # files: decoded RGB, swapped for the graph
    assert clf.classify(str(path), 1)[0][0].label == "red-top"


def test_float_nchw_bundle_gets_normalised_pixels(tmp_path):
    """A graph exported with --input float-nchw: the Classifier does the contract's normalisation."""
    bundle = make_bundle(tmp_path / "f", float_input=True)
    clf = Classifier.load(bundle, prefer=("onnxruntime",))
    assert clf.runner.inputs()[0].dtype == "float32"
    imgs = sample_images()
    assert [t[0].label for t in clf.classify(imgs, 1)] == LABELS
    np.testing.assert_allclose(clf.probabilities(imgs), expected_probs(imgs), atol=1e-6)


def test_other_sizes_are_resized_by_the_rule(bundles):
    clf = Classifier.load(bundles["static"], prefer=("onnxruntime",))
    big = half_red(90, 50, "right")
    assert clf.classify(big, 1)[0][0].label == "red-right"
    # dynamic bundle at a requested size, refused when the patch grid does not tile it
    dyn = Classifier.load(bundles["dynamic"], prefer=("onnxruntime",), size=(24, 32))
    assert dyn.input_size == (24, 32)
    assert dyn.classify(half_red(24, 32, "left"), 1)[0][0].label == "red-left"
    with pytest.raises(UserError, match="not a multiple of the patch size"):
        Classifier.load(bundles["dynamic"], prefer=("onnxruntime",), size=(18, 32))


def test_top_k_order_ties_and_bounds():
    probs = np.array([0.1, 0.3, 0.2, 0.3, 0.1], dtype=np.float32)
    assert [t.label for t in top_k_of(probs, list("abcde"), 3)] == ["b", "d", "c"]  # tie: lower index first
    assert len(top_k_of(probs, list("abcde"), 10)) == 5


def test_bad_inputs_are_user_errors(bundles):
    clf = Classifier.load(bundles["static"], prefer=("onnxruntime",))
    for bad, what in [
        (np.zeros((16, 16, 3), np.float32), "uint8"),
        (np.zeros((16, 16), np.uint8), r"\[H, W, 3\]"),
        (42, "cannot classify a int"),
        ([], "no images"),
    ]:
        with pytest.raises(UserError, match=what):
            clf.classify(bad)
    with pytest.raises(UserError, match="top_k"):
        clf.classify(sample_images(), top_k=0)
    with pytest.raises(UserError, match="no int8 graph"):
        Classifier.load(bundles["static"], precision="int8")
    with pytest.raises(UserError, match="unknown backend"):
        Classifier.load(bundles["static"], prefer=("openvino",))


# -- backend and precision choice ------------------------------------------------------------
def test_without_tensorrt_it_falls_back_to_ort_and_says_why(bundles):
    clf = Classifier.load(bundles["static"])
    assert clf.backend == "onnxruntime" and clf.precision == "fp32"
    assert clf.runner.info.device == "cpu"
    assert clf.backend_reason.startswith("tensorrt: ")
    assert "no TensorRT engine" in clf.backend_reason and "onnxruntime fp32 on cpu" in clf.backend_reason
    with pytest.raises(DeviceError, match="no TensorRT engine"):
        Classifier.load(bundles["static"], prefer=("tensorrt",))


def test_precision_best_is_fp32_on_cpu_and_fp16_on_request(bundles):
    best = Classifier.load(bundles["fp16"], prefer=("onnxruntime",))
    assert best.precision == "fp32"
    half = Classifier.load(bundles["fp16"], prefer=("onnxruntime",), precision="fp16")
    assert half.precision == "fp16" and half.runner.info.precision == "fp16"
    imgs = sample_images()
    np.testing.assert_allclose(half.probabilities(imgs), best.probabilities(imgs), atol=2e-3)


class RecordingRunner:
    """Stands in for the TensorRT runner (GPU-only): computes the graph's answer with ORT and records
    every batch and how many calls ran at once."""

    def __init__(self, onnx_path, delay=0.0):
        self.ort = OrtRunner(onnx_path)
        self.info = self.ort.info
        self.batches, self.active, self.max_active, self.delay = [], 0, 0, delay
        self._count = threading.Lock()

    def input_names(self):
        return self.ort.input_names()

    def run(self, feeds, outputs=None):
        with self._count:
            self.active += 1
            self.max_active = max(self.max_active, self.active)
        time.sleep(self.delay)
        self.batches.append(len(feeds["images"]))
        out = self.ort.run(feeds, outputs)
        with self._count:
            self.active -= 1
        return out

    def close(self):
        pass


def test_engine_selection_by_fingerprint(tmp_path, monkeypatch):
    """The TensorRT path's choice logic, with the GPU-only pieces replaced."""
    from vitdeploy.engine import fingerprint, versions

    bundle = make_bundle(tmp_path / "b", fp16=True)
    fake_engine(bundle, "orin-trt10.3.0-fp16", "fp16")
    fake_engine(bundle, "h200-trt10.3.0-fp32", "fp32", gpu="NVIDIA H200", cc="9.0")
    fake_engine(bundle, "orin-trt8.6.1-fp32", "fp32", trt="8.6.1")
    monkeypatch.setattr(versions, "import_tensorrt", lambda purpose="": object())
    monkeypatch.setattr(versions, "installed_version", lambda: versions.TrtVersion.parse("10.3.0"))
    monkeypatch.setattr(fingerprint, "query_device", lambda index=0: fingerprint.DeviceInfo("NVIDIA H200", "9.0"))
    made = []

    def runner(entry):
        made.append(entry.target)
        return RecordingRunner(bundle.artifact_path("fp32"))

    monkeypatch.setattr(select, "open_engine", runner)
    clf = Classifier.load(bundle)
    # fp16 would be "best" but was built for sm 8.7; the H200 fp32 engine fits
    assert made == ["h200-trt10.3.0-fp32"]
    assert clf.backend == "tensorrt" and clf.precision == "fp32" and (clf.min_batch, clf.max_batch) == (1, 8)
    assert "tensorrt fp32 engine h200-trt10.3.0-fp32" in clf.backend_reason
    # fp16 asked for explicitly: none fits -> ORT, and the reason says rebuild
    clf16 = Classifier.load(bundle, precision="fp16")
    assert clf16.backend == "onnxruntime"
    assert "compute capability 8.7" in clf16.backend_reason and "rebuild on this device" in clf16.backend_reason
    with pytest.raises(DeviceError, match="rebuild on this device"):
        Classifier.load(bundle, prefer=("tensorrt",), precision="fp16")


def test_engines_of_a_bare_onnx_are_found_by_source_hash(tmp_path):
    from vitdeploy.bundle import Bundle

    bundle = make_bundle(tmp_path / "b", fp16=True)
    fake_engine(bundle, "mine", "fp32")  # built from model.onnx
    fake_engine(bundle, "other", "fp16")  # built from model.fp16.onnx
    bare = Bundle.open(bundle.root / "model.onnx")
    assert [e.target for e in clf_mod.find_engines(bare)] == ["mine"]
    assert [e.target for e in clf_mod.find_engines(bundle)] == ["mine", "other"]


def test_batches_split_to_the_engine_profile_and_padded_to_its_minimum(tmp_path, monkeypatch):
    bundle = make_bundle(tmp_path / "b")
    imgs = np.concatenate([sample_images()] * 2)  # 10 images
    runner = RecordingRunner(bundle.artifact_path("fp32"))
    clf = Classifier(runner, bundle, backend="tensorrt", precision="fp32", backend_reason="test", input_size=(16, 16), max_batch=4, min_batch=3)
    probs = clf.probabilities(imgs)
    assert runner.batches == [4, 4, 3]  # 4 + 4 + 2 padded to the profile's minimum of 3
    assert probs.shape == (10, 5)
    np.testing.assert_allclose(probs, expected_probs(imgs), atol=1e-6)
    ort = Classifier.load(bundle, prefer=("onnxruntime",), max_batch=3)
    assert ort.max_batch == 3 and ort.classify(imgs, 1) == clf.classify(imgs, 1)


def test_threads_share_one_classifier(tmp_path):
    bundle = make_bundle(tmp_path / "b")
    imgs = sample_images()
    expected = [t[0].label for t in Classifier.load(bundle, prefer=("onnxruntime",)).classify(imgs, 1)]

    def hammer(clf, results):
        def work(i):
            for _ in range(5):
                results[i].append([t[0].label for t in clf.classify(np.roll(imgs, i, axis=0), 1)])

        threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    # ORT: concurrent runs, no lock
    ort = Classifier.load(bundle, prefer=("onnxruntime",))
    results = {i: [] for i in range(4)}
    hammer(ort, results)
    for i, rows in results.items():
        assert all(r == list(np.roll(np.array(expected), i)) for r in rows)
    # A runner that is not thread-safe (TensorRT's context) is entered by one thread at a time
    runner = RecordingRunner(bundle.artifact_path("fp32"), delay=0.002)
    locked = Classifier(runner, bundle, backend="tensorrt", precision="fp32", backend_reason="test", input_size=(16, 16), max_batch=8)
    results = {i: [] for i in range(4)}
    hammer(locked, results)
    assert runner.max_active == 1 and len(runner.batches) == 20
    for i, rows in results.items():
        assert all(r == list(np.roll(np.array(expected), i)) for r in rows)


BLOCK_TORCH = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch.") or name in ("torchvision", "timm", "transformers"):
            raise ImportError("blocked: " + name)
sys.meta_path.insert(0, Block())
from vitdeploy.runtime.classifier import Classifier
clf = Classifier.load(sys.argv[1])
top = clf.classify(sys.argv[2], top_k=1)[0][0]
assert not [m for m in sys.modules if m == "torch" or m.startswith("torch.")]
print(clf.backend, top.label)
"""


def test_runtime_imports_and_runs_without_torch(tmp_path):
    bundle = make_bundle(tmp_path / "b")
    Image.fromarray(half_red(20, 20, "bottom")).save(tmp_path / "x.png")
    proc = subprocess.run(
        [sys.executable, "-c", BLOCK_TORCH, str(bundle.root), str(tmp_path / "x.png")],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).resolve().parents[1],
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["onnxruntime", "red-bottom"]


# -- acceptance on the real model ------------------------------------------------------------
def test_same_top1_as_ort_runner_on_digits_test_split(digits_bundle):
    """Acceptance: the Classifier answers what `vitdeploy check`'s ONNX Runtime runner answers."""
    from vitdeploy.builtin import BUILTIN_MODELS

    bundle = digits_bundle

    images, labels = BUILTIN_MODELS["digits"].load_split("test")
    clf = Classifier.load(bundle, prefer=("onnxruntime",))
    ours = np.array([clf.labels.index(t[0].label) for t in clf.classify(images, top_k=1)])
    runner = OrtRunner(bundle.artifact_path("fp32"))
    ref = np.concatenate([runner.infer(images[i : i + 64])["logits"].argmax(1) for i in range(0, len(images), 64)])
    assert len(ours) == len(labels) == 360
    assert (ours == ref).all()
    assert (ours == np.asarray(labels)).mean() > 0.9  # and the model is the trained one


@pytest.mark.gpu
def test_tensorrt_classifier_matches_ort_on_a_real_engine(tmp_path):
    pytest.importorskip("tensorrt")
    from vitdeploy.engine.fingerprint import query_device

    try:
        query_device()
    except Exception as exc:  # no GPU / no cuda-python
        pytest.skip(f"no usable GPU: {exc}")
    from click.testing import CliRunner

    from vitdeploy.cli import main

    bundle = make_bundle(tmp_path / "b")
    built = CliRunner().invoke(main, ["build-engine", str(bundle.root), "--precision", "fp32", "--batch", "1:4:8"])
    assert built.exit_code == 0, built.output
    trt = Classifier.load(bundle.root)
    assert trt.backend == "tensorrt"
    imgs = np.concatenate([sample_images()] * 3)
    ort = Classifier.load(bundle.root, prefer=("onnxruntime",))
    np.testing.assert_allclose(trt.probabilities(imgs), ort.probabilities(imgs), atol=1e-4)


def test_ort_sessions_take_their_default_threads_from_the_environment(digits_bundle, monkeypatch):
    """VITDEPLOY_ORT_THREADS sets the intra-op threads of sessions that ask for none (several processes
    on one machine); an explicit count still wins, and a bad value is one line."""
    from vitdeploy.errors import UserError
    from vitdeploy.runtime.ort import OrtRunner

    graph = digits_bundle.artifact_path("fp32")
    monkeypatch.setenv("VITDEPLOY_ORT_THREADS", "1")
    runner = OrtRunner(graph)
    assert runner.info.details["threads"] == 1 and runner.session.get_session_options().intra_op_num_threads == 1
    assert OrtRunner(graph, threads=2).session.get_session_options().intra_op_num_threads == 2
    monkeypatch.setenv("VITDEPLOY_ORT_THREADS", "two")
    with pytest.raises(UserError, match="VITDEPLOY_ORT_THREADS='two': expected a whole number"):
        OrtRunner(graph)
