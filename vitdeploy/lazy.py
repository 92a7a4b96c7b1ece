"""The one place heavy optional modules are imported.

``require("torch")`` returns the module or raises MissingDependencyError with the pip line that
installs it, so a missing optional dependency is one clear line, never an ImportError traceback.
"""

from __future__ import annotations

import importlib
import sys
from types import ModuleType

# module -> what to install for it
_INSTALL_HINTS = {
    "torch": "pip install 'vitdeploy[export]'",
    "torchvision": "pip install 'vitdeploy[export]'",
    "timm": "pip install 'vitdeploy[export]' (or: pip install timm)",
    "transformers": "pip install 'vitdeploy[export]' (or: pip install transformers)",
    "onnxscript": "pip install 'vitdeploy[export]' (or: pip install onnxscript)",
    "onnxslim": "pip install onnxslim",
    "onnxconverter_common": "pip install onnxconverter-common",
    "sklearn": "pip install scikit-learn",
    # one build only: both install the same module and overwrite each other (microsoft/onnxruntime#26996)
    "onnxruntime": ("pip install 'vitdeploy[cpu]' (ONNX Runtime's CPU build) or 'vitdeploy[gpu]' (its CUDA build), never both; "
                    "on a Jetson, NVIDIA's onnxruntime-gpu wheel for its JetPack (docs/INSTALL.md)"),
    "onnx": "pip install onnx",
    "tensorrt": "install TensorRT on the target (JetPack ships it; on servers: pip install tensorrt)",
    "cuda": "pip install cuda-python",
    "pycuda": "pip install pycuda (needs a CUDA driver)",
    "matplotlib": "pip install matplotlib",
    "PIL": "pip install pillow",
    "tritonclient": "pip install tritonclient",
}


# The `export` extra (the workstation side) is declared for Python >= 3.10 only (pyproject.toml): on
# JetPack 5's Python 3.8 installing it gives nothing, so the hint says where the step runs instead.
WORKSTATION_PYTHON = (3, 10)
# (scikit-learn, onnxslim, onnxconverter-common still install on 3.8 by hand: they keep their pip hint.)
_WORKSTATION_MODULES = {"torch", "torchvision", "timm", "transformers", "onnxscript"}


def install_hint(module: str) -> str:
    top = (module or "").split(".")[0]
    if top in _WORKSTATION_MODULES and sys.version_info[:2] < WORKSTATION_PYTHON:
        need = ".".join(map(str, WORKSTATION_PYTHON))
        return (f"the workstation side (torch, export, calibrate, check against PyTorch) needs Python >= {need} and this is "
                f"{sys.version_info[0]}.{sys.version_info[1]}: run that step on a workstation and copy the bundle here, "
                f"or drive this device from the workstation with `--on HOST`")
    return _INSTALL_HINTS.get(top, f"pip install {top}")


def require(module: str, purpose: str | None = None) -> ModuleType:
    """Import ``module`` or raise MissingDependencyError naming what to install."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        from .errors import MissingDependencyError

        hint = install_hint(module)
        what = f" for {purpose}" if purpose else ""
        raise MissingDependencyError(f"{module} is needed{what} but cannot be imported ({exc}); {hint}") from None


def available(module: str) -> bool:
    """True when ``module`` imports (used to choose a backend, never to fail)."""
    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True
