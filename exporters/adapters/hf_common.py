"""What transformers' ViT-family classes share: the wrapper that makes a task model return logits, the
spec read from the config, the backbone's read-outs (last_hidden_state, pooler_output), the module
names, the position table's re-gridding, and the lookup from a config's ``model_type`` to its adapter.

Each family (hf_vit.py, hf_deit.py, hf_beit.py, hf_dinov2.py) declares its model types, its task and
headless classes, where the backbone sits, and overrides only what it does differently.
"""

from __future__ import annotations

import copy
from typing import Any, ClassVar

from vitdeploy.errors import UserError
from vitdeploy.lazy import require
from vitdeploy.spec import ViTSpec

from .base import FamilyAdapter, adapters_of


# transformers model types that are vision transformers but not a deployable global-attention ViT
# encoder as they stand: one line naming why, as timm_common.OUT_OF_REACH does for timm classes
OUT_OF_REACH = {
    "vit_mae": "masks a random 75% of the patches in every forward and returns the kept tokens in shuffled order "
               "(MAE pre-training); export a classifier fine-tuned from it (ViTForImageClassification) instead",
    "swin": "attends within shifted local windows, which the global-attention export does not express",
    "swinv2": "attends within shifted local windows, which the global-attention export does not express",
    "vit_hybrid": "makes its patch grid with a CNN backbone, not one patch-size Conv",
    "levit": "is a convolution/attention hybrid with shrinking stages, not one patch grid",
    "mobilevit": "is a convolution/attention hybrid, not one patch grid",
}


class HFFamily(FamilyAdapter):
    library = "transformers"
    variable_size_refusal = "transformers' encoders have no key-mask path here"
    model_types: ClassVar[tuple[str, ...]] = ()  # config.model_type values this adapter exports
    classifiers: ClassVar[tuple[str, ...]] = ()  # task classes (config.architectures[0])
    backbone: ClassVar[str] = ""  # the headless class
    base_attr: ClassVar[str] = ""  # attribute of the task model that holds the backbone (model.vit, ...)
    takes_pos_flag: ClassVar[bool] = True  # forward takes interpolate_pos_encoding
    # the processor may give another size than config.image_size (the table is interpolated to every input)
    keeps_trained_table: ClassVar[bool] = False
    # classes a repository may be saved as that export as another class (``load_plan``): a dual encoder's image tower
    published_as: ClassVar[tuple[str, ...]] = ()

    # -- loading -----------------------------------------------------------------------------------
    def load_plan(self, config: Any, arch: str) -> tuple[str, Any, bool]:
        """(the transformers class to build, the config it is built from, headless) for a repository saved as
        ``arch``. Default: that class from the repository's config; a dual encoder answers its image tower."""
        return arch, config, arch == self.backbone

    def loaded_extra(self, model: Any) -> dict[str, Any]:
        """What the LoadedModel's ``extra`` gains for this model (e.g. {"projection_head": {"dim": P}})."""
        return {}

    def fixed_size(self, processor: Any) -> tuple[int, int] | None:
        """The bundle's size where the image processor has no one size rule of its own (NaFlex keeps each image's
        aspect ratio), else None: the processor's rule (hf_sources.preprocessing_of)."""
        return None

    # -- the spec ----------------------------------------------------------------------------------
    def spec_from_config(self, config: Any, model: Any, arch: str, headless: bool) -> ViTSpec:
        mlp_ratio, mlp_kind = self.mlp_shape(config, model)
        distill = self.distill_tokens(config)
        abs_table = self.abs_table(config)
        return ViTSpec(
            image_size=pair_of(config.image_size),
            patch_size=pair_of(config.patch_size),
            embed_dim=config.hidden_size,
            depth=config.num_hidden_layers,
            num_heads=config.num_attention_heads,
            num_classes=0 if headless else config.num_labels,
            in_chans=config.num_channels,
            mlp_ratio=mlp_ratio,
            mlp_kind=mlp_kind,
            global_pool="avg" if self.mean_pooled(config) else "token",
            num_distill_tokens=distill,
            pos_embed_prefix_rows=(1 + distill) if abs_table else 0,
            abs_pos_embed=abs_table,
            rel_pos_bias=self.rel_pos_bias(config),
            architecture=f"hf-{config.model_type}" + ("-distilled" if arch.endswith("WithTeacher") else ""),
        )

    def mlp_shape(self, config: Any, model: Any) -> tuple[float, str]:
        return config.intermediate_size / config.hidden_size, "mlp"

    def distill_tokens(self, config: Any) -> int:
        return 0

    def mean_pooled(self, config: Any) -> bool:
        return False

    def abs_table(self, config: Any) -> bool:
        return True

    def rel_pos_bias(self, config: Any) -> dict[str, Any] | None:
        return None

    # -- positions ---------------------------------------------------------------------------------
    def regrid_static(self, loaded: Any, height: int, width: int, interp: Any) -> Any:
        """The absolute table resampled offline to the new grid; the backbone told its new size."""
        import torch

        from vitdeploy.posembed import resample_pos_embed

        spec = loaded.spec
        model = copy.deepcopy(loaded.model)
        holder = hf_base(model).embeddings
        with torch.no_grad():
            table = resample_pos_embed(holder.position_embeddings.detach(), spec.grid(height, width), spec.native_grid,
                                       spec.pos_embed_prefix_rows, interp.method, interp.align_corners, interp.antialias)
        holder.position_embeddings = torch.nn.Parameter(table, requires_grad=False)
        _set_image_size(model, (height, width))
        return model

    def make_dynamic(self, loaded: Any, interp: Any) -> tuple[Any, ViTSpec]:
        return self.interpolating(loaded, interp, "--dynamic-resolution"), loaded.spec

    def interpolating(self, loaded: Any, interp: Any, what: str) -> Any:
        """A copy of a transformers model that adapts its position terms to each input by transformers' rules."""
        from vitdeploy.posembed import PosEmbedInterpolation

        if interp != PosEmbedInterpolation("bicubic", False, False):
            raise UserError(
                "Hugging Face ViTs interpolate their position table bicubic, align_corners=False, without antialias; "
                f"choose that convention for {what}"
            )
        model = copy.deepcopy(loaded.model)
        model.interpolate_pos_encoding = True  # DINOv2 interpolates always and ignores it
        return model

    # -- read-outs ---------------------------------------------------------------------------------
    def readout(self, loaded: Any) -> str:
        if loaded.spec.global_pool == "avg":
            return "gap"
        return "cls+dist" if str(loaded.source.get("architecture", "")).endswith("WithTeacher") else "cls"

    def final_norms(self, loaded: Any) -> tuple[str | None, str | None]:
        if loaded.spec.global_pool == "avg":  # BEiT's mean pooling: the backbone's layernorm is Identity, the pooler's follows the mean
            return None, "pooler.layernorm"
        return "layernorm", "layernorm"

    def features(self, loaded: Any, model: Any, x: Any, need_logits: bool, need_embedding: bool) -> tuple[Any, Any, Any]:
        """last_hidden_state (after the final layernorm, where the model has one), the pre-head feature
        its classifier reads, and, when asked, the logits computed from them as transformers does."""
        import torch

        out = model.backbone(x)
        tokens = out.last_hidden_state
        hf = model.hf
        readout = self.readout(loaded)
        if readout == "gap":  # BEiT: BeitPooler, layernorm(mean of the patch tokens)
            pooled = out.pooler_output
        elif readout == "cls|gap":  # Dinov2ForImageClassification
            pooled = torch.cat([tokens[:, 0], tokens[:, 1:].mean(dim=1)], dim=1)
        elif readout == "cls+dist":
            pooled = (tokens[:, 0] + tokens[:, 1]) / 2
        else:
            pooled = tokens[:, 0]
        if not need_logits:
            return tokens, pooled, None
        if hasattr(hf, "cls_classifier"):  # DeiTForImageClassificationWithTeacher: mean of both heads
            return tokens, pooled, (hf.cls_classifier(tokens[:, 0]) + hf.distillation_classifier(tokens[:, 1])) / 2
        return tokens, pooled, hf.classifier(pooled if readout in ("gap", "cls|gap") else tokens[:, 0])

    def reference_calls(self, loaded: Any) -> dict[str, str]:
        row = {"cls+dist": "mean of last_hidden_state[:, 0] and [:, 1] (after the final layernorm)",
               "gap": "pooler_output (layernorm of the mean of the patch tokens)",
               "cls|gap": "[last_hidden_state[:, 0], mean of last_hidden_state[:, 1:]] concatenated (after the final layernorm)",
               }.get(self.readout(loaded), "last_hidden_state[:, 0] (after the final layernorm)")
        return {"logits": "transformers model(pixel_values).logits", "embedding": f"transformers {row}",
                "patch_grid": "transformers last_hidden_state[:, prefix:] reshaped row-major, permuted to [B, d, G_h, G_w]"}

    # -- modules -----------------------------------------------------------------------------------
    def module_names(self, loaded: Any) -> list[str]:
        """Module paths (inside vitdeploy's wrapper) of each block, the final norm and the head, for `check`."""
        model, depth = loaded.model, loaded.spec.depth
        names = {name for name, _ in model.named_modules()}
        base = f"hf.{self.base_attr}" if f"hf.{self.base_attr}" in names else "hf"
        # transformers 5 keeps the blocks in `<base>.layers` for ViT/DeiT/BEiT, 4.x (and DINOv2) in `<base>.encoder.layer`
        blocks = f"{base}.layers" if f"{base}.layers.0" in names else f"{base}.encoder.layer"
        ends = [m for m in (f"{base}.layernorm", f"{base}.pooler", "hf.cls_classifier", "hf.classifier") if m in names]
        return [f"{blocks}.{i}" for i in range(depth)] + ends

    # -- the wrapper -------------------------------------------------------------------------------
    def wrap(self, model: Any) -> Any:
        """The transformers model inside vitdeploy's wrapper: forward(pixel_values) -> logits."""
        return hf_module(model, self.takes_pos_flag)


def hf_adapter(config: Any, what: str) -> tuple[HFFamily, str]:
    """(the adapter, the class the repository was saved as: config.architectures) if vitdeploy exports it."""
    named = list(getattr(config, "architectures", None) or [])
    cls = adapter_class(config.model_type)
    arch = named[0] if named else ((*cls.classifiers, cls.backbone)[0] if cls else config.model_type)
    if cls is None or arch not in (*cls.classifiers, cls.backbone, *cls.published_as):
        supported = ", ".join(c for f in adapters_of("transformers") for c in (*f.classifiers, f.backbone, *f.published_as))
        why = OUT_OF_REACH.get(config.model_type)
        if why is not None:
            raise UserError(f"{what} is a {arch} (model type {config.model_type!r}): it {why}; supported: {supported}")
        raise UserError(f"{what} is a {arch} (model type {config.model_type!r}), which vitdeploy does not export; "
                        f"supported: {supported}")
    return cls(), arch


def adapter_class(model_type: str) -> type[HFFamily] | None:
    by_type = {t: cls for cls in adapters_of("transformers") for t in cls.model_types}
    return by_type.get(model_type)


def pair_of(value: Any) -> tuple[int, int]:
    return (int(value), int(value)) if isinstance(value, int) else (int(value[0]), int(value[1]))


def model_wrapper_free(model: Any) -> Any:
    """The transformers model itself, whether or not it is inside vitdeploy's wrapper."""
    return getattr(model, "hf", model)


def hf_base(model: Any) -> Any:
    """The backbone (ViTModel, DeiTModel, BeitModel, Dinov2Model) of a task model, wrapped or not."""
    inner = model_wrapper_free(model)
    cls = adapter_class(getattr(inner.config, "model_type", ""))
    return getattr(inner, cls.base_attr, inner) if cls else inner


def _set_image_size(model: Any, size: tuple[int, int]) -> None:
    base = hf_base(model)
    pe = base.embeddings.patch_embeddings
    pe.image_size = size
    if hasattr(base.embeddings, "image_size"):  # transformers >= 5 checks the size here
        base.embeddings.image_size = size
    pe.num_patches = (size[0] // pe.patch_size[0]) * (size[1] // pe.patch_size[1])
    model.hf.config.image_size = size[0] if size[0] == size[1] else list(size)


def hf_module(model: Any, pos_flag: bool) -> Any:
    """Wrap a transformers model so forward(pixel_values) returns the logits tensor (the class is made
    here so that importing this module does not import torch)."""
    torch = require("torch")

    class HFLogits(torch.nn.Module):
        def __init__(self, inner: Any):
            super().__init__()
            self.hf = inner
            # ViT/DeiT/BEiT: True interpolates the position terms to the input (dynamic graphs);
            # DINOv2 always interpolates and takes no such argument
            self.interpolate_pos_encoding = False
            self.takes_pos_flag = pos_flag

        def forward(self, pixel_values):
            if self.takes_pos_flag:
                return self.hf(pixel_values=pixel_values, interpolate_pos_encoding=self.interpolate_pos_encoding).logits
            return self.hf(pixel_values=pixel_values).logits

        def backbone(self, pixel_values):
            """The backbone's output (last_hidden_state, pooler_output) at the graph's position handling."""
            base = hf_base(self.hf)
            if self.takes_pos_flag:
                return base(pixel_values=pixel_values, interpolate_pos_encoding=self.interpolate_pos_encoding)
            return base(pixel_values=pixel_values)

    return HFLogits(model)
