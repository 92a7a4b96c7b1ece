"""timm's DINOv3 ViTs (``vit_*_patch16_dinov3*``): timm's ``Eva`` with DINOv3's rotary positions
(``RotaryEmbeddingDinoV3``), 4 register tokens and LayerScale.

What differs from the other rotary ViTs is the coordinate rule: every patch gets the *centre* of its
cell normalised by the grid, ``2 (i + 0.5) / G - 1`` per axis (in [-1, 1], so a larger image keeps
the trained span of angles), times ``2 pi / period`` with periods ``temperature ** (4 j / head_dim)``.
timm builds those coordinates with ``float(G)`` and ``torch.arange(0.5, G)`` (huggingface/pytorch-image-models
timm/layers/pos_embed_sincos.py ``_build_grid``, grid_type 'centered'; upstream: facebookresearch/dinov3
dinov3/layers/rope_position_encoding.py). Traced by torch.onnx's dynamo exporter (torch 2.14), ``float(G)``
becomes a constant of the export's grid: every other grid would get its coordinates divided by the
native G (read from the exported graph: a Div by the initializer 6.0 for a 96 px export; with the
test model of tests/test_family_dinov3.py such coordinates move patch_grid by ~1.1 at 96x160, and
timm's LayerScale init of 1e-5 hides it from random-weight export checks).
The dynamic graph computes them here instead, from the input's shape, with ops every supported
TensorRT parses (Shape, Range over int64, Cast, Div, Mul, Sin, Cos, Unsqueeze, Expand, Concat,
Reshape; no If, Loop or Tile): the same float32 operations in the same order as timm's, so the
sin/cos equal timm's own ``get_embed`` at every grid (tests/test_family_dinov3.py).

Static sizes are timm's own forward at that size (the sin/cos are baked as constants). The read-outs
are timm's: ``forward_head(pre_logits=True)`` is the mean of the patch tokens (timm's default
``global_pool='avg'`` for DINOv3) or the CLS token (``global_pool='token'``, upstream DINOv3's), the
patch grid drops the CLS and the 4 register rows.
"""

from __future__ import annotations

import dataclasses
import math
import types
from typing import Any

from vitdeploy.errors import UserError
from vitdeploy.spec import ViTSpec

from .base import register_family
from .timm_eva import TimmEva, spec_from_eva

NORMALIZATIONS = ("separate", "min", "max")  # RotaryEmbeddingDinoV3.normalize_coords: the denominator per axis


@register_family
class TimmDinoV3(TimmEva):
    name = "timm-dinov3"
    variable_size_refusal = ("its rotary coordinates are patch centres normalised by each image's own grid, which the "
                             "masked forward does not compute per row")

    @classmethod
    def claims(cls, model: Any) -> bool:
        from timm.layers.pos_embed_sincos import RotaryEmbeddingDinoV3

        return super().claims(model) and isinstance(getattr(model, "rope", None), RotaryEmbeddingDinoV3)

    def accept(self, model: Any, name: str) -> None:
        super().accept(model, name)
        # the periods are a fixed buffer whichever schedule made them (temperature or min/max); the
        # coordinates' denominator is one of timm's three rules, which centred_rope_embed computes
        if model.rope.normalize_coords not in NORMALIZATIONS:
            raise UserError(f"timm model {name!r}: DINOv3 rotary normalize_coords={model.rope.normalize_coords!r} is not one of "
                            f"{', '.join(NORMALIZATIONS)}")

    def spec(self, model: Any, name: str) -> ViTSpec:
        spec = spec_from_eva(model, name, rotary=rotary_record(model.rope))
        return dataclasses.replace(spec, architecture="dinov3", extra_terms=_extra_terms(model, spec))

    def make_dynamic(self, loaded: Any, interp: Any) -> tuple[Any, ViTSpec]:
        model, spec = super().make_dynamic(loaded, interp)  # timm Eva rebuilt with dynamic_img_size=True
        model.rope.get_embed = types.MethodType(centred_rope_embed, model.rope)  # this instance only
        return model, spec


def centred_rope_embed(rope: Any, shape: Any = None, dtype: Any = None) -> Any:
    """timm's ``RotaryEmbeddingDinoV3.get_embed(shape=(G_h, G_w))`` (eval mode) as in-graph ops on a
    symbolic grid: [G_h G_w, 2 head_dim], the sin then the cos, each in the rotation's layout.

    Per axis a = (arange(G) + 0.5 + offset) / denominator, coordinate 2 a - 1, angle 2 pi coord / period,
    in timm's float32 order; sin/cos are taken per axis (G_h + G_w rows) and broadcast over the grid."""
    import torch

    if shape is None:  # the cached grid of a fixed-size model: timm's own path
        return type(rope).get_embed(rope, None, dtype)
    gh, gw = shape[0], shape[1]
    periods = rope.periods
    sizes = [_as_float(gh, periods), _as_float(gw, periods)]
    if rope.normalize_coords == "separate":
        denominators = sizes
    else:
        pick = torch.minimum if rope.normalize_coords == "min" else torch.maximum
        denominators = [pick(sizes[0], sizes[1])] * 2
    sines, cosines = [], []
    for size, denominator in zip((gh, gw), denominators):
        index = torch.arange(size, device=periods.device, dtype=torch.int64).to(torch.float32)
        centre = (index + 0.5 + rope.grid_offset) / denominator
        coord = 2.0 * centre - 1.0
        angle = 2 * math.pi * coord[:, None] / periods[None, :]  # [G, head_dim / 4]
        sines.append(angle.sin())
        cosines.append(angle.cos())
    first, second = (0, 1) if rope.grid_indexing == "ij" else (1, 0)  # 'xy': the width coordinate first

    def on_grid(per_axis: list[Any]) -> Any:
        bands = per_axis[0].shape[-1]
        rows = per_axis[0][:, None, :].expand(-1, per_axis[1].shape[0], -1)  # [G_h, G_w, bands]
        cols = per_axis[1][None, :, :].expand(per_axis[0].shape[0], -1, -1)
        pair = (rows, cols)
        flat = torch.cat([pair[first], pair[second]], dim=-1).reshape(-1, 2 * bands)  # [G_h G_w, head_dim / 2]
        if rope.rotate_half:
            return torch.cat([flat, flat], dim=-1)
        return torch.stack([flat, flat], dim=-1).flatten(-2)  # interleaved: f0 f0 f1 f1 ...

    embed = torch.cat([on_grid(sines), on_grid(cosines)], dim=-1)
    return embed if dtype is None else embed.to(dtype=dtype)



def rotary_record(rope: Any) -> dict[str, Any]:
    """The manifest's record of DINOv3's rotary rule (timm's RotaryEmbeddingDinoV3)."""
    indexing = str(rope.grid_indexing)
    periods = (f"periods {rope.min_period:g} to {rope.max_period:g}" if rope.min_period is not None and rope.max_period is not None
               else f"periods temperature^(4j/head_dim), temperature {rope.temperature:g}")
    offset = f" + {rope.grid_offset:g}" if rope.grid_offset else ""
    return {
        "type": "dinov3",
        "grid_indexing": indexing,
        "grid_type": "centered",
        "normalize_coords": str(rope.normalize_coords),
        "grid_offset": float(rope.grid_offset),
        "temperature": float(rope.temperature) if rope.temperature is not None else None,
        "rotate_half": bool(rope.rotate_half),
        "rule": (f"axial sin/cos of patch centres 2(i + 0.5{offset})/G - 1 in [-1, 1] (G: {rope.normalize_coords} per axis), "
                 f"{indexing} indexing, x 2 pi / {periods}; {'half' if rope.rotate_half else 'interleaved'} layout "
                 "(timm RotaryEmbeddingDinoV3)"),
    }


def _as_float(size: Any, like: Any) -> Any:
    """A grid extent (an int, or a symbolic size in a dynamic export) as a float32 scalar tensor."""
    import torch

    return torch.ones((), dtype=torch.float32, device=like.device) * size


def _extra_terms(model: Any, spec: ViTSpec) -> tuple[dict[str, Any], ...]:
    """What a DINOv3 block holds beyond the standard ViT's parameters (costs.param_count): its two
    LayerScale vectors, and its q/k/v biases (none, or q and v only: timm's Eva keeps k's as a zero
    buffer) instead of the standard 3d. Both are element-wise: no MACs."""
    d, depth = spec.embed_dim, spec.depth
    terms = []
    scales = sum(p.numel() for b in model.blocks for n, p in b.named_parameters() if n.startswith("gamma_"))
    if scales:
        terms.append({"name": "layer-scale", "macs": [0, 0, 0], "params": int(scales)})
    attn = model.blocks[0].attn
    if hasattr(attn, "qkv"):
        qkv_bias = sum(p.numel() for blk in model.blocks for p in (blk.attn.q_bias, blk.attn.v_bias) if p is not None)
        qkv_bias += sum(blk.attn.qkv.bias.numel() for blk in model.blocks if blk.attn.qkv.bias is not None)
    else:
        qkv_bias = sum(lin.bias.numel() for blk in model.blocks for lin in (blk.attn.q_proj, blk.attn.k_proj, blk.attn.v_proj)
                       if lin.bias is not None)
    if qkv_bias != 3 * d * depth:
        terms.append({"name": "qkv-bias", "macs": [0, 0, 0], "params": int(qkv_bias - 3 * d * depth)})
    return tuple(terms)
