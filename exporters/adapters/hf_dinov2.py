"""transformers' DINOv2: ``Dinov2ForImageClassification`` (its head reads [CLS, mean of the patch
tokens], concatenated) and the headless ``Dinov2Model``; MLP or SwiGLU blocks.

DINOv2 keeps its 518x518 table and interpolates it to every input (its forward takes no
``interpolate_pos_encoding``); its processor crops 224, so the bundle's default size is the
processor's, with the table resampled by transformers' own rule (bicubic, no antialias)."""

from __future__ import annotations

import types
from typing import Any

from .base import register_family
from .hf_common import HFFamily, hf_base


@register_family
class HFDinov2(HFFamily):
    name = "hf-dinov2"
    model_types = ("dinov2",)
    classifiers = ("Dinov2ForImageClassification",)
    backbone = "Dinov2Model"
    base_attr = "dinov2"
    takes_pos_flag = False
    keeps_trained_table = True

    def mlp_shape(self, config: Any, model: Any) -> tuple[float, str]:
        # no intermediate_size: mlp_ratio, or SwiGLU's rounded two thirds
        mlp = hf_base(model).encoder.layer[0].mlp
        gated = bool(getattr(config, "use_swiglu_ffn", False))
        hidden = mlp.down_proj.in_features if gated else mlp.fc1.out_features
        return hidden / config.hidden_size, ("gated" if gated else "mlp")

    def regrid_static(self, loaded: Any, height: int, width: int, interp: Any) -> Any:
        model = super().regrid_static(loaded, height, width, interp)
        _use_stored_table(hf_base(model).embeddings)
        return model

    def readout(self, loaded: Any) -> str:
        from ..features import has_head

        if loaded.spec.global_pool != "avg" and has_head(loaded):
            return "cls|gap"  # Dinov2ForImageClassification: [CLS, mean of the patch tokens]
        return super().readout(loaded)


def _use_stored_table(embeddings: Any) -> None:
    """transformers' DINOv2 interpolates its table to every input (a square table assumed); a static
    copy holds the table already resampled to its grid, which it then adds as it is."""

    def stored(self: Any, _embeddings: Any, _height: int, _width: int) -> Any:
        return self.position_embeddings

    embeddings.interpolate_pos_encoding = types.MethodType(stored, embeddings)  # this instance only
