"""Engines that travel (CPU): --strip-weights, --version-compatible, --hardware-compatible as plans, trtexec
lines and engine.json records, and the refit path around TensorRT with stand-in objects.

The TensorRT names these use are checked against the real bindings in test_engine_bindings.py; a real
refit needs a GPU (test_engine_gpu.py::test_weight_stripped_engine_is_small_and_refits_to_the_same_outputs).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from engine_fixtures import write_bundle

from vitdeploy.engine import fingerprint, portable, versions
from vitdeploy.engine.builder import recipe
from vitdeploy.engine.plan import PlanOptions, make_plan
from vitdeploy.engine.service import recipe_as_data
from vitdeploy.engine.trtexec import trtexec_command
from vitdeploy.errors import ConfigError, DeviceError, UserError
from vitdeploy.fileio import sha256_file


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    return write_bundle(tmp_path_factory.mktemp("portable") / "b", precisions=("fp32", "fp16"))


def _plan(bundle, version, **options):
    caps = versions.capabilities_for(version)
    opts = PlanOptions(precision="fp16", **options)
    return portable.apply(make_plan(bundle, opts, caps), opts, caps), caps


def test_strip_weights_plan_recipe_and_trtexec(bundle):
    plan, caps = _plan(bundle, "10.3", strip_weights=True)
    assert plan.strip_weights and any("REFIT_IDENTICAL" in n for n in plan.notes)
    config = recipe_as_data(recipe(plan, caps))["config"]
    assert config[-2:] == ["config.set_flag(trt.BuilderFlag.STRIP_PLAN)", "config.set_flag(trt.BuilderFlag.REFIT_IDENTICAL)"]
    cmd = trtexec_command(plan, caps, "e/model.plan")
    assert "--stripWeights" in cmd.argv and "--refit" not in cmd.argv  # trtexec refits with identical weights by default
    assert any("no --refitFromOnnx (10.14+)" in n for n in cmd.notes)  # 10.3's trtexec cannot refit from ONNX
    plan16, caps16 = _plan(bundle, "10.16", strip_weights=True)
    assert any("--refitFromOnnx=" in n and n.endswith("model.fp16.onnx`") for n in trtexec_command(plan16, caps16, "e/model.plan").notes)


@pytest.mark.parametrize("version", ["8.5", "8.6"])
def test_strip_weights_refused_before_10(bundle, version):
    with pytest.raises(ConfigError, match="needs TensorRT >= 10.0"):
        _plan(bundle, version, strip_weights=True)


def test_strip_weights_refused_with_dla(bundle):
    with pytest.raises(ConfigError, match="DLA loadables are not refitted"):
        _plan(bundle, "10.3", strip_weights=True, dla_core=0, batch=("1",))


def test_compat_plans_note_what_they_imply(bundle):
    plan, caps = _plan(bundle, "11.4", version_compatible=True, hardware_compatibility="ampere+")
    notes = " ".join(plan.notes)
    assert "later TensorRT 11.x" in notes and "lean runtime" in notes and "not portable across platforms" in notes
    assert "--versionCompatible" in trtexec_command(plan, caps).argv


def test_fingerprint_records_the_refit_graph(bundle):
    plan, _ = _plan(bundle, "10.16", strip_weights=True)
    record = fingerprint.make_fingerprint(plan, fingerprint.DeviceInfo("Orin", "8.7"), "10.16.1", "0" * 64, 1, 0.0)
    assert record["strip_weights"] is True
    assert record["refit"] == {"file": "model.fp16.onnx", "sha256": sha256_file(bundle.root / "model.fp16.onnx"), "mode": "identical",
                               "api": "OnnxParserRefitter.refit_from_file + Refitter.refit_cuda_engine"}
    full, _ = _plan(bundle, "10.16")
    assert "refit" not in fingerprint.make_fingerprint(full, fingerprint.DeviceInfo("Orin", "8.7"), "10.16.1", "0" * 64, 1, 0.0)


def test_refit_graph_is_found_and_checked(bundle, tmp_path):
    engine_dir = bundle.root / "engines" / "stripped"
    record = {"strip_weights": True, "refit": {"file": "model.fp16.onnx", "sha256": sha256_file(bundle.root / "model.fp16.onnx")}}
    assert portable.refit_graph(engine_dir, record) == bundle.root / "model.fp16.onnx"
    with pytest.raises(UserError, match="sha256 differs"):
        portable.refit_graph(engine_dir, {"refit": {"file": "model.fp16.onnx", "sha256": "f" * 64}})
    with pytest.raises(UserError, match="are not beside it"):
        portable.refit_graph(tmp_path / "engines" / "x", record)
    with pytest.raises(UserError, match="names no refit graph"):
        portable.refit_graph(engine_dir, {"strip_weights": True})


class _Refitter:
    def __init__(self, ok, missing=()):
        self.ok, self.missing, self.calls = ok, list(missing), []

    def refit_cuda_engine(self):
        self.calls.append("refit_cuda_engine")
        return self.ok

    def get_missing_weights(self):
        return self.missing


class _ParserRefitter:
    def __init__(self, refitter, ok, errors=()):
        self.refitter, self.ok, self.errors = refitter, ok, list(errors)
        self.num_errors = len(self.errors)

    def refit_from_file(self, path):
        self.refitter.calls.append(("refit_from_file", path))
        return self.ok

    def get_error(self, i):
        return SimpleNamespace(desc=lambda: self.errors[i])


def _fake_trt(refit_ok=True, parse_ok=True, errors=(), missing=()):
    made = {}

    def refitter(engine, logger):
        made["refitter"] = _Refitter(refit_ok, missing)
        return made["refitter"]

    def parser_refitter(r, logger):
        return _ParserRefitter(r, parse_ok, errors)

    return SimpleNamespace(Refitter=refitter, OnnxParserRefitter=parser_refitter), made


def test_refit_engine_calls_in_order_and_fails_in_one_line(tmp_path):
    graph = tmp_path / "model.onnx"
    trt, made = _fake_trt()
    portable.refit_engine(trt, object(), graph, None)
    assert made["refitter"].calls == [("refit_from_file", str(graph)), "refit_cuda_engine"]
    trt, _ = _fake_trt(parse_ok=False, errors=["weights file truncated"])
    with pytest.raises(DeviceError, match="could not read the weights .*weights file truncated"):
        portable.refit_engine(trt, object(), graph, None)
    trt, _ = _fake_trt(refit_ok=False, missing=["blocks.0.attn.qkv.weight"])
    with pytest.raises(DeviceError, match="missing weights: blocks.0.attn.qkv.weight"):
        portable.refit_engine(trt, object(), graph, None)
