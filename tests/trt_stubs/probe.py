"""Run inside a subprocess that has ONE real TensorRT bindings version importable over the stand-in
libraries (see __init__.py). Checks vitdeploy's engine code against that version's real module and
prints one JSON object; tests/test_engine_bindings.py asserts on it.

    python probe.py STATIC_BUNDLE DYNAMIC_BUNDLE WORKDIR
"""

from __future__ import annotations

import ctypes
import json
import sys
import traceback
from pathlib import Path

# What the `tensorrt` package of the pip distribution does (`from tensorrt_bindings import *`):
# make the bindings importable as `tensorrt`, the name vitdeploy imports.
import tensorrt_bindings  # noqa: E402

sys.modules["tensorrt"] = tensorrt_bindings

import numpy as np  # noqa: E402
import tensorrt as trt  # noqa: E402
from click.testing import CliRunner  # noqa: E402

from vitdeploy.bundle import Bundle  # noqa: E402
from vitdeploy.cli import main  # noqa: E402
from vitdeploy.engine import builder, fingerprint, portable, versions  # noqa: E402
from vitdeploy.engine.plan import PlanOptions, make_plan  # noqa: E402
from vitdeploy.engine.service import recipe_as_data  # noqa: E402
from vitdeploy.errors import VitDeployError  # noqa: E402

static_bundle, dynamic_bundle, work = (Path(a) for a in sys.argv[1:4])
caps = versions.capabilities_of(trt)
out: dict = {
    "module_version": trt.__version__,
    "installed_version": str(versions.installed_version()),
    "caps_live": caps.to_dict(),
    "caps_number": versions.capabilities_for(trt.__version__).to_dict(),
    "feature_api": {name: versions.has(trt, path) for name, path in versions.feature_api_names().items()},
}

# -- every plan vitdeploy can make for this version: its recipe's names exist, with the right kind
MATRIX = {
    "fp32": (static_bundle, PlanOptions(precision="fp32")),
    "fp16": (static_bundle, PlanOptions(precision="fp16")),
    "int8": (static_bundle, PlanOptions(precision="int8")),
    "best-dynamic-2-profiles": (dynamic_bundle, PlanOptions(batch=("1:8:32", "1"), resolution=("32:48:64", "32"))),
    "knobs": (static_bundle, PlanOptions(precision="fp16", workspace="2G", optimization_level=4, timing_cache=str(work / "t.cache"), version_compatible=True)),
    "ampere+": (static_bundle, PlanOptions(precision="fp16", hardware_compatibility="ampere+")),
    "same-cc": (static_bundle, PlanOptions(precision="fp16", hardware_compatibility="same-cc")),
    "dla": (static_bundle, PlanOptions(precision="int8", dla_core=0)),
    "dla-no-fallback": (static_bundle, PlanOptions(precision="fp16", dla_core=1, gpu_fallback=False)),
    "legacy-fp16": (static_bundle, PlanOptions(precision="fp16", legacy_precision=True)),
    "legacy-int8": (static_bundle, PlanOptions(precision="int8", legacy_precision=True, calib_cache=str(work / "calib.cache"))),
    "strip-weights": (static_bundle, PlanOptions(precision="fp16", strip_weights=True, version_compatible=True)),
    "strip-weights-int8": (static_bundle, PlanOptions(precision="int8", strip_weights=True, hardware_compatibility="ampere+")),
    "profile-layers": (static_bundle, PlanOptions(precision="fp16", profile_layers=True)),
}
plans: dict = {}
for label, (bundle_dir, options) in MATRIX.items():
    try:
        plan = portable.apply(make_plan(Bundle.open(bundle_dir), options, caps), options, caps)
        rec = builder.recipe(plan, caps)
    except VitDeployError as exc:
        plans[label] = {"refused": str(exc)}
        continue
    missing = [name for name in rec.api_names() if not versions.has(trt, name)]
    wrong_kind = []
    for step in rec.config_steps:
        member = getattr(trt.IBuilderConfig, step.member, None)
        if member is None:
            continue  # already in `missing`
        if step.assign != isinstance(member, property):
            wrong_kind.append(f"IBuilderConfig.{step.member} is {'not ' if step.assign else ''}a property")
        for arg in step.args:
            if isinstance(arg, builder.Ref) and versions.has(trt, arg.path):
                enum_type = getattr(trt, arg.path.split(".")[0])
                if not isinstance(versions.resolve(trt, arg.path), enum_type):
                    wrong_kind.append(f"{arg.path} is not a {enum_type.__name__}")
    plans[label] = {
        "path": plan.precision_path,
        "source": Path(plan.source).name,
        "builder_flags": list(plan.builder_flags),
        "network_flags": [r.path for r in rec.network_flags],
        "network_flags_value": builder.network_flags(trt, rec.network_flags) if not missing else None,
        "config": recipe_as_data(rec)["config"],
        "support_query": rec.support_query,
        "calibrator": rec.calibrator,
        "api_checked": len(rec.api_names()),
        "missing": missing,
        "wrong_kind": wrong_kind,
    }
out["plans"] = plans
out["runtime_api_missing"] = [n for n in builder.RUNTIME_API if not versions.has(trt, n)]
out["used_api_missing"] = [n for n in builder.USED_API if not versions.has(trt, n)]
# engines that travel: the refit path (10.0+) and the lean-runtime switch of version-compatible plans (8.6+)
out["refit_api_missing"] = [n for n in portable.REFIT_API if not versions.has(trt, n)]
out["version_compat_runtime_api_missing"] = [n for n in builder.RUNTIME_VERSION_COMPAT_API if not versions.has(trt, n)]
out["engine_host_code_is_property"] = isinstance(getattr(trt.Runtime, "engine_host_code_allowed", None), property)


# -- the legacy calibrator: a real subclass of this version's IInt8EntropyCalibrator2
class HostMemory:
    """Host buffers standing in for device memory, so the batch flow runs without CUDA."""

    def __init__(self) -> None:
        self.buffers: dict[int, ctypes.Array] = {}

    def alloc(self, nbytes: int) -> int:
        buf = ctypes.create_string_buffer(nbytes)
        self.buffers[ctypes.addressof(buf)] = buf
        return ctypes.addressof(buf)

    def upload(self, ptr: int, array: np.ndarray) -> None:
        ctypes.memmove(ptr, np.ascontiguousarray(array).ctypes.data, array.nbytes)

    def free(self, ptr: int) -> None:
        self.buffers.pop(ptr, None)


rng = np.random.default_rng(0)
batches = [rng.integers(0, 256, (2, 32, 32, 3), dtype=np.uint8) for _ in range(3)]
cache = work / "legacy.calib"
try:
    memory = HostMemory()
    cal = builder.make_entropy_calibrator(trt, iter(batches), cache, memory=memory)
    fed = []
    while True:
        ptrs = cal.get_batch(["images"])
        if ptrs is None:
            break
        fed.append(ctypes.string_at(ptrs[0], batches[0].nbytes) == batches[len(fed)].tobytes())
    cal.write_calibration_cache(b"TRT-calibration-cache")
    out["calibrator"] = {
        "is_subclass": isinstance(cal, trt.IInt8EntropyCalibrator2),
        "batch_size": cal.get_batch_size(),
        "batch_shape": list(cal.batch_shape),
        "fed_equal": fed,
        "cache_roundtrip": cal.read_calibration_cache() == b"TRT-calibration-cache",
    }
except VitDeployError as exc:
    out["calibrator"] = {"refused": str(exc)}

# -- no usable GPU: the builder factory returns NULL, as on a GPU-less host with real TensorRT
try:
    builder.create_builder(trt, trt.Logger(trt.Logger.WARNING))
    out["no_gpu_builder"] = "builder created"
except VitDeployError as exc:
    out["no_gpu_builder"] = str(exc)
runner = CliRunner()
res = runner.invoke(main, ["build-engine", str(static_bundle), "--precision", "fp16"])
out["cli_build"] = {"exit_code": res.exit_code, "output": res.output, "exception": repr(res.exception) if res.exit_code not in (0, 1) else None}
res = runner.invoke(main, ["build-engine", str(static_bundle), "--precision", "fp16", "--dry-run", "--print-trtexec"])
out["cli_dry_run"] = {"exit_code": res.exit_code, "output": res.output}
res = runner.invoke(main, ["build-engine", str(static_bundle), "--precision", "fp16", "--legacy-precision", "--dry-run"])
out["cli_legacy"] = {"exit_code": res.exit_code, "output": res.output}

# -- the runtime: fingerprint first; then the no-GPU message of trt.Runtime
from vitdeploy.engine.fingerprint import DeviceInfo, make_fingerprint  # noqa: E402
from vitdeploy.fileio import atomic_write_bytes, atomic_write_json, sha256_bytes  # noqa: E402
from vitdeploy.runtime.tensorrt import TensorRTRunner  # noqa: E402

plan = make_plan(Bundle.open(static_bundle), PlanOptions(precision="fp16"), caps)
device = DeviceInfo("NVIDIA Stand-in GPU", "8.7")
blob = b"not a real plan"
results = {}
for label, version in (("other-version", "7.1.3"), ("this-version", trt.__version__)):
    engine_dir = work / f"engine-{label}"
    atomic_write_bytes(engine_dir / fingerprint.PLAN_FILE, blob)
    atomic_write_json(engine_dir / fingerprint.FINGERPRINT_FILE, make_fingerprint(plan, device, version, sha256_bytes(blob), len(blob), 0.0))
    try:
        TensorRTRunner(engine_dir)
        results[label] = "loaded"
    except VitDeployError as exc:
        results[label] = f"{type(exc).__name__}: {exc}"
    except Exception:  # noqa: BLE001 - report, the test fails on it
        results[label] = "unexpected: " + traceback.format_exc(limit=3)
out["runner"] = results

print(json.dumps(out))
