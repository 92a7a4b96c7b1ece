"""The CPU-deployment INT8 variant (``vitdeploy calibrate --target cpu``).

The TensorRT graph is symmetric S8S8, which is what TensorRT accepts. ONNX Runtime on an x86 CPU
executes a Q/DQ graph (optimization level "all") with integer kernels, and on AVX2 without VNNI those
multiply u8 x s8 pairs with ``vpmaddubsw``, which adds two products into a *saturating* int16:
255 * 127 * 2 = 64,770 > 32,767. Measured on an earlier AVX2 machine: a 99.7%-accurate digits ViT
dropped to 95.6% with S8S8/U8S8 int8 kernels, while the same graph run as fake-quant kept 99.4%.

The CPU graph therefore uses ORT's documented settings for x86: uint8 asymmetric activations, int8
symmetric per-channel weights with ``reduce_range`` (7-bit weights: 255 * 63 * 2 = 32,130 fits an
int16), and int32 biases (ORT fuses them). ``reduce_range`` is applied whatever CPU calibrates, since
the graph may run on another CPU than the one that made it; VNNI CPUs (``vpdpbusd`` accumulates in
int32) lose only the one bit of weight precision. The CPU features of the calibrating machine are
recorded so a reader can tell where the graph was measured.
"""

from __future__ import annotations

import platform
from pathlib import Path
from typing import Any

from .settings import QuantSettings

# CPU flags that give 8-bit dot products accumulating in 32 bits (no int16 saturation).
_DOT_PRODUCT_FLAGS = ("avx512_vnni", "avx_vnni", "amx_int8", "asimddp", "i8mm")


def cpu_settings() -> QuantSettings:
    return QuantSettings(
        target="cpu",
        activation_type="QUInt8",
        weight_type="QInt8",
        activation_symmetric=False,
        reduce_range=True,
        quantize_bias=True,
        description="Q/DQ for ONNX Runtime CPU integer kernels: U8S8 with 7-bit weights (reduce_range), "
        "so u8 x s8 pair sums cannot saturate int16 on AVX2 CPUs without VNNI",
    )


def cpu_features() -> dict[str, Any]:
    """What this CPU offers for int8 (recorded with CPU-target graphs and benchmark numbers)."""
    flags = _cpu_flags()
    model = _cpu_model()
    x86 = platform.machine().lower() in ("x86_64", "amd64", "i686")
    dot = sorted(f for f in _DOT_PRODUCT_FLAGS if f in flags)
    return {
        "machine": platform.machine(),
        "model": model,
        "avx2": "avx2" in flags,
        "avx512": "avx512f" in flags,
        "int8_dot_product": dot,  # empty on AVX2-only x86: u8s8 kernels saturate there
        "int8_kernels_may_saturate": bool(x86 and "avx2" in flags and not dot),
    }


def _cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        key = line.split(":", 1)[0].strip().lower()
        if key in ("flags", "features"):
            return set(line.split(":", 1)[1].split())
    return set()


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"
