"""timm ``VisionTransformer`` with an attention-pool head (``global_pool='map'``, ``model.attn_pool``):
timm's SigLIP ViTs (``vit_*_siglip_*``, no CLS token) and any other timm ViT built with a MAP head.

The head (timm/layers/attention_pool.py ``AttentionPoolLatent``) is one learned latent query that
attends over the final tokens (the patch tokens; the prefix tokens too where the model sets
``pool_include_prefix``), then an output projection and a residual MLP. Everything else is the
plain timm ViT (TimmViT): the absolute position table re-gridded offline for a static size and in
forward (timm's ``dynamic_img_size`` path) for a dynamic one. The head takes any number of keys, so
every size a ViT supports, the MAP head supports. Under ``--variable-size`` the head's attention
gets the same key mask as the encoder (its ``attn_mask``), so padded rows pool only valid patches.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from vitdeploy.errors import UserError
from vitdeploy.spec import ViTSpec

from .base import register_family
from .timm_vit import TimmParts, TimmViT, spec_from_timm


@register_family
class TimmMapViT(TimmViT):
    """A TimmViT whose read-out is timm's AttentionPoolLatent (it wins over TimmViT: a subclass)."""

    name = "timm-vit-map"

    @classmethod
    def claims(cls, model: Any) -> bool:
        from timm.layers import AttentionPoolLatent

        return super().claims(model) and isinstance(getattr(model, "attn_pool", None), AttentionPoolLatent)

    def accept(self, model: Any, name: str) -> None:
        super().accept(model, name)
        pool = model.attn_pool
        if pool.pos_embed is not None:  # a table of fixed length over the keys: no rule re-grids it
            raise UserError(f"timm model {name!r} adds a fixed-length position table inside its attention-pool head; "
                            "vitdeploy exports MAP heads without one")
        if pool.pool not in ("token", "avg"):  # '' keeps every latent: [B, latent_len, d]
            raise UserError(f"timm model {name!r} returns its {pool.latent_len} pooled latent(s) unreduced (pool_type={pool.pool!r}); "
                            "vitdeploy exports one pooled vector per image")

    def spec(self, model: Any, name: str) -> ViTSpec:
        spec = spec_from_timm(model, name, readouts=("map",))
        label = "vit-reg-map" if spec.num_reg_tokens else "vit-map"
        return dataclasses.replace(spec, architecture=label, extra_terms=(map_head_term(model, spec),))

    def readout(self, loaded: Any) -> str:
        return "map"

    def features(self, loaded: Any, model: Any, x: Any, need_logits: bool, need_embedding: bool) -> tuple[Any, Any, Any]:
        # the pool once: timm's forward_head(x) is head(forward_head(x, pre_logits=True)), and two calls
        # would leave two copies of the head's attention in the graph (and two sets of its layers to rank)
        tokens = model.forward_features(x)
        if not (need_logits or need_embedding):
            return tokens, None, None
        pooled = model.forward_head(tokens, pre_logits=True)
        return tokens, (pooled if need_embedding else None), (model.head(pooled) if need_logits else None)

    def reference_calls(self, loaded: Any) -> dict[str, str]:
        calls = super().reference_calls(loaded)
        calls["embedding"] = "timm forward_head(forward_features(x), pre_logits=True): the attention-pool (MAP) output"
        return calls

    def module_names(self, loaded: Any) -> list[str]:
        # the head is a module of its own: check localises it, recipes and debug-precision name its cells
        # (attn_pool/qkv, attn_pool/attention-matmuls, attn_pool/attn-proj, attn_pool/mlp-fc1, attn_pool/mlp-fc2)
        return super().module_names(loaded)[:-1] + ["attn_pool", "head"]

    def variable_parts(self, loaded: Any) -> Any:
        return TimmMapParts(loaded.model)


def map_head_term(model: Any, spec: ViTSpec) -> dict[str, Any]:
    """The MAP head's cost as an ``extra_terms`` entry: MACs per image c0 + c1 L + c2 L^2, and its parameters.

    m latent queries (latent width d_l) against K keys of width d: q projection m d_l d, k and v
    projections 2 d^2 K, q.k^T and attn.v 2 m d K, output projection m d d_o, MLP 2 m d_o h. The keys
    are the L tokens less the prefix tokens unless the model pools over them (pool_include_prefix)."""
    import torch

    pool = model.attn_pool
    d = int(pool.kv.in_features)
    m = int(pool.latent_len)
    q = pool.q.in_features * pool.q.out_features if isinstance(pool.q, torch.nn.Linear) else 0
    proj = pool.proj.in_features * pool.proj.out_features if isinstance(pool.proj, torch.nn.Linear) else 0
    mlp = 0 if pool.mlp is None else pool.mlp.fc1.in_features * pool.mlp.fc1.out_features + pool.mlp.fc2.in_features * pool.mlp.fc2.out_features
    per_key = 2 * d * d + 2 * m * d
    excluded = 0 if getattr(model, "pool_include_prefix", False) else spec.num_prefix_tokens  # K = L - excluded
    return {"name": "map-head", "macs": [m * (q + proj + mlp) - excluded * per_key, per_key, 0],
            "params": int(sum(p.numel() for p in pool.parameters()))}


class TimmMapParts(TimmParts):
    """The masked forward of a MAP-head ViT: TimmParts' patch tokens, prefix and encoder; the pool masked."""

    def __init__(self, model: Any):  # TimmParts refuses attn_pool; everything else it checks is checked here
        import inspect

        if "attn_mask" not in inspect.signature(type(model.blocks[0]).forward).parameters:
            import timm

            raise UserError(f"timm {timm.__version__} blocks take no attention mask; --variable-size needs timm >= 1.0.20")
        self.model = model
        self.table = model.pos_embed
        self.prefix_rows = 0 if model.no_embed_class else model.num_prefix_tokens

    def head(self, features: Any, valid: Any) -> Any:
        import torch

        from ..variable_size import MASK_BIAS

        m = self.model
        bias = torch.where(valid, torch.zeros((), dtype=torch.float32), torch.full((), MASK_BIAS, dtype=torch.float32))
        if m.pool_include_prefix:
            bias = torch.cat([torch.zeros(bias.shape[0], m.num_prefix_tokens, dtype=torch.float32, device=bias.device), bias], dim=1)
        else:
            features = features[:, m.num_prefix_tokens:]
        pooled = m.attn_pool(features, attn_mask=bias[:, None, None, :])  # [B, 1, 1, K]: over heads and the latent
        return m.head(m.head_drop(m.fc_norm(pooled)))
