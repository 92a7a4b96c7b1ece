"""FP8 (E4M3) through the precision registry: the entry, the placement in both attention modes, the
target rules, and (slow) the gated pass end to end on the digits bundle, the stress variants and a
random-init timm ViT. Verified in ONNX Runtime's CPU reference semantics only: no GPU here."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner

from precision_fixtures import export_timm, massive_bundle, outlier_bundle, timm_variants, variant_checkpoints  # noqa: F401
from vitdeploy import precisions
from vitdeploy.cli import main


def test_fp8_is_one_registry_entry_with_its_target_rules() -> None:
    fp8 = precisions.get("fp8")
    assert fp8.artifact == "model.fp8.onnx" and "float8e4m3fn" in fp8.graph_dtypes
    assert precisions.calibrated() == ("int8", "fp8") and precisions.best_of({"fp32", "int8", "fp8"}) == "fp8"
    assert fp8.builder_flags((10, 3)) == () and fp8.trtexec_flags((10, 3)) == ()  # strongly typed: no --fp8
    assert fp8.why_not_on((10, 13), (11, 0)) is None and fp8.why_not_on((10, 3), (9, 0)) is None
    assert "compute capability 8.9" in fp8.why_not_on((10, 3), (8, 7))  # Orin
    assert "TensorRT 10.0" in fp8.why_not_on((8, 5), (8, 9))
    assert "DLA" in fp8.why_not_on((10, 3), (8, 9), dla=True)


def test_fp8_attention_fusion_rule() -> None:
    from vitdeploy.engine.fp8_target import attention_fuses, attention_note, parse_cc

    assert parse_cc("8.7") == (8, 7) and parse_cc("11.0?") == (11, 0) and parse_cc(None) is None
    assert attention_fuses((10, 0), (9, 0))[0] is True
    assert attention_fuses((10, 3), (8, 9))[0] is False and attention_fuses((10, 6), (8, 9), 197, 64)[0] is True
    assert attention_fuses((10, 8), (8, 9), 197, 80)[0] is False  # Ada's head-size limit
    assert attention_fuses((10, 3), None)[0] is None
    assert "--fp8-attention float" in attention_note("fp8", (10, 3), (8, 9))
    assert "attention matmuls in fp16" in attention_note("float", (10, 3), (9, 0))


def test_e4m3_saturates_at_448() -> None:
    import ml_dtypes

    from vitdeploy.calibration.fp8 import scale_of, to_fp8_bytes

    got = np.frombuffer(to_fp8_bytes(np.array([1000.0, -1000.0, 1.0, 0.0], np.float32)), dtype=ml_dtypes.float8_e4m3fn)
    assert got.astype(np.float32).tolist() == [448.0, -448.0, 1.0, 0.0]
    assert scale_of(896.0) == 2.0 and scale_of(0.0) == 1.0


def _fp8_graph(bundle, attention):
    """The digits fp32 graph with E4M3 Q/DQ at every site (amax 8 everywhere: placement, not accuracy)."""
    from vitdeploy.calibration.fp8 import calibrated_tensors, find_sites, insert_qdq

    model = onnx.load(str(bundle.artifact_path("fp32")))
    sites = find_sites(model)
    nodes = {n.name: n for n in model.graph.node}
    tensor_of = {(n, 0): nodes[n].input[0] for n in sites.linear}
    tensor_of.update({(n, i): nodes[n].input[i] for n, ins in sites.attention.items() for i in ins})
    amax = {t: 8.0 for t in calibrated_tensors(model, sites, attention)}
    insert_qdq(model, sites, amax, tensor_of, attention)
    return model, sites


@pytest.mark.parametrize("attention", ["fp8", "float"])
def test_both_attention_placements(digits_bundle, attention) -> None:
    """Q/DQ on every linear layer; on Q, K, V and the softmax output (fixed scale 1/448) only in fp8 mode."""
    import onnxruntime as ort

    from vitdeploy.calibration.fp8 import SOFTMAX_SCALE, inspect_fp8_placement

    model, sites = _fp8_graph(digits_bundle, attention)
    placement = inspect_fp8_placement(model)
    assert placement["violations"] == []
    assert placement["linear_fp8"] == placement["linear_layers"] == len(sites.linear) == 17
    if attention == "fp8":
        assert placement["attention_fp8"] == placement["attention_matmuls"] == 8 and placement["softmax_fixed_scale"] == 4
    else:
        assert placement["attention_fp8"] == 0 and placement["attention"] == "float"
    fp8_inits = [i for i in model.graph.initializer if i.data_type == onnx.TensorProto.FLOAT8E4M3FN]
    assert len(fp8_inits) >= 17  # the weights stored as E4M3 (and the zero point)
    scales = [onnx.numpy_helper.to_array(i) for i in model.graph.initializer if i.name.endswith("/fp8/scale") and "input" in i.name]
    assert any(abs(float(s) - SOFTMAX_SCALE) < 1e-9 for s in scales) == (attention == "fp8")
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    images = np.random.default_rng(0).integers(0, 256, (2, 32, 32, 3), dtype=np.uint8)
    assert np.isfinite(session.run(["logits"], {"images": images})[0]).all()


def test_parse_lint_knows_fp8_qdq_per_version(digits_bundle, tmp_path) -> None:
    from vitdeploy.engine.lint import lint_file
    from vitdeploy.engine.parser_rules import RULES, rules_for

    model, _ = _fp8_graph(digits_bundle, "fp8")
    path = tmp_path / "model.fp8.onnx"
    onnx.save(model, str(path))
    old = lint_file(path, RULES["8.6"]).by_rule()
    assert old.get("QuantizeLinear with FP8 (float8e4m3fn)") and old.get("DequantizeLinear with FP8 (float8e4m3fn)")
    for version in ("10.3", "10.13", "11.4"):
        assert lint_file(path, rules_for(version)).findings == [], version


def _calibrate(path, *extra):
    result = CliRunner().invoke(main, ["calibrate", str(path), "--precision", "fp8", "--json", *extra])
    assert result.exit_code == 0, result.output
    return json.loads(result.output[result.output.index("{"):])


@pytest.mark.slow
def test_digits_fp8_acceptance(digits_bundle, copy_bundle) -> None:
    path = copy_bundle(digits_bundle)
    record = _calibrate(path, "--data", "digits:train", "--eval-data", "digits:test")
    graph = onnx.load(str(path / "model.fp8.onnx"), load_external_data=False)
    linear = [n for n in graph.graph.node if n.op_type in ("MatMul", "Gemm", "Conv")]
    quantized = record["linear_layers"]["fp8"] + record["attention"]["fp8"]
    assert len(linear) == 26 and quantized >= 24
    ev = record["evaluation"]
    ref = ev["reference"]
    assert (ev["fp32_accuracy"] - ref["accuracy"]) * 100 <= 0.3 and ref["top1_agreement"] >= 0.994 and ev["gate"]["passed"]
    assert record["calibration"]["sha256"] and record["method"] in ("max", "percentile") and record["attention"]["placement"] == "fp8"
    runner = CliRunner()
    check = runner.invoke(main, ["check", str(path), "--precision", "fp8"])
    assert check.exit_code == 0, check.output
    thor = runner.invoke(main, ["build-engine", str(path), "--dry-run", "--print-trtexec", "--precision", "fp8", "--target", "jp7.1-agx-thor"])
    assert thor.exit_code == 0 and "--stronglyTyped" in thor.output and "--fp8" not in thor.output.replace("model.fp8", ""), thor.output
    hopper = runner.invoke(main, ["build-engine", str(path), "--dry-run", "--precision", "fp8", "--trt-version", "10.8"])
    assert hopper.exit_code == 0 and "fp8 via strongly-typed" in hopper.output, hopper.output
    for refused, why in ((["--target", "jp6.2-agx-orin"], "compute capability 8.9"), (["--trt-version", "8.5"], "TensorRT 10.0"),
                         (["--trt-version", "10.3", "--legacy-precision"], "drop --legacy-precision")):
        out = runner.invoke(main, ["build-engine", str(path), "--dry-run", "--precision", "fp8", *refused])
        assert out.exit_code != 0 and why in out.output and "Traceback" not in out.output and len(out.output.strip().splitlines()) == 1


@pytest.mark.slow
def test_fp8_outliers_pass_without_smoothing(outlier_bundle, copy_bundle) -> None:
    record = _calibrate(copy_bundle(outlier_bundle), "--data", "digits:train", "--eval-data", "digits:test")
    assert record["evaluation"]["gate"]["passed"] and "smoothing" not in record  # FP8 has no smoothing step


@pytest.mark.slow
def test_fp8_massive_residual_passes_with_fp32_islands(massive_bundle, copy_bundle) -> None:
    record = _calibrate(copy_bundle(massive_bundle), "--data", "digits:train", "--eval-data", "digits:test")
    assert record["evaluation"]["gate"]["passed"]
    assert record["fp32_islands"]["range_pass"]["nodes"]  # the overflowing residual nodes stayed fp32


@pytest.mark.slow
def test_fp8_timm_vit_builds_and_verifies(export_cached, timm_variants, copy_bundle) -> None:  # noqa: F811
    import onnxruntime as ort

    path = copy_bundle(export_timm(export_cached, timm_variants, "plain"))
    images = np.random.default_rng(1).integers(0, 256, (96, 224, 224, 3), dtype=np.uint8)
    np.save(path / "calib.npy", images[:64])
    record = _calibrate(path, "--data", str(path / "calib.npy"), "--samples", "64")
    assert record["linear_layers"]["fp8"] == record["linear_layers"]["total"] > 0 and record["attention"]["fp8"] > 0
    fp32 = ort.InferenceSession(str(path / "model.onnx"), providers=["CPUExecutionProvider"])
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    fp8 = ort.InferenceSession(str(path / "model.fp8.onnx"), options, providers=["CPUExecutionProvider"])
    a, b = (s.run(["logits"], {"images": images[64:72]})[0] for s in (fp32, fp8))
    cos = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    assert np.isfinite(b).all() and cos.min() > 0.95


@pytest.mark.slow
def test_debug_precision_fp8_ranks_and_its_recipe_reproduces(digits_bundle, copy_bundle) -> None:
    path = copy_bundle(digits_bundle)
    runner = CliRunner()
    out = runner.invoke(main, ["debug-precision", str(path), "--precision", "fp8", "--samples", "64", "--eval-limit", "120", "--json"])
    assert out.exit_code == 0, out.output
    report = json.loads(out.output[out.output.index("{"):])
    assert {"cells", "blocks", "roles"} <= set(report["ranking"]) and report["ranking"]["roles"]
    assert "attention-matmuls" in {r["unit"] for r in report["ranking"]["roles"]}  # FP8 ranks the attention matmuls too
    recipe = json.loads(Path(report["recipe_file"]).read_text())
    assert recipe["precision"] == "fp8" and recipe["method"] == "max" and "nodes" in recipe["keep_float"]
    record = _calibrate(path, "--recipe", report["recipe_file"], "--samples", "64", "--eval-limit", "120")
    assert record["evaluation"]["gate"]["passed"] and record["kept_float"] == recipe["keep_float"]["nodes"]


def test_calibrate_refuses_options_of_the_other_precision(digits_bundle) -> None:
    runner = CliRunner()
    for args, why in ((["--precision", "fp8", "--method", "entropy"], "max, percentile"), (["--precision", "fp8", "--sweep"], "INT8 only"),
                      (["--precision", "fp8", "--smooth", "layernorm"], "INT8 only"), (["--fp8-attention", "float"], "fp8 only")):
        out = runner.invoke(main, ["calibrate", str(digits_bundle.root), *args])
        assert out.exit_code != 0 and why in out.output and "Traceback" not in out.output, (args, out.output)
    assert not (digits_bundle.root / "model.fp8.onnx").exists()
