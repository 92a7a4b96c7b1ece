"""Give a loaded model another input resolution, per source family (§39.3, Algorithm 39.1 step 2).

Static: the stored position table is resampled offline (split off the prefix rows, resample the
G_h x G_w grid, flatten back) and the graph holds the new table as a constant.
Dynamic: the model resamples the table inside forward from the input's H/W, so the exported graph
carries one Resize whose output size comes from the input shape.

Every path uses one named convention (vitdeploy.posembed.PosEmbedInterpolation), recorded in the
manifest. BEiT's relative-position bias tables and EVA/RoPE rotary frequencies follow timm's own
rules (exporters/relpos.py, exporters/rotary.py), named in the spec. The default, bicubic / align_corners=False / no antialias, is what TensorRT's ONNX
parser implements; timm's own default antialiases when shrinking, so below the native grid our
tables differ from timm's on purpose (upsampling is identical).
"""

from __future__ import annotations

import copy
import dataclasses
import types
from typing import Any

import torch

from vitdeploy.errors import UserError
from vitdeploy.posembed import PosEmbedInterpolation, resample_pos_embed

from .families import TIMM_BEIT, TIMM_EVA
from .hf_sources import hf_base
from .relpos import beit_dynamic, beit_static, default_max_grid, hf_beit_traceable
from .rotary import eva_dynamic, eva_static
from .sources import LoadedModel


def regrid_static(loaded: LoadedModel, height: int, width: int, interp: PosEmbedInterpolation) -> LoadedModel:
    """A copy of ``loaded`` whose position table is resampled to a fixed height x width."""
    spec = loaded.spec
    new_grid = spec.grid(height, width)  # refuses sizes the patch does not tile, naming valid ones
    if (height, width) == tuple(spec.image_size):
        return loaded
    if loaded.family == "reference":
        from vitdeploy.model import with_resolution

        model = with_resolution(loaded.model, height, width, interp)
    elif loaded.family == TIMM_BEIT:
        model = beit_static(loaded.model, (height, width), interp, spec.native_grid)
    elif loaded.family == TIMM_EVA:
        model = eva_static(loaded.model, (height, width), interp, spec.native_grid, spec.pos_embed_prefix_rows)
    elif loaded.family == "hf" and loaded.source.get("model_type") == "beit":
        # transformers resizes BEiT's bias tables to the input's grid by its own rule (bilinear), and its
        # absolute table (if any) when asked to: the static graph is transformers' model at this size
        model = _hf_interpolating(loaded, interp, "a static BEiT export")
    else:
        model = copy.deepcopy(loaded.model)
        holder, attr = _table_holder(model, loaded.family)
        with torch.no_grad():
            table = resample_pos_embed(
                getattr(holder, attr).detach(), new_grid, spec.native_grid, spec.pos_embed_prefix_rows,
                interp.method, interp.align_corners, interp.antialias,
            )
        setattr(holder, attr, torch.nn.Parameter(table, requires_grad=False))
        _set_image_size(model, loaded.family, (height, width))
        if loaded.family == "hf" and loaded.source.get("model_type") == "dinov2":
            _use_stored_table(holder)
    new_spec = spec.with_image_size(height, width)
    out = copy.copy(loaded)
    out.model, out.spec = model.eval(), new_spec
    return out


def make_dynamic(loaded: LoadedModel, interp: PosEmbedInterpolation) -> LoadedModel:
    """A copy of ``loaded`` that accepts any H/W that is a multiple of the patch size."""
    out = copy.copy(loaded)
    if loaded.family == "reference":
        model = copy.deepcopy(loaded.model)
        model.interpolation = interp
    elif loaded.family == "timm":
        model = _timm_dynamic(loaded, interp)
    elif loaded.family == TIMM_BEIT:
        max_grid = default_max_grid(loaded.spec.native_grid)
        model = beit_dynamic(loaded.model, interp, max_grid)
        if loaded.spec.rel_pos_bias:  # the graph carries resampling weights up to this grid: declare it
            out.spec = dataclasses.replace(loaded.spec, max_grid=max_grid)
    elif loaded.family == TIMM_EVA:
        model = eva_dynamic(loaded.model, loaded.extra.get("timm_name") or loaded.source["name"], loaded.source.get("model_kwargs") or {},
                            loaded.spec.num_classes, interp, loaded.spec.pos_embed_prefix_rows)
    else:
        model = _hf_interpolating(loaded, interp, "--dynamic-resolution")
    out.model = model.eval()
    return out


def _hf_interpolating(loaded: LoadedModel, interp: PosEmbedInterpolation, what: str) -> Any:
    """A copy of a transformers model that adapts its position terms to each input by transformers' rules."""
    if interp != PosEmbedInterpolation("bicubic", False, False):
        raise UserError(
            "Hugging Face ViTs interpolate their position table bicubic, align_corners=False, without antialias; "
            f"choose that convention for {what}"
        )
    model = copy.deepcopy(loaded.model)
    model.interpolate_pos_encoding = True  # DINOv2 interpolates always and ignores it
    if loaded.source.get("model_type") == "beit":
        hf_beit_traceable(model)  # its bias index, built for the input's grid inside the graph
    return model


def _use_stored_table(embeddings: Any) -> None:
    """transformers' DINOv2 interpolates its table to every input (a square table assumed); a static
    copy holds the table already resampled to its grid, which it then adds as it is."""

    def stored(self: Any, _embeddings: torch.Tensor, _height: int, _width: int) -> torch.Tensor:
        return self.position_embeddings

    embeddings.interpolate_pos_encoding = types.MethodType(stored, embeddings)  # this instance only


def _table_holder(model: Any, family: str) -> tuple[Any, str]:
    if family == "timm":
        return model, "pos_embed"
    return hf_base(model).embeddings, "position_embeddings"


def _set_image_size(model: Any, family: str, size: tuple[int, int]) -> None:
    if family == "timm":
        model.patch_embed.set_input_size(img_size=size)
    else:
        base = hf_base(model)
        pe = base.embeddings.patch_embeddings
        pe.image_size = size
        if hasattr(base.embeddings, "image_size"):  # transformers >= 5 checks the size here
            base.embeddings.image_size = size
        pe.num_patches = (size[0] // pe.patch_size[0]) * (size[1] // pe.patch_size[1])
        model.hf.config.image_size = size[0] if size[0] == size[1] else list(size)


def _timm_dynamic(loaded: LoadedModel, interp: PosEmbedInterpolation) -> Any:
    """Rebuild the timm ViT with dynamic_img_size and our own position-table resampling."""
    import timm

    name = loaded.extra.get("timm_name") or loaded.source["name"]  # an hf-hub: name pinned to its config's commit
    kwargs = dict(loaded.source.get("model_kwargs") or {})
    kwargs.update(num_classes=loaded.spec.num_classes, dynamic_img_size=True)
    state = loaded.model.state_dict()
    # Built on the meta device, the rebuild skips timm's weight init (ViT-B/16: 1.6-2.5 s of random
    # numbers that load_state_dict overwrites) and takes the loaded tensors as they are; a model that
    # computes a buffer outside its state dict (rotary tables) would keep it on meta: rebuild it fully.
    with torch.device("meta"):
        model = timm.create_model(name, pretrained=False, **kwargs)
    model.load_state_dict(state, strict=True, assign=True)
    if any(t.is_meta for t in (*model.parameters(), *model.buffers())):
        model = timm.create_model(name, pretrained=False, **kwargs)
        model.load_state_dict(state, strict=True)
    prefix_rows = loaded.spec.pos_embed_prefix_rows
    native_grid = tuple(model.patch_embed.grid_size)

    def _pos_embed(self: Any, x: torch.Tensor) -> torch.Tensor:
        # timm's _pos_embed with the table resampled by the convention we record (timm's own
        # antialiases when shrinking, which TensorRT's ONNX parser does not implement).
        batch, gh, gw, dim = x.shape
        table = resample_pos_embed(self.pos_embed, (gh, gw), native_grid, prefix_rows, interp.method, interp.align_corners, interp.antialias)
        x = x.reshape(batch, gh * gw, dim)
        prefix = [t.expand(batch, -1, -1) for t in (self.cls_token, getattr(self, "dist_token", None), self.reg_token) if t is not None]
        if self.no_embed_class:
            x = x + table
            return torch.cat(prefix + [x], dim=1) if prefix else x
        x = torch.cat(prefix + [x], dim=1) if prefix else x
        return x + table

    model._pos_embed = types.MethodType(_pos_embed, model)  # this instance only
    return model
