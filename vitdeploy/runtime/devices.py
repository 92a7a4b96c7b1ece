"""What accelerators this machine has, asked without importing torch or TensorRT."""

from __future__ import annotations

import sys
from pathlib import Path


def cuda_visible() -> bool:
    """Is there an NVIDIA GPU? Asked without importing torch: a loaded torch is asked, otherwise the
    driver's device node (discrete GPUs: /dev/nvidia0; Jetson: /dev/nvhost-ctrl-gpu) is looked for.
    onnxruntime-gpu is no evidence: it lists CUDA even on a machine without one."""
    if "torch" in sys.modules:
        return bool(sys.modules["torch"].cuda.is_available())
    return Path("/dev/nvidia0").exists() or Path("/dev/nvhost-ctrl-gpu").exists()
