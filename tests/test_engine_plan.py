"""Build plans: version table, precision paths, profiles against the graph, knobs, DLA rules (CPU only)."""

from __future__ import annotations

import pytest
from engine_fixtures import write_bundle

from vitdeploy.engine import versions
from vitdeploy.engine.knobs import parse_workspace_size
from vitdeploy.engine.plan import (
    PATH_LEGACY,
    PATH_STRONGLY_TYPED,
    PATH_TYPED_GRAPH_FLAGS,
    EnginePlan,
    PlanOptions,
    make_plan,
    parse_batch,
    parse_resolution_range,
)
from vitdeploy.errors import ConfigError, UserError


@pytest.fixture(scope="module")
def bundles(tmp_path_factory):
    root = tmp_path_factory.mktemp("plan")
    return {
        "static": write_bundle(root / "static", precisions=("fp32", "fp16", "int8")),
        "dynamic": write_bundle(root / "dynamic", dynamic_hw=True, precisions=("fp32", "fp16")),
        "fp32only": write_bundle(root / "fp32only"),
    }


CAPS = {v: versions.capabilities_for(v) for v in ("8.5.2", "8.6.1", "10.3.0", "10.9", "11.4.0")}


# -- versions -------------------------------------------------------------------------------------
def test_version_parsing_and_support():
    assert versions.TrtVersion.parse("10.3.0.26") == versions.TrtVersion(10, 3, 0, 26)
    assert str(versions.TrtVersion.parse("11.4")) == "11.4.0"
    assert versions.TrtVersion.parse("8.6.1") < versions.TrtVersion.parse("10.0")
    with pytest.raises(UserError, match="not MAJOR.MINOR"):
        versions.TrtVersion.parse("ten")
    for unsupported in ("7.1.3", "9.2.0", "8.4.3"):
        with pytest.raises(UserError, match="not supported"):
            versions.capabilities_for(unsupported)


def test_capability_table_follows_the_api_history():
    c85, c86, c103, c109, c11 = (CAPS[v] for v in ("8.5.2", "8.6.1", "10.3.0", "10.9", "11.4.0"))
    # precision paths
    assert [c.strongly_typed for c in (c86, c103, c11)] == [False, True, True]
    assert [c.legacy_precision for c in (c86, c103, c11)] == [True, True, False]
    assert [c.always_strongly_typed for c in (c86, c103, c11)] == [False, False, True]
    assert [c.int8_calibrator for c in (c86, c103, c11)] == [True, True, False]
    # explicit batch: required before 10, a no-op in 10, gone in 11
    assert [c.explicit_batch_required for c in (c86, c103, c11)] == [True, False, False]
    assert [c.explicit_batch_flag for c in (c86, c103, c11)] == [True, True, False]
    # parser query and knobs
    assert [c.supports_model_v2 for c in (c86, c103, c11)] == [False, True, True]
    assert [c.supports_model_v1 for c in (c86, c103, c11)] == [True, True, False]
    assert not c85.builder_optimization_level and c86.builder_optimization_level
    assert not c103.same_compute_capability and c109.same_compute_capability
    assert [c.trtexec_strongly_typed_flag for c in (c86, c103, c11)] == [False, True, False]
    # trtexec 8.5 has --buildOnly; 8.6 renamed it --skipInference (sampleOptions.cpp, release/8.5 vs 8.6)
    assert [c.trtexec_skip_inference for c in (c85, c86, c103, c11)] == [False, True, True, True]


# -- parsers --------------------------------------------------------------------------------------
def test_option_parsers():
    assert parse_batch("1:8:32") == (1, 8, 32)
    assert parse_batch("4") == (4, 4, 4)
    assert parse_resolution_range("224:224:384") == ((224, 224, 384), (224, 224, 384))
    assert parse_resolution_range("224x320") == ((224, 224, 224), (320, 320, 320))
    assert parse_workspace_size("4G") == 4 << 30 and parse_workspace_size("512M") == 512 << 20 and parse_workspace_size("1024") == 1 << 30
    assert parse_workspace_size("1.5GiB") == int(1.5 * (1 << 30))
    for bad, match in (("8:1:32", "MIN <= OPT <= MAX"), ("1:8", "MIN:OPT:MAX"), ("a:b:c", "integers"), ("0:1:2", "positive")):
        with pytest.raises(UserError, match=match):
            parse_batch(bad)
    with pytest.raises(UserError, match="below 1 MiB"):
        parse_workspace_size("10K")


# -- precision paths --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "version, precision, path, source, flags",
    [
        ("10.3.0", "best", PATH_STRONGLY_TYPED, "model.int8.onnx", ()),
        ("10.3.0", "fp16", PATH_STRONGLY_TYPED, "model.fp16.onnx", ()),
        ("11.4.0", "fp32", PATH_STRONGLY_TYPED, "model.onnx", ()),
        ("8.6.1", "fp16", PATH_TYPED_GRAPH_FLAGS, "model.fp16.onnx", ("FP16",)),
        ("8.6.1", "int8", PATH_TYPED_GRAPH_FLAGS, "model.int8.onnx", ("INT8", "FP16")),
    ],
)
def test_precision_picks_the_bundle_graph(bundles, version, precision, path, source, flags):
    plan = make_plan(bundles["static"], PlanOptions(precision=precision), CAPS[version])
    assert (plan.precision_path, plan.source.rsplit("/", 1)[-1], plan.builder_flags) == (path, source, flags)
    assert len(plan.source_sha256) == 64


def test_best_falls_back_to_what_the_bundle_has(bundles):
    assert make_plan(bundles["dynamic"], PlanOptions(), CAPS["10.3.0"]).precision == "fp16"
    assert make_plan(bundles["fp32only"], PlanOptions(), CAPS["10.3.0"]).precision == "fp32"
    with pytest.raises(UserError, match="no fp16 graph"):
        make_plan(bundles["fp32only"], PlanOptions(precision="fp16"), CAPS["10.3.0"])


def test_legacy_path_uses_fp32_graph_and_flags_and_is_refused_on_11(bundles):
    plan = make_plan(bundles["static"], PlanOptions(precision="fp16", legacy_precision=True), CAPS["10.3.0"])
    assert (plan.precision_path, plan.source_precision, plan.builder_flags) == (PATH_LEGACY, "fp32", ("FP16",))
    assert any("LayerNorm" in n for n in plan.notes)
    int8 = make_plan(bundles["static"], PlanOptions(precision="int8", legacy_precision=True, calib_cache="c.cache", calib_batch=4), CAPS["8.6.1"])
    assert int8.builder_flags == ("INT8", "FP16") and int8.calibration == {"algorithm": "entropy2", "data": None, "cache": "c.cache", "batch": 4}
    with pytest.raises(UserError, match="calibration data"):
        make_plan(bundles["static"], PlanOptions(precision="int8", legacy_precision=True), CAPS["10.3.0"])
    with pytest.raises(ConfigError, match="needs TensorRT < 11"):
        make_plan(bundles["static"], PlanOptions(precision="fp16", legacy_precision=True), CAPS["11.4.0"])
    with pytest.raises(UserError, match="add --legacy-precision"):
        make_plan(bundles["static"], PlanOptions(precision="int8", calib_data="x.npy"), CAPS["10.3.0"])


# -- profiles ---------------------------------------------------------------------------------------
def test_profiles_follow_the_graph_input(bundles):
    plan = make_plan(bundles["dynamic"], PlanOptions(batch=("1:8:32", "1"), resolution=("32:48:64", "32")), CAPS["10.3.0"])
    assert [p.shapes(plan.layout) for p in plan.profiles] == [
        {"min": (1, 32, 32, 3), "opt": (8, 48, 48, 3), "max": (32, 64, 64, 3)},
        {"min": (1, 32, 32, 3), "opt": (1, 32, 32, 3), "max": (1, 32, 32, 3)},
    ]
    assert (plan.input_name, plan.input_dtype, plan.input_layout) == ("images", "uint8", "NHWC")
    # one --resolution applies to every batch profile; the static graph's H/W default to its size
    two = make_plan(bundles["dynamic"], PlanOptions(batch=("1", "8"), resolution=("48",)), CAPS["10.3.0"])
    assert [(p.batch, p.height) for p in two.profiles] == [((1, 1, 1), (48, 48, 48)), ((8, 8, 8), (48, 48, 48))]
    default = make_plan(bundles["static"], PlanOptions(), CAPS["10.3.0"])
    assert default.profiles[0].batch == (1, 8, 32) and default.profiles[0].height == (32, 32, 32)
    assert EnginePlan.from_dict(plan.to_dict()) == plan


@pytest.mark.parametrize(
    "bundle, options, match",
    [
        ("static", PlanOptions(resolution=("64",)), "fixed at 32"),
        ("dynamic", PlanOptions(resolution=("30:32:64",)), "not a multiple of the patch size 8"),
        ("dynamic", PlanOptions(batch=("1", "2", "4"), resolution=("32", "48")), "one of each per profile"),
        ("dynamic", PlanOptions(batch=("4", "4")), "identical"),
    ],
)
def test_bad_profiles_are_one_clear_error(bundles, bundle, options, match):
    with pytest.raises(UserError, match=match):
        make_plan(bundles[bundle], options, CAPS["10.3.0"])


# -- knobs by version -------------------------------------------------------------------------------
def test_knobs_are_checked_against_the_version(bundles):
    plan = make_plan(
        bundles["static"],
        PlanOptions(precision="fp16", workspace="2G", optimization_level=5, hardware_compatibility="same-cc", version_compatible=True),
        CAPS["10.9"],
    )
    assert (plan.workspace_bytes, plan.optimization_level, plan.hardware_compatibility, plan.version_compatible) == (2 << 30, 5, "same-cc", True)
    with pytest.raises(ConfigError, match="added in 10.9"):
        make_plan(bundles["static"], PlanOptions(hardware_compatibility="same-cc"), CAPS["10.3.0"])
    with pytest.raises(ConfigError, match="added in 8.6"):
        make_plan(bundles["static"], PlanOptions(optimization_level=3), CAPS["8.5.2"])
    with pytest.raises(ConfigError, match="added in 8.6"):
        make_plan(bundles["static"], PlanOptions(version_compatible=True), CAPS["8.5.2"])
    with pytest.raises(UserError, match="outside 0..5"):
        make_plan(bundles["static"], PlanOptions(optimization_level=7), CAPS["10.3.0"])


# -- DLA ----------------------------------------------------------------------------------------------
def test_dla_needs_reduced_precision_and_static_shapes(bundles):
    plan = make_plan(bundles["static"], PlanOptions(precision="fp16", dla_core=1), CAPS["10.3.0"])
    assert plan.dla_core == 1 and plan.gpu_fallback and plan.profiles[0].is_static  # batch defaults to 1 with DLA
    assert plan.default_target("orin") == "orin-trt10.3.0-fp16-dla1"
    with pytest.raises(ConfigError, match="FP16 and INT8 only"):
        make_plan(bundles["static"], PlanOptions(precision="fp32", dla_core=0), CAPS["10.3.0"])
    with pytest.raises(ConfigError, match="no dynamic dimensions"):
        make_plan(bundles["static"], PlanOptions(precision="fp16", dla_core=0, batch=("1:4:8",)), CAPS["10.3.0"])
    with pytest.raises(ConfigError, match="at most 4096"):
        make_plan(bundles["static"], PlanOptions(precision="fp16", dla_core=0, batch=("5000",)), CAPS["10.3.0"])
    with pytest.raises(ConfigError, match="GPU-only"):
        make_plan(bundles["static"], PlanOptions(precision="fp16", dla_core=0, hardware_compatibility="ampere+"), CAPS["10.3.0"])
    with pytest.raises(UserError, match="only applies with --dla-core"):
        make_plan(bundles["static"], PlanOptions(gpu_fallback=False), CAPS["10.3.0"])
