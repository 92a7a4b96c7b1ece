"""Give a loaded model another input resolution, by its family's rule (§39.3, Algorithm 39.1 step 2).

Static: the stored position table is resampled offline (split off the prefix rows, resample the
G_h x G_w grid, flatten back) and the graph holds the new table as a constant.
Dynamic: the model resamples the table inside forward from the input's H/W, so the exported graph
carries one Resize whose output size comes from the input shape.

Where each family's position terms live and how they are re-gridded is its adapter's answer
(exporters/adapters/: ``regrid_static``, ``make_dynamic``). Every path uses one named convention
(vitdeploy.posembed.PosEmbedInterpolation), recorded in the manifest. BEiT's relative-position bias
tables and EVA/RoPE rotary frequencies follow timm's own rules (exporters/relpos.py,
exporters/rotary.py), named in the spec. The default, bicubic / align_corners=False / no antialias,
is what TensorRT's ONNX parser implements; timm's own default antialiases when shrinking, so below
the native grid our tables differ from timm's on purpose (upsampling is identical).
"""

from __future__ import annotations

import copy

from vitdeploy.posembed import PosEmbedInterpolation

from .loaded import LoadedModel


def regrid_static(loaded: LoadedModel, height: int, width: int, interp: PosEmbedInterpolation) -> LoadedModel:
    """A copy of ``loaded`` whose position table is resampled to a fixed height x width."""
    spec = loaded.spec
    spec.grid(height, width)  # refuses sizes the patch does not tile, naming valid ones
    if (height, width) == tuple(spec.image_size):
        return loaded
    model = loaded.adapter.regrid_static(loaded, height, width, interp)
    out = copy.copy(loaded)
    out.model, out.spec = model.eval(), spec.with_image_size(height, width)
    return out


def make_dynamic(loaded: LoadedModel, interp: PosEmbedInterpolation) -> LoadedModel:
    """A copy of ``loaded`` that accepts any H/W that is a multiple of the patch size."""
    out = copy.copy(loaded)
    model, out.spec = loaded.adapter.make_dynamic(loaded, interp)
    out.model = model.eval()
    return out
