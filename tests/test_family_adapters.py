"""The family adapters' registry (exporters/adapters/): every family answers for itself, the loaders find it
without testing names, and a more specific adapter wins over the one it refines (issue 37, item 2)."""

from __future__ import annotations

import types

import pytest

from vitdeploy.errors import UserError
from vitdeploy.exporters.adapters import FAMILY_ADAPTERS, HFFamily, hf_adapter, register_family, timm_adapter
from vitdeploy.exporters.adapters.timm_vit import TimmViT


def test_every_family_is_registered_once_and_answers_for_itself():
    assert {"timm-vit", "timm-beit", "timm-eva", "hf-vit", "hf-deit", "hf-beit", "hf-dinov2", "reference-vit",
            "builtin-digits"} <= set(FAMILY_ADAPTERS)
    for name, cls in FAMILY_ADAPTERS.items():
        assert cls.name == name and cls.library in ("timm", "transformers", "vitdeploy")
        for reason in (cls.dynamic_refusal, cls.variable_size_refusal):
            assert reason is None or (reason and "\n" not in reason)
        if issubclass(cls, HFFamily):
            assert cls.model_types and cls.backbone and cls.base_attr  # classifiers may be () (headless-only: DINOv3)
    types_ = [t for cls in FAMILY_ADAPTERS.values() if issubclass(cls, HFFamily) for t in cls.model_types]
    assert len(types_) == len(set(types_)), "one adapter per transformers model type"
    with pytest.raises(ValueError):
        register_family(type("Again", (TimmViT,), {"name": "timm-vit"}))


def test_hf_lookup_by_model_type_and_class_and_one_line_refusal():
    adapter, arch = hf_adapter(types.SimpleNamespace(model_type="deit", architectures=["DeiTForImageClassificationWithTeacher"]), "hf:x")
    assert adapter.name == "hf-deit" and arch == "DeiTForImageClassificationWithTeacher"
    adapter, arch = hf_adapter(types.SimpleNamespace(model_type="dinov2", architectures=None), "hf:x")
    assert adapter.name == "hf-dinov2" and arch == "Dinov2ForImageClassification"
    with pytest.raises(UserError) as err:
        hf_adapter(types.SimpleNamespace(model_type="swin", architectures=["SwinForImageClassification"]), "hf:x")
    assert "\n" not in str(err.value) and "SwinForImageClassification" in str(err.value) and "Dinov2Model" in str(err.value)
    assert "shifted local windows" in str(err.value)
    with pytest.raises(UserError) as err:  # MAE's forward masks at random: one line that says so
        hf_adapter(types.SimpleNamespace(model_type="vit_mae", architectures=["ViTMAEModel"]), "hf:x")
    assert "\n" not in str(err.value) and "masks a random 75% of the patches" in str(err.value)


def test_the_most_specific_timm_adapter_wins_and_the_rest_are_refused():
    import timm
    import torch

    with torch.device("meta"):
        gap = timm.create_model("vit_tiny_patch16_224", pretrained=False, depth=1, global_pool="avg", class_token=False)
        cnn = timm.create_model("resnet18", pretrained=False)
    assert type(timm_adapter(gap, "vit_tiny")).__name__ == "TimmViT"

    @register_family
    class GapOnly(TimmViT):  # a refinement of TimmViT for GAP models: it must win where both claim
        name = "test-timm-vit-gap"

        @classmethod
        def claims(cls, model):
            return super().claims(model) and model.global_pool == "avg"

    try:
        assert type(timm_adapter(gap, "vit_tiny")) is GapOnly
    finally:
        del FAMILY_ADAPTERS[GapOnly.name]
    assert type(timm_adapter(gap, "vit_tiny")).__name__ == "TimmViT"
    with pytest.raises(UserError) as err:
        timm_adapter(cnn, "resnet18")
    assert "not a ViT-family model" in str(err.value) and "\n" not in str(err.value)
