"""The preprocessing contract, computed on the host in numpy: the reference that the graph's baked
preprocessing must reproduce (§39.6: x = (p/255 - mean)/std; feeding p instead of p/255, another
mean/std, or swapped channels is not a small error).

Pure numpy on purpose: it is an implementation independent of the exported graph and of PyTorch.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .errors import UserError


def normalise(images: np.ndarray, preprocessing: dict[str, Any]) -> np.ndarray:
    """uint8 NHWC (in the contract's channel order) -> float32 NCHW, as the model was trained."""
    if images.dtype != np.uint8 or images.ndim != 4 or images.shape[-1] != 3:
        raise UserError(f"expected uint8 images [N,H,W,3], got {images.dtype} {list(images.shape)}")
    x = images.astype(np.float32)
    if preprocessing.get("channel_order", "rgb") == "bgr":
        x = x[..., ::-1]  # the graph takes BGR; the model was trained on RGB
    x = x / np.float32(255.0)
    mean = np.asarray(preprocessing["mean"], dtype=np.float32)
    std = np.asarray(preprocessing["std"], dtype=np.float32)
    x = (x - mean) / std
    return np.ascontiguousarray(x.transpose(0, 3, 1, 2))


def random_images(count: int, height: int, width: int, seed: int = 0) -> np.ndarray:
    """Seeded uniform uint8 images [count, height, width, 3]."""
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, size=(count, height, width, 3), dtype=np.uint8)
