"""vitdeploy.exporters: PyTorch model sources -> verified ONNX bundles.

Attributes are resolved lazily so that ONNX-only modules of this package (the fp16 pass) import
without torch.
"""

from typing import Any

__all__ = ["ExportOptions", "export", "loaded_for_bundle"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from . import api

        return getattr(api, name)
    raise AttributeError(name)
