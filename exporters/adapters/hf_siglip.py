"""transformers' SigLIP and SigLIP 2 image towers.

SigLIP (``SiglipVisionModel``; the dual encoder ``SiglipModel`` as published, e.g.
google/siglip-base-patch16-224 and the fixed-size SigLIP 2 checkpoints such as google/siglip2-base-patch16-224,
exports its ``vision_model``): no class token, a G x G table, ``post_layernorm`` on every token, and the
image embedding is the attention-pool head's output (``SiglipMultiheadAttentionPoolingHead``: one learned
probe attends over the tokens, then LayerNorm + MLP with a residual: ``pooler_output``, what
``SiglipModel.get_image_features`` returns). ``SiglipForImageClassification`` classifies the mean of the
(normalised) tokens; its tower's attention-pool head is not on that path and not in the graph.
Positions: transformers' ``interpolate_pos_encoding`` (bicubic, no antialias) in-graph for dynamic graphs;
a static size holds the table resampled offline (hf_clip.HFTower).

SigLIP 2 NaFlex (``Siglip2VisionModel``, ``Siglip2ForImageClassification``, the dual encoder ``Siglip2Model``)
takes patchified pixels [B, N, C*P*P] with ``pixel_attention_mask`` and ``spatial_shapes``: its processor
resizes each image to keep its aspect ratio under ``max_num_patches``. A bundle takes one image size
(square: the size the processor gives a square image; any other with ``--resolution``), so the graph takes
the image: the processor's patchify followed by the Linear patch embedding is one stride-P Conv with the
Linear's weight reordered (row order (p_y, p_x, c), as ``convert_image_to_patches`` flattens), every patch
valid (no mask), and the position table resized for that grid by transformers' own rule
(``Siglip2VisionEmbeddings.resize_positional_embeddings``: bilinear with antialias), computed offline.
``--dynamic-resolution`` is refused (an antialiased resize has no in-graph form TensorRT parses); the
aspect-keeping variable-size path is timm's NaFlexVit (exporters/adapters/timm_naflex.py, where present).
"""

from __future__ import annotations

import copy
from typing import Any

from vitdeploy.errors import UserError
from vitdeploy.lazy import require
from vitdeploy.spec import ViTSpec

from .base import register_family
from .hf_clip import HFTower
from .hf_common import hf_base


def map_head_term(model: Any, spec: ViTSpec) -> dict[str, Any]:
    """The attention-pool head's cost: k, v of L rows; q, the output projection and the MLP once; the probe's
    scores and weighted sum over L rows (c0 + c1 L, per image)."""
    head = hf_base(model).head
    d, hidden = spec.embed_dim, head.mlp.fc1.out_features
    return {"name": "map-head", "macs": [2 * d * d + 2 * d * hidden, 2 * d * d + 2 * d, 0],
            "params": sum(p.numel() for p in head.parameters())}


@register_family
class HFSiglip(HFTower):
    name = "hf-siglip"
    model_types = ("siglip", "siglip_vision_model")
    classifiers = ("SiglipForImageClassification",)
    backbone = "SiglipVisionModel"
    published_as = ("SiglipModel",)
    class_token = False

    dual_encoder = "SiglipModel"
    tower_class = "SiglipVisionModel"  # the image embedding is the tower's pooler_output

    def pool(self, model: Any, headless: bool) -> str:
        return "map" if headless and getattr(hf_base(model), "head", None) is not None else "avg"

    def cost_terms(self, model: Any, spec: ViTSpec) -> list[dict[str, Any]]:
        return [map_head_term(model, spec)] if spec.global_pool == "map" else []

    def final_norms(self, loaded: Any) -> tuple[str | None, str | None]:
        return "post_layernorm", "post_layernorm"

    def features(self, loaded: Any, model: Any, x: Any, need_logits: bool, need_embedding: bool) -> tuple[Any, Any, Any]:
        out = model.backbone(x)
        tokens = out.last_hidden_state
        if loaded.spec.global_pool == "map":
            return tokens, out.pooler_output, None
        pooled = tokens.mean(dim=1)  # SiglipForImageClassification's read-out (and a head-less tower's)
        return tokens, pooled, (model.hf.classifier(pooled) if need_logits else None)

    def reference_calls(self, loaded: Any) -> dict[str, str]:
        cls = self.classifiers[0].replace("ForImageClassification", "VisionModel")
        pooled = (f"transformers {cls} pooler_output (the attention-pool head on last_hidden_state)"
                  if loaded.spec.global_pool == "map" else "transformers mean of last_hidden_state (after post_layernorm), "
                  f"what {self.classifiers[0]}'s classifier reads")
        return {"logits": f"transformers {self.classifiers[0]}(pixel_values).logits", "embedding": pooled,
                "patch_grid": "transformers last_hidden_state (after post_layernorm; no class token) reshaped row-major, "
                              "permuted to [B, d, G_h, G_w]"}


@register_family
class HFSiglip2(HFSiglip):
    name = "hf-siglip2"
    model_types = ("siglip2", "siglip2_vision_model")
    classifiers = ("Siglip2ForImageClassification",)
    backbone = "Siglip2VisionModel"
    published_as = ("Siglip2Model",)
    dual_encoder = "Siglip2Model"
    tower_class = "Siglip2VisionModel"
    keeps_trained_table = True  # its table is resized to every image's grid; the processor decides the size
    # transformers 4.x: F.interpolate(antialias=True), a Resize TensorRT's parser rejects; 5.x: explicit weights guarded
    # by runtime checks (aten._is_all_true) the ONNX exporter cannot convert
    dynamic_refusal = ("resize their position table with antialiased bilinear interpolation (transformers' "
                       "Siglip2VisionEmbeddings.resize_positional_embeddings), which has no in-graph form TensorRT parses")
    RULE = ("bilinear", False, True)  # transformers' Siglip2 resize: bilinear, align_corners=False, antialias

    def table_size(self, vision: Any) -> Any:
        side = int(round(vision.num_patches ** 0.5))
        return side * vision.patch_size

    def fixed_size(self, processor: Any) -> tuple[int, int] | None:
        """What the processor gives a square image: the largest square grid within max_num_patches."""
        patches, patch = getattr(processor, "max_num_patches", None), getattr(processor, "patch_size", None)
        if not patches or not patch:
            return None
        side = int(patches ** 0.5)
        while (side + 1) ** 2 <= patches:
            side += 1
        return side * int(patch), side * int(patch)

    def wrap(self, model: Any) -> Any:
        return siglip2_image_module(model)

    def regrid_static(self, loaded: Any, height: int, width: int, interp: Any) -> Any:
        if (interp.method, interp.align_corners, interp.antialias) != self.RULE:
            raise UserError(f"SigLIP 2 resizes its position table bilinear with antialias (transformers' rule); "
                            f"export {height}x{width} with --pos-interp bilinear --no-align-corners --antialias")
        model = copy.deepcopy(loaded.model)
        model.set_grid(loaded.spec.grid(height, width))
        return model

    def make_dynamic(self, loaded: Any, interp: Any) -> tuple[Any, ViTSpec]:
        raise UserError(f"--dynamic-resolution: {self.name} models {self.dynamic_refusal}; export each size with "
                        "--resolution HxW --pos-interp bilinear --antialias (the table is resized offline)")


def siglip2_image_module(model: Any) -> Any:
    """transformers' SigLIP 2 tower (or classifier) on images [B, C, H, W]: forward -> logits, backbone -> its output.

    The class is made here so that importing this module does not import torch."""
    torch = require("torch")
    from transformers.modeling_outputs import BaseModelOutputWithPooling

    class Siglip2Image(torch.nn.Module):
        def __init__(self, inner: Any):
            super().__init__()
            self.hf = inner
            embeddings = hf_base(inner).embeddings
            linear, patch = embeddings.patch_embedding, embeddings.patch_size
            dim, channels = linear.out_features, linear.in_features // (patch * patch)
            # the processor flattens each patch as (p_y, p_x, c): that Linear is a stride-P Conv with its weight reordered
            self.patch_embed = torch.nn.Conv2d(channels, dim, patch, stride=patch)
            with torch.no_grad():
                self.patch_embed.weight.copy_(linear.weight.reshape(dim, patch, patch, channels).permute(0, 3, 1, 2))
                self.patch_embed.bias.copy_(linear.bias)
            side = embeddings.position_embedding_size
            self.register_buffer("pos_table", torch.zeros(1, 1, dim), persistent=False)
            self.set_grid((side, side))

        def set_grid(self, grid: tuple[int, int]) -> None:
            """The table resized to ``grid`` by transformers' own rule (antialiased bilinear), held as a constant."""
            embeddings = hf_base(self.hf).embeddings
            side = embeddings.position_embedding_size
            table = embeddings.position_embedding.weight.detach().reshape(side, side, -1)
            shapes = torch.tensor([list(grid)], dtype=torch.long)
            with torch.no_grad():
                self.pos_table = embeddings.resize_positional_embeddings(table, shapes, max_length=grid[0] * grid[1])

        def backbone(self, pixel_values: Any) -> Any:
            """Siglip2VisionModel.forward on every patch of the image (no padding, so no mask)."""
            base = hf_base(self.hf)
            hidden = self.patch_embed(pixel_values).flatten(2).transpose(1, 2) + self.pos_table
            hidden = base.encoder(inputs_embeds=hidden).last_hidden_state
            tokens = base.post_layernorm(hidden)
            pooled = base.head(tokens) if getattr(base, "use_head", False) else None
            return BaseModelOutputWithPooling(last_hidden_state=tokens, pooler_output=pooled)

        def forward(self, pixel_values: Any) -> Any:
            tokens = self.backbone(pixel_values).last_hidden_state
            return self.hf.classifier(tokens.mean(dim=1))  # Siglip2ForImageClassification, every patch valid

    return Siglip2Image(model)
