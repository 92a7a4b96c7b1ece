"""`profile` cells for variable-size bundles: a canvas and a fill ratio instead of one input size.

A variable-size graph (``export --variable-size --canvas HxW``) takes ``images`` uint8 [B, H_c, W_c, 3]
and ``valid_hw`` int32 [B, 2]. It computes the whole canvas whatever the images fill (the mask hides
padded keys, it skips no work), but the runtimes' kernels can still run at another speed on masked
rows (ORT's CPU Softmax does, see docs/DESIGN.md), so a cell is (canvas, fill, batch), where

    fill = mean valid area / canvas area.

Declared rule for the sizes of a fill ratio (seeded, the same for every backend and precision of a
sweep, recorded in profile.json): on the canvas grid G_h x G_w (N = G_h G_w patches) each image
covers about A = fill N whole patches; its grid height is drawn uniformly among the heights h with
ceil(A / G_w) <= h <= min(G_h, A) (every aspect ratio that fits the canvas), its width is
round(A / h) clamped to [1, G_w]; sizes are h x w patches. Fill 1.0 is the full canvas. The fill
achieved by the drawn sizes (``fill_actual``) is reported beside the fill asked for.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from ..errors import UserError
from ..runtime.base import Runner, RunnerInfo, TensorInfo
from ..variable import VALID_INPUT

FILL_RULE = (
    "fill = mean valid area / canvas area; per image about fill x N whole patches (N = canvas grid cells): grid height drawn "
    "uniformly (seeded) among the heights that fit, width = round(fill x N / height) clamped to the canvas grid; fill 1.0 = "
    "the full canvas"
)
DEFAULT_FILLS = (1.0, 0.5, 0.25)


def parse_fills(values: Sequence[Any]) -> list[float]:
    """Fill ratios in (0, 1], in the order given, each once; one line for anything else."""
    out: list[float] = []
    for raw in values:
        text = str(raw).strip()
        try:
            value = float(text)
        except ValueError:
            raise UserError(f"--fill {text!r} is not a number; give fill ratios in (0, 1], e.g. --fill 1.0,0.5,0.25") from None
        if not (math.isfinite(value) and 0.0 < value <= 1.0):
            raise UserError(f"--fill {text} is outside (0, 1]: a fill ratio is the share of the canvas the images cover, e.g. 0.5")
        if value not in out:
            out.append(value)
    if not out:
        raise UserError("--fill is empty; give fill ratios in (0, 1], e.g. --fill 1.0,0.5,0.25")
    return out


def sizes_for_fill(canvas: Sequence[int], patch: Sequence[int], fill: float, count: int, seed: int = 0) -> np.ndarray:
    """``count`` whole-patch valid sizes (int32 [count, 2], pixels) drawn by the module's declared rule."""
    grid_h, grid_w = int(canvas[0]) // int(patch[0]), int(canvas[1]) // int(patch[1])
    cells = grid_h * grid_w
    area = max(1.0, fill * cells)  # patches per image
    low = max(1, math.ceil(area / grid_w - 1e-9))
    high = max(low, min(grid_h, int(math.floor(area + 1e-9))))
    rng = np.random.default_rng([seed, int(round(fill * 1e6)), count])
    heights = rng.integers(low, high + 1, size=count)
    widths = np.clip(np.rint(area / heights), 1, grid_w).astype(np.int64)
    heights = np.clip(heights, 1, grid_h)
    return np.stack([heights * int(patch[0]), widths * int(patch[1])], axis=1).astype(np.int32)


def achieved_fill(valid_hw: np.ndarray, canvas: Sequence[int]) -> float:
    valid = np.asarray(valid_hw, dtype=np.float64)
    return float((valid[:, 0] * valid[:, 1]).mean() / (int(canvas[0]) * int(canvas[1])))


class VariableTorchRunner(Runner):
    """The bundle's masked forward in PyTorch (exporters' VariableSizeGraph, the module the graph was
    exported from), eager under inference_mode, fed the same (images, valid_hw) as the graph: the
    PyTorch baseline of a variable-size cell (the per-image reference that `check` compares with is
    exporters/torch_runner.py's)."""

    def __init__(self, bundle: Any, contract: Any, canvas: Sequence[int] | None = None, device: str = "cpu", threads: int | None = None):
        import torch

        from vitdeploy.exporters.api import loaded_for_bundle
        from vitdeploy.exporters.torch_runner import position_rule
        from vitdeploy.exporters.variable_size import VariableSizeGraph

        if threads:
            torch.set_num_threads(int(threads))
        loaded = loaded_for_bundle(bundle, resolution=contract.native)
        self.torch = torch
        self.device = torch.device(device)
        self.contract = contract
        self.canvas = (int(canvas[0]), int(canvas[1])) if canvas is not None else contract.size  # a cell's canvas (a variant's)
        self.module = VariableSizeGraph(loaded, bundle.preprocessing, self.canvas, position_rule(bundle)).eval().to(self.device)
        self.info = RunnerInfo("torch", "fp32", str(self.device), {"torch_mode": "eager", "threads": threads or torch.get_num_threads(),
                                                                  "torch": torch.__version__})

    def inputs(self) -> list[TensorInfo]:
        h, w = self.canvas
        return [TensorInfo(self.contract.image_input, "uint8", ("batch", h, w, 3)), TensorInfo(VALID_INPUT, "int32", ("batch", 2))]

    def outputs(self) -> list[str]:
        return ["logits", "probs"]

    def _execute(self, feeds: dict[str, np.ndarray], outputs: list[str] | None) -> dict[str, np.ndarray]:
        torch = self.torch
        images, valid = feeds[self.contract.image_input], feeds[VALID_INPUT]
        if len(images) != len(valid):
            raise UserError(f"{len(images)} images for {len(valid)} valid_hw rows")
        with torch.inference_mode():
            logits, probs = self.module(torch.from_numpy(np.ascontiguousarray(images)).to(self.device),
                                        torch.from_numpy(np.ascontiguousarray(valid, dtype=np.int32)).to(self.device))
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
        return {"logits": logits.float().cpu().numpy(), "probs": probs.float().cpu().numpy()}

    def close(self) -> None:
        self.module = None  # type: ignore[assignment]
        if self.device.type == "cuda":
            self.torch.cuda.empty_cache()
