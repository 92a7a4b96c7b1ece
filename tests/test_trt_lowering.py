"""TensorRT 8.x graphs for the trained digits bundle: the lint finds what 8.5/8.6 cannot parse, the
lowered graphs are clean and equal the bundle's graphs within their gates, and build-engine plans,
prints and refuses accordingly (CPU only: the parser rules are read from the sources, not run)."""

from __future__ import annotations

import json
import shutil

import onnx
import pytest
from bundle_edits import vouch_for
from click.testing import CliRunner

from vitdeploy.bundle import Bundle
from vitdeploy.cli import main
from vitdeploy.engine import service
from vitdeploy.engine.lint import lint_file
from vitdeploy.engine.lowering import bundle_graph
from vitdeploy.engine.parser_rules import RULES
from vitdeploy.engine.plan import PlanOptions
from vitdeploy.engine.versions import capabilities_for
from vitdeploy.errors import UserError

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def digits3(digits_bundle, tmp_path_factory) -> Bundle:
    """The trained digits bundle with its fp16 graph and a calibrated int8 Q/DQ graph."""
    from vitdeploy.calibration.api import CalibrateOptions, calibrate_bundle
    from vitdeploy.exporters.fp16 import add_fp16_to_bundle

    root = tmp_path_factory.mktemp("trt8") / "digits"
    shutil.copytree(digits_bundle.root, root)
    add_fp16_to_bundle(Bundle.open(root))
    calibrate_bundle(root, CalibrateOptions(samples=64, method="minmax"))
    return Bundle.open(root)


def _ops(path) -> dict[str, int]:
    counts: dict[str, int] = {}
    for node in onnx.load(str(path)).graph.node:
        counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return counts


@pytest.mark.parametrize("precision", ["fp32", "fp16", "int8"])
def test_lint_finds_and_lowering_removes_what_8x_cannot_parse(digits3, precision):
    source = digits3.artifact_path(precision)
    ops = _ops(source)
    for key, missing in (("8.5", {"Gelu", "LayerNormalization"}), ("8.6", {"Gelu"})):
        report = lint_file(source, RULES[key])
        found = {f.op_type for f in report.findings if f.rule.startswith("no importer")}
        assert found == missing
        assert sum(1 for f in report.findings if f.op_type in missing) == sum(ops[op] for op in missing)
        assert not report.blocking  # every finding is one the lowering rewrites
        path, record = bundle_graph(digits3, source, precision, RULES[key])
        assert lint_file(path, RULES[key]).findings == []
        lowered = onnx.load(str(path))
        assert lowered.opset_import[0].version == 17 and "Gelu" not in _ops(path)
        assert ("LayerNormalization" in _ops(path)) is (key == "8.6")
        assert record["verification"]["passed"] and record["rewrites"]["Gelu -> Erf form"] == ops["Gelu"]
        gates = {g["name"]: g for g in record["verification"]["gates"]}
        if precision == "fp32":
            assert all(g["value"] <= 1e-5 for name, g in gates.items() if "spread" not in name)
            assert all(g["passed"] for g in gates.values())  # and within 1% of PyTorch's spread across the images
        else:
            assert gates["accuracy drop on digits:test"]["passed"] and gates["top-1 agreement on digits:test"]["passed"]
        if precision == "int8":  # Q/DQ placement and per-channel axes untouched
            qdq = lambda m: [(n.op_type, list(n.input), [(a.name, a.i) for a in n.attribute])  # noqa: E731
                             for n in m.graph.node if n.op_type in ("QuantizeLinear", "DequantizeLinear")]
            assert qdq(lowered) == qdq(onnx.load(str(source)))
        # reused, not redone, while the bundle graph is unchanged
        again, _ = bundle_graph(Bundle.open(digits3.root), source, precision, RULES[key])
        assert again == path
    for key in ("10.1", "11.1"):
        assert lint_file(source, RULES[key]).findings == []


def test_dry_run_86_plans_the_lowered_graph_and_10x_11x_are_unchanged(digits3, tmp_path):
    root = tmp_path / "d"
    shutil.copytree(digits3.root, root)
    res = CliRunner().invoke(main, ["build-engine", str(root), "--dry-run", "--print-trtexec", "--trt-version", "8.6", "--precision", "fp16"])
    assert res.exit_code == 0, res.output
    report = json.loads((root / "reports" / "engine-plan-trt8.6.0-fp16.json").read_text())
    parsed = report["plan"]["parse_graph"]
    model = onnx.load(parsed)
    assert model.opset_import[0].version <= 17 and "Gelu" not in {n.op_type for n in model.graph.node}
    assert report["trtexec"]["argv"][1] == f"--onnx={parsed}" and parsed.endswith("model.fp16.trt8.6.onnx")
    assert report["plan"]["source"].endswith("model.fp16.onnx") and report["parse_lint"]["findings"] == []
    assert "--skipInference" in report["trtexec"]["argv"]
    manifest = json.loads((root / "manifest.json").read_text())
    assert manifest["parser_graphs"]["fp16@trt8.6"]["file"] == "model.fp16.trt8.6.onnx"
    for version in ("10.3", "11.4"):
        res = CliRunner().invoke(main, ["build-engine", str(root), "--dry-run", "--print-trtexec", "--trt-version", version, "--precision", "fp16"])
        assert res.exit_code == 0, res.output
        assert f"--onnx={root / 'model.fp16.onnx'}" in res.output and "lower" not in res.output
        plan = json.loads(next((root / "reports").glob(f"engine-plan-trt{version}*-fp16.json")).read_text())["plan"]
        assert plan["parse_graph"] is None and plan["lowering"] is None
    # trtexec 8.5 has --buildOnly, not --skipInference
    res = CliRunner().invoke(main, ["build-engine", str(root), "--print-trtexec", "--trt-version", "8.5", "--precision", "int8"])
    assert res.exit_code == 0, res.output
    assert "model.int8.trt8.5.onnx" in res.output and "--buildOnly" in res.output and "--skipInference" not in res.output


def test_lint_mode_prints_only_the_lint(digits3):
    res = CliRunner().invoke(main, ["build-engine", str(digits3.root), "--lint", "--trt-version", "8.5", "--precision", "fp32"])
    assert res.exit_code == 0, res.output
    assert "no importer for Gelu: 4 node(s)" in res.output and "no importer for LayerNormalization: 9 node(s)" in res.output
    assert "8.5-GA" in res.output and "trtexec" not in res.output and "plan:" not in res.output


def test_dla_report_reads_the_graph_the_target_parses(digits3, tmp_path):
    root = tmp_path / "d"
    shutil.copytree(digits3.root, root)
    res = CliRunner().invoke(main, ["build-engine", str(root), "--dla-report", "--trt-version", "8.5", "--precision", "fp16"])
    assert res.exit_code == 0, res.output
    report = json.loads((root / "reports" / "dla-fp16.json").read_text())
    assert report["graph"].endswith("model.fp16.trt8.5.onnx")
    ops = {n["op_type"] for n in report["nodes"]}
    assert "Erf" in ops and "Gelu" not in ops and "LayerNormalization" not in ops


def test_a_build_refuses_an_unparsable_graph_before_tensorrt(digits3, tmp_path, monkeypatch):
    root = tmp_path / "d"
    shutil.copytree(digits3.root, root)
    model = onnx.load(str(root / "model.onnx"))
    resize = next(n for n in model.graph.node if n.op_type == "Transpose")
    resize.domain = "com.example"  # a node no parser has an importer for
    onnx.save(model, str(root / "model.onnx"))
    vouch_for(root)
    monkeypatch.setattr(service, "_capabilities", lambda request, need_live: (capabilities_for("8.6"), object()))
    monkeypatch.setattr(service, "_build", lambda *a: pytest.fail("TensorRT must not be called"))
    with pytest.raises(UserError, match=r"cannot parse model.onnx: .*no importer for com.example::Transpose.*nothing was built"):
        service.run(service.BuildEngineRequest(root, PlanOptions(precision="fp32")))
    res = CliRunner().invoke(main, ["build-engine", str(root), "--dry-run", "--trt-version", "10.3", "--precision", "fp32"])
    assert res.exit_code == 1 and "com.example::Transpose" in res.output


def test_fp16_is_made_when_the_bundle_has_none(digits_bundle, copy_bundle):
    root = copy_bundle(digits_bundle, "fp32only")
    assert not (root / "model.fp16.onnx").exists()
    res = CliRunner().invoke(main, ["build-engine", str(root), "--dry-run", "--trt-version", "10.3", "--precision", "fp16"])
    assert res.exit_code == 0, res.output
    assert "has no fp16 graph: making model.fp16.onnx" in res.output
    assert "fp16" in Bundle.open(root).precisions() and "from model.fp16.onnx" in res.output


def test_fp16_without_the_fp16_pass_is_one_line(digits_bundle, copy_bundle, monkeypatch):
    import vitdeploy.lazy

    root = copy_bundle(digits_bundle, "nofp16")
    real = vitdeploy.lazy.available
    monkeypatch.setattr(vitdeploy.lazy, "available", lambda module: False if module == "onnxconverter_common" else real(module))
    res = CliRunner().invoke(main, ["build-engine", str(root), "--dry-run", "--trt-version", "10.3", "--precision", "fp16"])
    assert res.exit_code == 1 and res.output.count("\n") == 1
    assert "no fp16 graph" in res.output and "pip install onnxconverter-common" in res.output
    assert not (root / "model.fp16.onnx").exists()
