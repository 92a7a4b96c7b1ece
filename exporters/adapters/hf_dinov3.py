"""transformers' DINOv3 ViT: the headless ``DINOv3ViTModel`` (model type ``dinov3_vit``; transformers
5.x has no DINOv3 classification class). What transformers' modeling_dinov3_vit.py does:

- tokens [CLS, R registers, N patches]; no position table: rotary positions on the patch tokens'
  q and k only (``apply_rotary_pos_emb``: the prefix rows pass unrotated);
- the rotary angles come from the *patch-centre coordinates* normalised to [-1, 1] per axis
  (``get_patches_center_coordinates``: (i + 0.5) / G * 2 - 1), times ``2 pi / rope_theta^(4k/head_dim)``,
  y bands then x bands, the whole repeated twice (``rotate_half`` pairs i with i + head_dim/2).
  Training shifts/jitters/rescales those coordinates; in eval (here) they are exact;
- LayerScale on both residual branches, an MLP or a gated (SwiGLU-style) MLP, optional biases.

Because the coordinates are normalised, the angles for any grid are a function of that grid alone:
static and dynamic graphs both compute them from the input's shape, with ``Range``, ``Mul``, ``Div``,
``Sin``, ``Cos``; the export replaces transformers' ``tile`` by a concatenation and the cached
coordinate helper by the same arithmetic (``rope_forward``), so the graph has no ``Tile`` and no
``If`` (the lint checks), and equals transformers' forward (tested at square and non-square sizes).
The read-outs: ``pooler_output`` (CLS after the final norm) and the patch tokens without CLS and
registers.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import types
from typing import Any

from vitdeploy.spec import ViTSpec

from .base import register_family
from .hf_common import HFFamily, hf_base

RULE = ("transformers DINOv3ViTRopePositionEmbedding: patch-centre coordinates (i + 0.5) / G scaled to [-1, 1] "
        "per axis, angles 2 pi x coordinate / rope_theta^(4k/head_dim), recomputed for every grid in the graph")


@register_family
class HFDinov3(HFFamily):
    name = "hf-dinov3"
    model_types = ("dinov3_vit",)
    classifiers = ()  # transformers has DINOv3ViTModel and DINOv3ViTBackbone only
    backbone = "DINOv3ViTModel"
    base_attr = "dinov3_vit"  # no task class holds one: hf_base is the model itself
    takes_pos_flag = False
    keeps_trained_table = True  # no table: any processor size is the model's own

    def spec_from_config(self, config: Any, model: Any, arch: str, headless: bool) -> ViTSpec:
        spec = HFFamily.spec_from_config(self, config, model, arch, True)
        d, depth, head_dim = spec.embed_dim, spec.depth, spec.head_dim
        absent = d * sum(not bool(getattr(config, f"{name}_bias", True)) for name in ("query", "key", "value", "proj"))
        if not bool(getattr(config, "mlp_bias", True)):
            hidden = int(config.intermediate_size)
            absent += hidden * (2 if spec.mlp_kind == "gated" else 1) + d
        # beyond the standard ViT the cost model counts: LayerScale (2 d per block, element-wise) and the
        # biases DINOv3 leaves out (the key's, by default)
        terms = [{"name": "layer-scale", "macs": [0, 0, 0], "params": 2 * d * depth}]
        if absent:
            terms.append({"name": "biases absent", "macs": [0, 0, 0], "params": -absent * depth})
        rotary = {"type": "dinov3", "grid_type": "centered", "grid_indexing": "ij", "theta": float(config.rope_theta),
                  "bands": head_dim // 4, "rule": RULE}
        return dataclasses.replace(spec, num_reg_tokens=int(config.num_register_tokens), rotary=rotary,
                                   extra_terms=tuple(terms))

    def mlp_shape(self, config: Any, model: Any) -> tuple[float, str]:
        return config.intermediate_size / config.hidden_size, ("gated" if config.use_gated_mlp else "mlp")

    def abs_table(self, config: Any) -> bool:
        return False

    def wrap(self, model: Any) -> Any:
        rope = hf_base(model).rope_embeddings
        rope.forward = types.MethodType(rope_forward, rope)  # this instance only: every size's graph computes it so
        return super().wrap(model)

    # -- positions: recomputed from the input's shape, statically or not ----------------------------
    def regrid_static(self, loaded: Any, height: int, width: int, interp: Any) -> Any:
        return copy.deepcopy(loaded.model)

    def make_dynamic(self, loaded: Any, interp: Any) -> tuple[Any, ViTSpec]:
        return copy.deepcopy(loaded.model), loaded.spec

    # -- read-outs ---------------------------------------------------------------------------------
    def final_norms(self, loaded: Any) -> tuple[str | None, str | None]:
        return "norm", "norm"

    def reference_calls(self, loaded: Any) -> dict[str, str]:
        calls = super().reference_calls(loaded)
        calls["embedding"] = "transformers DINOv3ViTModel pooler_output (last_hidden_state[:, 0], after the final norm)"
        calls["patch_grid"] = ("transformers last_hidden_state[:, 1 + num_register_tokens:] reshaped row-major, "
                               "permuted to [B, d, G_h, G_w]")
        return calls

    def module_names(self, loaded: Any) -> list[str]:
        return [f"hf.model.layer.{i}" for i in range(loaded.spec.depth)] + ["hf.norm"]


def rope_forward(self: Any, pixel_values: Any) -> tuple[Any, Any]:
    """DINOv3ViTRopePositionEmbedding.forward in eval, the same arithmetic in the same order, with
    ``cat`` for ``tile`` and no cache (the sizes may be symbolic)."""
    import torch

    patch = self.config.patch_size
    ph, pw = (patch, patch) if isinstance(patch, int) else tuple(patch)
    gh, gw = pixel_values.shape[-2] // ph, pixel_values.shape[-1] // pw
    coords_h = torch.arange(0.5, gh, dtype=torch.float32, device=pixel_values.device) / gh
    coords_w = torch.arange(0.5, gw, dtype=torch.float32, device=pixel_values.device) / gw
    coords = torch.stack(torch.meshgrid(coords_h, coords_w, indexing="ij"), dim=-1).flatten(0, 1)
    coords = 2.0 * coords - 1.0
    angles = (2 * math.pi * coords[:, :, None] * self.inv_freq[None, None, :]).flatten(1, 2)
    angles = torch.cat([angles, angles], dim=-1)
    return torch.cos(angles).to(pixel_values.dtype), torch.sin(angles).to(pixel_values.dtype)
