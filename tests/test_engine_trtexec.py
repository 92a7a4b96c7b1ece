"""trtexec lines per TensorRT version, `build-engine --dry-run --print-trtexec`, and the build recipe."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from engine_fixtures import write_bundle

from vitdeploy.cli import main
from vitdeploy.engine import builder, versions
from vitdeploy.engine.plan import PlanOptions, make_plan
from vitdeploy.engine.trtexec import trtexec_command
from vitdeploy.errors import UserError
from vitdeploy.lazy import available


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    return write_bundle(tmp_path_factory.mktemp("trtexec") / "b", dynamic_hw=True, precisions=("fp32", "fp16"))


def _line(bundle, version, **opts):
    caps = versions.capabilities_for(version)
    plan = make_plan(bundle, PlanOptions(**opts), caps)
    return trtexec_command(plan, caps, "out/model.plan")


def test_trtexec_10x_strongly_typed_with_knobs(bundle):
    cmd = _line(bundle, "10.3", precision="fp16", batch=("1:8:32",), resolution=("32:48:64",), workspace="4G",
                optimization_level=4, timing_cache="t.cache", hardware_compatibility="ampere+", version_compatible=True)
    assert cmd.argv == [
        "trtexec", f"--onnx={bundle.root / 'model.fp16.onnx'}",
        "--minShapes=images:1x32x32x3", "--optShapes=images:8x48x48x3", "--maxShapes=images:32x64x64x3",
        "--stronglyTyped", "--memPoolSize=workspace:4096", "--builderOptimizationLevel=4", "--timingCacheFile=t.cache",
        "--hardwareCompatibilityLevel=ampere+", "--versionCompatible", "--saveEngine=out/model.plan", "--skipInference",
    ]
    assert cmd.notes == []


def test_trtexec_11x_has_no_precision_flags(bundle):
    cmd = _line(bundle, "11.4", precision="fp16", batch=("1:8:32", "1"), resolution=("32:48:64", "32"), hardware_compatibility="same-cc")
    text = cmd.text(multiline=False)
    for absent in ("--fp16", "--int8", "--best", "--stronglyTyped", "--calib"):
        assert absent not in text
    assert cmd.argv[2:10] == [
        "--profile=0", "--minShapes=images:1x32x32x3", "--optShapes=images:8x48x48x3", "--maxShapes=images:32x64x64x3",
        "--profile=1", "--minShapes=images:1x32x32x3", "--optShapes=images:1x32x32x3", "--maxShapes=images:1x32x32x3",
    ]
    assert "--hardwareCompatibilityLevel=sameComputeCapability" in cmd.argv


def test_trtexec_legacy_and_8x(bundle):
    legacy = _line(bundle, "10.3", precision="int8", legacy_precision=True, calib_cache="calib.cache")
    assert legacy.argv[1].endswith("model.onnx") and "--stronglyTyped" not in legacy.argv
    assert [a for a in legacy.argv if a in ("--int8", "--fp16") or a.startswith("--calib")] == ["--int8", "--fp16", "--calib=calib.cache"]
    old = _line(bundle, "8.6.1", precision="fp16", batch=("1:8:32", "1"), resolution=("32", "48"))
    assert "--profile=0" not in old.argv and "--fp16" in old.argv
    assert "single optimisation profile" in old.notes[0]
    dla = _line(bundle, "10.3", precision="fp16", dla_core=0, resolution=("32",))
    assert dla.argv[-4:-2] == ["--useDLACore=0", "--allowGPUFallback"]


def test_recipe_names_each_versions_calls(bundle):
    plan10 = make_plan(bundle, PlanOptions(precision="fp16", workspace="1G", optimization_level=2, dla_core=0, resolution=("32",)), versions.capabilities_for("10.3"))
    rec = builder.recipe(plan10, versions.capabilities_for("10.3"))
    assert [r.path for r in rec.network_flags] == ["NetworkDefinitionCreationFlag.STRONGLY_TYPED"]
    assert [(s.member, s.assign) for s in rec.config_steps] == [
        ("set_memory_pool_limit", False), ("builder_optimization_level", True),
        ("default_device_type", True), ("DLA_core", True), ("set_flag", False),
    ]
    assert rec.support_query == "supports_model_v2"
    assert {"BuilderFlag.GPU_FALLBACK", "DeviceType.DLA", "MemoryPoolType.WORKSPACE", "OnnxParser.get_subgraph_nodes"} <= set(rec.api_names())
    caps11 = versions.capabilities_for("11.4")
    rec11 = builder.recipe(make_plan(bundle, PlanOptions(precision="fp16"), caps11), caps11)
    assert rec11.network_flags == ()  # always strongly typed; the flag is deprecated and ignored
    caps86 = versions.capabilities_for("8.6.1")
    rec86 = builder.recipe(make_plan(bundle, PlanOptions(precision="fp16", legacy_precision=True), caps86), caps86)
    assert [r.path for r in rec86.network_flags] == ["NetworkDefinitionCreationFlag.EXPLICIT_BATCH"]
    assert rec86.support_query == "supports_model" and ("set_flag", ("BuilderFlag.FP16",)) in [
        (s.member, tuple(a.path for a in s.args)) for s in rec86.config_steps
    ]


def test_apply_config_sets_and_calls_what_the_recipe_says(bundle):
    class FakeTrt:  # stands in for the tensorrt module's enums only; the real ones are checked in test_engine_bindings
        class MemoryPoolType:
            WORKSPACE = "pool:workspace"

        class BuilderFlag:
            VERSION_COMPATIBLE = "flag:vc"

    class Config:
        def __init__(self):
            self.calls = []

        def set_memory_pool_limit(self, pool, size):
            self.calls.append(("pool", pool, size))

        def set_flag(self, flag):
            self.calls.append(("flag", flag))

    caps = versions.capabilities_for("10.3")
    plan = make_plan(bundle, PlanOptions(workspace="64M", optimization_level=1, version_compatible=True), caps)
    config = Config()
    builder.apply_config(FakeTrt, config, builder.recipe(plan, caps).config_steps)
    assert config.calls == [("pool", "pool:workspace", 64 << 20), ("flag", "flag:vc")]
    assert config.builder_optimization_level == 1


def test_npy_calibration_batches(tmp_path):
    data = np.random.default_rng(0).integers(0, 256, (10, 32, 32, 3), dtype=np.uint8)
    np.save(tmp_path / "calib.npy", data)
    batches = list(builder.npy_batches(tmp_path / "calib.npy", 4, 32, 32))
    assert [b.shape for b in batches] == [(4, 32, 32, 3)] * 2 and np.array_equal(batches[1], data[4:8])
    np.save(tmp_path / "bad.npy", data.astype(np.float32))
    with pytest.raises(UserError, match=r"expected uint8 \[N,32,32,3\]"):
        list(builder.npy_batches(tmp_path / "bad.npy", 4, 32, 32))


@pytest.mark.parametrize("version, has_typed_flag", [("10.3", True), ("11.4", False)])
def test_cli_dry_run_prints_trtexec_and_writes_the_plan_report(bundle, version, has_typed_flag):
    res = CliRunner().invoke(main, ["build-engine", str(bundle.root), "--dry-run", "--print-trtexec", "--trt-version", version,
                                    "--precision", "fp16", "--batch", "1:8:32", "--resolution", "32:48:64"])
    assert res.exit_code == 0, res.output
    assert ("--stronglyTyped" in res.output) is has_typed_flag
    assert "--minShapes=images:1x32x32x3" in res.output and "--fp16" not in res.output
    report_path = bundle.root / "reports" / f"engine-plan-trt{versions.TrtVersion.parse(version)}-fp16.json"
    report = json.loads(report_path.read_text())
    assert report["plan"]["precision_path"] == "strongly-typed" and report["trtexec"]["argv"][0] == "trtexec"
    assert ("trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED" in report["tensorrt_calls"]["network_flags"]) is has_typed_flag
    assert not (bundle.root / "engines").exists()  # a dry run builds nothing


@pytest.mark.skipif(available("tensorrt"), reason="TensorRT is installed here")
def test_cli_without_tensorrt_is_one_clear_line(bundle):
    res = CliRunner().invoke(main, ["build-engine", str(bundle.root)])
    assert res.exit_code == 1
    assert res.output.count("\n") == 1 and "engines are built on the target device" in res.output
    res = CliRunner().invoke(main, ["build-engine", str(bundle.root), "--legacy-precision", "--dry-run", "--trt-version", "11.4"])
    assert res.exit_code == 1 and "needs TensorRT < 11" in res.output


@pytest.mark.skipif(available("tensorrt"), reason="TensorRT is installed here")
def test_dry_run_without_tensorrt_plans_for_the_newest_known_release(bundle):
    """README: a dry run needs no TensorRT. With none installed or named it plans for the newest
    release vitdeploy knows, says so, and records it in the plan report."""
    from vitdeploy.engine.service import PLAN_DEFAULT_TRT

    version = versions.TrtVersion.parse(PLAN_DEFAULT_TRT)
    report_path = bundle.root / "reports" / f"engine-plan-trt{version}-fp32.json"
    report_path.unlink(missing_ok=True)  # the module's bundle: another test may have planned this one
    res = CliRunner().invoke(main, ["build-engine", str(bundle.root), "--dry-run", "--print-trtexec", "--precision", "fp32"])
    assert res.exit_code == 0, res.output
    assert f"planned for TensorRT {PLAN_DEFAULT_TRT}, the newest release vitdeploy knows" in res.output
    assert f"# trtexec equivalent for TensorRT {version}:" in res.output and f"plan report: {report_path}" in res.output
    report = json.loads(report_path.read_text())
    assert report["capabilities"]["version"] == str(version)
    assert any("newest release vitdeploy knows" in n for n in report["plan"]["notes"])
    assert not (bundle.root / "engines").exists()  # a dry run builds nothing


_DIGITS_WEIGHTS = Path(__file__).resolve().parent.parent / "vitdeploy" / "builtin" / "digits.json"


@pytest.mark.skipif(not _DIGITS_WEIGHTS.is_file(), reason="the builtin digits model is not trained yet (scripts/train_digits.py)")
@pytest.mark.parametrize("version, typed_flag", [("10.3", True), ("11.4", False)])
def test_builtin_bundle_dry_run(digits_bundle, copy_bundle, version, typed_flag):
    root = copy_bundle(digits_bundle, f"digits-{version}")
    res = CliRunner().invoke(main, ["build-engine", str(root), "--dry-run", "--print-trtexec", "--trt-version", version])
    assert res.exit_code == 0, res.output
    assert f"--onnx={root / 'model.onnx'}" in res.output and "--minShapes=images:1x" in res.output
    assert ("--stronglyTyped" in res.output) is typed_flag and "--fp16" not in res.output
