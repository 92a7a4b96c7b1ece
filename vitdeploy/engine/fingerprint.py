"""engine.json: what an engine was built for, checked before anyone deserialises it.

A TensorRT plan runs only with the TensorRT version that built it (unless built version-compatible)
and on GPUs of the compute capability it was built for (unless hardware-compatible). Deserialising a
mismatched plan fails deep inside TensorRT with a message about serialization tags; vitdeploy
compares this fingerprint first and says "rebuild on this device" instead.

The device is described by ``DeviceInfo``: GPU name and compute capability (cuda-python), CPU
architecture, and on Jetson the L4T release from /etc/nv_tegra_release with the JetPack it belongs to.
"""

from __future__ import annotations

import platform
import re
import socket
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..errors import DeviceError, UserError
from .versions import TrtVersion

FORMAT = "vitdeploy-engine/1"
PLAN_FILE = "model.plan"
FINGERPRINT_FILE = "engine.json"
TEGRA_RELEASE = Path("/etc/nv_tegra_release")

@dataclass(frozen=True)
class DeviceInfo:
    gpu_name: str
    compute_capability: str  # "8.7", "9.0"
    arch: str = platform.machine()
    l4t: str | None = None
    jetpack: str | None = None
    cuda_runtime: str | None = None
    cuda_driver: str | None = None
    model: str | None = None  # /proc/device-tree/model on a Jetson ("NVIDIA Jetson AGX Orin Developer Kit")

    @property
    def slug(self) -> str:
        """A folder-safe GPU name: 'NVIDIA H200' -> 'nvidia-h200'; Orin -> 'orin-...'."""
        return re.sub(r"[^a-z0-9]+", "-", self.gpu_name.lower()).strip("-") or "gpu"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def parse_tegra_release(text: str) -> dict[str, str] | None:
    """'# R36 (release), REVISION: 4.3, GCID: ..., BOARD: generic, EABI: aarch64' -> l4t 36.4.3."""
    match = re.search(r"#\s*R(\d+)\s*\(release\),\s*REVISION:\s*([\d.]+)", text)
    if not match:
        return None
    l4t = f"{match.group(1)}.{match.group(2)}"
    return {"l4t": l4t, "jetpack": jetpack_for_l4t(l4t)}


def jetpack_for_l4t(l4t: str) -> str | None:
    """The JetPack of an exact Jetson Linux release, from the matrix in ``jetpack`` (exact releases only:
    L4T 35.1 was JetPack 5.0.2 and 35.2.1 was 5.1, so a prefix match would mislabel boards)."""
    from .jetpack import jetpack_for_l4t as lookup

    return lookup(l4t)


def read_tegra_release(path: Path = TEGRA_RELEASE) -> dict[str, str] | None:
    try:
        return parse_tegra_release(path.read_text(errors="replace"))
    except OSError:
        return None  # not a Jetson


def cudart() -> Any:
    """cuda-python's runtime module (``cuda.bindings.runtime``; ``cuda.cudart`` on older releases)."""
    from ..lazy import available, require

    if available("cuda.bindings.runtime"):
        return require("cuda.bindings.runtime")
    return require("cuda.cudart", "querying the GPU")


def cuda_check(result: Any, what: str) -> Any:
    """cuda-python returns (error, *values): raise DeviceError on failure, return the values."""
    rt = cudart()
    err, *values = result if isinstance(result, tuple) else (result,)
    if int(err) != 0:
        _, msg = rt.cudaGetErrorString(err)
        message = msg.decode() if isinstance(msg, bytes) else str(msg)
        raise DeviceError(f"{what} failed: {message}")
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)


def query_device(index: int = 0) -> DeviceInfo:
    """Describe GPU ``index`` of this machine, or raise DeviceError when there is no usable GPU."""
    rt = cudart()
    err, count = rt.cudaGetDeviceCount()
    if int(err) != 0 or not count:
        _, msg = rt.cudaGetErrorString(err)
        reason = msg.decode() if isinstance(msg, bytes) else str(msg)
        raise DeviceError(f"no usable NVIDIA GPU ({reason}); engines are built and run on the target device")
    if index >= count:
        raise DeviceError(f"GPU {index} requested but this machine has {count}")
    prop = cuda_check(rt.cudaGetDeviceProperties(index), "cudaGetDeviceProperties")
    name = prop.name.decode(errors="replace") if isinstance(prop.name, bytes) else str(prop.name)
    runtime_v = cuda_check(rt.cudaRuntimeGetVersion(), "cudaRuntimeGetVersion")
    driver_v = cuda_check(rt.cudaDriverGetVersion(), "cudaDriverGetVersion")
    tegra = read_tegra_release() or {}
    model = None
    if tegra:
        try:
            model = Path("/proc/device-tree/model").read_text(errors="replace").strip("\x00 \n") or None
        except OSError:
            model = None
    return DeviceInfo(
        gpu_name=name.strip("\x00 ").strip(),
        compute_capability=f"{prop.major}.{prop.minor}",
        l4t=tegra.get("l4t"),
        jetpack=tegra.get("jetpack"),
        cuda_runtime=_cuda_version(runtime_v),
        cuda_driver=_cuda_version(driver_v),
        model=model,
    )


def _cuda_version(number: int) -> str:
    return f"{number // 1000}.{(number % 1000) // 10}"


# -- the fingerprint ---------------------------------------------------------------------------
def make_fingerprint(
    plan: Any,
    device: DeviceInfo,
    trt_version: str,
    plan_sha256: str,
    plan_bytes: int,
    build_seconds: float,
    timing_cache_sha256: str | None = None,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    data = {
        "format": FORMAT,
        "tensorrt": str(trt_version),
        "device": device.to_dict(),
        "precision": plan.precision,
        "precision_path": plan.precision_path,
        "builder_flags": list(plan.builder_flags),
        "profiles": plan.to_dict()["profiles"],
        "input": {"name": plan.input_name, "dtype": plan.input_dtype, "layout": plan.input_layout},
        "hardware_compatibility": plan.hardware_compatibility,
        "version_compatible": plan.version_compatible,
        "dla_core": plan.dla_core,
        "strip_weights": bool(getattr(plan, "strip_weights", False)),
        "gpu_fallback": plan.gpu_fallback if plan.dla_core is not None else None,
        "source_sha256": plan.source_sha256,
        "source_precision": plan.source_precision,
        "timing_cache_sha256": timing_cache_sha256,
        "plan_sha256": plan_sha256,
        "plan_bytes": plan_bytes,
        "build_seconds": round(float(build_seconds), 3),
        "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "built_on": socket.gethostname(),  # the machine that built it (the device, also when driven with --on HOST)
        "plan": plan.to_dict(),
    }
    if data["strip_weights"]:
        from .portable import refit_source

        data["refit"] = refit_source(plan)
    if getattr(plan, "device_target", None):
        data["device_target"] = plan.device_target
    extras = getattr(plan, "extra_inputs", ())
    if extras:  # variable-size engines: every input, in binding order (images first, then valid_hw)
        data["inputs"] = [data["input"]] + [{"name": e.name, "dtype": e.dtype, "shape": ["batch"] + list(e.dims)} for e in extras]
    if extra:
        data.update(extra)
    return data


def mismatches(fingerprint: dict[str, Any], device: DeviceInfo | None, trt_version: str | None) -> list[str]:
    """Why an engine with ``fingerprint`` cannot run here (empty when it can).

    ``device=None`` checks only what needs no GPU (TensorRT version, CPU architecture).
    """
    problems: list[str] = []
    if fingerprint.get("format") != FORMAT:
        return [f"engine.json has format {fingerprint.get('format')!r}, expected {FORMAT!r}"]
    built = TrtVersion.parse(fingerprint["tensorrt"])
    if trt_version is not None:
        here = TrtVersion.parse(trt_version)
        if fingerprint.get("version_compatible"):
            # Version-compatible plans run on the same or a later TensorRT of the same major.
            if here.major != built.major or here < built:
                problems.append(f"built version-compatible with TensorRT {built}, this is TensorRT {here} (needs {built.major}.x >= {built})")
        elif (here.major, here.minor, here.patch) != (built.major, built.minor, built.patch):
            problems.append(f"built with TensorRT {built}, this is TensorRT {here}")
    dev = fingerprint.get("device", {})
    if dev.get("arch") and dev["arch"] != platform.machine():
        problems.append(f"built on {dev['arch']}, this is {platform.machine()}")
    if device is not None:
        built_cc, here_cc = dev.get("compute_capability"), device.compute_capability
        hw = fingerprint.get("hardware_compatibility", "none")
        if hw == "ampere+":
            if _cc(here_cc) < (8, 0):
                problems.append(f"hardware-compatible (ampere+) engine, this GPU is compute capability {here_cc}")
        elif built_cc != here_cc:
            problems.append(f"built for {dev.get('gpu_name')} (compute capability {built_cc}), this is {device.gpu_name} ({here_cc})")
        if fingerprint.get("dla_core") is not None and dev.get("l4t") and device.l4t and dev["l4t"] != device.l4t:
            problems.append(f"DLA engine built on L4T {dev['l4t']}, this is L4T {device.l4t}")
    return problems


def _cc(text: str) -> tuple[int, int]:
    major, _, minor = str(text).partition(".")
    return int(major), int(minor or 0)


def read_fingerprint(engine_dir: str | Path) -> dict[str, Any]:
    import json

    path = Path(engine_dir) / FINGERPRINT_FILE
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise UserError(f"{path} is missing: {engine_dir} is not a vitdeploy engine; build one with `vitdeploy build-engine`") from None
    except (OSError, json.JSONDecodeError) as exc:
        raise UserError(f"{path} is unreadable ({exc}); rebuild the engine with `vitdeploy build-engine`") from None


def require_match(engine_dir: str | Path, fingerprint: dict[str, Any], device: DeviceInfo | None, trt_version: str | None) -> None:
    problems = mismatches(fingerprint, device, trt_version)
    if problems:
        raise DeviceError(
            f"engine {engine_dir} does not fit this device: {'; '.join(problems)}; rebuild on this device with "
            "`vitdeploy build-engine BUNDLE`"
        )


def verify_plan_file(engine_dir: str | Path, fingerprint: dict[str, Any]) -> Path:
    """The plan file, after checking it is the one engine.json describes."""
    from ..fileio import sha256_file

    plan = Path(engine_dir) / PLAN_FILE
    if not plan.is_file():
        raise UserError(f"{plan} is missing; rebuild the engine with `vitdeploy build-engine`")
    if fingerprint.get("plan_sha256") and sha256_file(plan) != fingerprint["plan_sha256"]:
        raise UserError(f"{plan} does not match its engine.json (sha256 differs); rebuild the engine")
    return plan
