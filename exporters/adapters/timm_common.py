"""What timm's ViT-family classes share: the forward_features / forward_head read-outs, the MLP shape,
the pooling check, and the lookup from a built timm model to its adapter (or one line why not).

A ViT in the chapter's sense has a patch grid from one Conv, prefix tokens, a Pre-LN encoder with
global attention and a CLS or GAP readout. timm implements that in three classes that differ only in
how position enters: ``VisionTransformer`` (absolute table), ``Beit`` (relative-position bias tables,
optionally an absolute table) and ``Eva`` (rotary frequencies, EVA-02 also an absolute table); each
has its adapter (timm_vit.py, timm_beit.py, timm_eva.py). Everything else gets one line saying why it
is out of reach.
"""

from __future__ import annotations

from typing import Any

from vitdeploy.errors import UserError

from .base import FamilyAdapter, adapters_of

# Classes that are vision transformers but not the global-attention, patch-grid ViT vitdeploy exports.
OUT_OF_REACH = {
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


class TimmFamily(FamilyAdapter):
    """A timm class with the forward_features / forward_head split (ViT, BEiT, EVA)."""

    library = "timm"

    @classmethod
    def claims(cls, model: Any) -> bool:
        """Is ``model`` an instance of the timm class this adapter exports?"""
        raise NotImplementedError

    def accept(self, model: Any, name: str) -> None:
        """Refuse (one UserError line) a variant of the class the export does not express."""

    def spec(self, model: Any, name: str) -> Any:
        raise NotImplementedError

    def default_resolution(self, model: Any) -> tuple[int, int] | None:
        """The size to export at when none is asked, where it differs from the spec's native size (the
        weight's preprocessing size for a table kept at another grid); None: the native size."""
        return None

    def features(self, loaded: Any, model: Any, x: Any, need_logits: bool, need_embedding: bool) -> tuple[Any, Any, Any]:
        tokens = model.forward_features(x)
        logits = model.forward_head(tokens) if need_logits else None
        pooled = None
        if need_embedding:
            if loaded.extra.get("projection_head"):  # CLIP-style: the embedding is the projection of the read-out
                pooled = model.forward_head(tokens)
            else:
                pooled = model.forward_head(tokens, pre_logits=True)  # timm's own semantics (fc_norm, DeiT's mean)
        return tokens, pooled, logits

    def reference_calls(self, loaded: Any) -> dict[str, str]:
        return {"logits": "timm model(x)", "embedding": "timm forward_head(forward_features(x), pre_logits=True)",
                "patch_grid": "timm forward_features(x)[:, num_prefix_tokens:] reshaped row-major to [B, G_h, G_w, d], permuted to [B, d, G_h, G_w]"}


def timm_adapter(model: Any, name: str) -> TimmFamily:
    """The adapter of a built timm model, or a UserError naming why this model is out of reach."""
    claimed = [cls for cls in adapters_of("timm") if cls.claims(model)]
    # the most specific claimant: an adapter that subclasses another (a MAP-head ViT under TimmViT) wins
    specific = [cls for cls in claimed if not any(other is not cls and issubclass(other, cls) for other in claimed)]
    if specific:
        adapter = specific[0]()
        adapter.accept(model, name)
        return adapter
    kind = type(model).__name__
    if kind in OUT_OF_REACH:
        raise UserError(f"timm model {name!r} is a {kind}: it {OUT_OF_REACH[kind]}")
    raise UserError(f"timm model {name!r} is a {kind}, not a ViT-family model vitdeploy can export "
                    "(supported: VisionTransformer incl. MAP-head SigLIP, Beit, Eva incl. DINOv3, NaFlexVit)")


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


def readout_pool(model: Any, name: str) -> str:
    """timm's global_pool, if it is a read-out vitdeploy exports (CLS or GAP)."""
    pool = model.global_pool
    if pool not in ("token", "avg"):
        raise UserError(f"timm model {name!r} uses global_pool={pool!r}; vitdeploy supports 'token' (CLS) and 'avg' (GAP) readouts")
    return pool


def rebuild_timm(loaded: Any, **overrides: Any) -> Any:
    """The loaded timm model built again by name with ``overrides`` (e.g. dynamic_img_size=True), same weights."""
    import timm
    import torch

    name = loaded.extra.get("timm_name") or loaded.source["name"]  # an hf-hub: name pinned to its config's commit
    kwargs = dict(loaded.source.get("model_kwargs") or {})
    kwargs.update(num_classes=loaded.spec.num_classes, **overrides)
    state = loaded.model.state_dict()
    # Built on the meta device, the rebuild skips timm's weight init (ViT-B/16: 1.6-2.5 s of random
    # numbers that load_state_dict overwrites) and takes the loaded tensors as they are; a model that
    # computes a buffer outside its state dict (rotary tables) would keep it on meta: rebuild it fully.
    with torch.device("meta"):
        model = timm.create_model(name, pretrained=False, **kwargs)
    model.load_state_dict(state, strict=True, assign=True)
    if any(t.is_meta for t in (*model.parameters(), *model.buffers())):
        model = timm.create_model(name, pretrained=False, **kwargs)
        model.load_state_dict(state, strict=True)
    return model
