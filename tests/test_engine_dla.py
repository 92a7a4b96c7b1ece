"""DLA feasibility report: rules and multiply-add shares from the ONNX graph alone (CPU only)."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from engine_fixtures import make_spec, write_bundle
from onnx import TensorProto, helper

from vitdeploy.cli import main
from vitdeploy.engine import dla


@pytest.fixture(scope="module")
def bundles(tmp_path_factory):
    root = tmp_path_factory.mktemp("dla")
    return {
        "p8": write_bundle(root / "p8", precisions=("fp32", "fp16", "int8")),
        "p16": write_bundle(root / "p16", precisions=("fp32", "fp16"), spec=make_spec(image=32, patch=16)),
        "dynamic": write_bundle(root / "dyn", dynamic_hw=True, precisions=("fp32", "fp16")),
    }


def _by_name(report):
    return {n.name: n for n in report.nodes}


def test_fp16_vit_macs_and_placement(bundles):
    spec = bundles["p8"].spec
    report = dla.analyse(bundles["p8"].artifact_path("fp16"), (2, 32, 32, 3), "fp16")
    nodes = _by_name(report)
    d, (gh, gw), p = spec.embed_dim, spec.native_grid, spec.patch_size[0]
    tokens = gh * gw + 1
    assert nodes["patch/conv"].macs == 2 * d * gh * gw * 3 * p * p
    assert nodes["mlp/fc1_mm"].macs == 2 * tokens * d * 4 * d
    assert nodes["attn/scores"].macs == 2 * spec.num_heads * tokens * tokens * spec.head_dim
    # the patch Conv (stride 8, fp16) runs on DLA; every matmul, Gather, LayerNorm, Erf and Cast does not
    assert nodes["patch/conv"].device == "dla" and nodes["patch/conv"].reasons == []
    for name, rule in [("attn/qkv_mm", "MatrixMultiply is not a DLA layer"), ("attn/q", "Gather is not a DLA layer"),
                       ("blk.norm1/ln", "LayerNormalization is not a DLA layer"), ("mlp/gelu_erf", "Erf (exact GELU) is not a DLA op"),
                       ("cls/concat", "Concat not along channels"), ("attn/qkv_split", "tensor rank > 4")]:
        assert nodes[name].device == "gpu" and rule in [r for r, _ in nodes[name].reasons], name
    assert nodes["mlp/gelu_mul"].device == "dla"  # elementwise fp16
    assert nodes["cls/shape"].device == "folded"  # shape arithmetic is constant-folded at build time
    assert report.macs_gpu == report.macs_total - nodes["patch/conv"].macs
    assert report.by_rule()[0]["rule"] == "MatrixMultiply is not a DLA layer"


def test_fp32_int8_and_patch16(bundles):
    fp32 = dla.analyse(bundles["p8"].artifact_path("fp32"), (1, 32, 32, 3), "fp32")
    assert fp32.gpu_share == 1.0 and all(n.device == "gpu" for n in fp32.counted)
    assert all(("fp32 compute", "DLA runs FP16 and INT8 only") in n.reasons for n in fp32.counted if n.dtype == "float32")
    # legacy FP16/INT8 flags let TensorRT lower fp32 layers: then only the layer rules remain
    lowered = dla.analyse(bundles["p8"].artifact_path("fp32"), (1, 32, 32, 3), "fp16", flags_lower_fp32=True)
    assert _by_name(lowered)["patch/conv"].device == "dla"
    int8 = dla.analyse(bundles["p8"].artifact_path("int8"), (1, 32, 32, 3), "int8")
    nodes = _by_name(int8)
    assert nodes["patch/conv"].dtype == "int8" and nodes["patch/conv"].device == "dla"
    assert int8.to_dict()["layers"]["fused"] > 0  # Q/DQ pairs merge into the int8 layers
    p16 = dla.analyse(bundles["p16"].artifact_path("fp16"), (1, 32, 32, 3), "fp16")
    conv = _by_name(p16)["patch/conv"]
    assert conv.device == "gpu" and conv.reasons[0][0] == "Convolution stride > 8"
    assert p16.gpu_share == 1.0


def test_dynamic_profiles_and_resolution(bundles):
    report = dla.analyse(bundles["dynamic"].artifact_path("fp16"), (1, 48, 64, 3), "fp16", static_shapes=False)
    assert all(("dynamic dimensions", "DLA needs min = opt = max in every profile") in n.reasons for n in report.counted)
    assert _by_name(report)["pos/resize"].device == "folded"  # position-table resize of a constant at a fixed size
    assert _by_name(report)["attn/scores"].macs == 2 * (6 * 8 + 1) ** 2 * 16


def _softmax_graph(path, shape):
    graph = helper.make_graph(
        [helper.make_node("Softmax", ["x"], ["y"], name="softmax", axis=-1)], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT16, shape)], [helper.make_tensor_value_info("y", TensorProto.FLOAT16, shape)],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


@pytest.mark.parametrize("shape, ok", [([1, 2, 600, 600], True), ([1, 2, 1100, 1100], False), ([1, 1, 1, 5000], True), ([1, 1, 1, 9000], False)])
def test_softmax_axis_limits(tmp_path, shape, ok):
    report = dla.analyse(_softmax_graph(tmp_path / "s.onnx", shape), tuple(shape), "fp16")
    node = report.nodes[0]
    assert (node.device == "dla") is ok, node.reasons


def test_cli_dla_report(bundles):
    res = CliRunner().invoke(main, ["build-engine", str(bundles["p8"].root), "--precision", "fp16", "--dla-report"])
    assert res.exit_code == 0, res.output
    assert "multiply-adds on the GPU" in res.output and "MatrixMultiply is not a DLA layer" in res.output
    report = json.loads((bundles["p8"].root / "reports" / "dla-fp16.json").read_text())
    assert report["input_shape"] == [1, 32, 32, 3] and 0 < report["gpu_share"] < 1
    assert report["profiles"][0]["batch"] == [1, 1, 1]


def test_integer_shape_arithmetic_is_resolved(tmp_path):
    """Exporters compute sizes with integer Div (e.g. H // patch), which ONNX's data propagation leaves
    unknown; the report then falls back to ONNX Runtime's symbolic shape inference."""
    pytest.importorskip("sympy")
    from onnx import numpy_helper

    consts = {"one": [1], "two": [2], "s1": [1], "s2": [2]}
    inits = [numpy_helper.from_array(np.array(v, np.int64), k) for k, v in consts.items()]
    inits.append(numpy_helper.from_array(np.ones((2, 4), np.float16), "w"))
    nodes = [
        helper.make_node("Shape", ["x"], ["shp"], name="shape"),
        helper.make_node("Slice", ["shp", "s1", "s2"], ["width"], name="width"),
        helper.make_node("Div", ["width", "two"], ["half"], name="half"),
        helper.make_node("Concat", ["one", "half", "two"], ["newshape"], axis=0, name="newshape"),
        helper.make_node("Reshape", ["x", "newshape"], ["r"], name="reshape"),
        helper.make_node("MatMul", ["r", "w"], ["y"], name="mm"),
    ]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [1, "w"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT16, None)], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "div.onnx")
    report = dla.analyse(tmp_path / "div.onnx", (1, 64), "fp16")
    assert _by_name(report)["mm"].macs == 1 * 32 * 4 * 2 and report.to_dict()["macs_unknown_nodes"] == []
