"""timm's ``VisionTransformer``: ViT, DeiT (also distilled), registers, GAP; an absolute position table.

Static sizes resample the table offline; dynamic graphs rebuild the model with ``dynamic_img_size``
and resample the table in forward by the bundle's convention (timm's own antialiases when shrinking,
which TensorRT's ONNX parser does not implement). The only family besides the reference ViT with a
masked variable-size forward (its blocks take ``attn_mask`` from timm 1.0.20).
"""

from __future__ import annotations

import copy
import inspect
import types
from typing import Any

from vitdeploy.errors import UserError
from vitdeploy.spec import ViTSpec

from .base import register_family
from .timm_common import TimmFamily, mlp_shape, rebuild_timm


@register_family
class TimmViT(TimmFamily):
    name = "timm-vit"
    variable_size_refusal = None
    token_merge_blocks = "timm"

    @classmethod
    def claims(cls, model: Any) -> bool:
        from timm.models.vision_transformer import VisionTransformer

        return isinstance(model, VisionTransformer)

    def accept(self, model: Any, name: str) -> None:
        stem = type(model.patch_embed).__name__
        if stem != "PatchEmbed" or not hasattr(model.patch_embed, "proj") or not _is_patch_conv(model.patch_embed.proj):
            raise UserError(
                f"timm model {name!r} has a {stem} stem (a CNN backbone makes its patch grid); vitdeploy exports "
                "ViTs whose tokens come from one patch-size Conv"
            )
        block = model.blocks[0] if len(model.blocks) else None
        if block is None or not (hasattr(block, "attn") and hasattr(block, "mlp")):
            raise UserError(f"timm model {name!r} is built of {type(block).__name__} blocks (parallel attention/MLP "
                            "branches), not the Pre-LN attention-then-MLP block vitdeploy exports")

    def spec(self, model: Any, name: str) -> ViTSpec:
        return spec_from_timm(model, name)

    def regrid_static(self, loaded: Any, height: int, width: int, interp: Any) -> Any:
        import torch

        from vitdeploy.posembed import resample_pos_embed

        spec = loaded.spec
        model = copy.deepcopy(loaded.model)
        with torch.no_grad():
            table = resample_pos_embed(model.pos_embed.detach(), spec.grid(height, width), spec.native_grid, spec.pos_embed_prefix_rows,
                                       interp.method, interp.align_corners, interp.antialias)
        model.pos_embed = torch.nn.Parameter(table, requires_grad=False)
        model.patch_embed.set_input_size(img_size=(height, width))
        return model

    def make_dynamic(self, loaded: Any, interp: Any) -> tuple[Any, ViTSpec]:
        from vitdeploy.posembed import resample_pos_embed

        model = rebuild_timm(loaded, dynamic_img_size=True)
        prefix_rows = loaded.spec.pos_embed_prefix_rows
        native_grid = tuple(model.patch_embed.grid_size)

        def _pos_embed(self: Any, x: Any) -> Any:
            import torch

            # timm's _pos_embed with the table resampled by the convention we record (timm's own
            # antialiases when shrinking, which TensorRT's ONNX parser does not implement).
            batch, gh, gw, dim = x.shape
            table = resample_pos_embed(self.pos_embed, (gh, gw), native_grid, prefix_rows, interp.method, interp.align_corners, interp.antialias)
            x = x.reshape(batch, gh * gw, dim)
            prefix = [t.expand(batch, -1, -1) for t in (self.cls_token, getattr(self, "dist_token", None), self.reg_token) if t is not None]
            if self.no_embed_class:
                x = x + table
                return torch.cat(prefix + [x], dim=1) if prefix else x
            x = torch.cat(prefix + [x], dim=1) if prefix else x
            return x + table

        model._pos_embed = types.MethodType(_pos_embed, model)  # this instance only
        return model, loaded.spec

    def variable_parts(self, loaded: Any) -> Any:
        return TimmParts(loaded.model)


def _is_patch_conv(proj: Any) -> bool:
    import torch

    return isinstance(proj, torch.nn.Conv2d) and tuple(proj.kernel_size) == tuple(proj.stride)


def spec_from_timm(model: Any, name: str, readouts: tuple[str, ...] = ("token", "avg")) -> ViTSpec:
    """The spec of a timm VisionTransformer whose read-out (global_pool) is one of ``readouts``."""
    blocks = list(model.blocks)
    embed_dim = int(model.embed_dim)
    mlp_ratio, mlp_kind = mlp_shape(blocks[0], embed_dim)  # plain fc1/fc2, or gated (SwiGLU/GLU)
    num_heads = int(blocks[0].attn.num_heads)
    dist = 1 if getattr(model, "dist_token", None) is not None else 0
    regs = int(model.reg_token.shape[1]) if getattr(model, "reg_token", None) is not None else 0
    pool = model.global_pool
    if pool not in readouts:
        raise UserError(f"timm model {name!r} uses global_pool={pool!r}; vitdeploy supports {' and '.join(repr(r) for r in readouts)}")
    if getattr(model, "pos_embed", None) is None:
        raise UserError(f"timm model {name!r} has no learned absolute position table")
    prefix_rows = 0 if model.no_embed_class else int(model.num_prefix_tokens)
    return ViTSpec(
        image_size=tuple(model.patch_embed.img_size),
        patch_size=tuple(model.patch_embed.patch_size),
        embed_dim=embed_dim,
        depth=len(blocks),
        num_heads=num_heads,
        num_classes=int(model.num_classes),
        in_chans=int(model.patch_embed.proj.in_channels),
        mlp_ratio=mlp_ratio,
        mlp_kind=mlp_kind,
        class_token=model.cls_token is not None,
        num_reg_tokens=regs,
        num_distill_tokens=dist,
        global_pool=pool,
        pos_embed_prefix_rows=prefix_rows,
        architecture="deit-distilled" if dist else ("vit-reg" if regs else "vit"),
    )


class TimmParts:
    """A timm VisionTransformer (incl. DeiT-distilled, registers, GAP) split into the masked forward's steps."""

    def __init__(self, model: Any):
        if getattr(model, "attn_pool", None) is not None:
            raise UserError("--variable-size supports CLS and GAP read-outs; this timm model pools by attention (global_pool='map')")
        if model.global_pool not in ("token", "avg"):
            raise UserError(f"--variable-size supports global_pool 'token' or 'avg', this model uses {model.global_pool!r}")
        if getattr(model, "pos_embed", None) is None:
            raise UserError("--variable-size needs a learned absolute position table; this timm model has none")
        block_forward = inspect.signature(type(model.blocks[0]).forward).parameters
        if "attn_mask" not in block_forward:
            import timm

            raise UserError(f"timm {timm.__version__} blocks take no attention mask; --variable-size needs timm >= 1.0.20")
        self.model = model
        self.table = model.pos_embed
        self.prefix_rows = 0 if model.no_embed_class else model.num_prefix_tokens

    def patch_tokens(self, x: Any) -> Any:
        pe = self.model.patch_embed
        tokens = pe.proj(x).flatten(2).transpose(1, 2)  # [B, N, d], n = r*G_w + s (timm's NLC order)
        return pe.norm(tokens)

    def prefix_tokens(self, batch: int) -> list[Any]:
        m = self.model
        tokens = [t for t in (m.cls_token, getattr(m, "dist_token", None), m.reg_token) if t is not None]
        return [t.expand(batch, -1, -1) for t in tokens]

    def encode(self, z: Any, key_bias: Any) -> Any:
        m = self.model
        z = m.norm_pre(m.patch_drop(m.pos_drop(z)))
        bias = key_bias[:, None, None, :]  # [B, 1, 1, L], broadcast over heads and queries
        for block in m.blocks:
            z = block(z, attn_mask=bias)
        return m.norm(z)

    def head(self, features: Any, valid: Any) -> Any:
        m = self.model
        if m.global_pool == "token":
            return m.forward_head(features)  # reads the prefix rows only (DeiT-distilled averages its two)
        patches = features[:, m.num_prefix_tokens:]
        weights = valid.to(patches.dtype).unsqueeze(-1)
        pooled = (patches * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1.0)
        return m.head(m.head_drop(m.fc_norm(pooled)))
