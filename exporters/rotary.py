"""Rotary positions (EVA-02, timm's ``vit_*_rope_*``) at another patch grid (issue 17).

A rotary model rotates each head's q and k of the N patch tokens by angles ``t(r, s) * f``: the
frequencies f are fixed bands (``cat``: EVA-02 and axial RoPE ViTs) or learned per block and head
(``mixed``), the coordinates t come from the grid. Adapting to another grid is therefore a
recomputation, not a resampling, and the rule is timm's: integer grid coordinates (+ offset),
``ij`` or ``xy`` indexing, and for EVA-02 a rescale to the pre-training grid
(``ref_feat_shape``: t = index / G * G_ref, so a larger grid keeps the trained span of angles).

* static: timm's own ``set_input_size`` -> ``rope.update_feat_shape`` recomputes the sin/cos table
  for the new grid, and the export bakes it as a constant;
* dynamic: the model is rebuilt with ``dynamic_img_size=True`` and timm's ``rope.get_embed(shape=
  (G_h, G_w))`` runs inside the graph (Range, Mul, Sin, Cos on the input's shape; verified with the
  dynamo exporter); an absolute table (EVA-02 has one) is resampled with the bundle's convention,
  as for plain ViTs.

sin/cos and the rotation multiplies stay fp32 in the fp16 graph (``exporters/fp16.py``), as timm
computes them in fp32 under autocast.
"""

from __future__ import annotations

import copy
import types
from typing import Any, Sequence

import torch

from vitdeploy.errors import UserError
from vitdeploy.posembed import PosEmbedInterpolation, resample_pos_embed

SUPPORTED_TYPES = {
    "RotaryEmbeddingCat": "cat",
    "RotaryEmbeddingMixed": "mixed",
}


def rope_type(model: Any) -> str | None:
    rope = getattr(model, "rope", None)
    if rope is None:
        return None
    kind = SUPPORTED_TYPES.get(type(rope).__name__)
    if kind is None:
        raise UserError(
            f"rotary embedding {type(rope).__name__} is not one vitdeploy has verified (supported: axial "
            "'cat' as in EVA-02 and vit_*_rope_*, learned 'mixed' as in vit_*_rope_mixed_*)"
        )
    return kind


def rotary_record(model: Any) -> dict[str, Any] | None:
    """The spec's ``rotary`` entry: the rule that gives the sin/cos for a grid, named in the manifest."""
    kind = rope_type(model)
    if kind is None:
        return None
    rope = model.rope
    indexing = str(rope.grid_indexing)
    if kind == "mixed":
        return {
            "type": "mixed",
            "grid_indexing": indexing,
            "temperature": float(rope.temperature),
            "rule": (f"learned per-block frequencies x integer grid coordinates ({indexing} indexing), "
                     "recomputed per grid by timm's RotaryEmbeddingMixed.get_embed"),
        }
    ref = list(rope.ref_feat_shape) if rope.ref_feat_shape is not None else None
    grid_type = str(getattr(rope, "grid_type", "pixel" if rope.in_pixels else "index"))
    coords = {
        "index": "integer grid index" + (f" + {rope.grid_offset:g}" if rope.grid_offset else ""),
        "pixel": "evenly spaced in [-1, 1]",
        "centered": "cell centres in [-1, 1]",
    }.get(grid_type, grid_type)
    bands = (f"pixel bands up to {rope.max_res}" if rope.in_pixels else f"inverse-frequency bands, temperature {rope.temperature:g}")
    scale = f" rescaled to the {ref[0]}x{ref[1]} reference grid (t x G_ref / G)" if ref else ""
    return {
        "type": "cat",
        "grid_indexing": indexing,
        "grid_type": grid_type,
        "ref_feat_shape": ref,
        "grid_offset": float(rope.grid_offset),
        "temperature": float(rope.temperature),
        "in_pixels": bool(rope.in_pixels),
        "rotate_half": bool(rope.rotate_half),
        "rule": (f"axial sin/cos of {coords}{scale}, {indexing} indexing, x {bands}; "
                 f"{'half' if rope.rotate_half else 'interleaved'} layout (timm RotaryEmbeddingCat)"),
    }


def rotary_embed(model: Any, grid: Sequence[Any]) -> torch.Tensor:
    """The sin/cos a dynamic graph computes for ``grid`` (timm's own get_embed at that shape)."""
    return model.rope.get_embed(shape=(grid[0], grid[1]))


# -- whole models -------------------------------------------------------------------------------
def eva_static(model: Any, size: tuple[int, int], interp: PosEmbedInterpolation, native_grid: tuple[int, int],
               prefix_rows: int) -> Any:
    """A copy of a timm Eva at a fixed size: rotary recomputed by timm's ``set_input_size``; an
    absolute table (EVA-02) resampled with the bundle's convention (timm's antialiases)."""
    out = copy.deepcopy(model)
    table = out.pos_embed.detach().clone() if out.pos_embed is not None else None
    out.set_input_size(img_size=size)
    if table is not None:
        with torch.no_grad():
            resampled = resample_pos_embed(table, tuple(out.patch_embed.grid_size), native_grid, prefix_rows,
                                           interp.method, interp.align_corners, interp.antialias)
        out.pos_embed = torch.nn.Parameter(resampled, requires_grad=False)
    return out.eval()


def eva_dynamic(model: Any, name: str, model_kwargs: dict[str, Any], num_classes: int, interp: PosEmbedInterpolation,
                prefix_rows: int) -> Any:
    """A timm Eva rebuilt with ``dynamic_img_size=True`` (rotary computed in-graph per grid) and the
    absolute table, if any, resampled with the bundle's convention."""
    import timm

    kwargs = dict(model_kwargs)
    kwargs.update(num_classes=num_classes, dynamic_img_size=True)
    out = timm.create_model(name, pretrained=False, **kwargs)
    out.load_state_dict(model.state_dict(), strict=True)
    native_grid = tuple(int(g) for g in out.patch_embed.grid_size)

    def _pos_embed(self: Any, x: torch.Tensor) -> tuple[torch.Tensor, Any]:
        # timm's Eva._pos_embed (dynamic branch, eval mode) with the bundle's table convention
        batch, gh, gw, dim = x.shape
        table = None
        if self.pos_embed is not None:
            table = resample_pos_embed(self.pos_embed, (gh, gw), native_grid, prefix_rows,
                                       interp.method, interp.align_corners, interp.antialias)
        x = x.reshape(batch, gh * gw, dim)
        rope = rotary_embed(self, (gh, gw)) if self.rope is not None else None
        prefix = [t.expand(batch, -1, -1) for t in (self.cls_token, self.reg_token) if t is not None]
        if self.no_embed_class:
            if table is not None:
                x = x + table
            x = torch.cat(prefix + [x], dim=1) if prefix else x
        else:
            x = torch.cat(prefix + [x], dim=1) if prefix else x
            if table is not None:
                x = x + table
        return self.pos_drop(x), rope

    out._pos_embed = types.MethodType(_pos_embed, out)  # this instance only
    return out.eval()
