"""The files `predict` and `embed` take: image files and folders, or one uint8 .npy array."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

import numpy as np

from ..errors import UserError


def expand_image_paths(items: Sequence[str | os.PathLike]) -> list[Path]:
    """Files as given; a folder stands for the image files under it (sorted)."""
    from ..images import IMAGE_SUFFIXES

    paths: list[Path] = []
    for item in items:
        path = Path(item)
        if path.is_dir():
            found = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)
            if not found:
                raise UserError(f"folder {path} holds no image files ({', '.join(IMAGE_SUFFIXES)})")
            paths.extend(found)
        else:
            paths.append(path)
    if not paths:
        raise UserError("no images given")
    return paths


def load_npy_images(path: Path) -> np.ndarray:
    """A .npy of uint8 [N, H, W, 3] images in the graph's channel order (never unpickled)."""
    try:
        arr = np.load(path, allow_pickle=False, mmap_mode="r")
    except (OSError, ValueError) as exc:
        raise UserError(f"cannot read {path} as a .npy array ({exc})") from None
    if arr.dtype != np.uint8 or arr.ndim != 4 or arr.shape[-1] != 3:
        raise UserError(f"{path} holds {arr.dtype} {list(arr.shape)}; expected uint8 [N, H, W, 3] images in the graph's channel order")
    return np.asarray(arr)
