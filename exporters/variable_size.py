"""Variable-size input: one graph for a batch of images of different sizes (Algorithm 39.1, steps 1-3).

The graph takes ``images`` uint8 [B, H_c, W_c, 3] (each image top-left in a fixed canvas) and
``valid_hw`` int32 [B, 2] (each image's valid height and width in pixels). The declared rule:

- valid sizes are whole patches: the graph floors ``valid_hw / P`` to a patch grid (g_h, g_w) and
  clamps it to [1, canvas grid], so no input can make an empty grid (the runtime refuses sizes that
  are not whole patches before the call, see :mod:`vitdeploy.variable`);
- pixels outside the valid rectangle carry the normalised zero (an attention mask removes whole
  positions only, it cannot remove invalid pixels inside a patch: with whole-patch sizes there are none);
- each image gets the position table of its OWN grid, resampled with the bundle's declared rule
  (:func:`vitdeploy.posembed.resample_pos_grid_per_sample`: one GridSample with per-sample
  coordinates) and laid into the canvas grid, so a padded image computes what the same image computes
  alone at its own size;
- padded positions are masked as keys with a finite additive bias (MASK_BIAS, kept in fp32) while the
  prefix tokens (CLS, registers, distillation) are always valid: no softmax row is ever all-masked,
  so no input can produce NaN;
- GAP models read out by the mean over valid patch tokens only; CLS models read the CLS row; an
  attention-pool (MAP) head attends over the valid keys only (the same key mask).

Supported (each family adapter's ``variable_parts``): the reference ViT (builtin, ref:) and timm
VisionTransformer models whose blocks take an ``attn_mask`` (timm >= 1.0.20) with a CLS, GAP or
MAP read-out, with a classification head. The other families (Hugging Face ViTs have no key-mask path through their encoder here)
get a one-line refusal naming why.
"""

from __future__ import annotations

from typing import Any

import torch

from vitdeploy.posembed import PosEmbedInterpolation, resample_pos_grid_per_sample

from .graph import DeployGraph
from .loaded import LoadedModel

VALID_INPUT = "valid_hw"
# Additive key bias for padded positions: exp(-30000 + s) is exactly 0 in fp32 for any realistic
# attention score s, and the value is finite in fp16 too (max 65504), so casting it cannot make inf - inf.
MASK_BIAS = -30000.0
RULE = (
    "valid sizes floored to whole patches and clamped to [1 patch, canvas]; padding pixels carry the normalised zero; "
    "each image's position grid resampled to its own patch grid and laid top-left in the canvas grid; padded keys "
    f"masked by an additive {MASK_BIAS:g} bias in fp32; prefix tokens always valid; GAP = mean over valid patches"
)


def model_parts(loaded: LoadedModel) -> Any:
    """The masked forward's steps of this model (patch tokens, prefix tokens, masked encoder, head), from
    its family adapter (exporters/adapters/); one line why not where the family has no such path."""
    return loaded.adapter.variable_parts(loaded)


class VariableSizeGraph(torch.nn.Module):
    """(images uint8 [B, H_c, W_c, 3], valid_hw int32 [B, 2]) -> (logits, probs); see the module doc."""

    def __init__(self, loaded: LoadedModel, preprocessing: dict[str, Any], canvas: tuple[int, int],
                 interpolation: PosEmbedInterpolation):
        super().__init__()
        spec = loaded.spec
        self.canvas_grid = spec.grid(*canvas)  # refuses a canvas the patch does not tile
        self.patch = tuple(spec.patch_size)
        self.native_grid = spec.native_grid
        self.interpolation = interpolation
        self.parts = model_parts(loaded)
        self.pre = DeployGraph(torch.nn.Identity(), preprocessing)  # the same baked preprocessing as every bundle
        self.model = loaded.model  # registered, so .eval() and the exporter see the weights

    def grids(self, valid_hw: torch.Tensor) -> torch.Tensor:
        """valid_hw [B, 2] pixels -> patch grid [B, 2], floored and clamped to [1, canvas grid]."""
        patch = torch.tensor(self.patch, dtype=torch.int64, device=valid_hw.device)
        upper = torch.tensor(self.canvas_grid, dtype=torch.int64, device=valid_hw.device)
        grid = torch.div(valid_hw.to(torch.int64), patch, rounding_mode="floor")
        return torch.minimum(grid.clamp(min=1), upper)

    def forward(self, images: torch.Tensor, valid_hw: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        grid = self.grids(valid_hw)
        x = self.pre.preprocess(images)  # [B, 3, H_c, W_c], normalised
        canvas_h, canvas_w = self.canvas_grid
        p_h, p_w = self.patch
        rows = torch.arange(canvas_h * p_h, device=x.device).view(1, -1, 1)
        cols = torch.arange(canvas_w * p_w, device=x.device).view(1, 1, -1)
        valid_pixels = (rows < (grid[:, 0] * p_h).view(-1, 1, 1)) & (cols < (grid[:, 1] * p_w).view(-1, 1, 1))
        x = x * valid_pixels.unsqueeze(1).to(x.dtype)  # padding = the normalised zero

        tokens = self.parts.patch_tokens(x)  # [B, N_c, d]
        batch = tokens.shape[0]
        positions = getattr(self.parts, "positions", None)  # a family whose table follows its own rule (adapters/)
        pos = positions(grid, self.canvas_grid) if positions else resample_pos_grid_per_sample(
            self.parts.table, self.native_grid, self.parts.prefix_rows, grid, self.canvas_grid, self.interpolation)
        cell_r = torch.arange(canvas_h, device=x.device).view(1, canvas_h, 1)
        cell_s = torch.arange(canvas_w, device=x.device).view(1, 1, canvas_w)
        valid = ((cell_r < grid[:, 0].view(-1, 1, 1)) & (cell_s < grid[:, 1].view(-1, 1, 1))).flatten(1)  # [B, N_c]
        z = tokens + pos
        prefix = self.parts.prefix_tokens(batch)
        if prefix:
            prefix = torch.cat(prefix, dim=1)
            if self.parts.prefix_rows:  # the table's first rows belong to the prefix tokens (not no_embed_class)
                prefix = prefix + self.parts.table[:, :self.parts.prefix_rows]
            z = torch.cat([prefix, z], dim=1)
        num_prefix = z.shape[1] - tokens.shape[1]
        key_bias = torch.where(valid, torch.zeros((), dtype=torch.float32), torch.full((), MASK_BIAS, dtype=torch.float32))
        key_bias = torch.cat([torch.zeros(batch, num_prefix, dtype=torch.float32, device=x.device), key_bias], dim=1)
        features = self.parts.encode(z, key_bias)
        logits = self.parts.head(features, valid)
        return logits, torch.softmax(logits, dim=-1)


def export_variable_graph(module: VariableSizeGraph, canvas: tuple[int, int], opset: int) -> tuple[Any, float]:
    """torch.onnx (dynamo) export with two inputs and a dynamic batch; returns (ModelProto, seconds)."""
    import contextlib
    import io
    import time
    import warnings

    from torch.export import Dim

    from .onnx_export import INPUT_NAME, release_rewriter_matches

    height, width = canvas
    example = (torch.randint(0, 256, (3, height, width, 3), dtype=torch.uint8),
               torch.tensor([[height, width], [height // 2, width], [height, width // 2]], dtype=torch.int32))
    batch = Dim("batch", min=1)
    start = time.perf_counter()
    with warnings.catch_warnings(), torch.no_grad(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        program = torch.onnx.export(
            module, example, dynamo=True, opset_version=opset,
            input_names=[INPUT_NAME, VALID_INPUT], output_names=["logits", "probs"],
            dynamic_shapes={"images": {0: batch}, "valid_hw": {0: batch}}, external_data=False,
        )
    model = program.model_proto
    del program
    release_rewriter_matches()  # else the exporter's rewrite rules keep the model alive (onnx_export.py)
    for value in list(model.graph.input) + list(model.graph.output):
        dim = value.type.tensor_type.shape.dim
        if dim and not dim[0].dim_value:
            dim[0].dim_param = "batch"
    return model, time.perf_counter() - start
