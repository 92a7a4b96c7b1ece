"""timm's ``Eva`` (EVA-02, the RoPE ViTs): rotary frequencies multiplied into q and k, optionally an
absolute table; re-gridded by timm's own rotary rule (exporters/rotary.py)."""

from __future__ import annotations

from typing import Any

from vitdeploy.errors import UserError
from vitdeploy.spec import ViTSpec

from .base import register_family
from .timm_common import TimmFamily, mlp_shape, readout_pool


@register_family
class TimmEva(TimmFamily):
    name = "timm-eva"
    variable_size_refusal = "its rotary positions have no per-image grid in the masked forward"

    @classmethod
    def claims(cls, model: Any) -> bool:
        from timm.models.eva import Eva

        return isinstance(model, Eva)

    def accept(self, model: Any, name: str) -> None:
        if getattr(model.patch_embed, "dynamic_img_pad", False):
            raise UserError(f"timm model {name!r} pads images to the patch size in-graph (dynamic_img_pad); export it without")

    def spec(self, model: Any, name: str) -> ViTSpec:
        return spec_from_eva(model, name)

    def regrid_static(self, loaded: Any, height: int, width: int, interp: Any) -> Any:
        from ..rotary import eva_static

        spec = loaded.spec
        return eva_static(loaded.model, (height, width), interp, spec.native_grid, spec.pos_embed_prefix_rows)

    def make_dynamic(self, loaded: Any, interp: Any) -> tuple[Any, ViTSpec]:
        from ..rotary import eva_dynamic

        model = eva_dynamic(loaded.model, loaded.extra.get("timm_name") or loaded.source["name"], loaded.source.get("model_kwargs") or {},
                            loaded.spec.num_classes, interp, loaded.spec.pos_embed_prefix_rows)
        return model, loaded.spec


def spec_from_eva(model: Any, name: str, rotary: dict[str, Any] | None = None) -> ViTSpec:
    """The spec of a timm Eva; ``rotary``: the manifest's rotary record when a subclass adapter makes its own
    (DINOv3), else the one exporters/rotary.py knows for timm's axial and mixed RoPE."""
    from ..rotary import rotary_record

    d = int(model.embed_dim)
    ratio, kind = mlp_shape(model.blocks[0], d)
    has_abs = model.pos_embed is not None
    regs = int(model.reg_token.shape[1]) if getattr(model, "reg_token", None) is not None else 0
    prefix = int(model.num_prefix_tokens)
    rotary = rotary if rotary is not None else rotary_record(model)
    if name.startswith("eva02"):
        architecture = "eva02"
    elif rotary and "rope" in name:
        architecture = "vit-rope-mixed" if rotary["type"] == "mixed" else "vit-rope"
    else:
        architecture = "eva"
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
        global_pool=readout_pool(model, name),
        pos_embed_prefix_rows=(0 if model.no_embed_class else prefix) if has_abs else 0,
        architecture=architecture,
        abs_pos_embed=has_abs,
        rotary=rotary,
        mlp_kind=kind,
    )
