"""vitdeploy.contract: the input contract parsed once from a manifest (fixed / dynamic / canvas), what it
does with images and feeds, and the one-line refusals (issue 28). Pure: manifests and numpy, no graph
runs except the last test's (a variable-size graph fed without valid_hw)."""

from __future__ import annotations

import numpy as np
import pytest

from synthetic_bundle import half_red, make_bundle
from vitdeploy.contract import CANVAS, DYNAMIC, FIXED, InputContract
from vitdeploy.errors import UserError
from vitdeploy.spec import ViTSpec

SPEC = ViTSpec.from_dict({"image_size": [32, 32], "patch_size": [4, 4], "embed_dim": 8, "depth": 1, "num_heads": 2, "num_classes": 3})
PRE = {"input": "uint8-nhwc", "channel_order": "rgb", "mean": [0.5] * 3, "std": [0.5] * 3, "input_size": [32, 32], "in_graph_resize": None,
       "host_resize": {"mode": "stretch", "interpolation": "bilinear"}}
STATIC = {"mode": "static", "height": 32, "width": 32}
CANVAS_PRE = {**PRE, "input_size": [48, 48], "variable_size": {"canvas": [48, 48], "round_to": [4, 4], "host_policy": "fit-within",
                                                               "valid_input": "valid_hw"}}


def canvas() -> InputContract:
    return InputContract.from_manifest(CANVAS_PRE, {"mode": "variable", "height": 48, "width": 48}, SPEC)


def test_kinds_are_read_from_the_manifest():
    fixed = InputContract.from_manifest(PRE, STATIC, SPEC)
    assert (fixed.kind, fixed.size, fixed.input_names, fixed.source_size) == (FIXED, (32, 32), ("images",), (32, 32))
    dynamic = InputContract.from_manifest({**PRE, "input_size": None}, {"mode": "dynamic", "height": 32, "width": 32}, SPEC, size=(24, 40))
    assert (dynamic.kind, dynamic.size) == (DYNAMIC, (24, 40))
    c = canvas()
    assert (c.kind, c.size, c.input_names, c.policy, c.source_size, c.mixes_sizes) == (CANVAS, (48, 48), ("images", "valid_hw"),
                                                                                       "fit-within", (32, 32), True)
    assert c.describe()["inputs"] == ["images", "valid_hw"] and c.runtime_details() == {"canvas": [48, 48], "policy": "fit-within"}
    assert fixed.runtime_details() == {} and not fixed.mixes_sizes
    named = InputContract.from_manifest(PRE, STATIC, SPEC, graph={"input": {"name": "pixels"}})
    assert named.input_names == ("pixels",)


@pytest.mark.parametrize("build, message", [
    (lambda: InputContract.from_manifest(PRE, STATIC, SPEC, size=(48, 48)), "takes 32x32 images only"),
    (lambda: InputContract.from_manifest(CANVAS_PRE, STATIC, SPEC, size=(32, 32)), "a size is not chosen at run time"),
    (lambda: InputContract.from_manifest(CANVAS_PRE, STATIC, SPEC, policy="stretch"), "unknown variable-size policy 'stretch'"),
    (lambda: InputContract.from_manifest({**PRE, "host_resize": {"mode": "zoom"}}, STATIC, SPEC), "unknown host_resize mode"),
])
def test_bad_contracts_are_one_line(build, message):
    with pytest.raises(UserError, match=message) as info:
        build()
    assert "\n" not in str(info.value)


def test_fixed_images_are_resized_by_the_rule_and_batched_by_size():
    fixed = InputContract.from_manifest(PRE, STATIC, SPEC)
    same = half_red(32, 32, "top")
    assert fixed.prepare(same) is same  # the graph's size goes in unchanged
    assert fixed.prepare(half_red(50, 20, "left")).shape == (32, 32, 3)
    feeds = fixed.feeds([same, fixed.prepare(half_red(8, 8, "right"))])
    assert list(feeds) == ["images"] and feeds["images"].shape == (2, 32, 32, 3)
    big = np.zeros((4, 32, 32, 3), np.uint8)
    assert fixed.feeds_for(big)["images"] is big  # a batch the graph takes as it is is not copied
    assert fixed.feeds_for(np.zeros((2, 20, 20, 3), np.uint8))["images"].shape == (2, 32, 32, 3)
    dynamic = InputContract.from_manifest({**PRE, "input_size": None}, {"mode": "dynamic", "height": 32, "width": 32}, SPEC)
    runs = list(dynamic.group([np.zeros((32, 32, 3), np.uint8)] * 3 + [np.zeros((24, 24, 3), np.uint8)], max_rows=2))
    assert [len(r) for r in runs] == [2, 1, 1]  # one size per call, at most two rows
    with pytest.raises(UserError, match="several sizes"):
        dynamic.feeds([np.zeros((32, 32, 3), np.uint8), np.zeros((24, 24, 3), np.uint8)])


def test_a_canvas_fits_pads_and_crops_back():
    c = canvas()
    images = [c.prepare(half_red(h, w, "top")) for h, w in ((100, 50), (10, 30), (48, 48))]
    assert [im.shape[:2] for im in images] == [(48, 24), (16, 48), (48, 48)]  # aspect kept, whole patches, within the canvas
    assert [len(r) for r in c.group(images, max_rows=2)] == [2, 1]  # sizes mix in one call
    feeds = c.feeds(images)
    assert feeds["images"].shape == (3, 48, 48, 3) and feeds["valid_hw"].dtype == np.int32
    assert feeds["valid_hw"].tolist() == [[48, 24], [16, 48], [48, 48]]
    back = c.crops(feeds)
    assert all(np.array_equal(a, b) for a, b in zip(back, images))
    padded = c.pad_rows(feeds, 5)
    assert c.rows(padded) == 5 and padded["valid_hw"][3:].tolist() == [[48, 48]] * 2
    assert c.take(padded, 1, 3)["valid_hw"].tolist() == [[16, 48], [48, 48]]
    placed = c.at_size(24, 40)
    assert placed.policy == "none" and placed.prepare(np.zeros((24, 40, 3), np.uint8)).shape == (24, 40, 3)
    random = c.random_feeds(4, 48, 48, seed=1, valid_hw=np.array([[8, 8]] * 4))
    assert random["images"].shape == (4, 48, 48, 3) and random["valid_hw"].tolist() == [[8, 8]] * 4


@pytest.mark.parametrize("feeds, message", [
    ({"images": np.zeros((1, 48, 48, 3), np.uint8)}, r"takes inputs \(images, valid_hw\), got \(images\); valid_hw is each image"),
    ({"images": np.zeros((1, 48, 48, 3), np.float32), "valid_hw": np.array([[8, 8]])}, "takes uint8, got float32"),
    ({"images": np.zeros((1, 40, 48, 3), np.uint8), "valid_hw": np.array([[8, 8]])}, r"must be \[B, 48, 48, 3\] \(the canvas\)"),
    ({"images": np.zeros((2, 48, 48, 3), np.uint8), "valid_hw": np.array([[8, 8]])}, "1 rows for 2 images"),
    ({"images": np.zeros((1, 48, 48, 3), np.uint8), "valid_hw": np.array([[10, 8]])}, "not whole 4x4 patches"),
    ({"images": np.zeros((1, 48, 48, 3), np.uint8), "valid_hw": np.array([[0, 8]])}, "at least one"),
    ({"images": np.zeros((1, 48, 48, 3), np.uint8), "valid_hw": np.array([[52, 8]])}, "larger than the 48x48 canvas"),
])
def test_bad_canvas_feeds_are_one_line(feeds, message):
    with pytest.raises(UserError, match=message) as info:
        canvas().check_feeds(feeds)
    assert "\n" not in str(info.value)


def test_an_engine_profile_narrows_rows_and_sizes():
    dynamic = InputContract.from_manifest({**PRE, "input_size": None}, {"mode": "dynamic", "height": 32, "width": 32}, SPEC)
    engine = dynamic.narrowed(batch=(2, 4), heights=(16, 32), widths=(16, 48))
    assert (engine.min_rows, engine.max_rows(32), dynamic.max_rows(32)) == (2, 4, 32)
    assert engine.accepts(32, 48) and not engine.accepts(36, 48) and not engine.accepts(30, 32)
    with pytest.raises(UserError, match="outside the engine profile's 16..32"):
        engine.check_feeds({"images": np.zeros((2, 36, 32, 3), np.uint8)})
    with pytest.raises(UserError, match="at most 4"):
        engine.check_feeds({"images": np.zeros((5, 32, 32, 3), np.uint8)})


def test_a_float_input_graph_gets_normalised_nchw(tmp_path):
    bundle = make_bundle(tmp_path / "f", float_input=True)
    contract = InputContract.from_bundle(bundle)
    feeds = contract.feeds([half_red(16, 16, "top")])
    assert feeds["images"].dtype == np.float32 and feeds["images"].shape == (1, 3, 16, 16)
    assert feeds["images"].min() == pytest.approx(-1.0) and feeds["images"].max() == pytest.approx(1.0)  # (p/255 - 0.5)/0.5


@pytest.fixture(scope="module")
def canvas_bundle(export_cached):
    """The digits model exported with --variable-size --canvas 48x48 (set-up: shared through the cache)."""
    return export_cached("builtin:digits", variable_size=True, canvas=(48, 48))


def test_a_two_input_graph_fed_one_input_says_what_is_missing(canvas_bundle):
    """The seam `evaluate` used to hit (ONNX Runtime's raw "Required inputs (['valid_hw']) are missing"): now one line."""
    from vitdeploy.runtime.ort import OrtRunner

    bundle = canvas_bundle
    runner = OrtRunner(bundle.artifact_path("fp32"), threads=1)
    assert runner.input_names() == ["images", "valid_hw"]
    for call in (lambda: runner.infer(np.zeros((1, 48, 48, 3), np.uint8)), lambda: runner.run({"images": np.zeros((1, 48, 48, 3), np.uint8)})):
        with pytest.raises(UserError, match="valid_hw") as info:
            call()
        assert "\n" not in str(info.value) and "Required inputs" not in str(info.value)
    contract = InputContract.from_bundle(bundle)
    out = runner.run(contract.feeds([contract.prepare(half_red(20, 36, "left"))]))
    assert out["probs"].shape == (1, 10) and np.isclose(out["probs"].sum(), 1.0, atol=1e-5)
