"""The CPU graph a runner opens: ``model.cpu.onnx`` (the fp32 graph with ONNX Runtime's fused attention),
when the bundle has one that passed its gate and was made from the current fp32 graph.

The graph is written and gated on the workstation by ``vitdeploy.exporters.cpu_fused`` (``vitdeploy convert
BUNDLE --target cpu``); the runtime only reads it. It is a backend variant, not a precision
(``vitdeploy.precisions.VARIANTS``): it computes in fp32.
"""

from __future__ import annotations

from pathlib import Path

from ..bundle import Bundle
from ..precisions import VARIANT_BY_NAME

CPU_KEY = "cpu"  # the bundle's artifacts entry
CPU_FILE = VARIANT_BY_NAME[CPU_KEY].artifact


def cpu_graph_for(bundle: Bundle) -> Path | None:
    """The bundle's fused CPU graph when it exists, passed its gate and was made from the current fp32 graph."""
    if bundle.bare_onnx is not None:
        return None
    record = bundle.artifact(CPU_KEY)
    if not record or not (bundle.root / record.file).is_file():
        return None
    if record.derived_from != bundle.artifact_sha256("fp32") or not record.passed:
        return None
    return bundle.root / record.file
