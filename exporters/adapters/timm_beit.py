"""timm's ``Beit`` (BEiT, BEiT v2): relative-position bias tables per block or shared, optionally an
absolute table; re-gridded by timm's rule (exporters/relpos.py)."""

from __future__ import annotations

import dataclasses
from typing import Any

from vitdeploy.spec import ViTSpec

from .base import register_family
from .timm_common import TimmFamily, mlp_shape, readout_pool


@register_family
class TimmBeit(TimmFamily):
    name = "timm-beit"
    variable_size_refusal = "its relative-position bias has no per-image grid in the masked forward"

    @classmethod
    def claims(cls, model: Any) -> bool:
        from timm.models.beit import Beit

        return isinstance(model, Beit)

    def spec(self, model: Any, name: str) -> ViTSpec:
        return spec_from_beit(model, name)

    def regrid_static(self, loaded: Any, height: int, width: int, interp: Any) -> Any:
        from ..relpos import beit_static

        return beit_static(loaded.model, (height, width), interp, loaded.spec.native_grid)

    def make_dynamic(self, loaded: Any, interp: Any) -> tuple[Any, ViTSpec]:
        from ..relpos import beit_dynamic, default_max_grid

        max_grid = default_max_grid(loaded.spec.native_grid)
        model = beit_dynamic(loaded.model, interp, max_grid)
        spec = loaded.spec
        if spec.rel_pos_bias:  # the graph carries resampling weights up to this grid: declare it
            spec = dataclasses.replace(spec, max_grid=max_grid)
        return model, spec


def spec_from_beit(model: Any, name: str) -> ViTSpec:
    from ..relpos import rel_pos_record

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
        global_pool=readout_pool(model, name),
        pos_embed_prefix_rows=1 if has_abs else 0,
        architecture="beitv2" if name.startswith("beitv2") else "beit",
        abs_pos_embed=has_abs,
        rel_pos_bias=rel_pos_record(model),
        mlp_kind=kind,
    )
