"""The precision registry (vitdeploy/precisions.py) and what reads it: one entry per precision decides the file,
the "best" order, the TensorRT flags per version, the CLI choices and the bundle's recorded order."""

from __future__ import annotations

import json

import click
import pytest
from engine_fixtures import write_bundle

from vitdeploy import precisions
from vitdeploy.bundle import ARTIFACT_FILES, Bundle, refuse_export_precisions
from vitdeploy.cli import main
from vitdeploy.engine import versions
from vitdeploy.engine.plan import PlanOptions, choose_precision, make_plan
from vitdeploy.engine.trtexec import trtexec_command
from vitdeploy.errors import UsageError


def test_entries_give_the_files_order_and_gates():
    assert precisions.NAMES == ("fp32", "fp16", "int8", "fp8")
    assert precisions.BEST_ORDER == ("fp8", "int8", "fp16", "fp32")
    assert precisions.REDUCED == ("fp8", "int8", "fp16")
    assert ARTIFACT_FILES == {"fp32": "model.onnx", "fp16": "model.fp16.onnx", "int8": "model.int8.onnx", "fp8": "model.fp8.onnx",
                              "cpu": "model.cpu.onnx"}
    assert precisions.DERIVED_ARTIFACTS == ("fp16", "int8", "fp8", "cpu")
    assert [precisions.get(n).gate for n in precisions.NAMES] == ["exact", "reduced", "reduced", "reduced"]
    assert precisions.best_of(["fp32", "fp16"]) == "fp16" and precisions.best_of([]) is None
    # "cpu" is a backend variant of the fp32 graph, not a precision
    assert "cpu" not in precisions.NAMES and precisions.computes_in("cpu") == "fp32" and precisions.computes_in("int8") == "int8"


def test_tensorrt_flags_per_version():
    fp16, int8 = precisions.get("fp16"), precisions.get("int8")
    assert fp16.builder_flags((8, 6)) == ("FP16",) and int8.builder_flags((10, 16)) == ("INT8", "FP16")
    assert int8.trtexec_flags((8, 5)) == ("--int8", "--fp16")
    assert fp16.builder_flags((11, 4)) == () and int8.trtexec_flags((11, 0)) == ()  # 11: strongly typed only
    assert precisions.get("fp32").builder_flags((8, 6)) == ()
    assert precisions.get("fp32").why_not_on((10, 3), dla=True) == "DLA does not run fp32"
    assert fp16.why_not_on((8, 5), (8, 7), dla=True) is None
    assert int8.why_not_on((8, 4)) == "int8 needs TensorRT 8.5 or later"


def test_a_new_entry_reaches_orders_choices_and_flags(monkeypatch):
    """What one more entry gives without touching the readers (a hypothetical fp4, as a stand-in only)."""
    fp4 = precisions.Precision(name="fp4", artifact="model.fp4.onnx", graph_dtypes=("float4e2m1", "float16", "float32"),
                               passes=("calibrate",), make_hint="create it with `vitdeploy calibrate --precision fp4`", rank=9,
                               gate="reduced", min_trt=(10, 8), min_compute_capability=(10, 0))
    registry = precisions.REGISTRY + (fp4,)
    order = tuple(p.name for p in sorted(registry, key=lambda p: -p.rank))
    assert order[0] == "fp4" and fp4.builder_flags((10, 8)) == ()
    assert fp4.why_not_on((10, 8), (9, 0)) == "fp4 needs compute capability 10.0 or later"
    assert fp4.why_not_on((10, 3), (10, 0)) == "fp4 needs TensorRT 10.8 or later"
    monkeypatch.setattr(precisions, "REGISTRY", registry)
    assert precisions.writers_text() == "fp32 and fp16 (export, convert), int8 and fp8 and fp4 (calibrate)"


def test_cli_choices_come_from_the_registry():
    params = {name: {p.name: p for p in main.commands[name].params} for name in
              ("build-engine", "predict", "embed", "serve", "triton-repo", "convert", "debug-precision")}
    choice = {name: list(p["precision"].type.choices) for name, p in params.items()}
    assert choice["build-engine"] == [*precisions.NAMES, "best"]
    for name in ("predict", "embed", "serve", "triton-repo"):
        assert choice[name] == ["best", *precisions.NAMES], name
    assert choice["convert"] == ["fp16", "int8", "fp8"] and choice["debug-precision"] == list(precisions.REDUCED)
    assert isinstance(params["debug-precision"]["precision"].type, click.Choice) and params["debug-precision"]["precision"].required


def test_export_refusals_name_the_passes():
    refuse_export_precisions(["fp32", "fp16"])
    with pytest.raises(UsageError, match=r"^export writes fp32 and fp16 graphs; int8 needs calibration images"):
        refuse_export_precisions(["fp32", "int8"])
    with pytest.raises(UsageError, match=r"it writes fp32 and fp16 \(export, convert\), int8 and fp8 \(calibrate\)$"):
        refuse_export_precisions(["bf16"])


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    return write_bundle(tmp_path_factory.mktemp("precisions") / "b", precisions=("fp32", "fp16", "int8"))


def test_plans_follow_the_entries(bundle):
    caps86, caps10 = versions.capabilities_for("8.6"), versions.capabilities_for("10.3")
    assert choose_precision("best", ["fp32", "fp16"], legacy=False, has_calibration=False) == "fp16"
    assert choose_precision("best", [], legacy=True, has_calibration=True) == "int8"
    assert choose_precision("best", [], legacy=True, has_calibration=False) == "fp16"
    plan = make_plan(bundle, PlanOptions(precision="int8"), caps86)
    assert plan.builder_flags == ("INT8", "FP16") and plan.source.endswith("model.int8.onnx")
    argv = trtexec_command(plan, caps86, "e.plan").argv
    assert argv[argv.index("--int8"):argv.index("--int8") + 2] == ["--int8", "--fp16"]
    assert make_plan(bundle, PlanOptions(precision="int8"), caps10).builder_flags == ()


def test_engine_records_carry_the_best_order(bundle):
    """The C++ host library chooses an engine by this record (examples/cpp, Bundle::precision_order)."""
    opened = Bundle.open(bundle.root)
    opened.record_engine("gpu-trt10.3-int8", {"dir": "engines/gpu-trt10.3-int8", "precision": "int8"})
    manifest = json.loads((bundle.root / "manifest.json").read_text())
    assert manifest["precisions"] == {"best_order": ["fp8", "int8", "fp16", "fp32"],
                                      "files": {"fp32": "model.onnx", "fp16": "model.fp16.onnx", "int8": "model.int8.onnx",
                                                "fp8": "model.fp8.onnx"}}
    assert manifest["engines"]["gpu-trt10.3-int8"]["precision"] == "int8"
