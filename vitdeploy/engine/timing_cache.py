"""Timing caches, keyed by TensorRT version and GPU, refused when they come from elsewhere.

TensorRT's timing cache makes rebuilds fast, but a cache from another GPU or TensorRT version holds
timings that do not apply (TensorRT's own header check can be switched off, and its failure message is
cryptic). vitdeploy writes a small key file beside each cache (``<cache>.json``: TensorRT version,
GPU name, compute capability, the cache's sha256) and refuses a cache whose key does not match the
build, or that has no key at all.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..errors import UserError
from ..fileio import atomic_write_bytes, atomic_write_json, sha256_bytes
from .fingerprint import DeviceInfo

KEY_FORMAT = "vitdeploy-timing-cache/1"


def key_path(cache: str | Path) -> Path:
    cache = Path(cache)
    return cache.with_name(cache.name + ".json")


def cache_key(device: DeviceInfo, trt_version: str) -> dict[str, str]:
    return {
        "format": KEY_FORMAT,
        "tensorrt": str(trt_version),
        "gpu_name": device.gpu_name,
        "compute_capability": device.compute_capability,
    }


def load(cache: str | Path, device: DeviceInfo, trt_version: str) -> bytes:
    """The cache's bytes (b"" when the file does not exist yet: TensorRT starts an empty cache)."""
    cache = Path(cache)
    if not cache.exists():
        return b""
    if not cache.is_file():
        raise UserError(f"--timing-cache {cache} is not a file")
    kpath = key_path(cache)
    try:
        key = json.loads(kpath.read_text())
    except FileNotFoundError:
        raise UserError(
            f"timing cache {cache} has no key file {kpath.name}: vitdeploy cannot tell which GPU and TensorRT made it; "
            "delete it or give a new --timing-cache path"
        ) from None
    except (OSError, json.JSONDecodeError) as exc:
        raise UserError(f"timing cache key {kpath} is unreadable ({exc}); delete the cache and its key") from None
    data = cache.read_bytes()
    problems = key_mismatches(key, cache_key(device, trt_version))
    if key.get("sha256") and key["sha256"] != sha256_bytes(data):
        problems.append("the cache file changed since its key was written")
    if problems:
        raise UserError(f"timing cache {cache} refused: {'; '.join(problems)}; give another --timing-cache path for this device")
    return data


def key_mismatches(found: dict[str, Any], wanted: dict[str, str]) -> list[str]:
    if found.get("format") != KEY_FORMAT:
        return [f"key format {found.get('format')!r}, expected {KEY_FORMAT!r}"]
    labels = {"tensorrt": "TensorRT", "gpu_name": "GPU", "compute_capability": "compute capability"}
    return [
        f"made with {labels[k]} {found.get(k)!r}, this build uses {wanted[k]!r}"
        for k in ("tensorrt", "gpu_name", "compute_capability")
        if found.get(k) != wanted[k]
    ]


def save(cache: str | Path, data: bytes, device: DeviceInfo, trt_version: str) -> str:
    """Write the cache and its key atomically; return the cache's sha256 (recorded in engine.json)."""
    digest = sha256_bytes(data)
    atomic_write_bytes(cache, data)
    atomic_write_json(key_path(cache), {**cache_key(device, trt_version), "sha256": digest, "bytes": len(data)})
    return digest
