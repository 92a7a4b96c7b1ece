"""Family adapters: one class per model family, registered with ``@register_family`` (base.py).

The loaders (timm_source.py, hf_sources.py, sources.py) find a model's adapter here and keep it on
the LoadedModel; regrid.py, features.py, export_steps.py and variable_size.py ask ``loaded.adapter``
instead of testing family names. Importing this package imports every module in it, so a new
family is one new module (docs/DESIGN.md, "Adding a model family"); torch, timm and transformers
are imported only when an adapter is used.
"""

from __future__ import annotations

import importlib
import pkgutil

from .base import FAMILY_ADAPTERS, FamilyAdapter, named_adapter, register_family  # noqa: F401
from .hf_common import HFFamily, hf_adapter  # noqa: F401
from .timm_common import TimmFamily, timm_adapter  # noqa: F401

for _module in sorted(m.name for m in pkgutil.iter_modules(__path__)):
    importlib.import_module(f"{__name__}.{_module}")  # each family module registers its adapters
