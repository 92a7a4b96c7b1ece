"""Family adapters: one class per model family, registered with ``@register_family`` (base.py).

The loaders (timm_source.py, hf_sources.py, sources.py) find a model's adapter here and keep it on
the LoadedModel; regrid.py, features.py, export_steps.py and variable_size.py ask ``loaded.adapter``
instead of testing family names. Importing this package registers every family below (torch,
timm and transformers are imported only when an adapter is used).
"""

from __future__ import annotations

from . import hf_beit, hf_deit, hf_dinov2, hf_vit, reference, timm_beit, timm_eva, timm_vit  # noqa: F401  (registers them)
from .base import FAMILY_ADAPTERS, FamilyAdapter, named_adapter, register_family  # noqa: F401
from .hf_common import HFFamily, hf_adapter  # noqa: F401
from .timm_common import TimmFamily, timm_adapter  # noqa: F401
