"""transformers' DeiT: CLS and distillation tokens; ``DeiTForImageClassification`` reads the CLS row,
``...WithTeacher`` the mean of its CLS and distillation heads (as timm's distilled DeiT)."""

from __future__ import annotations

from typing import Any

from .base import register_family
from .hf_common import HFFamily


@register_family
class HFDeiT(HFFamily):
    name = "hf-deit"
    model_types = ("deit",)
    classifiers = ("DeiTForImageClassification", "DeiTForImageClassificationWithTeacher")
    backbone = "DeiTModel"
    base_attr = "deit"

    def distill_tokens(self, config: Any) -> int:
        return 1
