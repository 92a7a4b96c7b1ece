"""FP16 mixed-precision pass: accuracy on the trained digits model, the precision policy read back
from the graph, ViT-S/16 logits, and the `convert` command's errors."""

from __future__ import annotations

import hashlib
import json
import warnings
from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner

from vitdeploy.bundle import Bundle, read_onnx_manifest
from vitdeploy.cli import main
from vitdeploy.exporters.fp16 import add_fp16_to_bundle, convert_to_fp16, inspect_fp16_placement, tensor_elem_types
from vitdeploy.preprocess import random_images
from vitdeploy.runtime.ort import OrtRunner

FLOAT, FLOAT16 = onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16


def _logits(path: Path, images: np.ndarray) -> np.ndarray:
    runner = OrtRunner(path, providers=["CPUExecutionProvider"])
    return np.concatenate([runner.infer(images[i : i + 64])["logits"] for i in range(0, len(images), 64)])


@pytest.fixture(scope="module")
def fp16_digits(digits_bundle, tmp_path_factory) -> Bundle:
    import shutil

    root = tmp_path_factory.mktemp("fp16") / "digits"
    shutil.copytree(digits_bundle.root, root)
    bundle = Bundle.open(root)
    add_fp16_to_bundle(bundle)
    return Bundle.open(root)


def test_fp16_digits_accuracy_within_0_2_points(fp16_digits: Bundle) -> None:
    from vitdeploy.builtin import load_digits_split

    images, labels = load_digits_split("test")
    fp32 = _logits(fp16_digits.artifact_path("fp32"), images)
    fp16 = _logits(fp16_digits.artifact_path("fp16"), images)
    acc32 = float((fp32.argmax(1) == labels).mean())
    acc16 = float((fp16.argmax(1) == labels).mean())
    assert acc32 > 0.9, "the digits model should be trained"
    assert abs(acc32 - acc16) * 100 <= 0.2, f"fp16 {acc16:.4f} vs fp32 {acc32:.4f}"
    assert np.abs(fp32 - fp16).max() < 0.05


def test_fp16_record_and_embedded_manifest(fp16_digits: Bundle) -> None:
    record = fp16_digits.artifact_record("fp16")
    path = fp16_digits.artifact_path("fp16")
    assert record["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert record["from_fp32_sha256"] == fp16_digits.artifact_record("fp32")["sha256"]
    assert set(record["kept_fp32_op_types"]) >= {"LayerNormalization", "Softmax"}
    assert record["sanity"]["top1_agreement"] == 1.0
    core = read_onnx_manifest(path)
    assert core["graph"]["precision"] == "fp16"
    assert core["labels"] == fp16_digits.labels


def test_fp16_layernorm_softmax_preprocessing_and_io_stay_fp32(fp16_digits: Bundle) -> None:
    model = onnx.load(str(fp16_digits.artifact_path("fp16")))
    types = tensor_elem_types(model)
    ln = [n for n in model.graph.node if n.op_type == "LayerNormalization"]
    sm = [n for n in model.graph.node if n.op_type == "Softmax"]
    assert len(ln) == 2 * fp16_digits.spec.depth + 1 and len(sm) == fp16_digits.spec.depth + 1
    for node in ln + sm:
        for tensor in [node.input[0], node.output[0]]:
            assert types[tensor] == FLOAT, f"{node.op_type} {node.name}: {tensor} is not fp32"
    # the linear layers really are fp16
    matmul_weights = [types[n.input[1]] for n in model.graph.node if n.op_type in ("MatMul", "Gemm") and n.input[1] in
                      {i.name for i in model.graph.initializer}]
    assert matmul_weights and all(t == FLOAT16 for t in matmul_weights)
    assert model.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.UINT8
    assert {o.name: o.type.tensor_type.elem_type for o in model.graph.output} == {"logits": FLOAT, "probs": FLOAT}
    conv = next(n for n in model.graph.node if n.op_type == "Conv")
    cast = next(n for n in model.graph.node if conv.input[0] in n.output)
    assert cast.op_type == "Cast", "the normalised pixels are computed in fp32 and cast only at the patch embedding"
    report = inspect_fp16_placement(model)
    assert report["violations"] == [] and report["linear_ops_fp16"] == report["linear_ops"]


def test_fp16_inspection_catches_fp16_layernorm(fp16_digits: Bundle, tmp_path: Path) -> None:
    """The inspection is not vacuous: a conversion without the block list is flagged."""
    from onnxconverter_common import float16

    model = onnx.load(str(fp16_digits.artifact_path("fp32")))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the converter warns about each weight it clamps
        naive = float16.convert_float_to_float16(model, keep_io_types=True)
    report = inspect_fp16_placement(naive)
    assert any(v.startswith("LayerNormalization") for v in report["violations"])
    assert any(v.startswith("Softmax") for v in report["violations"])


def test_fp16_keep_fp32_extra_op(fp16_digits: Bundle, tmp_path: Path) -> None:
    out = tmp_path / "gelu32.onnx"
    record = convert_to_fp16(fp16_digits.artifact_path("fp32"), out, keep_fp32_ops=["Gelu"], manifest=fp16_digits.manifest)
    assert "Gelu" in record["kept_fp32_op_types"]
    report = inspect_fp16_placement(out, extra_fp32_ops=["Gelu"])
    assert report["violations"] == [] and report["fp32_op_counts"]["Gelu"] == fp16_digits.spec.depth


@pytest.mark.slow
def test_fp16_vit_small_logits_within_5e_3(export_cached, tmp_path: Path) -> None:
    bundle = export_cached("timm:vit_small_patch16_224", check_images=2, random_init=True)
    out = tmp_path / "vits.fp16.onnx"
    convert_to_fp16(bundle.artifact_path("fp32"), out, manifest=bundle.manifest)
    images = random_images(4, 224, 224, seed=3)
    diff = np.abs(_logits(bundle.artifact_path("fp32"), images) - _logits(out, images)).max()
    assert diff <= 5e-3, f"ViT-S/16 fp16 max |dlogit| {diff:.2e}"
    assert inspect_fp16_placement(out)["violations"] == []


def test_convert_cli_writes_and_records(digits_bundle, copy_bundle) -> None:
    root = copy_bundle(digits_bundle)
    result = CliRunner().invoke(main, ["convert", str(root), "--precision", "fp16"])
    assert result.exit_code == 0, result.output
    assert "wrote model.fp16.onnx" in result.output and "LayerNormalization" in result.output
    assert Bundle.open(root).precisions() == ["fp32", "fp16"]


def _state(root: Path) -> tuple[list[str], str]:
    return sorted(p.name for p in root.iterdir()), (root / "manifest.json").read_text()


@pytest.mark.parametrize(
    "args, message, code",
    [
        (["--precision", "int8"], "vitdeploy calibrate", 2),  # usage: convert does not make int8
        (["--precision", "fp16", "--keep-fp32", "Foo"], "not in the graph: Foo", 1),
    ],
)
def test_convert_cli_refuses(digits_bundle, copy_bundle, args: list[str], message: str, code: int) -> None:
    root = copy_bundle(digits_bundle)
    before = _state(root)
    result = CliRunner().invoke(main, ["convert", str(root), *args])
    assert result.exit_code == code
    assert message in result.output and len(result.output.strip().splitlines()) == 1
    assert _state(root) == before


def test_convert_bundle_without_fp32_graph(digits_bundle, copy_bundle) -> None:
    root = copy_bundle(digits_bundle)
    (root / "model.onnx").unlink()
    result = CliRunner().invoke(main, ["convert", str(root), "--precision", "fp16"])
    assert result.exit_code == 1 and "no fp32 graph" in result.output
    assert not (root / "model.fp16.onnx").exists()
    assert "fp16" not in json.loads((root / "manifest.json").read_text())["artifacts"]


def test_convert_refuses_an_fp16_graph_as_input(fp16_digits: Bundle, tmp_path: Path) -> None:
    from vitdeploy.errors import UserError

    with pytest.raises(UserError, match="already holds float16"):
        convert_to_fp16(fp16_digits.artifact_path("fp16"), tmp_path / "again.onnx")
    assert not (tmp_path / "again.onnx").exists()
