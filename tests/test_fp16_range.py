"""FP16 that cannot be written broken: the range pass, the gate at write time, keep-fp32 by module.

The massive-residual variant of the digits model (stream x 8192, LayerNorm epsilon x 8192^2: fp32
unchanged) carries values past fp16's 65504. The range pass keeps the stream's Adds and writers in
fp32 and the graph passes `check`; without it the gate refuses the graph in one line, although ONNX
Runtime's CPU kernels (fp32 inside) would score it fine: the static overflow check is what catches
it. The shipped digits model keeps its figures (nothing extra kept, 99.72%).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner

from precision_fixtures import export_timm, massive_bundle, timm_variants, variant_checkpoints  # noqa: F401
from vitdeploy.bundle import Bundle
from vitdeploy.cli import main
from vitdeploy.exporters.fp16 import convert_to_fp16, tensor_elem_types
from vitdeploy.runtime.ort import OrtRunner


def _state(root: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(root.iterdir()) if p.is_file()}


def _test_split():
    from vitdeploy.builtin import load_digits_split

    return load_digits_split("test")


@pytest.mark.slow
def test_export_fp16_of_the_massive_variant_passes_check(variant_checkpoints, tmp_path: Path) -> None:
    """The acceptance: `export --precision fp32,fp16` writes an fp16 graph that `check` passes on
    digits:test, with most linear layers still fp16 (17 of 26: qkv, attention, fc1, head)."""
    out = tmp_path / "massive"
    runner = CliRunner()
    result = runner.invoke(main, ["export", f"ref:{variant_checkpoints['massive']}", "-o", str(out), "--precision", "fp32,fp16",
                                  "--fp16-data", "digits:train", "--check-images", "8"])
    assert result.exit_code == 0, result.output
    assert "range pass: kept" in result.output and "gate on digits:test" in result.output
    record = Bundle.open(out).artifact_record("fp16")
    kept = record["range_pass"]["kept"]
    assert {k["op_type"] for k in kept} >= {"Add", "MatMul", "Conv"} and all(k["max_abs"] > record["range_pass"]["data_max"] for k in kept)
    assert record["placement"]["linear_ops"] == 26 and record["placement"]["linear_ops_fp16"] >= 17
    assert record["gate"]["passed"] and record["gate"]["task"]["accuracy"] == pytest.approx(359 / 360)
    assert not record["gate"]["overflow"]["tensors"]
    check = runner.invoke(main, ["check", str(out), "--data", "digits:test", "--precision", "fp16"])
    assert check.exit_code == 0, check.output
    images, labels = _test_split()
    logits = OrtRunner(out / "model.fp16.onnx", providers=["CPUExecutionProvider"]).infer(images)["logits"]
    assert np.isfinite(logits).all() and float((logits.argmax(1) == labels).mean()) == pytest.approx(359 / 360)


@pytest.mark.slow
def test_without_the_range_pass_the_massive_graph_is_refused(massive_bundle, copy_bundle, tmp_path: Path) -> None:
    root = copy_bundle(massive_bundle)
    before = _state(root)
    result = CliRunner().invoke(main, ["convert", str(root), "--precision", "fp16", "--data-max", "inf"])
    assert result.exit_code == 1
    assert len(result.output.strip().splitlines()) == 1 and "exceed 65504" in result.output and "nothing was written" in result.output
    assert _state(root) == before
    # why a static check: the same graph, written without the gate, runs "fine" on ONNX Runtime's CPU
    # kernels (they compute fp16 ops in fp32) although its stream is past fp16's range
    unguarded = tmp_path / "unguarded.fp16.onnx"
    convert_to_fp16(root / "model.onnx", unguarded, manifest=massive_bundle.manifest)
    images, labels = _test_split()
    logits = OrtRunner(unguarded, providers=["CPUExecutionProvider"]).infer(images[:64])["logits"]
    assert np.isfinite(logits).all()
    types = tensor_elem_types(onnx.load(str(unguarded)))
    stream = massive_bundle.manifest["graph"]["module_outputs"]["blocks.3"]
    assert types[stream] == onnx.TensorProto.FLOAT16


@pytest.mark.slow
def test_convert_keeps_modules_and_cells_and_refuses_unknown_names(massive_bundle, copy_bundle) -> None:
    root = copy_bundle(massive_bundle)
    runner = CliRunner()
    result = runner.invoke(main, ["convert", str(root), "--precision", "fp16", "--keep-fp32", "blocks.2/mlp-fc2,head,Gelu",
                                  "--data", "digits:train"])
    assert result.exit_code == 0, result.output
    record = Bundle.open(root).artifact_record("fp16")
    assert record["user_kept_fp32_modules"] == {"blocks.2/mlp-fc2": 2, "head": 1} and record["user_kept_fp32_op_types"] == ["Gelu"]
    model = onnx.load(str(root / "model.fp16.onnx"))
    types = tensor_elem_types(model)
    head = next(n for n in model.graph.node if n.op_type == "Gemm")
    assert types[head.input[1]] == onnx.TensorProto.FLOAT
    assert all(types[n.output[0]] == onnx.TensorProto.FLOAT for n in model.graph.node if n.op_type == "Gelu")
    result = runner.invoke(main, ["convert", str(root), "--precision", "fp16", "--keep-fp32", "blocks.9,blocks.1/nope"])
    assert result.exit_code == 1 and "not in the graph: blocks.9, blocks.1/nope" in result.output
    assert len(result.output.strip().splitlines()) == 1


@pytest.mark.slow
def test_the_digits_fp16_graph_keeps_its_figures(digits_bundle, copy_bundle) -> None:
    root = copy_bundle(digits_bundle)
    result = CliRunner().invoke(main, ["convert", str(root), "--precision", "fp16", "--json"])
    assert result.exit_code == 0, result.output
    record = json.loads(result.output)
    assert record["range_pass"]["nodes"] == [] and record["range_pass"]["images"]["source"] == "digits:train"
    assert record["placement"]["linear_ops_fp16"] == record["placement"]["linear_ops"] == 26
    task = record["gate"]["task"]
    assert task["data"] == "digits:test" and task["accuracy"] == pytest.approx(359 / 360) == task["fp32_accuracy"]
    assert task["top1_agreement"] == 1.0 and record["gate"]["passed"]


@pytest.mark.slow
def test_timm_massive_stream_range_pass_and_gate(export_cached, timm_variants, copy_bundle) -> None:
    """Graph mechanics on timm's export (random weights, bias-free linears, Gemm head): noise range
    images find the overflowing stream; the guarded graph has no fp16 tensor past 65504."""
    bundle = export_timm(export_cached, timm_variants, "massive")
    plain = export_timm(export_cached, timm_variants, "plain")
    from vitdeploy.preprocess import random_images

    images = random_images(4, 224, 224, seed=5)
    ref = OrtRunner(plain.artifact_path("fp32"), providers=["CPUExecutionProvider"]).infer(images)["logits"]
    got = OrtRunner(bundle.artifact_path("fp32"), providers=["CPUExecutionProvider"]).infer(images)["logits"]
    # timm rebuilds LayerNorm with its own epsilon (1e-6, not x C^2): fp32 equal to that epsilon's effect
    assert float(np.abs(got - ref).max() / np.abs(ref).max()) < 1e-3
    root = copy_bundle(bundle)
    result = CliRunner().invoke(main, ["convert", str(root), "--precision", "fp16", "--json"])
    assert result.exit_code == 0, result.output
    record = json.loads(result.output)
    assert record["range_pass"]["kept"] and record["gate"]["passed"] and not record["gate"]["overflow"]["tensors"]
    assert "seeded uint8 noise" in record["range_pass"]["images"]["source"]
    assert 0 < record["placement"]["linear_ops_fp16"] < record["placement"]["linear_ops"]


@pytest.mark.slow
def test_variable_size_fp16_runs_the_range_pass_on_padded_pairs(export_cached, copy_bundle) -> None:
    bundle = export_cached("builtin:digits", variable_size=True, canvas=(48, 48))
    root = copy_bundle(bundle)
    result = CliRunner().invoke(main, ["convert", str(root), "--precision", "fp16", "--json"])
    assert result.exit_code == 0, result.output
    record = json.loads(result.output)
    assert record["range_pass"]["images"]["source"] == "digits:train" and record["gate"]["passed"]
    assert record["gate"]["numbers"]["kind"] == "variable-size invariance" and record["gate"]["task"]["top1_agreement"] >= 0.99


@pytest.mark.slow
def test_build_engine_makes_the_fp16_graph_through_the_range_pass(massive_bundle, copy_bundle) -> None:
    """`build-engine --precision fp16` on a bundle without its fp16 graph makes it as convert does:
    range pass, gate; the plan then compiles that graph (a dry run: no TensorRT here)."""
    root = copy_bundle(massive_bundle)
    result = CliRunner().invoke(main, ["build-engine", str(root), "--precision", "fp16", "--dry-run", "--trt-version", "10.3"])
    assert result.exit_code == 0, result.output
    assert "range pass: kept" in result.output
    record = Bundle.open(root).artifact_record("fp16")
    assert record["range_pass"]["nodes"] and record["gate"]["passed"] and not record["gate"]["overflow"]["tensors"]


def test_range_rule_on_a_small_graph() -> None:
    """The rule alone: a node stays fp32 when an output, a float input it reads, or a weight it reads
    is beyond the threshold / fp16's range; already-fp32 nodes are not reported again."""
    from onnx import TensorProto, helper, numpy_helper

    from vitdeploy.exporters.fp16_range import FP16_MAX, overflow_nodes

    big = numpy_helper.from_array(np.array([1e5], dtype=np.float32), "big")
    small = numpy_helper.from_array(np.array([2.0], dtype=np.float32), "small")
    huge_w = numpy_helper.from_array(np.full((4, 4), 7e4, dtype=np.float32), "huge_w")
    nodes = [helper.make_node("Mul", ["x", "small"], ["a"], name="scale_small"),       # |a| <= 2
             helper.make_node("Mul", ["a", "big"], ["b"], name="scale_big"),           # |b| ~ 1e5: output
             helper.make_node("Relu", ["b"], ["c"], name="reads_big"),                 # reads b: input (and output)
             helper.make_node("Div", ["c", "big"], ["d"], name="back_down"),           # reads c: input
             helper.make_node("MatMul", ["a", "huge_w"], ["e"], name="huge_weight"),   # weight past fp16's range
             helper.make_node("Identity", ["d"], ["y"], name="out")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4]),
                               helper.make_tensor_value_info("e", TensorProto.FLOAT, [2, 4])], [big, small, huge_w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    feeds = [{"x": np.random.default_rng(0).uniform(-1, 1, (2, 4)).astype(np.float32)}]
    found = overflow_nodes(model, feeds, data_max=FP16_MAX / 8)
    why = {k["node"]: k["reason"] for k in found["kept"]}
    assert why == {"scale_big": "output", "reads_big": "output", "back_down": "input", "huge_weight": "output"}
    assert overflow_nodes(model, feeds, data_max=FP16_MAX / 8, already_fp32={"scale_big", "reads_big"})["nodes"] == ["back_down", "huge_weight"]
    relaxed = overflow_nodes(model, feeds, data_max=1e6)
    assert {k["node"]: k["reason"] for k in relaxed["kept"]} == {"scale_big": "weight", "back_down": "weight", "huge_weight": "weight"}
