"""transformers' BEiT: relative-position bias (per block or shared), optionally an absolute table, and
a mean-pooled read-out through the pooler's LayerNorm. Every size, static or dynamic, is transformers'
own model at that size: its bias tables are resized by its rule (bilinear), with the index rebuilt
traceably (exporters/relpos.py, hf_beit_traceable)."""

from __future__ import annotations

from typing import Any

from vitdeploy.spec import ViTSpec

from .base import register_family
from .hf_common import HFFamily

# BEiT's relative bias at another grid, as transformers computes it (BeitRelativePositionBias.forward)
BEIT_RULE = ("transformers BeitRelativePositionBias: the (2G_h-1)x(2G_w-1) offset table resized bilinearly "
             "(align_corners=False) to the new grid's offsets; CLS rows copied; index rebuilt for the new grid")


@register_family
class HFBeit(HFFamily):
    name = "hf-beit"
    model_types = ("beit",)
    classifiers = ("BeitForImageClassification",)
    backbone = "BeitModel"
    base_attr = "beit"

    def mean_pooled(self, config: Any) -> bool:
        return bool(getattr(config, "use_mean_pooling", False))

    def abs_table(self, config: Any) -> bool:
        return bool(getattr(config, "use_absolute_position_embeddings", False))

    def rel_pos_bias(self, config: Any) -> dict[str, Any] | None:
        if not (config.use_relative_position_bias or config.use_shared_relative_position_bias):
            return None
        return {"scope": "shared" if config.use_shared_relative_position_bias else "per-block", "rule": BEIT_RULE,
                "table": "(2G_h-1)(2G_w-1)+3 rows x heads", "transformers_class": "BeitRelativePositionBias"}

    def regrid_static(self, loaded: Any, height: int, width: int, interp: Any) -> Any:
        # transformers resizes BEiT's bias tables to the input's grid by its own rule (bilinear), and its
        # absolute table (if any) when asked to: the static graph is transformers' model at this size
        return self.interpolating(loaded, interp, "a static BEiT export")

    def interpolating(self, loaded: Any, interp: Any, what: str) -> Any:
        from ..relpos import hf_beit_traceable

        model = super().interpolating(loaded, interp, what)
        hf_beit_traceable(model)  # its bias index, built for the input's grid inside the graph
        return model

    def make_dynamic(self, loaded: Any, interp: Any) -> tuple[Any, ViTSpec]:
        return self.interpolating(loaded, interp, "--dynamic-resolution"), loaded.spec
