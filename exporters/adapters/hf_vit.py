"""transformers' ViT (``ViTForImageClassification``, ``ViTModel``): CLS read-out, an absolute table."""

from __future__ import annotations

from .base import register_family
from .hf_common import HFFamily


@register_family
class HFViT(HFFamily):
    name = "hf-vit"
    model_types = ("vit",)
    classifiers = ("ViTForImageClassification",)
    backbone = "ViTModel"
    base_attr = "vit"
