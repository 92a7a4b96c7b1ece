"""Trained models that ship inside vitdeploy, so every stage can be shown and tested on real weights.

Importing this package is cheap: torch and scikit-learn are imported only when a model or its data
is loaded. ``BUILTIN_MODELS`` maps a name (``vitdeploy export builtin:digits``) to its loaders.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from ..errors import UserError
from .digits import (
    digits_to_rgb32,
    load_digits_config,
    load_digits_model,
    load_digits_split,
)


@dataclass(frozen=True)
class BuiltinModel:
    """One bundled model: how to load it, its config, and its evaluation data."""

    name: str
    description: str
    load_model: Callable[[], Any]  # -> VisionTransformer in eval mode
    load_config: Callable[[], dict[str, Any]]  # spec, preprocessing, labels, training record
    load_split: Callable[[str], tuple[Any, Any]]  # "train" | "test" -> (uint8 NHWC images, int64 labels)


BUILTIN_MODELS: dict[str, BuiltinModel] = {
    "digits": BuiltinModel(
        name="digits",
        description="reference ViT (patch 4, 32x32 RGB) trained on scikit-learn's handwritten digits",
        load_model=load_digits_model,
        load_config=load_digits_config,
        load_split=load_digits_split,
    ),
}


def get_builtin(name: str) -> BuiltinModel:
    try:
        return BUILTIN_MODELS[name]
    except KeyError:
        raise UserError(f"unknown builtin model {name!r}; available: {', '.join(sorted(BUILTIN_MODELS))}") from None


__all__ = [
    "BUILTIN_MODELS",
    "BuiltinModel",
    "digits_to_rgb32",
    "get_builtin",
    "load_digits_config",
    "load_digits_model",
    "load_digits_split",
]
