"""Localisation: when an artifact disagrees with PyTorch, name the first PyTorch module whose
output diverges (``blocks.3``, ``norm``, ``head``), by comparing each module's output with the ONNX
tensor the exporter recorded for it (manifest graph.module_outputs)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ..compare import cosine_rows
from .taps import tapped_runner


def localise(reference: Any, onnx_path: Path, module_outputs: dict[str, str], images: np.ndarray,
             cosine_limit: float, precision: str = "fp32") -> dict[str, Any]:
    """Per-module cosine similarity in forward order, and the first module below ``cosine_limit``."""
    if not module_outputs:
        return {"available": False, "reason": "the graph records no module outputs (exported by an older vitdeploy?)"}
    runner, present = tapped_runner(onnx_path, list(module_outputs.values()), precision)
    names = [m for m, t in module_outputs.items() if t in present]
    if not names:
        return {"available": False, "reason": f"none of the recorded module tensors survive in the {precision} graph"}
    got = runner.infer(images)
    ref = reference.capture(images, names)
    rows, first = [], None
    for module in names:
        a, b = ref[module], got[module_outputs[module]].astype(np.float32)
        if a.shape != b.shape:
            rows.append({"module": module, "cosine_min": None, "max_abs": None, "note": f"shapes {a.shape} vs {b.shape}"})
            continue
        cos = float(cosine_rows(a, b).min())
        rows.append({"module": module, "cosine_min": cos, "max_abs": float(np.abs(a - b).max())})
        if first is None and cos < cosine_limit:
            first = module
    return {"available": True, "cosine_limit": cosine_limit, "first_divergence": first, "modules": rows}
