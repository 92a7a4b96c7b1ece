"""`vitdeploy check`: correct artifacts pass; planted faults are caught with the right diagnosis."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from bundle_edits import vouch_for
from click.testing import CliRunner
from onnx import numpy_helper

from vitdeploy.bundle import Bundle
from vitdeploy.checks import CheckOptions, run_check
from vitdeploy.cli import main


def _check(path: Path, **options) -> dict:
    options.setdefault("random_count", 16)
    return run_check(path, CheckOptions(**options))


def _preprocess_nodes(model: onnx.ModelProto) -> tuple[onnx.NodeProto, onnx.NodeProto, onnx.NodeProto]:
    """The baked (x / 255 - mean) / std: the first Div, the Sub it feeds and the Div after that."""
    nodes = list(model.graph.node)
    div255 = next(n for n in nodes if n.op_type == "Div")
    sub = next(n for n in nodes if n.op_type == "Sub" and n.input[0] == div255.output[0])
    div_std = next(n for n in nodes if n.op_type == "Div" and n.input[0] == sub.output[0])
    return div255, sub, div_std


def _edit_graph(bundle_dir: Path, edit) -> None:
    path = bundle_dir / "model.onnx"
    model = onnx.load(str(path))
    edit(model)
    onnx.save(model, str(path))
    vouch_for(bundle_dir)  # a planted export bug: the manifest vouches for the faulty graph


def _set_const(model: onnx.ModelProto, node: onnx.NodeProto, index: int, values, name: str) -> None:
    model.graph.initializer.append(numpy_helper.from_array(np.asarray(values, np.float32), name))
    node.input[index] = name


def test_digits_bundle_passes_with_pytorch_accuracy(digits_bundle, copy_bundle):
    path = copy_bundle(digits_bundle)
    report = _check(path)
    assert report["passed"], report["failures"]
    fp32 = next(a for a in report["artifacts"] if a["precision"] == "fp32")
    real = next(row for row in fp32["sets"] if row["set"] == "digits:test")
    assert real["accuracy"] == report["reference"]["accuracy"]["digits:test"]  # fp32 accuracy equals PyTorch's
    assert real["accuracy"] >= 0.97
    assert real["logits"]["max_abs"] <= 1e-4
    assert report["protocol"]["preprocessing"]["passed"] and report["protocol"]["patch_grid"]["passed"]
    assert report["protocol"]["labels"]["passed"]
    written = json.loads((path / "reports" / "check.json").read_text())
    assert written["passed"] and written["inputs"][-1]["count"] == 360  # the 20% test split
    assert Bundle.open(path).manifest["records"]["check"]["passed"]


def test_imagenet_mean_std_is_diagnosed(digits_bundle, copy_bundle):
    path = copy_bundle(digits_bundle)

    def plant(model):
        _, sub, div = _preprocess_nodes(model)
        _set_const(model, sub, 1, np.reshape([0.485, 0.456, 0.406], (1, 3, 1, 1)), "planted_mean")
        _set_const(model, div, 1, np.reshape([0.229, 0.224, 0.225], (1, 3, 1, 1)), "planted_std")

    _edit_graph(path, plant)
    report = _check(path)
    assert not report["passed"]
    assert "mean/std replaced by ImageNet values" in report["protocol"]["preprocessing"]["diagnosis"]


def test_unscaled_input_is_diagnosed(digits_bundle, copy_bundle):
    path = copy_bundle(digits_bundle)
    _edit_graph(path, lambda model: _set_const(model, _preprocess_nodes(model)[0], 1, 1.0, "planted_one"))
    report = _check(path)
    assert not report["passed"]
    assert "p instead of p/255" in report["protocol"]["preprocessing"]["diagnosis"]


@pytest.mark.slow
def test_rgb_bgr_swap_is_diagnosed(export_cached, copy_bundle):
    # A graph that flips channels (exported for BGR cameras) whose contract claims RGB.
    bundle = export_cached("builtin:digits", channel_order="bgr")
    path = copy_bundle(bundle)
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["preprocessing"]["channel_order"] = "rgb"
    (path / "manifest.json").write_text(json.dumps(manifest))
    report = _check(path)
    assert not report["passed"]
    assert "channels swapped" in report["protocol"]["preprocessing"]["diagnosis"]


def test_swapped_labels_are_diagnosed(digits_bundle, copy_bundle):
    path = copy_bundle(digits_bundle)
    lines = (path / "labels.txt").read_text().splitlines()
    lines[3], lines[5] = lines[5], lines[3]
    (path / "labels.txt").write_text("\n".join(lines) + "\n")
    report = _check(path)
    assert not report["passed"]
    problems = report["protocol"]["labels"]["problems"]
    assert any("'3' and '5' are swapped (lines 4 and 6)" in p or "'5' and '3' are swapped (lines 4 and 6)" in p for p in problems)


def _block_weight(model: onnx.ModelProto, block_out: str, previous_out: str) -> str:
    """A MatMul/Gemm weight initializer that lies between two block outputs."""
    producers = {out: node for node in model.graph.node for out in node.output}
    inits = {i.name for i in model.graph.initializer}

    def ancestors(tensor: str) -> set[str]:
        seen, stack = set(), [tensor]
        while stack:
            name = stack.pop()
            node = producers.get(name)
            if node is None or node.name in seen:
                continue
            seen.add(node.name)
            stack.extend(node.input)
        return seen

    inside = ancestors(block_out) - ancestors(previous_out)
    for node in model.graph.node:
        if node.name in inside and node.op_type in ("MatMul", "Gemm"):
            for name in node.input:
                if name in inits:
                    return name
    raise AssertionError("no weight found inside the block")


def test_perturbed_block_is_localised(digits_bundle, copy_bundle):
    path = copy_bundle(digits_bundle)
    outputs = digits_bundle.manifest["graph"]["module_outputs"]
    assert {"blocks.0", "blocks.1", "norm", "head"} <= set(outputs)

    def plant(model):
        name = _block_weight(model, outputs["blocks.2"], outputs["blocks.1"])
        init = next(i for i in model.graph.initializer if i.name == name)
        weight = numpy_helper.to_array(init).copy()
        weight += np.random.default_rng(0).normal(0, 0.2, weight.shape).astype(np.float32)
        init.CopyFrom(numpy_helper.from_array(weight, name))

    _edit_graph(path, plant)
    report = _check(path)
    assert not report["passed"]
    fp32 = next(a for a in report["artifacts"] if a["precision"] == "fp32")
    assert fp32["localisation"]["first_divergence"] == "blocks.2"
    cos = {row["module"]: row["cosine_min"] for row in fp32["localisation"]["modules"]}
    assert cos["blocks.0"] > 0.9999 and cos["blocks.1"] > 0.9999 and cos["blocks.2"] < 0.9999
    assert "first divergence at PyTorch module blocks.2" in " ".join(report["failures"])


def test_cli_exit_codes_and_json(digits_bundle, copy_bundle, tmp_path):
    path = copy_bundle(digits_bundle)
    ok = CliRunner().invoke(main, ["check", str(path), "--images", "8", "--json"])
    assert ok.exit_code == 0, ok.output
    assert json.loads(ok.output)["passed"] is True
    lines = (path / "labels.txt").read_text().splitlines()
    lines[0], lines[1] = lines[1], lines[0]
    (path / "labels.txt").write_text("\n".join(lines) + "\n")
    bad = CliRunner().invoke(main, ["check", str(path), "--images", "8"])
    assert bad.exit_code == 1
    assert "labels.txt order differs" in bad.output
    usage = CliRunner().invoke(main, ["check", str(path), "--images", "0"])
    assert usage.exit_code == 2
    missing = CliRunner().invoke(main, ["check", str(path), "--precision", "int8"])
    assert missing.exit_code == 1 and "no int8 graph" in missing.output and "Traceback" not in missing.output


@pytest.mark.slow
def test_check_models_of_the_export_issue(export_cached, tmp_path):
    """A dynamic-resolution timm graph passes at every declared size (the rest of the matrix is in
    test_export_matrix.py, where the export's own parity check covers each model)."""
    bundle = export_cached("timm:vit_tiny_patch16_224", num_classes=10, model_kwargs={"depth": 2}, dynamic_resolution=True, random_init=True)
    report = _check(bundle.root, write_report=False)
    assert report["passed"], report["failures"]
    sizes = [(i["height"], i["width"]) for i in report["inputs"]]
    assert sizes == [(224, 224), (160, 160), (288, 288), (224, 320)]


@pytest.mark.slow
def test_reduced_precision_digits_through_check(digits_bundle, copy_bundle):
    """The precision issue's acceptance, measured by `check` on the held-out digits test split:
    fp16 within 0.2 point of fp32; int8 within 1 point with >= 98% top-1 agreement (reference
    semantics, what TensorRT computes); both graphs follow the ViT precision policy."""
    from vitdeploy.calibration.api import CalibrateOptions, calibrate_bundle
    from vitdeploy.exporters.fp16 import add_fp16_to_bundle

    path = copy_bundle(digits_bundle)
    add_fp16_to_bundle(Bundle.open(path))
    calibrate_bundle(path, CalibrateOptions(samples=256))
    report = _check(path)
    assert report["passed"], report["failures"]
    by = {(a["precision"], a["execution"]): a for a in report["artifacts"]}
    fp32_acc = report["reference"]["accuracy"]["digits:test"]

    def real(entry):
        return next(row for row in entry["sets"] if row["set"] == "digits:test")

    fp16 = real(by[("fp16", "onnxruntime")])
    assert fp32_acc - fp16["accuracy"] <= 0.002
    int8 = real(by[("int8", "reference (fake-quant)")])
    assert fp32_acc - int8["accuracy"] <= 0.01 and int8["logits"]["top1_agreement"] >= 0.98
    assert "accuracy" in real(by[("int8", "this CPU (int8 kernels)")])  # reported as this CPU runs it
    assert not by[("fp16", "onnxruntime")]["placement"]["violations"]
    assert not by[("int8", "reference (fake-quant)")]["placement"]["violations"]


def test_engines_are_skipped_with_the_reason_where_tensorrt_is_absent(digits_bundle, copy_bundle):
    path = copy_bundle(digits_bundle)
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["engines"] = {"orin-trt10.3-fp16": {"dir": "engines/orin-trt10.3-fp16", "precision": "fp16",
                                                 "source_sha256": manifest["artifacts"]["fp32"]["sha256"]}}
    (path / "manifest.json").write_text(json.dumps(manifest))
    report = _check(path)
    engine = next(a for a in report["artifacts"] if a["backend"] == "tensorrt")
    assert report["passed"] and engine["passed"] is None
    assert "TensorRT is not installed" in engine["skipped"]


@pytest.mark.gpu
def test_built_engine_passes_check(digits_bundle, copy_bundle):
    """On a GPU with TensorRT: build an fp16 engine and score it through `check` against PyTorch."""
    pytest.importorskip("tensorrt")
    from vitdeploy.engine.plan import PlanOptions
    from vitdeploy.engine.service import BuildEngineRequest, run
    from vitdeploy.exporters.fp16 import add_fp16_to_bundle

    path = copy_bundle(digits_bundle)
    add_fp16_to_bundle(Bundle.open(path))
    run(BuildEngineRequest(path, PlanOptions(precision="fp16", batch=("1:8:16",))))
    report = _check(path)
    engine = next(a for a in report["artifacts"] if a["backend"] == "tensorrt")
    assert engine["passed"], engine.get("failed_gates") or engine.get("skipped")
    real = next(row for row in engine["sets"] if row["set"] == "digits:test")
    assert report["reference"]["accuracy"]["digits:test"] - real["accuracy"] <= 0.002
