"""transformers' CLIP image tower: ``CLIPVisionModel`` (the CLS row through ``post_layernorm``: its
pooler_output), ``CLIPVisionModelWithProjection`` (that, through ``visual_projection``: ``image_embeds``, the
joint image-text embedding), ``CLIPForImageClassification`` (a classifier on the mean of the patch tokens),
and the dual encoder as published (``CLIPModel``, e.g. openai/clip-vit-base-patch32), which exports its
image tower with its projection: ``CLIPVisionModelWithProjection`` built from ``config.vision_config``
(``projection_dim`` from the top-level config), the text tower's weights left unread.

CLIP has a ``pre_layrnorm`` before the first block, a bias-free patch Conv, and applies ``post_layernorm`` to
the CLS row only: ``last_hidden_state`` (hence the patch grid and the classifier's mean) is the last block's
output, un-normalised. The position table (CLS row + G x G grid) follows transformers'
``interpolate_pos_encoding`` (bicubic, align_corners=False, no antialias) for dynamic graphs; a static size
holds the table resampled offline by the bundle's convention.

``HFTower`` is what the CLIP and SigLIP towers share (hf_siglip.py): the spec read from the vision config,
the stored table at a static size, the module names.
"""

from __future__ import annotations

import copy
import dataclasses
import types
from typing import Any, ClassVar

from vitdeploy.errors import UserError
from vitdeploy.spec import ViTSpec

from .base import register_family
from .hf_common import HFFamily, pair_of, hf_base


def vision_config(config: Any) -> Any:
    """The image tower's config: ``config.vision_config`` of a dual encoder / classifier, else the config itself."""
    sub = getattr(config, "vision_config", None)
    return sub if sub is not None else config


class HFTower(HFFamily):
    """An image tower of a transformers dual encoder (CLIP, SigLIP): no backbone attribute of its own
    (``base_attr`` is the classifier's / projection model's ``vision_model``, absent on the bare tower)."""

    base_attr = "vision_model"
    class_token: ClassVar[bool] = True
    dual_encoder: ClassVar[str] = ""  # the published dual-encoder class (CLIPModel, SiglipModel): exports its image tower
    tower_class: ClassVar[str] = ""  # the class that tower is built as

    def load_plan(self, config: Any, arch: str) -> tuple[str, Any, bool]:
        if arch == self.dual_encoder:  # the dual encoder: its image tower, built from its vision sub-config
            tower = copy.deepcopy(config.vision_config)
            self.adapt_tower(tower, config)
            tower.architectures = [self.tower_class]
            return self.tower_class, tower, True
        return arch, config, arch not in self.classifiers

    def adapt_tower(self, tower: Any, config: Any) -> None:
        """What the tower's sub-config takes from the dual encoder's (CLIP: the projection width)."""

    # -- the spec ----------------------------------------------------------------------------------
    def spec_from_config(self, config: Any, model: Any, arch: str, headless: bool) -> ViTSpec:
        vision = vision_config(config)
        size, patch = pair_of(self.table_size(vision)), pair_of(vision.patch_size)
        if size[0] % patch[0] or size[1] % patch[1]:  # e.g. google/siglip-so400m-patch14-384: 384 = 27 x 14 + 6
            raise UserError(f"{arch}: its {size[0]}x{size[1]} images are not whole {patch[0]}x{patch[1]} patches (transformers' "
                            "patch Conv drops the remainder rows and columns); vitdeploy bundles take whole patches only")
        spec = ViTSpec(
            image_size=size,
            patch_size=patch,
            embed_dim=vision.hidden_size,
            depth=vision.num_hidden_layers,
            num_heads=vision.num_attention_heads,
            num_classes=0 if headless else config.num_labels,
            in_chans=vision.num_channels,
            mlp_ratio=vision.intermediate_size / vision.hidden_size,
            class_token=self.class_token,
            global_pool=self.pool(model, headless),
            pos_embed_prefix_rows=int(self.class_token),
            architecture=f"hf-{config.model_type}",
        )
        return dataclasses.replace(spec, extra_terms=tuple(self.cost_terms(model, spec)))

    def table_size(self, vision: Any) -> Any:
        return vision.image_size

    def pool(self, model: Any, headless: bool) -> str:
        """ViTSpec.global_pool: 'token' (CLS), 'avg' (mean of the patch tokens) or 'map' (attention pool)."""
        raise NotImplementedError

    def cost_terms(self, model: Any, spec: ViTSpec) -> list[dict[str, Any]]:
        """extra_terms (costs.py): what the tower computes beyond the chapter's ViT."""
        return []

    def readout(self, loaded: Any) -> str:
        return {"token": "cls", "avg": "gap", "map": "map"}[loaded.spec.global_pool]

    # -- positions ---------------------------------------------------------------------------------
    def regrid_static(self, loaded: Any, height: int, width: int, interp: Any) -> Any:
        """The table resampled offline to the new grid by the bundle's convention, added as it is (the model
        runs its interpolate_pos_encoding path, which here returns the stored table: no size check, no Resize)."""
        import torch

        from vitdeploy.posembed import resample_pos_embed

        spec = loaded.spec
        model = copy.deepcopy(loaded.model)
        embeddings = hf_base(model).embeddings
        with torch.no_grad():
            table = resample_pos_embed(embeddings.position_embedding.weight.detach()[None], spec.grid(height, width),
                                       spec.native_grid, spec.pos_embed_prefix_rows, interp.method, interp.align_corners,
                                       interp.antialias)
        use_stored_table(embeddings, table[0])
        model.interpolate_pos_encoding = True
        return model

    def make_dynamic(self, loaded: Any, interp: Any) -> tuple[Any, ViTSpec]:
        model = self.interpolating(loaded, interp, "--dynamic-resolution")
        vars(hf_base(model).embeddings).pop("interpolate_pos_encoding", None)  # transformers' own rule, in-graph
        return model, loaded.spec

    def wrap(self, model: Any) -> Any:
        """The model in vitdeploy's wrapper, its table read as a tensor: the dynamo exporter would name the folded
        ``position_embedding(position_ids)`` lookup ``embedding``, the name of the graph's output."""
        wrapped = super().wrap(model)
        embeddings = hf_base(model).embeddings
        use_stored_table(embeddings, embeddings.position_embedding.weight.detach())
        wrapped.interpolate_pos_encoding = True
        return wrapped

    # -- modules -----------------------------------------------------------------------------------
    def module_names(self, loaded: Any) -> list[str]:
        names = {name for name, _ in loaded.model.named_modules()}
        base = "hf.vision_model" if "hf.vision_model" in names else "hf"
        blocks = [f"{base}.encoder.layers.{i}" for i in range(loaded.spec.depth)]
        # the tower's own parts in forward order: CLIP's pre-norm, the final norm, SigLIP's attention-pool head,
        # CLIP's projection, a classifier (module_output_map drops those a graph does not compute)
        ends = [f"{base}.post_layernorm", f"{base}.head", "hf.visual_projection", "hf.classifier"]
        return [m for m in (f"{base}.pre_layrnorm",) if m in names] + blocks + [m for m in ends if m in names]


def use_stored_table(embeddings: Any, table: Any) -> None:
    """Hold ``table`` [rows, d] as the tower's position table and make its interpolate_pos_encoding return
    it as it is (this instance only): a static graph adds a constant."""
    import torch

    embeddings.position_embedding = torch.nn.Embedding.from_pretrained(table.contiguous(), freeze=True)

    def stored(self: Any, _embeddings: Any, _height: int, _width: int) -> Any:
        return self.position_embedding.weight.unsqueeze(0)

    embeddings.interpolate_pos_encoding = types.MethodType(stored, embeddings)


@register_family
class HFCLIP(HFTower):
    name = "hf-clip"
    model_types = ("clip", "clip_vision_model")
    classifiers = ("CLIPForImageClassification",)
    backbone = "CLIPVisionModel"
    published_as = ("CLIPVisionModelWithProjection", "CLIPModel")

    dual_encoder = "CLIPModel"
    tower_class = "CLIPVisionModelWithProjection"  # the image tower with the projection into the joint space

    def adapt_tower(self, tower: Any, config: Any) -> None:
        tower.projection_dim = config.projection_dim  # the sub-config's own default (512) need not be it

    def loaded_extra(self, model: Any) -> dict[str, Any]:
        projection = getattr(model, "visual_projection", None)
        return {"projection_head": {"dim": int(projection.out_features)}} if projection is not None else {}

    def pool(self, model: Any, headless: bool) -> str:
        return "token" if headless else "avg"  # CLIPForImageClassification: mean of the patch tokens

    def cost_terms(self, model: Any, spec: ViTSpec) -> list[dict[str, Any]]:
        d = spec.embed_dim
        terms = [{"name": "pre-layernorm", "macs": [0, 0, 0], "params": 2 * d}]  # LayerNorm before block 0
        projection = getattr(model, "visual_projection", None)
        if projection is not None:  # one bias-free d x P matrix on the pooled row
            terms.append({"name": "projection", "macs": [d * projection.out_features, 0, 0],
                          "params": d * projection.out_features})
        return terms

    def final_norms(self, loaded: Any) -> tuple[str | None, str | None]:
        # post_layernorm normalises the pooled CLS row only; the classifier reads the un-normalised tokens' mean
        return None, (None if loaded.spec.global_pool == "avg" else "post_layernorm")

    def features(self, loaded: Any, model: Any, x: Any, need_logits: bool, need_embedding: bool) -> tuple[Any, Any, Any]:
        out = model.backbone(x)
        tokens, hf = out.last_hidden_state, model.hf
        if loaded.spec.global_pool == "avg":  # CLIPForImageClassification
            pooled = tokens[:, 1:].mean(dim=1)
            return tokens, pooled, (hf.classifier(pooled) if need_logits else None)
        pooled = out.pooler_output
        if hasattr(hf, "visual_projection"):
            pooled = hf.visual_projection(pooled)  # image_embeds
        return tokens, pooled, None

    def reference_calls(self, loaded: Any) -> dict[str, str]:
        classifier = loaded.spec.global_pool == "avg"
        return {"logits": "transformers CLIPForImageClassification(pixel_values).logits",
                "embedding": "transformers mean of last_hidden_state[:, 1:] (what CLIPForImageClassification's classifier reads)"
                             if classifier else "transformers CLIPVisionModel pooler_output (post_layernorm of last_hidden_state[:, 0])",
                "projection": "transformers CLIPVisionModelWithProjection(pixel_values).image_embeds (= CLIPModel.get_image_features)",
                "patch_grid": "transformers last_hidden_state[:, 1:] (the last block's tokens: CLIP normalises only the CLS row) "
                              "reshaped row-major, permuted to [B, d, G_h, G_w]"}
