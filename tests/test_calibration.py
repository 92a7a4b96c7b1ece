"""INT8 Q/DQ calibration: accuracy on the trained digits model (both executions), what the manifest
records, the ViT-aware placement read back from the graph, exclusions, the CPU variant, ViT-S/16,
and bad input that must leave the bundle untouched."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner

from vitdeploy.bundle import Bundle, read_onnx_manifest
from vitdeploy.calibration.inspect import bundle_placement, inspect_qdq_placement
from vitdeploy.calibration.sources import open_source
from vitdeploy.cli import main
from vitdeploy.runtime.ort import OrtRunner

SAMPLES = "256"


def _invoke(*args: str):
    return CliRunner().invoke(main, ["calibrate", *args])


def _digits_test():
    from vitdeploy.builtin import load_digits_split

    return load_digits_split("test")


def _logits(path: Path, images: np.ndarray, optimization: str) -> np.ndarray:
    runner = OrtRunner(path, optimization=optimization, providers=["CPUExecutionProvider"])
    return np.concatenate([runner.infer(images[i : i + 64])["logits"] for i in range(0, len(images), 64)])


@pytest.fixture(scope="module")
def int8_digits(digits_bundle, tmp_path_factory) -> Bundle:
    """The digits bundle calibrated with the defaults (digits:train, entropy, TensorRT target)."""
    root = tmp_path_factory.mktemp("int8") / "digits"
    shutil.copytree(digits_bundle.root, root)
    result = _invoke(str(root), "--samples", SAMPLES)
    assert result.exit_code == 0, result.output
    assert "wrote model.int8.onnx" in result.output
    return Bundle.open(root)


@pytest.mark.slow
def test_int8_digits_accuracy_and_agreement(int8_digits: Bundle) -> None:
    """Measured here, not read from the record: reference semantics within the gate; this CPU's
    int8 kernels reported separately."""
    images, labels = _digits_test()
    fp32 = _logits(int8_digits.artifact_path("fp32"), images, "all")
    acc32 = float((fp32.argmax(1) == labels).mean())
    record = int8_digits.artifact_record("int8")["evaluation"]
    for execution, level in (("reference", "basic"), ("this_cpu", "all")):
        q = _logits(int8_digits.artifact_path("int8"), images, level)
        acc, agree = float((q.argmax(1) == labels).mean()), float((q.argmax(1) == fp32.argmax(1)).mean())
        assert record[execution]["accuracy"] == pytest.approx(acc) and record[execution]["top1_agreement"] == pytest.approx(agree)
        if execution == "reference":
            assert (acc32 - acc) * 100 <= 1.0, f"int8 {acc:.4f} vs fp32 {acc32:.4f}"
            assert agree >= 0.98
    assert record["fp32_accuracy"] == pytest.approx(acc32) and acc32 > 0.9
    assert record["gate"]["passed"] and record["gate"]["execution"] == "reference"
    # the gate of `vitdeploy check`: 1st percentile of the per-image logit cosines
    from vitdeploy.compare import cosine_percentile, cosine_rows

    ref = _logits(int8_digits.artifact_path("int8"), images, "basic")
    cos = cosine_rows(fp32, ref)
    assert cos.min() == pytest.approx(record["reference"]["cosine_min"])
    assert cosine_percentile(cos) == pytest.approx(record["reference"]["cosine_p1"]) and cosine_percentile(cos) >= 0.99


def test_int8_manifest_records_data_method_target(int8_digits: Bundle) -> None:
    record = int8_digits.artifact_record("int8")
    cal = record["calibration"]
    again = open_source("digits:train", int8_digits, samples=int(SAMPLES))
    assert (cal["source"], cal["count"], cal["sha256"]) == ("digits:train", int(SAMPLES), again.sha256)
    assert cal["available"] > cal["count"] and cal["subset_seed"] == 0
    assert record["target"] == "tensorrt"
    # no --method: the ladder, entropy first; every recipe before the chosen one was below the gate
    selection = record["selection"]
    assert selection["mode"] == "ladder" and selection["candidates"][0]["method"] == "entropy"
    assert [c["passed"] for c in selection["candidates"]] == [False] * (len(selection["candidates"]) - 1) + [True]
    assert (record["method"], "none") == (selection["chosen"]["method"], selection["chosen"]["exclusions"])
    assert record["exclusions"] == {"op_types": [], "blocks": [], "roles": [], "nodes": [], "by": {}}
    assert record["evaluation"]["data"] == "digits:test" and record["evaluation"]["count"] == len(_digits_test()[1])
    assert record["from_fp32_sha256"] == int8_digits.artifact_record("fp32")["sha256"]
    core = read_onnx_manifest(int8_digits.artifact_path("int8"))
    assert core["graph"]["precision"] == "int8" and core["graph"]["quantization"]["method"] == record["method"]


def test_int8_placement_vit_aware(int8_digits: Bundle) -> None:
    model = onnx.load(str(int8_digits.artifact_path("int8")))
    producers = {o: n for n in model.graph.node for o in n.output}
    inits = {i.name: i for i in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type in ("LayerNormalization", "Softmax"):
            for tensor in node.input:
                assert producers.get(tensor) is None or producers[tensor].op_type not in ("QuantizeLinear", "DequantizeLinear")
    weighted = 0
    for node in model.graph.node:
        if node.op_type in ("MatMul", "Gemm", "Conv"):
            dq = producers[node.input[1]]
            assert dq.op_type == "DequantizeLinear", f"{node.name} is not quantized"
            if dq.input[0] in inits:  # a weight: int8, one scale per output channel
                weighted += 1
                w = onnx.numpy_helper.to_array(inits[dq.input[0]])
                scale = onnx.numpy_helper.to_array(inits[dq.input[1]])
                assert w.dtype == np.int8 and scale.ndim == 1 and scale.size > 1
    depth = int8_digits.spec.depth
    assert weighted == 4 * depth + 2  # qkv, proj, fc1, fc2 per block + patch embedding + head
    report = bundle_placement(int8_digits, "int8")
    assert report["violations"] == [] and report["per_channel_weights"] == weighted
    assert report["quantized_dtypes"] == ["int8"]


def test_placement_inspection_flags_a_naive_quantization(digits_bundle, tmp_path: Path) -> None:
    """ORT's defaults (every op type, per-tensor, biases int32) break the policy; the inspection says so."""
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, quantize_static

    images = open_source("digits:train", digits_bundle, samples=16).images

    class Reader:
        def __init__(self) -> None:
            self.batches = iter([{"images": images}])

        def get_next(self):
            return next(self.batches, None)

    out = tmp_path / "naive.onnx"
    quantize_static(str(digits_bundle.artifact_path("fp32")), str(out), Reader(), quant_format=QuantFormat.QDQ,
                    per_channel=False, calibrate_method=CalibrationMethod.MinMax)
    violations = inspect_qdq_placement(out)["violations"]
    assert any("Softmax" in v and "reads a Q/DQ output" in v for v in violations)
    assert any("not per-channel" in v for v in violations)
    assert any("int32" in v for v in violations)


def test_exclusions_by_block_and_role(digits_bundle, copy_bundle) -> None:
    root = copy_bundle(digits_bundle)
    result = _invoke(str(root), "--samples", "128", "--exclude-blocks", "blocks.0", "--exclude-roles", "head")
    assert result.exit_code == 0, result.output
    record = Bundle.open(root).artifact_record("int8")
    by = record["exclusions"]["by"]
    assert len(by["blocks.0"]) == 6  # qkv, q.k^T, attn.v, proj, fc1, fc2
    assert len(by["head"]) == 1
    model = onnx.load(str(root / "model.int8.onnx"))
    producers = {o: n for n in model.graph.node for o in n.output}
    for node in model.graph.node:
        if node.name in record["exclusions"]["nodes"]:
            assert all(producers.get(i) is None or producers[i].op_type != "DequantizeLinear" for i in node.input)
    assert record["placement"]["excluded_layers"] == 7
    assert bundle_placement(Bundle.open(root), "int8")["violations"] == []


def test_cpu_target_variant(digits_bundle, copy_bundle) -> None:
    root = copy_bundle(digits_bundle)
    result = _invoke(str(root), "--samples", "128", "--target", "cpu")
    assert result.exit_code == 0, result.output
    record = Bundle.open(root).artifact_record("int8")
    assert record["target"] == "cpu" and "QUInt8 asymmetric" in record["activations"] and "7-bit" in record["weights"]
    assert record["evaluation"]["gate"]["execution"] == "this_cpu" and record["evaluation"]["gate"]["passed"]
    assert "int8_kernels_may_saturate" in record["calibrated_on_cpu"]
    assert record["placement"]["quantized_dtypes"] == ["int32", "int8", "uint8"]  # ORT's fused biases are int32


# -- bad input: one line, exit 1, the bundle exactly as it was --------------------------------------
def _snapshot(root: Path) -> tuple[list[str], str]:
    return sorted(p.name for p in root.iterdir()), (root / "manifest.json").read_text()


def _png(path: Path, value: int) -> None:
    from PIL import Image

    Image.fromarray(np.full((20, 28, 3), value, np.uint8)).save(path)


def _bad(digits_bundle, copy_bundle, tmp_path: Path, args: list[str], *messages: str) -> None:
    root = copy_bundle(digits_bundle)
    before = _snapshot(root)
    result = _invoke(str(root), *args)
    assert result.exit_code == 1, result.output
    lines = [line for line in result.output.strip().splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and all(m in lines[0] for m in messages), result.output
    assert _snapshot(root) == before, "a failed calibrate changed the bundle"


def test_empty_folder(digits_bundle, copy_bundle, tmp_path: Path) -> None:
    (tmp_path / "empty" / "sub").mkdir(parents=True)
    _bad(digits_bundle, copy_bundle, tmp_path, ["--data", str(tmp_path / "empty")], "holds no images")


def test_missing_folder(digits_bundle, copy_bundle, tmp_path: Path) -> None:
    _bad(digits_bundle, copy_bundle, tmp_path, ["--data", str(tmp_path / "nope")], "does not exist")


def test_unreadable_folder(digits_bundle, copy_bundle, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "locked"
    folder.mkdir()
    _png(folder / "a.png", 10)
    folder.chmod(0)
    if os.geteuid() == 0:  # root reads any folder: deny it the way the permission check sees it
        import vitdeploy.data as data  # the folder walker calibration reads through

        real_access = os.access
        monkeypatch.setattr(data.os, "access", lambda p, mode: False if Path(p) == folder else real_access(p, mode))
    try:
        _bad(digits_bundle, copy_bundle, tmp_path, ["--data", str(folder)], "not readable")
    finally:
        folder.chmod(0o755)


def test_undecodable_images_are_named(digits_bundle, copy_bundle, tmp_path: Path) -> None:
    folder = tmp_path / "calib"
    (folder / "cats").mkdir(parents=True)
    for i in range(3):
        _png(folder / "cats" / f"ok{i}.png", 40 * i)
    (folder / "cats" / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    (folder / "notes.png").write_text("text, not pixels")
    _bad(digits_bundle, copy_bundle, tmp_path, ["--data", str(folder)], "2 of 5 calibration images", "cats/broken.jpg", "notes.png")


def test_too_few_samples_for_the_method(digits_bundle, copy_bundle, tmp_path: Path) -> None:
    folder = tmp_path / "few"
    folder.mkdir()
    for i in range(5):
        _png(folder / f"{i}.png", 50 * i)
    _bad(digits_bundle, copy_bundle, tmp_path, ["--data", str(folder), "--method", "entropy"], "needs at least 64 images")


def test_npy_of_the_wrong_shape(digits_bundle, copy_bundle, tmp_path: Path) -> None:
    np.save(tmp_path / "x.npy", np.zeros((80, 28, 28, 3), np.uint8))
    _bad(digits_bundle, copy_bundle, tmp_path, ["--data", str(tmp_path / "x.npy")], "expected uint8 [N,32,32,3]")


def test_calibration_count_not_a_multiple_of_the_batch(digits_bundle, copy_bundle) -> None:
    """ORT's histogram collector stacks the batches of one call: a short last batch goes alone."""
    root = copy_bundle(digits_bundle)
    result = _invoke(str(root), "--samples", "101", "--method", "entropy", "--min-cosine", "0", "--min-agreement", "0")
    assert result.exit_code == 0, result.output
    assert Bundle.open(root).artifact_record("int8")["calibration"]["count"] == 101


def test_gate_defaults_are_checks(digits_bundle) -> None:
    """calibrate, debug-precision and check start from the one gate (vitdeploy.gate), in the library and the CLI."""
    from vitdeploy.calibration.api import CalibrateOptions
    from vitdeploy.calibration.debug_precision import DebugOptions
    from vitdeploy.checks.run import CheckOptions
    from vitdeploy.gate import Gate

    assert CalibrateOptions().gate == DebugOptions().gate == CheckOptions().gate == Gate()
    assert (Gate().min_cosine, Gate().min_agreement, Gate().max_drop) == (0.99, 0.99, 0.01)


def test_bundle_without_fp32_graph(digits_bundle, copy_bundle, tmp_path: Path) -> None:
    root = copy_bundle(digits_bundle)
    (root / "model.onnx").unlink()
    result = _invoke(str(root))
    assert result.exit_code == 1 and "no fp32 graph" in result.output
    assert not (root / "model.int8.onnx").exists()


def test_below_gate_writes_nothing(digits_bundle, copy_bundle, tmp_path: Path) -> None:
    # an unreachable gate: every image's int8 logits parallel to fp32's and all top-1 classes kept
    _bad(digits_bundle, copy_bundle, tmp_path, ["--samples", "64", "--method", "minmax", "--min-top1-agreement", "1", "--min-cosine", "1"],
         "below the gate")


def test_unknown_block(digits_bundle, copy_bundle, tmp_path: Path) -> None:
    _bad(digits_bundle, copy_bundle, tmp_path, ["--samples", "64", "--method", "minmax", "--exclude-blocks", "blocks.99"],
         "known: patch_embed, blocks.0")


# -- ViT-S/16 at 224, random init: builds and runs (no accuracy claim from random weights) ------------
@pytest.mark.slow
def test_vit_small_int8_builds_and_runs(export_cached, copy_bundle, tmp_path: Path) -> None:
    bundle = export_cached("timm:vit_small_patch16_224", check_images=2, random_init=True)
    root = copy_bundle(bundle, "vits")
    calib = tmp_path / "calib.npy"
    np.save(calib, np.random.default_rng(0).integers(0, 256, (16, 224, 224, 3), dtype=np.uint8))
    result = _invoke(str(root), "--data", str(calib), "--method", "minmax")
    assert result.exit_code == 0, result.output
    assert "accuracy not measured" in result.output
    int8 = Bundle.open(root)
    record = int8.artifact_record("int8")
    assert record["placement"]["quantized_layers"] == 4 * 12 + 2 + 2 * 12 and record["evaluation"] is None
    images = np.random.default_rng(1).integers(0, 256, (2, 224, 224, 3), dtype=np.uint8)
    for level in ("basic", "all"):
        out = OrtRunner(int8.artifact_path("int8"), optimization=level).infer(images)
        assert out["logits"].shape == (2, 1000) and np.isfinite(out["logits"]).all()
        assert np.allclose(out["probs"].sum(1), 1.0, atol=1e-4)
    assert json.loads((root / "manifest.json").read_text())["artifacts"]["int8"]["calibration"]["count"] == 16
