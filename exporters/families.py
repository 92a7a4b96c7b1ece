"""Which timm classes vitdeploy exports, and their ViTSpec (issue 17).

A ViT in the chapter's sense has a patch grid from one Conv, prefix tokens, a Pre-LN encoder with
global attention and a CLS or GAP readout. timm implements that in three classes that differ only in
how position enters: ``VisionTransformer`` (absolute table), ``Beit`` (relative-position bias
tables, optionally an absolute table) and ``Eva`` (rotary frequencies, EVA-02 also an absolute
table). Everything else gets one line saying why it is out of reach.
"""

from __future__ import annotations

from typing import Any

from vitdeploy.errors import UserError
from vitdeploy.spec import ViTSpec

# family tag of LoadedModel: how regrid.py gives the model another resolution
TIMM_VIT, TIMM_BEIT, TIMM_EVA = "timm", "timm-beit", "timm-eva"

# Classes that are vision transformers but not the global-attention, patch-grid ViT vitdeploy exports.
_OUT_OF_REACH = {
    "SwinTransformer": "attends within shifted local windows with per-window relative bias, which the global-attention export does not express",
    "SwinTransformerV2": "attends within shifted local windows with a per-window continuous bias, which the global-attention export does not express",
    "SwinTransformerV2Cr": "attends within shifted local windows, which the global-attention export does not express",
    "MaxxVit": "mixes convolution stages with window and grid attention; it has no single patch grid",
    "Levit": "is a convolution/attention hybrid with shrinking resolution stages, not one patch grid",
    "PoolingVisionTransformer": "pools between stages (PiT), so there is no single patch grid",
    "ConViT": "uses gated positional self-attention with learned local priors",
    "Twins": "uses locally-grouped attention with conditional position encodings",
    "Hiera": "is a hierarchical multi-stage transformer with mask units",
    "MultiScaleVit": "is a multi-scale pooling-attention transformer",
    "EfficientFormer": "is a convolution/attention hybrid",
    "EfficientFormerV2": "is a convolution/attention hybrid",
    "FastVit": "is a convolution/attention hybrid",
}


def timm_family(model: Any, name: str) -> str:
    """TIMM_VIT, TIMM_BEIT or TIMM_EVA, or a UserError naming why this model is out of reach."""
    from timm.models.beit import Beit
    from timm.models.eva import Eva
    from timm.models.vision_transformer import VisionTransformer as TimmViT

    cls = type(model).__name__
    if isinstance(model, TimmViT):
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
        return TIMM_VIT
    if isinstance(model, Beit):
        return TIMM_BEIT
    if isinstance(model, Eva):
        if getattr(model.patch_embed, "dynamic_img_pad", False):
            raise UserError(f"timm model {name!r} pads images to the patch size in-graph (dynamic_img_pad); export it without")
        return TIMM_EVA
    if cls in _OUT_OF_REACH:
        raise UserError(f"timm model {name!r} is a {cls}: it {_OUT_OF_REACH[cls]}")
    raise UserError(f"timm model {name!r} is a {cls}, not a ViT-family model vitdeploy can export "
                    "(supported: VisionTransformer, Beit, Eva)")


def _is_patch_conv(proj: Any) -> bool:
    import torch

    return isinstance(proj, torch.nn.Conv2d) and tuple(proj.kernel_size) == tuple(proj.stride)


def mlp_shape(block: Any, embed_dim: int) -> tuple[float, str]:
    """(hidden / d, "mlp" | "gated") of a block's MLP: fc1-act-fc2, SwiGLU (fc1_g, fc1_x) or GluMlp."""
    mlp = block.mlp
    if hasattr(mlp, "fc1_g"):  # SwiGLU: fc1_g, fc1_x -> hidden, fc2
        return mlp.fc1_g.out_features / embed_dim, "gated"
    fc1, fc2 = getattr(mlp, "fc1", None), getattr(mlp, "fc2", None)
    if fc1 is None or fc2 is None:
        return 4.0, "mlp"
    if fc1.out_features == 2 * fc2.in_features:  # GluMlp: one fc1 producing both halves
        return fc2.in_features / embed_dim, "gated"
    return fc1.out_features / embed_dim, "mlp"


def _pool(model: Any, name: str) -> str:
    pool = model.global_pool
    if pool not in ("token", "avg"):
        raise UserError(f"timm model {name!r} uses global_pool={pool!r}; vitdeploy supports 'token' (CLS) and 'avg' (GAP) readouts")
    return pool


def spec_from_beit(model: Any, name: str) -> ViTSpec:
    from .relpos import rel_pos_record

    d = int(model.embed_dim)
    ratio, kind = mlp_shape(model.blocks[0], d)
    has_abs = model.pos_embed is not None
    return ViTSpec(
        image_size=tuple(model.patch_embed.img_size),
        patch_size=tuple(model.patch_embed.patch_size),
        embed_dim=d,
        depth=len(model.blocks),
        num_heads=int(model.blocks[0].attn.num_heads),
        num_classes=int(model.num_classes),
        in_chans=int(model.patch_embed.proj.in_channels),
        mlp_ratio=ratio,
        class_token=True,
        global_pool=_pool(model, name),
        pos_embed_prefix_rows=1 if has_abs else 0,
        family="beitv2" if name.startswith("beitv2") else "beit",
        abs_pos_embed=has_abs,
        rel_pos_bias=rel_pos_record(model),
        mlp_kind=kind,
    )


def spec_from_eva(model: Any, name: str) -> ViTSpec:
    from .rotary import rotary_record

    d = int(model.embed_dim)
    ratio, kind = mlp_shape(model.blocks[0], d)
    has_abs = model.pos_embed is not None
    regs = int(model.reg_token.shape[1]) if getattr(model, "reg_token", None) is not None else 0
    prefix = int(model.num_prefix_tokens)
    rotary = rotary_record(model)
    if name.startswith("eva02"):
        family = "eva02"
    elif rotary and "rope" in name:
        family = "vit-rope-mixed" if rotary["type"] == "mixed" else "vit-rope"
    else:
        family = "eva"
    return ViTSpec(
        image_size=tuple(model.patch_embed.img_size),
        patch_size=tuple(model.patch_embed.patch_size),
        embed_dim=d,
        depth=len(model.blocks),
        num_heads=int(model.blocks[0].attn.num_heads),
        num_classes=int(model.num_classes),
        in_chans=int(model.patch_embed.proj.in_channels),
        mlp_ratio=ratio,
        class_token=model.cls_token is not None,
        num_reg_tokens=regs,
        global_pool=_pool(model, name),
        pos_embed_prefix_rows=(0 if model.no_embed_class else prefix) if has_abs else 0,
        family=family,
        abs_pos_embed=has_abs,
        rotary=rotary,
        mlp_kind=kind,
    )
