"""transformers' DINOv2 with registers: ``Dinov2WithRegistersForImageClassification`` and the headless
``Dinov2WithRegistersModel`` (model type ``dinov2_with_registers``).

What differs from DINOv2 (hf_dinov2.py), as transformers' modeling_dinov2_with_registers.py has it:

- register tokens sit between CLS and the patches ([CLS, R registers, N patches]); the position
  table has rows for CLS and the patches only (the registers are added after the table);
- the classifier reads [CLS, mean of the patch tokens] with the registers left out of the mean
  (``sequence_output[:, 1 + num_register_tokens:]``);
- the table is resampled bicubic *with antialias* (``interpolate_pos_encoding``: ``antialias=True``),
  so that is the bundle's convention (``position_convention``). TensorRT's parser has no antialiased
  Resize, so the dynamic graph does not carry one: the resampling is separable and linear with weights
  that depend only on the grid, so the bundle stores torch's own antialiased weights per output size
  (up to ``max_grid``) and the graph gathers the rows for the input's grid and applies them with two
  MatMuls on constants (position subgraph: fp32 in the fp16 graph, no Q/DQ in the int8 one).
"""

from __future__ import annotations

import copy
import dataclasses
import types
from typing import Any

from vitdeploy.errors import UserError
from vitdeploy.spec import ViTSpec

from .base import register_family
from .hf_common import HFFamily, hf_base
from .hf_dinov2 import HFDinov2

# transformers' rule (Dinov2WithRegistersEmbeddings.interpolate_pos_encoding)
RULE = ("transformers Dinov2WithRegistersEmbeddings.interpolate_pos_encoding: bicubic, align_corners=False, "
        "antialias=True (torch's a=-0.5 cubic, widened when shrinking)")


@register_family
class HFDinov2Registers(HFDinov2):
    name = "hf-dinov2-reg"
    model_types = ("dinov2_with_registers",)
    classifiers = ("Dinov2WithRegistersForImageClassification",)
    backbone = "Dinov2WithRegistersModel"
    base_attr = "dinov2_with_registers"

    def spec_from_config(self, config: Any, model: Any, arch: str, headless: bool) -> ViTSpec:
        spec = HFFamily.spec_from_config(self, config, model, arch, headless)
        regs = int(config.num_register_tokens)
        d, depth = spec.embed_dim, spec.depth
        # beyond the standard ViT: LayerScale (2 d per block: element-wise, no MACs) and, on the
        # classifier, the second half of its [CLS, mean of patches] input (d K MACs and weights)
        terms: list[dict[str, Any]] = [{"name": "layer-scale", "macs": [0, 0, 0], "params": 2 * d * depth}]
        if not headless:
            terms.append({"name": "head-on-patch-mean", "macs": [d * spec.num_classes, 0, 0], "params": d * spec.num_classes})
        return dataclasses.replace(spec, num_reg_tokens=regs, extra_terms=tuple(terms))

    def position_convention(self, requested: Any) -> Any:
        from vitdeploy.posembed import PosEmbedInterpolation

        own = PosEmbedInterpolation("bicubic", False, True)
        if requested not in (PosEmbedInterpolation(), own):  # the CLI default gives way to the model's rule
            raise UserError(f"{self.name} models resample their position table by {RULE}; "
                            "choose that convention (--pos-interp bicubic --antialias) or leave the default")
        return own

    # -- positions ---------------------------------------------------------------------------------
    def make_dynamic(self, loaded: Any, interp: Any) -> tuple[Any, ViTSpec]:
        from ..relpos import default_max_grid

        self.position_convention(interp)
        spec = loaded.spec
        top = default_max_grid(spec.native_grid)
        model = copy.deepcopy(loaded.model)
        embeddings = hf_base(model).embeddings
        embeddings.antialiased_table = antialiased_table(embeddings.position_embeddings.detach(), spec.native_grid, top,
                                                         spec.patch_size)
        embeddings.interpolate_pos_encoding = types.MethodType(_gathered_table, embeddings)  # this instance only
        return model, dataclasses.replace(spec, max_grid=top)

    # -- read-outs ---------------------------------------------------------------------------------
    def features(self, loaded: Any, model: Any, x: Any, need_logits: bool, need_embedding: bool) -> tuple[Any, Any, Any]:
        import torch

        tokens = model.backbone(x).last_hidden_state
        if self.readout(loaded) != "cls|gap":  # the headless model: pooler_output, CLS after the layernorm
            return tokens, tokens[:, 0], None
        patches = tokens[:, 1 + loaded.spec.num_reg_tokens:]  # registers are not patches
        pooled = torch.cat([tokens[:, 0], patches.mean(dim=1)], dim=1)
        return tokens, pooled, (model.hf.classifier(pooled) if need_logits else None)

    def reference_calls(self, loaded: Any) -> dict[str, str]:
        calls = super().reference_calls(loaded)
        if self.readout(loaded) == "cls|gap":
            calls["embedding"] = ("transformers [last_hidden_state[:, 0], mean of last_hidden_state[:, 1 + num_register_tokens:]] "
                                  "concatenated (after the final layernorm): the classifier's input")
        else:
            calls["embedding"] = "transformers pooler_output (last_hidden_state[:, 0], after the final layernorm)"
        calls["patch_grid"] = ("transformers last_hidden_state[:, 1 + num_register_tokens:] reshaped row-major, "
                               "permuted to [B, d, G_h, G_w]")
        return calls


def axis_weights(size: int, largest: int) -> Any:
    """[largest, largest, size]: row g-1 holds, in its first g rows, torch's antialiased bicubic weights
    (align_corners=False) that take a ``size``-long axis to a g-long one; read off torch itself by
    resampling the identity, so the weights are torch's to the bit."""
    import torch
    import torch.nn.functional as F

    eye = torch.eye(size, dtype=torch.float64).reshape(1, 1, size, size)  # column c: the unit vector e_c along the rows
    out = torch.zeros(largest, largest, size, dtype=torch.float64)
    for g in range(1, largest + 1):  # the columns keep their size (weights: the identity), the rows go to g
        resized = F.interpolate(eye, size=(g, size), mode="bicubic", align_corners=False, antialias=True)
        out[g - 1, :g] = resized[0, 0]  # [g, size]: output cell i reads source cell c with weight [i, c]
    return out.float()


def antialiased_table(table: Any, native: tuple[int, int], largest: tuple[int, int], patch: tuple[int, int]) -> Any:
    """A module that gives the table for an input's (H, W), its weights as buffers (graph constants)."""
    import torch

    class AntialiasedTable(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            gh, gw = native
            self.patch = patch
            self.register_buffer("cls_row", table[:, :1].float().clone(), persistent=False)
            self.register_buffer("grid", table[0, 1:].float().reshape(gh, gw * table.shape[-1]).clone(), persistent=False)
            self.register_buffer("rows", axis_weights(gh, largest[0]), persistent=False)
            self.register_buffer("cols", axis_weights(gw, largest[1]), persistent=False)

        def forward(self, height: Any, width: Any) -> Any:
            gh, gw = height // self.patch[0], width // self.patch[1]
            dim = self.cls_row.shape[-1]
            rows = self.rows[gh - 1, :gh]  # [G_h, native G_h]
            cols = self.cols[gw - 1, :gw]  # [G_w, native G_w]
            along_h = (rows @ self.grid).reshape(gh, -1, dim).permute(0, 2, 1)  # [G_h, d, native G_w]
            both = (along_h @ cols.T).permute(0, 2, 1)  # [G_h, G_w, d]
            return torch.cat([self.cls_row, both.reshape(1, -1, dim)], dim=1)

    return AntialiasedTable()


def _gathered_table(self: Any, embeddings: Any, height: Any, width: Any) -> Any:
    return self.antialiased_table(height, width).to(embeddings.dtype)
