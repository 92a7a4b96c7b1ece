"""The fp16 pass at a model's native size (issue 36): the range pass and the gate run as many images as
the cost-model budget of export's verification and `check` allows, the range pass reduces each tensor
inside the graph (scalars out, not every tensor of a batch), and a signal stops an ONNX Runtime run
while it computes. No test here reads a clock: counts and outcomes only."""

from __future__ import annotations

import signal
import threading

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from synthetic_bundle import make_bundle
from vitdeploy.budget import plan_verification
from vitdeploy.spec import ViTSpec

VIT_S14_518 = ViTSpec(image_size=(518, 518), patch_size=(14, 14), embed_dim=384, depth=12, num_heads=6, num_classes=0)


def _chain_model(opset: int = 18):
    """x -> a = x * 3 -> b = a + big (one row 1e30 -> inf in fp32 after *1e10) -> y; with a second output z."""
    three = numpy_helper.from_array(np.array(3.0, dtype=np.float32), "three")
    huge = numpy_helper.from_array(np.array([1.0, 1e30], dtype=np.float32), "huge")
    scale = numpy_helper.from_array(np.array(1e10, dtype=np.float32), "scale")
    nodes = [helper.make_node("Mul", ["x", "three"], ["a"], name="triple"),
             helper.make_node("Mul", ["a", "huge"], ["b"], name="blow_up"),
             helper.make_node("Mul", ["b", "scale"], ["c"], name="overflow"),  # 1e40: inf in fp32
             helper.make_node("Neg", ["a"], ["z"], name="negate"),
             helper.make_node("Identity", ["c"], ["y"], name="out")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 2]),
                               helper.make_tensor_value_info("z", TensorProto.FLOAT, [None, 2])], [three, huge, scale])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


@pytest.mark.parametrize("opset", [13, 18])  # ReduceMax/ReduceMin took axes as an attribute before 18, an input since
def test_range_pass_reduces_inside_the_graph(opset: int) -> None:
    from vitdeploy.exporters.fp16_range import tensor_absmax

    rng = np.random.default_rng(0)
    feeds = [{"x": rng.uniform(-2, 2, (3, 2)).astype(np.float32)} for _ in range(3)]
    steps: list[float] = []
    outputs: dict = {}
    got = tensor_absmax(_chain_model(opset), feeds, ["x", "a", "b", "c", "z"], steps=steps, outputs=outputs)
    x = np.concatenate([f["x"] for f in feeds]).astype(np.float64)
    assert got["x"] == pytest.approx(np.abs(x).max(), rel=1e-6)
    assert got["a"] == pytest.approx(3 * np.abs(x).max(), rel=1e-6) and got["z"] == got["a"]  # max |x| of a negative max
    assert got["b"] == pytest.approx(float(np.abs(np.float32(3) * x[:, 1] * np.float32(1e30)).max()), rel=1e-5)
    assert got["c"] == float("inf")  # beyond fp32: inf, as the numpy pass had it
    assert len(steps) == len(feeds)  # one run per feed, each timed for the log
    assert set(outputs) == {"y", "z"} and outputs["z"].shape == (9, 2)  # the graph's own outputs, for the gate
    assert np.allclose(outputs["z"], -3 * x, rtol=1e-6)


def test_range_and_gate_images_follow_the_cost_model_budget(tmp_path) -> None:
    """A ViT-S/14 at 518x518 (DINOv2-S's native size) runs what the budget allows, not the fixed counts;
    a small model still runs every image asked for."""
    from vitdeploy.exporters.fp16_gate import GATE_IMAGES
    from vitdeploy.exporters.fp16_range import NOISE_IMAGES, image_budget, range_feeds

    bundle = make_bundle(tmp_path / "b")
    small_feeds, small = range_feeds(bundle, "__noise__")
    assert small["count"] == NOISE_IMAGES and small["budget"]["images"] == NOISE_IMAGES
    assert sum(len(f["images"]) for f in small_feeds) == NOISE_IMAGES

    bundle.manifest["spec"] = VIT_S14_518.to_dict()
    bundle.manifest["preprocessing"]["input_size"] = [518, 518]
    want = plan_verification(VIT_S14_518, [(518, 518)], NOISE_IMAGES)[0]
    feeds, record = range_feeds(bundle, "__noise__")
    assert record["count"] == want.images < NOISE_IMAGES and record["budget"]["requested"] == NOISE_IMAGES
    assert [len(f["images"]) for f in feeds] == [want.batch] * (want.images // want.batch)
    assert feeds[0]["images"].shape[1:] == (518, 518, 3)
    gate = image_budget(bundle, GATE_IMAGES)
    assert gate.images == plan_verification(VIT_S14_518, [(518, 518)], GATE_IMAGES)[0].images < GATE_IMAGES


def test_a_signal_stops_an_onnx_runtime_run_while_it_computes() -> None:
    """SIGINT arrives while the main thread waits on a long run: KeyboardInterrupt comes out of the run
    (not after it), the run is told to stop, and no worker thread is left behind."""
    import onnxruntime as ort

    from vitdeploy.exporters import ort_interrupt

    n, depth = 768, 200  # hundreds of chained matmuls: seconds of work, stopped within one node
    w = numpy_helper.from_array((np.eye(n, dtype=np.float32) * 0.5), "w")
    nodes = [helper.make_node("MatMul", ["x" if i == 0 else f"t{i}", "w"], [f"t{i + 1}"]) for i in range(depth)]
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n, n])],
                              [helper.make_tensor_value_info(f"t{depth}", TensorProto.FLOAT, [n, n])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    started = threading.Event()
    main = threading.main_thread().ident

    original = session.run

    returned = threading.Event()

    def run_and_announce(*args, **kwargs):
        started.set()
        try:
            return original(*args, **kwargs)
        finally:
            returned.set()

    session.run = run_and_announce  # type: ignore[method-assign]

    def interrupt() -> None:
        started.wait()
        signal.pthread_kill(main, signal.SIGINT)

    sender = threading.Thread(target=interrupt)
    sender.start()
    with pytest.raises(KeyboardInterrupt):
        ort_interrupt.run(session, None, {"x": np.ones((n, n), np.float32)})
    # the interrupt comes out only once ONNX Runtime has returned: a signal landing inside
    # Thread.join(timeout) used to mark the still-running worker stopped (CPython's bpo-45274 branch),
    # and a command then exited with the run going on (exit 134 at interpreter exit)
    assert returned.is_set()
    sender.join()
    # waited for: the run returned on its terminate flag and its thread has ended
    assert not [t for t in threading.enumerate() if t.name == "ort-run" and t.is_alive()]
