"""Patchification: the exact, parameter-free index map between an image batch and a patch sequence.

Chapter §39.1, Eq. (39.2): for grid coordinates (r, s), in-patch coordinates (u, v) and channel c,

    X[b, n, f] = I[b, c, r*P_h + u, s*P_w + v],   n = r*G_w + s,   f = c*P_h*P_w + u*P_w + v

Patches run row-major over the grid, values inside a patch are channel-first and then row-major over
pixels. The map is a bijection (B*N*F = B*C*H*W): nothing is learned and no pixel is lost, which is
why :func:`unpatchify` can invert it exactly. The ordering matters: it is the ordering under which
a Conv2d patch embedding equals one shared linear map (§39.2, see ``vitdeploy.model``).

Works on numpy arrays and on torch tensors (same type out as in); no torch import is needed here.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from .errors import UserError
from .spec import check_resolution


def as_patch_size(patch: int | Sequence[int]) -> tuple[int, int]:
    """An int P means a square P x P patch; a pair is (P_h, P_w)."""
    if isinstance(patch, (int, np.integer)):
        ph = pw = int(patch)
    else:
        values = tuple(int(v) for v in patch)
        if len(values) != 2:
            raise UserError(f"patch size must be an int or a (P_h, P_w) pair, got {patch!r}")
        ph, pw = values
    if ph <= 0 or pw <= 0:
        raise UserError(f"patch size must be positive, got {(ph, pw)}")
    return ph, pw


def patch_index(r: int, s: int, grid_width: int) -> int:
    """n = r*G_w + s: the sequence position of grid cell (r, s) (Eq. 39.2, row-major grid)."""
    return r * grid_width + s


def feature_index(c: int, u: int, v: int, patch: int | Sequence[int]) -> int:
    """f = c*P_h*P_w + u*P_w + v: the position of channel c, pixel (u, v) inside a flattened patch."""
    ph, pw = as_patch_size(patch)
    return c * ph * pw + u * pw + v


def _is_torch(x: Any) -> bool:
    # Checked by type name so that numpy-only callers never import torch.
    return type(x).__module__.startswith("torch")


def _permute(x: Any, axes: tuple[int, ...]) -> Any:
    return x.permute(*axes) if _is_torch(x) else np.transpose(x, axes)


def patchify(images: Any, patch: int | Sequence[int]) -> Any:
    """[B, C, H, W] -> [B, N, F] by Eq. (39.2); refuses H, W that the patch does not tile."""
    ph, pw = as_patch_size(patch)
    if len(images.shape) != 4:
        raise UserError(f"patchify expects a [B, C, H, W] batch, got shape {tuple(images.shape)}")
    b, c, h, w = (int(v) for v in images.shape)
    check_resolution(h, w, (ph, pw))
    gh, gw = h // ph, w // pw
    # [B, C, G_h, P_h, G_w, P_w] -> [B, G_h, G_w, C, P_h, P_w]: grid axes first (n = r*G_w + s), then
    # channel, then the pixel row and column (f = c*P_h*P_w + u*P_w + v).
    blocks = images.reshape(b, c, gh, ph, gw, pw)
    blocks = _permute(blocks, (0, 2, 4, 1, 3, 5))
    return blocks.reshape(b, gh * gw, c * ph * pw)


def unpatchify(
    tokens: Any,
    patch: int | Sequence[int],
    image_size: Sequence[int] | None = None,
    channels: int | None = None,
    *,
    grid: Sequence[int] | None = None,
) -> Any:
    """[B, N, F] -> [B, C, H, W], the inverse of :func:`patchify`.

    Give the image size (H, W) or the grid (G_h, G_w); one of them is needed because N alone does not
    say whether the grid is 2x8 or 4x4. ``channels`` defaults to F / (P_h*P_w).
    """
    ph, pw = as_patch_size(patch)
    if len(tokens.shape) != 3:
        raise UserError(f"unpatchify expects a [B, N, F] sequence, got shape {tuple(tokens.shape)}")
    if (image_size is None) == (grid is None):
        raise UserError("unpatchify needs exactly one of image_size=(H, W) or grid=(G_h, G_w)")
    if grid is not None:
        gh, gw = (int(v) for v in grid)
        h, w = gh * ph, gw * pw
    else:
        h, w = (int(v) for v in image_size)
        check_resolution(h, w, (ph, pw))
        gh, gw = h // ph, w // pw
    b, n, f = (int(v) for v in tokens.shape)
    if channels is None:
        if f % (ph * pw):
            raise UserError(f"patch features F={f} are not a multiple of P_h*P_w={ph * pw}; check the patch size")
        channels = f // (ph * pw)
    if n != gh * gw:
        raise UserError(f"sequence has N={n} patches but the grid {gh}x{gw} has {gh * gw}; check the image size")
    if f != channels * ph * pw:
        raise UserError(f"patch features F={f} do not equal C*P_h*P_w={channels * ph * pw}; check channels and patch size")
    blocks = tokens.reshape(b, gh, gw, channels, ph, pw)
    blocks = _permute(blocks, (0, 3, 1, 4, 2, 5))
    return blocks.reshape(b, channels, h, w)
