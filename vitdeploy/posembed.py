"""Two-dimensional interpolation of a learned absolute position table (chapter §39.3).

The table is stored as one row per position, but row ``prefix + r*G_w + s`` belongs to grid cell
(r, s): it is a 2-D field. Adapting it to another grid therefore (1) splits off the prefix rows
(CLS, distillation, register tokens), which are kept unchanged, (2) reshapes the rest to
G_h x G_w x d, (3) resamples spatially and (4) flattens back row-major. Interpolating the whole
sequence as one line would mix the end of one grid row with the start of the next.

The sampling convention is part of the model: bicubic vs bilinear and corner- vs centre-aligned
coordinates give different tables, so every caller names one with :class:`PosEmbedInterpolation`
and records it. The export default is bicubic, ``align_corners=False``, no antialias. Note that
``antialias`` is not only about shrinking: torch's antialiased bicubic uses the a=-0.5 cubic
kernel (PIL's), the plain one a=-0.75, so the two differ when enlarging too. timm's
``resample_abs_pos_embed`` (and ``dynamic_img_size``) defaults to antialias=True; to reproduce a
timm model at another size use ``PosEmbedInterpolation("bicubic", False, True)``.

:func:`resample_pos_embed` takes the target grid as sizes that may be symbolic (``torch.SymInt``),
so ``torch.onnx.export(dynamo=True)`` with dynamic H/W carries the resampling in the graph as a
``Resize`` whose output size is computed from the input's shape.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from .errors import ConfigError

METHODS = ("bicubic", "bilinear")


@dataclass(frozen=True)
class PosEmbedInterpolation:
    """How a position grid is resampled. Changing any field changes the resulting table."""

    method: str = "bicubic"
    align_corners: bool = False
    antialias: bool = False

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ConfigError(f"position-table interpolation must be one of {', '.join(METHODS)}, got {self.method!r}")

    @property
    def name(self) -> str:
        """A short unambiguous tag, e.g. ``bicubic/centres`` or ``bilinear/corners+antialias``."""
        tag = f"{self.method}/{'corners' if self.align_corners else 'centres'}"
        return tag + ("+antialias" if self.antialias else "")

    def describe(self) -> str:
        """One sentence naming the convention, for reports and manifests."""
        coords = (
            "corner-aligned (align_corners=True: the outer grid points of old and new grid coincide)"
            if self.align_corners
            else "centre-aligned (align_corners=False: cell centres map, src = (i + 0.5) * old/new - 0.5)"
        )
        # torch's antialiased bicubic is the a=-0.5 (PIL) cubic even when enlarging; plain bicubic is a=-0.75.
        aa = {
            (True, "bicubic"): ", antialiased (a=-0.5 cubic, also when enlarging)",
            (True, "bilinear"): ", antialiased when shrinking",
        }.get((self.antialias, self.method), ", no antialias" + (" (a=-0.75 cubic)" if self.method == "bicubic" else ""))
        return f"{self.method} {coords}{aa}"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> "PosEmbedInterpolation":
        data = dict(data or {})
        unknown = set(data) - {"method", "align_corners", "antialias"}
        if unknown:
            raise ConfigError(f"unknown position-interpolation keys {sorted(unknown)}; use method, align_corners, antialias")
        return cls(**data)


EXPORT_DEFAULT = PosEmbedInterpolation()


def check_same_patch_size(old: int | Sequence[int], new: int | Sequence[int]) -> None:
    """Refuse a patch-size change: it changes F = C*P_h*P_w, the input width of W_E (§39.3 end)."""
    as_pair = lambda p: (int(p), int(p)) if isinstance(p, (int, np.integer)) else tuple(int(v) for v in p)  # noqa: E731
    if as_pair(old) != as_pair(new):
        raise ConfigError(
            f"patch size {as_pair(old)} -> {as_pair(new)}: interpolating the position table cannot fix a "
            "patch-size change: W_E changes; keep the trained patch size and change the image size instead"
        )


def resample_pos_embed(
    table: torch.Tensor,
    new_grid: Sequence[Any],
    old_grid: Sequence[int],
    num_prefix_rows: int = 1,
    method: str = "bicubic",
    align_corners: bool = False,
    antialias: bool = False,
) -> torch.Tensor:
    """Resample ``table`` [1, prefix + G_h*G_w, d] from ``old_grid`` to ``new_grid`` (§39.3).

    Prefix rows are returned unchanged; the grid rows are resampled as a d-channel image.
    ``new_grid`` may hold ``torch.SymInt`` sizes (dynamic export). The resampling runs in float32
    and the result is cast back to the table's dtype, so an fp16 table is not resampled in fp16.
    Degenerate grids follow torch: a 1-wide target samples the source centre (align_corners=False)
    or the first source cell (align_corners=True).
    """
    conv = PosEmbedInterpolation(method, align_corners, antialias)  # validates the method
    if table.dim() != 3:
        raise ConfigError(f"position table must be [1, rows, d], got shape {tuple(table.shape)}")
    old_h, old_w = (int(v) for v in old_grid)
    rows, dim = int(table.shape[1]), int(table.shape[2])
    if num_prefix_rows < 0 or rows != num_prefix_rows + old_h * old_w:
        raise ConfigError(
            f"position table has {rows} rows but {num_prefix_rows} prefix rows + a {old_h}x{old_w} grid "
            f"need {num_prefix_rows + old_h * old_w}; check the grid the table was trained for"
        )
    new_h, new_w = new_grid
    prefix = table[:, :num_prefix_rows]
    grid = table[:, num_prefix_rows:].reshape(table.shape[0], old_h, old_w, dim).permute(0, 3, 1, 2)
    grid = F.interpolate(
        grid.float(),
        size=(new_h, new_w),
        mode=conv.method,
        align_corners=conv.align_corners,
        antialias=conv.antialias,
    ).to(table.dtype)
    grid = grid.permute(0, 2, 3, 1).flatten(1, 2)  # row-major: row prefix + r*G_w' + s is cell (r, s)
    return torch.cat([prefix, grid], dim=1)


def resample_pos_embed_np(
    table: np.ndarray,
    new_grid: Sequence[int],
    old_grid: Sequence[int],
    num_prefix_rows: int = 1,
    interpolation: PosEmbedInterpolation = EXPORT_DEFAULT,
) -> np.ndarray:
    """:func:`resample_pos_embed` for numpy tables ([rows, d] or [1, rows, d]; same rank out)."""
    arr = np.asarray(table)
    squeeze = arr.ndim == 2
    tensor = torch.from_numpy(np.ascontiguousarray(arr[None] if squeeze else arr))
    out = resample_pos_embed(
        tensor,
        tuple(int(v) for v in new_grid),
        old_grid,
        num_prefix_rows,
        interpolation.method,
        interpolation.align_corners,
        interpolation.antialias,
    ).numpy()
    return out[0] if squeeze else out


def axis_weights_per_sample(old: int, new: torch.Tensor, canvas: int, interpolation: PosEmbedInterpolation) -> torch.Tensor:
    """Interpolation matrices [B, canvas, old]: row c of sample b holds the weights with which output
    cell c of a ``new[b]``-long axis reads the ``old`` source cells (torch's interpolate, exactly).

    Bicubic and bilinear resampling are separable, so a 2-D table resampled to a per-sample grid is
    ``W_h[b] @ table @ W_w[b]^T``: MatMuls and elementwise ops only, which every TensorRT parser takes
    (GridSample is absent before 8.6) and which cost a fraction of a per-pixel GridSample on a CPU.
    Rows c >= new[b] extrapolate and belong to padded cells that a key mask hides.
    """
    g = new.to(torch.float32).view(-1, 1)  # [B, 1]
    cells = torch.arange(canvas, dtype=torch.float32, device=new.device).view(1, -1)  # [1, canvas]
    if interpolation.align_corners:
        scale = torch.where(g > 1, (old - 1) / (g - 1).clamp(min=1), torch.zeros_like(g))
        src = scale * cells
    else:
        src = (old / g) * (cells + 0.5) - 0.5
    index = torch.arange(old, device=new.device).view(1, 1, -1)  # [1, 1, old]

    def one_hot(tap: torch.Tensor) -> torch.Tensor:  # [B, canvas] clamped source index -> [B, canvas, old]
        return (tap.clamp(0, old - 1).unsqueeze(-1) == index).to(torch.float32)

    if interpolation.method == "bilinear":
        if not interpolation.align_corners:
            src = src.clamp(min=0.0)  # torch clamps negative bilinear source coordinates to the first cell
        base = torch.floor(src)
        frac = src - base
        base = base.to(torch.int64)
        upper = torch.where(base < old - 1, base + 1, base)
        return one_hot(base) * (1 - frac).unsqueeze(-1) + one_hot(upper) * frac.unsqueeze(-1)
    a = -0.75  # torch's bicubic (upsample_bicubic2d) without antialias
    base = torch.floor(src)
    t = (src - base).unsqueeze(-1)
    base = base.to(torch.int64)

    def near(x: torch.Tensor) -> torch.Tensor:  # |x| <= 1
        return ((a + 2) * x - (a + 3)) * x * x + 1

    def far(x: torch.Tensor) -> torch.Tensor:  # 1 < |x| < 2
        return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a

    weights = (far(t + 1), near(t), near(1 - t), far(2 - t))
    return sum(one_hot(base - 1 + k) * w for k, w in enumerate(weights))


def resample_pos_grid_per_sample(
    table: torch.Tensor,
    old_grid: Sequence[int],
    num_prefix_rows: int,
    grid_hw: torch.Tensor,
    canvas_grid: Sequence[int],
    interpolation: PosEmbedInterpolation = EXPORT_DEFAULT,
) -> torch.Tensor:
    """Each sample's own resampled position grid, laid top-left into a canvas grid (variable-size input).

    ``table`` is [1, prefix + G_h*G_w, d]; ``grid_hw`` [B, 2] holds each sample's grid (g_h, g_w),
    1 <= g <= canvas. Returns [B, C_h*C_w, d] (row-major over the canvas grid) where cell (r, s) with
    r < g_h, s < g_w holds row r*g_w + s of ``resample_pos_embed(table, (g_h, g_w), ...)``, and the
    cells outside a sample's grid hold values that a key mask must hide.

    Computed as ``W_h[b] @ grid @ W_w[b]^T`` with per-sample interpolation matrices
    (:func:`axis_weights_per_sample`), equal to resampling each sample's grid alone. An antialiased
    resampling has a different kernel width per output size and is not supported here.
    """
    if interpolation.antialias:
        raise ConfigError(
            "per-sample position grids need an interpolation without antialias (its kernel width changes with "
            "each output size); export with --no-antialias"
        )
    old_h, old_w = (int(v) for v in old_grid)
    canvas_h, canvas_w = (int(v) for v in canvas_grid)
    dim = int(table.shape[2])
    source = table[0, num_prefix_rows:].float().reshape(old_h, old_w * dim)  # [G_h, G_w*d]
    w_h = axis_weights_per_sample(old_h, grid_hw[:, 0], canvas_h, interpolation)  # [B, C_h, G_h]
    w_w = axis_weights_per_sample(old_w, grid_hw[:, 1], canvas_w, interpolation)  # [B, C_w, G_w]
    rows = (w_h @ source).reshape(-1, canvas_h, old_w, dim)  # [B, C_h, G_w, d]
    cells = w_w.unsqueeze(1) @ rows  # [B, C_h, C_w, d]
    return cells.flatten(1, 2).to(table.dtype)
