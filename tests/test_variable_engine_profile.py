"""build-engine and profile for variable-size bundles (issue #13): (images, valid_hw) everywhere.

On the digits ViT exported with ``--variable-size --canvas 48x48``:

- the plan, the trtexec line and the builder recipe shape BOTH inputs from one batch range
  (images [B, 48, 48, 3], valid_hw [B, 2]); the builder's profile code runs against the REAL
  TensorRT Python bindings of 8.6, 10.3, 10.16 and 11.4 (stand-in native libraries, no GPU: the
  bindings' own Dims and IOptimizationProfile.set_shape signature, nothing is built);
- the parse lint of the variable graph per TensorRT line (8.5/8.6 lowered, verified with ONNX
  Runtime on both inputs; 10.x/11.x parse it as exported), and the DLA report's mask path;
- profile cells per fill ratio on ONNX Runtime and the PyTorch masked forward, with measured latencies
  and the canvas/fill columns; bad --fill values get one line.

The real TensorRT build and the TensorRT runner need a GPU and are not exercised here.
"""

from __future__ import annotations

import csv
import json
import shutil
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from vitdeploy.cli import main
from trt_stubs import BINDING_VERSIONS

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def variable_bundle(export_cached, tmp_path_factory) -> Path:
    """A private copy of the digits variable-size bundle (build-engine writes lowered graphs and reports into it)."""
    src = export_cached("builtin:digits", variable_size=True, canvas=(48, 48))
    dst = tmp_path_factory.mktemp("variable-engine") / "bundle"
    shutil.copytree(src.root, dst)
    return dst


def _invoke(args: list[str]) -> tuple[int, str]:
    result = CliRunner().invoke(main, [str(a) for a in args])
    assert "Traceback" not in result.output, result.output
    return result.exit_code, result.output


# -- plan, trtexec line, recipe ------------------------------------------------------------------
@pytest.mark.parametrize("trt", ["10.3", "11.4"])
def test_plan_and_trtexec_line_shape_both_inputs(variable_bundle, trt):
    code, out = _invoke(["build-engine", variable_bundle, "--dry-run", "--print-trtexec", "--trt-version", trt,
                         "--batch", "1:4:8", "--target", f"var-{trt}"])
    assert code == 0, out
    assert "--minShapes=images:1x48x48x3,valid_hw:1x2" in out
    assert "--optShapes=images:4x48x48x3,valid_hw:4x2" in out and "--maxShapes=images:8x48x48x3,valid_hw:8x2" in out
    assert "profile 0: batch 1:4:8, 48x48, valid_hw 1x2:4x2:8x2" in out
    report = json.loads((variable_bundle / "reports" / f"engine-plan-var-{trt}.json").read_text())
    plan = report["plan"]
    assert plan["input_name"] == "images" and plan["extra_inputs"] == [{"name": "valid_hw", "dtype": "int32", "dims": [2]}]
    assert plan["profiles"][0]["inputs"] == {
        "images": {"min": [1, 48, 48, 3], "opt": [4, 48, 48, 3], "max": [8, 48, 48, 3]},
        "valid_hw": {"min": [1, 2], "opt": [4, 2], "max": [8, 2]},
    }
    # the builder recipe: one set_shape per input per profile
    assert report["tensorrt_calls"]["profiles"] == [{"images": [[1, 48, 48, 3], [4, 48, 48, 3], [8, 48, 48, 3]],
                                                     "valid_hw": [[1, 2], [4, 2], [8, 2]]}]
    assert "IOptimizationProfile.set_shape" in report["tensorrt_calls"]["tensorrt_api"]
    assert report["parse_lint"]["findings"] == []


def test_fixed_canvas_and_legacy_int8_are_refused_in_one_line(variable_bundle):
    code, out = _invoke(["build-engine", variable_bundle, "--dry-run", "--trt-version", "10.3", "--resolution", "32:48:64"])
    assert code == 1 and out.strip().count("\n") == 0
    assert "fixed at 48" in out and "canvas is fixed at export" in out
    code, out = _invoke(["build-engine", variable_bundle, "--dry-run", "--trt-version", "10.3", "--legacy-precision",
                         "--precision", "int8", "--calib-cache", variable_bundle / "c.cache"])
    assert code == 1 and out.strip().count("\n") == 0 and "valid_hw" in out


# -- parse lint and 8.x lowering ------------------------------------------------------------------
def test_lint_of_the_variable_graph_per_tensorrt_version(variable_bundle):
    """10.x/11.x parse the graph as exported; 8.5/8.6 only after the lowering (opset 17, Gelu, 8.5 LayerNorm),
    and nothing in the mask path (Where, Less, Equal, Cast, Floor, Clip, MatMul ...) is refused anywhere."""
    from vitdeploy.engine.lint import lint_file
    from vitdeploy.engine.lowering import lower_for
    from vitdeploy.engine.parser_rules import rules_for

    import onnx

    graph = variable_bundle / "model.onnx"
    ops = {n.op_type for n in onnx.load(str(graph)).graph.node}
    assert {"Where", "MatMul", "Cast", "Floor"} <= ops  # the mask and the separable interpolation are in the graph
    for version in ("10.3", "10.16", "11.4"):
        report = lint_file(graph, rules_for(version))
        assert report.clean, (version, report.lines())
    for version in ("8.5", "8.6"):
        rules = rules_for(version)
        report = lint_file(graph, rules)
        assert report.findings and not report.blocking, (version, report.lines())  # every finding is lowerable
        rules_hit = set(report.by_rule())
        assert rules_hit <= {"opset 20 > 17", "no importer for Gelu", "no importer for LayerNormalization"}, rules_hit
        lowered, record = lower_for(onnx.load(str(graph)), rules)  # raises unless the result lints clean
        assert record["opset"] == [20, 17] and "opset 20 -> 17" in record["rewrites"]
    code, out = _invoke(["build-engine", variable_bundle, "--lint", "--trt-version", "11.4"])
    assert code == 0 and "nothing it cannot parse" in out


def test_dry_run_for_tensorrt_8_6_lowers_and_verifies_on_both_inputs(variable_bundle):
    code, out = _invoke(["build-engine", variable_bundle, "--dry-run", "--print-trtexec", "--trt-version", "8.6", "--batch", "1:2:4"])
    assert code == 0, out
    assert "model.trt8.6.onnx" in out and "--minShapes=images:1x48x48x3,valid_hw:1x2" in out
    record = json.loads((variable_bundle / "manifest.json").read_text())["parser_graphs"]["fp32@trt8.6"]
    verification = record["verification"]
    assert verification["passed"] and all(g["passed"] for g in verification["gates"])
    assert max(row["max_abs"] for row in verification["rows"]) <= 1e-5  # lowered = bundle graph on (images, valid_hw)


def test_an_integer_input_feeding_a_shape_is_a_lint_finding(tmp_path):
    """valid_hw must stay per-image data: a graph where it reaches a Reshape's shape would make it a shape tensor."""
    from onnx import TensorProto, helper

    from vitdeploy.engine.lint import lint_model
    from vitdeploy.engine.parser_rules import rules_for

    nodes = [helper.make_node("Cast", ["valid_hw"], ["v64"], to=TensorProto.INT64),
             helper.make_node("Reshape", ["x", "v64"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4]),
                                           helper.make_tensor_value_info("valid_hw", TensorProto.INT32, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    report = lint_model(model, rules_for("10.3"))
    assert [f.rule for f in report.blocking] == ["integer input used as a shape tensor"]
    assert "valid_hw" in report.blocking[0].detail


# -- DLA report ------------------------------------------------------------------------------------
def test_dla_report_names_the_mask_path_and_why_it_falls_back(variable_bundle):
    code, out = _invoke(["build-engine", variable_bundle, "--dla-report", "--precision", "fp32", "--trt-version", "10.3"])
    assert code == 0, out
    assert "mask path (computed from valid_hw alone)" in out
    report = json.loads((variable_bundle / "reports" / "dla-fp32.json").read_text())
    mask = report["mask_path"]
    assert report["other_inputs"] == ["valid_hw"] and mask["layers"] > 5
    assert mask["gpu"] == mask["layers"]  # integer/bool mask math, Cast, Where, MatMul: none of it is a DLA layer
    rules = {row["rule"] for row in mask["fallback"]}
    assert "integer/bool tensor math" in rules and "MatrixMultiply is not a DLA layer" in rules
    mask_nodes = [n for n in report["nodes"] if n["path"] == "mask"]
    assert {"Where", "MatMul"} <= {n["op_type"] for n in mask_nodes}
    assert not any(n["op_type"] == "Conv" for n in mask_nodes)  # the patch embedding reads the images


# -- the builder against the real TensorRT bindings --------------------------------------------------
PROBE = r'''
import json, sys
import tensorrt_bindings
sys.modules["tensorrt"] = tensorrt_bindings
import tensorrt as trt
from vitdeploy.bundle import Bundle
from vitdeploy.engine import builder, versions
from vitdeploy.engine.plan import PlanOptions, make_plan

class Recorder:
    def __init__(self):
        self.calls = []
    def set_shape(self, name, lo, opt, hi):
        self.calls.append([name, [list(trt.Dims(lo)), list(trt.Dims(opt)), list(trt.Dims(hi))]])

class FakeBuilder:
    def create_optimization_profile(self):
        return Recorder()

class FakeConfig:
    def __init__(self):
        self.profiles = []
    def add_optimization_profile(self, profile):
        self.profiles.append(profile)

caps = versions.capabilities_of(trt)
plan = make_plan(Bundle.open(sys.argv[1]), PlanOptions(precision="fp32", batch=("1:4:8", "16")), caps)
rec = builder.recipe(plan, caps)
config = FakeConfig()
builder.add_profiles(FakeBuilder(), config, rec)
print(json.dumps({
    "version": trt.__version__,
    "missing": [n for n in rec.api_names() if not versions.has(trt, n)],
    "set_shape_doc": trt.IOptimizationProfile.set_shape.__doc__.strip().splitlines()[0],
    "profiles": [p.calls for p in config.profiles],
    "int32": str(trt.nptype(trt.int32)),
}))
'''


@pytest.mark.parametrize("version", BINDING_VERSIONS)
def test_builder_sets_a_profile_for_both_inputs_on_the_real_bindings(version, variable_bundle, stub_cache, tmp_path):
    from trt_stubs import PYTHON, installed_bindings, probe_env

    bindings, stubs = installed_bindings(REPO, version, stub_cache)
    script = tmp_path / "probe_variable.py"
    script.write_text(PROBE)
    proc = subprocess.run([PYTHON, str(script), str(variable_bundle)], env=probe_env(bindings, stubs, REPO),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["version"] == version and got["missing"] == []
    # the real binding's signature: set_shape(input: str, min: Dims, opt: Dims, max: Dims)
    doc = got["set_shape_doc"]
    assert "input: str" in doc and all(f"{k}: tensorrt" in doc and "Dims" in doc for k in ("min", "opt", "max")), doc
    assert got["profiles"] == [
        [["images", [[1, 48, 48, 3], [4, 48, 48, 3], [8, 48, 48, 3]]], ["valid_hw", [[1, 2], [4, 2], [8, 2]]]],
        [["images", [[16, 48, 48, 3]] * 3], ["valid_hw", [[16, 2]] * 3]],
    ]
    assert "int32" in got["int32"]


# -- profile ----------------------------------------------------------------------------------------
def test_fill_rule_draws_whole_patch_sizes_near_the_fill():
    from vitdeploy.profile.variable import achieved_fill, sizes_for_fill

    assert sizes_for_fill((48, 48), (4, 4), 1.0, 5).tolist() == [[48, 48]] * 5
    for fill in (0.5, 0.25, 0.1):
        sizes = sizes_for_fill((48, 48), (4, 4), fill, 64, seed=3)
        assert (sizes % 4 == 0).all() and (sizes >= 4).all() and (sizes <= 48).all()
        assert abs(achieved_fill(sizes, (48, 48)) - fill) < 0.05
        assert len({tuple(s) for s in sizes.tolist()}) > 3  # several aspect ratios, not one shape
        assert (sizes == sizes_for_fill((48, 48), (4, 4), fill, 64, seed=3)).all()  # seeded


def test_profile_measures_cells_per_fill_ratio(variable_bundle, tmp_path):
    out = tmp_path / "reports"
    code, text = _invoke(["profile", variable_bundle, "--fill", "1.0,0.5,0.25", "--batch", "4", "--backend", "ort,torch",
                          "--iterations", "3", "--warmup", "1", "--threads", "1", "--no-plot", "-o", out])
    assert code == 0, text
    with open(out / "profile.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    header = list(rows[0])
    assert header[header.index("width") + 1:header.index("width") + 4] == ["canvas", "fill", "fill_actual"]
    assert len(rows) == 6 and {r["status"] for r in rows} == {"ok"}, [(r["backend"], r["note"]) for r in rows]
    for backend in ("ort", "torch"):
        mine = [r for r in rows if r["backend"] == backend]
        assert [float(r["fill"]) for r in mine] == [1.0, 0.5, 0.25]
        for r in mine:
            assert r["canvas"] == "48x48" and (r["height"], r["width"]) == ("48", "48")
            assert float(r["p50_ms"]) > 0 and int(r["iterations"]) == 3
            assert abs(float(r["fill_actual"]) - float(r["fill"])) <= 0.1
    report = json.loads((out / "profile.json").read_text())
    assert report["bundle"]["variable_size"]["canvas"] == [48, 48] and "fill" in report["columns"]
    assert "fill 0.5" in text or "0.50" in text  # the table shows the fill of each cell


def test_profile_at_another_canvas_times_the_two_input_variant(variable_bundle, tmp_path):
    """--resolutions on a variable-size bundle: other canvases, the same two-input graph re-exported
    (variants/HxW) for ORT and the masked forward built at that canvas for torch."""
    out = tmp_path / "reports"
    code, text = _invoke(["profile", variable_bundle, "--resolutions", "32", "--fill", "1.0", "--batch", "2", "--backend", "ort,torch",
                          "--iterations", "2", "--warmup", "0", "--threads", "1", "--no-plot", "-o", out])
    assert code == 0, text
    with open(out / "profile.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert [(r["backend"], r["canvas"], r["status"]) for r in rows] == [("ort", "32x32", "ok"), ("torch", "32x32", "ok")], rows
    assert rows[0]["graph"].startswith("variants/") and float(rows[0]["p50_ms"]) > 0


def test_profile_fill_values_are_checked_in_one_line(variable_bundle, tmp_path):
    from engine_fixtures import write_bundle

    for value, message in (("0", "outside (0, 1]"), ("1.5", "outside (0, 1]"), ("half", "not a number"), ("", "is empty")):
        code, out = _invoke(["profile", variable_bundle, "--fill", value, "--iterations", "1", "--no-plot"])
        assert code == 1 and out.strip().count("\n") == 0 and message in out, (value, out)
    fixed = write_bundle(tmp_path / "fixed")
    code, out = _invoke(["profile", fixed.root, "--fill", "0.5", "--iterations", "1", "--no-plot"])
    assert code == 1 and "applies to variable-size bundles" in out and out.strip().count("\n") == 0


def test_fixed_size_reports_keep_their_columns():
    from vitdeploy.profile.report import COLUMNS, columns_for

    assert columns_for([{"backend": "ort", "fill": None}]) is COLUMNS
    assert list(columns_for([{"fill": 0.5}]))[list(COLUMNS).index("width") + 1] == "canvas"
