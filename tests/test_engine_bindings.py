"""vitdeploy's TensorRT code against the REAL Python bindings of TensorRT 8.6.1, 10.3, 10.13, 10.16 and 11.4.

No TensorRT runtime or GPU here: each version's bindings wheel is installed alone
(scripts/install_trt_bindings.sh, run by `make setup` into .venv/trt-bindings) and imported in its
own subprocess over gcc-built stand-ins of libnvinfer/libnvinfer_plugin/libnvonnxparser
(tests/trt_stubs). ``import tensorrt`` is then the real module of that version, and
tests/trt_stubs/probe.py checks, in one subprocess per version:

- the version table (``capabilities_for``) equals what the live module has (``capabilities_of``);
- every TensorRT name each build plan applies exists, properties are properties and enum members
  belong to their enum;
- the legacy path: IInt8EntropyCalibrator2 subclass feeds batches and round-trips its cache (< 11),
  refused with a clear message on 11;
- no usable GPU (the stand-ins return NULL like libnvinfer without CUDA): `build-engine` exits 1
  with one line, and the TensorRT runner refuses a mismatched engine.json before deserialising.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from engine_fixtures import write_bundle
from trt_stubs import BINDING_VERSIONS, PYTHON, installed_bindings, probe_env

REPO = Path(__file__).resolve().parent.parent
PROBE = Path(__file__).resolve().parent / "trt_stubs" / "probe.py"


@pytest.fixture(scope="session")
def probe_bundles(tmp_path_factory):
    root = tmp_path_factory.mktemp("bindings")
    return write_bundle(root / "static", precisions=("fp32", "fp16", "int8")), write_bundle(root / "dynamic", dynamic_hw=True, precisions=("fp32", "fp16", "int8"))


_results: dict[str, dict] = {}


@pytest.fixture(params=BINDING_VERSIONS)
def probed(request, stub_cache, probe_bundles, tmp_path_factory) -> dict:
    version = request.param
    if version not in _results:
        bindings, stubs = installed_bindings(REPO, version, stub_cache)
        work = tmp_path_factory.mktemp(f"probe-{version}")
        static, dynamic = probe_bundles
        proc = subprocess.run(
            [PYTHON, str(PROBE), str(static.root), str(dynamic.root), str(work)],
            env=probe_env(bindings, stubs, REPO), capture_output=True, text=True, timeout=300,
        )
        assert proc.returncode == 0, f"probe for TensorRT {version} failed:\n{proc.stderr[-4000:]}"
        _results[version] = json.loads(proc.stdout.strip().splitlines()[-1])
    return _results[version]


def _major(result: dict) -> int:
    return int(result["module_version"].split(".")[0])


def test_real_module_is_loaded_and_version_table_matches(probed):
    assert probed["module_version"] in BINDING_VERSIONS and probed["installed_version"] == probed["module_version"]
    assert probed["caps_live"] == probed["caps_number"]


def test_version_shims_choose_the_right_path(probed):
    major, api = _major(probed), probed["feature_api"]
    # FP16/INT8 builder flags and the entropy calibrator exist up to 10.x and not in 11
    assert api["legacy_precision"] is api["int8_calibrator"] is (major < 11)
    assert api["explicit_batch_flag"] is (major < 11)
    assert api["strongly_typed"] is (major >= 10)
    assert api["supports_model_v2"] is (major >= 10) and api["supports_model_v1"] is (major < 11)
    plans = probed["plans"]
    expected_path = "typed-graph+flags" if major < 10 else "strongly-typed"
    assert plans["fp16"]["path"] == expected_path and plans["fp16"]["source"] == "model.fp16.onnx"
    assert plans["fp16"]["network_flags"] == {8: ["NetworkDefinitionCreationFlag.EXPLICIT_BATCH"], 10: ["NetworkDefinitionCreationFlag.STRONGLY_TYPED"], 11: []}[major]
    assert plans["fp16"]["support_query"] == ("supports_model" if major < 10 else "supports_model_v2")
    if major < 11:
        assert plans["legacy-int8"]["path"] == "legacy-flags" and plans["legacy-int8"]["calibrator"]
        assert "config.set_flag(trt.BuilderFlag.INT8)" in plans["legacy-int8"]["config"]
    else:
        assert "needs TensorRT < 11" in plans["legacy-fp16"]["refused"] and "needs TensorRT < 11" in plans["legacy-int8"]["refused"]
    version = tuple(int(v) for v in probed["module_version"].split(".")[:2])
    assert ("refused" in plans["same-cc"]) is (version < (10, 9))  # SAME_COMPUTE_CAPABILITY came in 10.9


def test_every_tensorrt_name_the_plans_apply_exists(probed):
    applied = {label: p for label, p in probed["plans"].items() if "refused" not in p}
    assert len(applied) >= 8
    for label, plan in applied.items():
        assert plan["missing"] == [] and plan["wrong_kind"] == [], label
        assert plan["api_checked"] >= 20
    dla = applied["dla"]["config"]
    assert "config.default_device_type = trt.DeviceType.DLA" in dla and "config.set_flag(trt.BuilderFlag.GPU_FALLBACK)" in dla
    assert "config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, 2147483648)" in applied["knobs"]["config"]
    assert probed["runtime_api_missing"] == [] and probed["used_api_missing"] == []


def test_legacy_calibrator_on_the_real_base_class(probed):
    cal = probed["calibrator"]
    if _major(probed) >= 11:
        assert "no IInt8EntropyCalibrator2" in cal["refused"]
    else:
        assert cal == {"is_subclass": True, "batch_size": 1, "batch_shape": [2, 32, 32, 3], "fed_equal": [True, True, True], "cache_roundtrip": True}


def test_no_usable_gpu_is_one_clear_line(probed):
    version = probed["module_version"]
    assert probed["no_gpu_builder"].startswith(f"TensorRT {version} found no usable NVIDIA GPU")
    build = probed["cli_build"]
    assert build["exit_code"] == 1 and build["output"].count("\n") == 1
    assert "engines are built on the target device" in build["output"] and "Traceback" not in build["output"]
    runner = probed["runner"]
    assert runner["other-version"].startswith("DeviceError") and "rebuild on this device" in runner["other-version"]
    assert "built with TensorRT 7.1.3" in runner["other-version"]
    assert runner["this-version"] == f"DeviceError: TensorRT {version} found no usable NVIDIA GPU; TensorRT engines run on the device they were built for"


def test_dry_run_uses_the_installed_version(probed):
    major = _major(probed)
    dry = probed["cli_dry_run"]
    assert dry["exit_code"] == 0 and f"TensorRT {probed['module_version']}" in dry["output"]
    assert ("--stronglyTyped" in dry["output"]) is (major == 10)
    assert ("--fp16" in dry["output"]) is (major < 10)
    assert probed["cli_legacy"]["exit_code"] == (1 if major >= 11 else 0)


def test_engines_that_travel_use_only_real_names(probed):
    """--strip-weights (STRIP_PLAN + REFIT_IDENTICAL) and the refit path exist from 10.0; 8.6 refuses them
    in one line; a version-compatible plan's lean-runtime switch is a real property from 8.6."""
    major = _major(probed)
    plans = probed["plans"]
    if major < 10:
        assert "needs TensorRT >= 10.0" in plans["strip-weights"]["refused"]
        assert set(probed["refit_api_missing"]) == {"OnnxParserRefitter", "OnnxParserRefitter.refit_from_file",
                                                    "OnnxParserRefitter.num_errors", "OnnxParserRefitter.get_error"}
    else:
        for label in ("strip-weights", "strip-weights-int8"):
            config = plans[label]["config"]
            assert "config.set_flag(trt.BuilderFlag.STRIP_PLAN)" in config and "config.set_flag(trt.BuilderFlag.REFIT_IDENTICAL)" in config
            assert plans[label]["missing"] == [] and plans[label]["wrong_kind"] == []
        assert "config.set_flag(trt.BuilderFlag.VERSION_COMPATIBLE)" in plans["strip-weights"]["config"]
        assert probed["refit_api_missing"] == []
    assert probed["version_compat_runtime_api_missing"] == [] and probed["engine_host_code_is_property"] is True
    # --profile-layers: detailed profiling verbosity is a real enum value and a property of the config in every version
    layers = plans["profile-layers"]
    assert "config.profiling_verbosity = trt.ProfilingVerbosity.DETAILED" in layers["config"]
    assert layers["missing"] == [] and layers["wrong_kind"] == []
