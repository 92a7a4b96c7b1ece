"""vitdeploy's own reference ViT (vitdeploy.model; ``ref:CHECKPOINT``) and the bundled digits model
(``builtin:digits``, the same class with its config and weights inside the package)."""

from __future__ import annotations

import copy
from typing import Any

from vitdeploy.errors import UserError
from vitdeploy.spec import ViTSpec

from .base import FamilyAdapter, register_family


@register_family
class ReferenceViT(FamilyAdapter):
    name = "reference-vit"
    token_merge_blocks = "reference"
    library = "vitdeploy"
    variable_size_refusal = None

    def spec(self, config: dict[str, Any]) -> ViTSpec:
        """The spec a reference checkpoint's config (or the builtin's) records; CLS or GAP read-out."""
        spec = ViTSpec.from_dict(config["spec"])
        if spec.global_pool not in ("token", "avg"):
            raise UserError(f"the reference ViT reads out by CLS ('token') or GAP ('avg'), not {spec.global_pool!r}")
        return spec

    def regrid_static(self, loaded: Any, height: int, width: int, interp: Any) -> Any:
        from vitdeploy.model import with_resolution

        return with_resolution(loaded.model, height, width, interp)

    def make_dynamic(self, loaded: Any, interp: Any) -> tuple[Any, ViTSpec]:
        model = copy.deepcopy(loaded.model)
        model.interpolation = interp
        return model, loaded.spec

    def features(self, loaded: Any, model: Any, x: Any, need_logits: bool, need_embedding: bool) -> tuple[Any, Any, Any]:
        tokens = model.forward_features(x)
        logits = model.forward_head(tokens) if need_logits else None
        pooled = None
        if need_embedding:
            pooled = model.pool(tokens)  # CLS or GAP, fc_norm applied; DeiT: (h, dist row)
            if isinstance(pooled, tuple):
                pooled = (pooled[0] + pooled[1]) / 2
        return tokens, pooled, logits

    def reference_calls(self, loaded: Any) -> dict[str, str]:
        return {"logits": "vitdeploy.model.VisionTransformer forward(x)",
                "embedding": "VisionTransformer pool(forward_features(x)) (CLS row or GAP, then fc_norm where the spec has one; DeiT: mean of the CLS and DIST rows)",
                "patch_grid": "VisionTransformer forward_features(x)[:, num_prefix_tokens:] reshaped row-major, permuted to [B, d, G_h, G_w]"}

    def variable_parts(self, loaded: Any) -> Any:
        return ReferenceParts(loaded.model)


@register_family
class BuiltinDigits(ReferenceViT):
    """``builtin:digits``: the reference ViT trained on the digits (scripts/train_digits.py)."""

    name = "builtin-digits"


class ReferenceParts:
    """The reference ViT (vitdeploy.model) split into the steps the masked forward needs."""

    def __init__(self, model: Any):
        self.model = model
        self.table = model.pos_embed
        self.prefix_rows = model.spec.pos_embed_prefix_rows

    def patch_tokens(self, x: Any) -> Any:
        return self.model.patch_embed(x)[0]

    def prefix_tokens(self, batch: int) -> list[Any]:
        return self.model._prefix_tokens(batch)

    def encode(self, z: Any, key_bias: Any) -> Any:
        for block in self.model.blocks:
            z = block(z, key_bias)
        return self.model.norm(z)

    def head(self, features: Any, valid: Any) -> Any:
        return self.model.forward_head(features, valid)  # masked mean for GAP; CLS row otherwise
