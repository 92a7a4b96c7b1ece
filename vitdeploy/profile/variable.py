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
from ..runtime.ort import OrtRunner

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


class VariableOrtRunner(OrtRunner):
    """ONNX Runtime on a two-input graph with a fixed ``valid_hw`` per cell: ``infer(images)`` feeds both,
    so the profiler's loop (one call per timed iteration) stays the same as for one-input graphs."""

    def __init__(self, model: Any, valid_hw: np.ndarray, **kwargs: Any):
        super().__init__(model, **kwargs)
        names = [i.name for i in self.session.get_inputs()]
        if len(names) != 2:
            raise UserError(f"{model} takes inputs {names}; a variable-size graph takes (images, valid_hw)")
        self._valid_name = names[1]
        self.valid_hw = np.ascontiguousarray(valid_hw, dtype=np.int32)
        self.info.details["valid_hw_rows"] = int(len(self.valid_hw))

    def _run(self, batch: np.ndarray) -> dict[str, np.ndarray]:
        if len(batch) != len(self.valid_hw):
            raise UserError(f"{len(batch)} images for {len(self.valid_hw)} valid_hw rows")
        return self._session_run(self._outputs, {self._input.name: batch, self._valid_name: self.valid_hw})


class VariableTorchRunner(Runner):
    """The bundle's masked forward in PyTorch (exporters' VariableSizeGraph, the module the graph was
    exported from), eager under inference_mode, fed the same (images, valid_hw) as the graph."""

    def __init__(self, bundle: Any, valid_hw: np.ndarray, canvas: Sequence[int], device: str = "cpu", threads: int | None = None):
        import torch

        from vitdeploy.exporters.api import loaded_for_bundle
        from vitdeploy.exporters.variable_size import VariableSizeGraph
        from vitdeploy.posembed import PosEmbedInterpolation

        if threads:
            torch.set_num_threads(int(threads))
        interp = PosEmbedInterpolation.from_dict(
            {k: v for k, v in bundle.resolution["pos_embed_interpolation"].items() if k != "description"})
        loaded = loaded_for_bundle(bundle, resolution=tuple(bundle.spec.image_size))
        self.torch = torch
        self.device = torch.device(device)
        self.module = VariableSizeGraph(loaded, bundle.preprocessing, (int(canvas[0]), int(canvas[1])), interp).eval().to(self.device)
        self.valid = torch.from_numpy(np.ascontiguousarray(valid_hw, dtype=np.int32)).to(self.device)
        self.canvas = (int(canvas[0]), int(canvas[1]))
        self.info = RunnerInfo("torch", "fp32", str(self.device), {"torch_mode": "eager", "threads": threads or torch.get_num_threads(),
                                                                  "torch": torch.__version__, "valid_hw_rows": int(len(valid_hw))})

    def inputs(self) -> list[TensorInfo]:
        return [TensorInfo("images", "uint8", ("batch", self.canvas[0], self.canvas[1], 3))]

    def outputs(self) -> list[str]:
        return ["logits", "probs"]

    def _run(self, batch: np.ndarray) -> dict[str, np.ndarray]:
        torch = self.torch
        if len(batch) != len(self.valid):
            raise UserError(f"{len(batch)} images for {len(self.valid)} valid_hw rows")
        with torch.inference_mode():
            logits, probs = self.module(torch.from_numpy(batch).to(self.device), self.valid)
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
        return {"logits": logits.float().cpu().numpy(), "probs": probs.float().cpu().numpy()}

    def close(self) -> None:
        self.module = None  # type: ignore[assignment]
        if self.device.type == "cuda":
            self.torch.cuda.empty_cache()
