"""Localisation: when an artifact disagrees with PyTorch, name the first PyTorch module whose
output diverges (``blocks.3``, ``norm``, ``head``), by comparing each module's output with the ONNX
tensor the exporter recorded for it (manifest graph.module_outputs)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ..compare import FP32_SPREAD_LIMIT, cosine_rows, reference_spread
from .taps import tapped_runner


def localise(reference: Any, onnx_path: Path, module_outputs: dict[str, str], images: np.ndarray,
             cosine_limit: float, precision: str = "fp32") -> dict[str, Any]:
    """Per-module agreement in forward order, and the first module that diverges.

    fp32 is judged on the gates' scale: max |d| over the spread of PyTorch's module output across the
    images (a removed sub-layer on random weights moves a block's output by a few percent of that, while
    its cosine stays 0.999999); reduced precision on the per-image cosine (``cosine_limit``)."""
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
        max_abs = float(np.abs(a.astype(np.float64) - b).max())
        spread = reference_spread(a)
        over = max_abs / spread if spread > 0 else None
        rows.append({"module": module, "cosine_min": cos, "max_abs": max_abs, "max_abs_over_spread": over})
        diverged = over > FP32_SPREAD_LIMIT if precision == "fp32" and over is not None else cos < cosine_limit
        if first is None and diverged:
            first = module
    return {"available": True, "cosine_limit": cosine_limit, "spread_limit": FP32_SPREAD_LIMIT if precision == "fp32" else None,
            "first_divergence": first, "modules": rows}
