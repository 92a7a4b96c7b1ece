"""engine.json fingerprints, Jetson release parsing and keyed timing caches (CPU only)."""

from __future__ import annotations

import platform

import pytest
from engine_fixtures import write_bundle

from vitdeploy.engine import fingerprint as fp
from vitdeploy.engine import timing_cache, versions
from vitdeploy.engine.plan import PlanOptions, make_plan
from vitdeploy.errors import DeviceError, UserError
from vitdeploy.fileio import atomic_write_bytes, atomic_write_json, sha256_bytes

ORIN = fp.DeviceInfo("Orin", "8.7", arch="aarch64", l4t="36.4.3", jetpack="6.2")
H200 = fp.DeviceInfo("NVIDIA H200", "9.0")
A100 = fp.DeviceInfo("NVIDIA A100-SXM4-80GB", "8.0")


@pytest.fixture(scope="module")
def plan(tmp_path_factory):
    bundle = write_bundle(tmp_path_factory.mktemp("fp") / "b", precisions=("fp32", "fp16"))
    return make_plan(bundle, PlanOptions(precision="fp16"), versions.capabilities_for("10.3.0"))


def test_tegra_release_and_jetpack():
    text = "# R36 (release), REVISION: 4.3, GCID: 38968081, BOARD: generic, EABI: aarch64, DATE: Wed Jan  8 01:49:37 UTC 2025\n"
    assert fp.parse_tegra_release(text) == {"l4t": "36.4.3", "jetpack": "6.2"}
    assert fp.parse_tegra_release("# R35 (release), REVISION: 4.1, GCID: 1") == {"l4t": "35.4.1", "jetpack": "5.1.2"}
    assert fp.jetpack_for_l4t("36.4.0") == "6.1" and fp.jetpack_for_l4t("99.1") is None
    assert fp.parse_tegra_release("not a tegra file") is None
    assert H200.slug == "nvidia-h200"


def _fingerprint(plan, device, version="10.3.0", **changes):
    record = fp.make_fingerprint(plan, device, version, "0" * 64, 10, 1.5)
    record.update(changes)
    return record


def test_fingerprint_records_what_the_engine_was_built_for(plan):
    record = _fingerprint(plan, ORIN)
    assert record["tensorrt"] == "10.3.0" and record["device"]["jetpack"] == "6.2"
    assert record["precision_path"] == "strongly-typed" and record["source_sha256"] == plan.source_sha256
    assert record["profiles"][0]["shapes"]["max"] == [32, 32, 32, 3]


def test_mismatches_name_what_differs(plan):
    here = platform.machine()
    same = fp.DeviceInfo("NVIDIA H200", "9.0", arch=here)
    record = _fingerprint(plan, same)
    assert fp.mismatches(record, same, "10.3.0") == []
    assert fp.mismatches(record, same, "10.3.0.26") == []  # the build number does not change the engine format
    assert fp.mismatches(record, same, "10.4.0") == ["built with TensorRT 10.3.0, this is TensorRT 10.4.0"]
    assert "compute capability 9.0), this is NVIDIA A100" in fp.mismatches(record, fp.DeviceInfo("NVIDIA A100", "8.0", arch=here), "10.3.0")[0]
    # hardware compatibility: any Ampere or newer GPU; version compatibility: a later 10.x
    compat = _fingerprint(plan, same, hardware_compatibility="ampere+", version_compatible=True)
    assert fp.mismatches(compat, fp.DeviceInfo("NVIDIA A100", "8.0", arch=here), "10.8.0") == []
    assert fp.mismatches(compat, fp.DeviceInfo("Tesla T4", "7.5", arch=here), "10.3.0") == ["hardware-compatible (ampere+) engine, this GPU is compute capability 7.5"]
    assert "needs 10.x >= 10.3.0" in fp.mismatches(compat, same, "11.0.0")[0]
    other_arch = _fingerprint(plan, fp.DeviceInfo("Orin", "8.7", arch="aarch64" if here != "aarch64" else "x86_64"))
    assert "built on" in fp.mismatches(other_arch, None, None)[0]
    assert fp.mismatches({"format": "old"}, None, None) == ["engine.json has format 'old', expected 'vitdeploy-engine/1'"]


def test_require_match_says_rebuild_and_plan_file_is_verified(plan, tmp_path):
    record = _fingerprint(plan, H200, version="10.3.0")
    with pytest.raises(DeviceError, match="rebuild on this device"):
        fp.require_match(tmp_path, record, None, "11.4.0")
    blob = b"serialized engine"
    atomic_write_bytes(tmp_path / fp.PLAN_FILE, blob)
    atomic_write_json(tmp_path / fp.FINGERPRINT_FILE, {**record, "plan_sha256": sha256_bytes(blob)})
    assert fp.verify_plan_file(tmp_path, fp.read_fingerprint(tmp_path)) == tmp_path / fp.PLAN_FILE
    atomic_write_bytes(tmp_path / fp.PLAN_FILE, b"tampered")
    with pytest.raises(UserError, match="does not match its engine.json"):
        fp.verify_plan_file(tmp_path, fp.read_fingerprint(tmp_path))
    with pytest.raises(UserError, match="not a vitdeploy engine"):
        fp.read_fingerprint(tmp_path / "nothing")


def test_timing_cache_is_keyed_and_refused_elsewhere(tmp_path):
    cache = tmp_path / "trt.cache"
    assert timing_cache.load(cache, H200, "10.3.0") == b""  # new cache
    digest = timing_cache.save(cache, b"timings", H200, "10.3.0")
    assert digest == sha256_bytes(b"timings") and timing_cache.key_path(cache).is_file()
    assert timing_cache.load(cache, H200, "10.3.0") == b"timings"
    with pytest.raises(UserError, match="made with GPU 'NVIDIA H200', this build uses 'NVIDIA A100-SXM4-80GB'"):
        timing_cache.load(cache, A100, "10.3.0")
    with pytest.raises(UserError, match="made with TensorRT '10.3.0', this build uses '10.4.0'"):
        timing_cache.load(cache, H200, "10.4.0")
    atomic_write_bytes(cache, b"edited")
    with pytest.raises(UserError, match="changed since its key was written"):
        timing_cache.load(cache, H200, "10.3.0")
    stray = tmp_path / "stray.cache"
    stray.write_bytes(b"from trtexec")
    with pytest.raises(UserError, match="has no key file"):
        timing_cache.load(stray, H200, "10.3.0")
