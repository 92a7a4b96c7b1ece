"""timm NaFlexVit's position rule as interpolation matrices: exact, and expressible in any graph.

NaFlexVit keeps its learned table at its own grid (``embeds.pos_embed`` [1, G0_h, G0_w, d], no prefix
rows) and resamples it for every input in ``forward`` with ``F.interpolate`` (its ``pos_embed_interp_mode``,
``pos_embed_align_corners`` and ``pos_embed_antialias``); ``pos_embed_ar_preserving`` resamples to the
square of the longer side and crops top-left; the factorized variant ('parfac') resamples a row and a
column table linearly (no antialias) and adds them (timm/models/naflexvit.py, ``NaFlexEmbeds``).

Every one of these resamplings is separable and linear, so output cell i of an axis is a weighted sum
of the source cells: a matrix ``W`` [rows, G0] per axis, and the 2-D table is ``W_h @ T @ W_w^T``. The
weights below are torch's own (aten/src/ATen/native/UpSample.h ``area_pixel_compute_source_index``,
cpu/UpSampleKernel.cpp ``_compute_weights_aa``: the antialiased kernel is the a=-0.5 cubic / triangle
stretched by the scale, taps in [floor(c - s + 0.5), floor(c + s + 0.5)), normalised by their sum),
built from elementwise ops (scalar constants, no ``*_like``: a Shape read of a mask-path tensor would
pull it into fp16 in a variable-size graph), so the same code gives the table of a static size (constants), of the
input's shape (dynamic graphs: no Resize, so no antialiased Resize a TensorRT parser refuses) and of
each image's own grid in a padded batch (variable size). Tested against F.interpolate and against
timm's forward.
"""

from __future__ import annotations

from typing import Any

import torch


def _cubic(x: torch.Tensor, a: float) -> torch.Tensor:
    x = x.abs()
    near = ((a + 2) * x - (a + 3)) * x * x + 1
    far = ((a * x - 5 * a) * x + 8 * a) * x - 4 * a
    return torch.where(x < 1, near, torch.where(x < 2, far, 0.0))


def axis_weights(old: int, length: torch.Tensor, rows: Any, mode: str, align_corners: bool, antialias: bool) -> torch.Tensor:
    """[..., rows, old]: the weights with which output cell i < rows of an ``old`` -> ``length`` resample
    reads the source cells (``F.interpolate(mode, align_corners, antialias)`` along one axis).

    ``length`` is a float tensor [...] (a scalar for one size, [B] per sample); ``rows`` an int (or a
    symbolic size): rows past ``length`` are the ar-preserving crop's or the canvas's extra cells."""
    n = length.to(torch.float32).unsqueeze(-1).unsqueeze(-1)  # [..., 1, 1]
    i = torch.arange(rows, device=length.device).to(torch.float32).view(-1, 1)  # [rows, 1]
    j = torch.arange(old, device=length.device).to(torch.float32).view(1, -1)  # [1, old]
    if align_corners:
        scale = torch.where(n > 1, (old - 1) / (n - 1).clamp(min=1), 0.0)
    else:
        scale = old / n
    if antialias:
        half = 1.0 if mode in ("bilinear", "linear") else 2.0
        support = torch.where(scale >= 1, half * scale, half)
        invscale = torch.where(scale >= 1, 1 / scale, 1.0)
        center = scale * (i + 0.5)
        lo = torch.floor(center - support + 0.5).clamp(min=0)
        hi = torch.floor(center + support + 0.5)
        x = (j - center + 0.5) * invscale
        if half == 1.0:
            w = (1 - x.abs()).clamp(min=0)
        else:
            w = _cubic(x, -0.5)
        w = w * ((j >= lo) & (j < hi)).to(torch.float32)
        total = w.sum(dim=-1, keepdim=True)
        return w / torch.where(total == 0, 1.0, total)
    src = scale * i if align_corners else scale * (i + 0.5) - 0.5
    if mode in ("bilinear", "linear"):
        if not align_corners:
            src = src.clamp(min=0.0)  # torch clamps negative linear source coordinates to the first cell
        base = torch.floor(src)
        frac = src - base
        upper = torch.where(base < old - 1, base + 1, base)
        return (j == base).to(torch.float32) * (1 - frac) + (j == upper).to(torch.float32) * frac
    base = torch.floor(src)
    t = src - base
    taps = (_cubic(t + 1, -0.75), _cubic(t, -0.75), _cubic(1 - t, -0.75), _cubic(2 - t, -0.75))
    return sum(((base - 1 + k).clamp(0, old - 1) == j).to(torch.float32) * w for k, w in enumerate(taps))


def naflex_positions(embeds: Any, grid_h: torch.Tensor, grid_w: torch.Tensor, rows: Any, cols: Any) -> torch.Tensor | None:
    """NaFlexEmbeds' position table for grids (grid_h, grid_w) ([] or [B] tensors), laid row-major over a
    rows x cols grid: [..., rows*cols, d], cells beyond a sample's grid hold values a key mask hides.
    None for a model without positions (pos_embed='none')."""
    kind = embeds.pos_embed_type
    if kind == "none":
        return None
    lead = (-1,) if grid_h.dim() else ()  # sizes spelled out: no Shape read of a per-sample (mask-path) tensor
    dim = int(embeds.embed_dim)
    if embeds.pos_embed_ar_preserving:
        len_h = len_w = torch.maximum(grid_h, grid_w)
    else:
        len_h, len_w = grid_h, grid_w
    if kind == "factorized":  # timm: linear, align_corners=False, no antialias, on each 1-D table
        table_y, table_x = embeds.pos_embed_y[0].float(), embeds.pos_embed_x[0].float()  # [G0_h, d], [G0_w, d]
        pe_y = axis_weights(table_y.shape[0], len_h, rows, "linear", False, False) @ table_y  # [..., rows, d]
        pe_x = axis_weights(table_x.shape[0], len_w, cols, "linear", False, False) @ table_x  # [..., cols, d]
        pos = pe_y.unsqueeze(-2) + pe_x.unsqueeze(-3)  # [..., rows, cols, d]
    else:
        table = embeds.pos_embed[0].float()  # [G0_h, G0_w, d]
        old_h, old_w = (int(v) for v in table.shape[:2])
        rule = (embeds.pos_embed_interp_mode, bool(embeds.pos_embed_align_corners), bool(embeds.pos_embed_antialias))
        w_h = axis_weights(old_h, len_h, rows, *rule)  # [..., rows, G0_h]
        w_w = axis_weights(old_w, len_w, cols, *rule)  # [..., cols, G0_w]
        by_rows = (w_h @ table.reshape(old_h, old_w * dim)).reshape(*lead, rows, old_w, dim)  # [..., rows, G0_w, d]
        pos = w_w.unsqueeze(-3) @ by_rows  # [..., rows, cols, d]
    return pos.reshape(*lead, rows * cols, dim)


def rule_text(embeds: Any) -> str:
    """timm's rule for this model's positions, in words (spec, manifest, docs)."""
    kind = embeds.pos_embed_type
    if kind == "none":
        return "none"
    crop = ("resampled to the square of the longer grid side, then cropped top-left (aspect-preserving)"
            if embeds.pos_embed_ar_preserving else "resampled to the grid")
    if kind == "factorized":
        return f"factorized row + column tables ({tuple(embeds.pos_embed_y.shape[1:2]) + tuple(embeds.pos_embed_x.shape[1:2])}), each {crop} linearly, summed"
    grid = tuple(int(v) for v in embeds.pos_embed.shape[1:3])
    aa = "antialiased" if embeds.pos_embed_antialias else "no antialias"
    corners = "corners" if embeds.pos_embed_align_corners else "centres"
    return f"learned {grid[0]}x{grid[1]} table, {crop} by {embeds.pos_embed_interp_mode}/{corners}, {aa} (timm NaFlexEmbeds)"
