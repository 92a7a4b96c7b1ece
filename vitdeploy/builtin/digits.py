"""The bundled trained model: a small reference ViT on scikit-learn's handwritten digits.

Data (``sklearn.datasets.load_digits``): 1,797 grayscale 8x8 images valued 0..16, 10 classes. The
split is fixed: ``train_test_split(..., test_size=0.2, stratify=y, random_state=0)`` -> 1,437 train,
360 test images.

Image rule (:func:`digits_to_rgb32`), the same for training, evaluation and calibration:
  1. scale 0..16 to 0..255 in float: v * 255 / 16 (no rounding yet);
  2. upscale 8x8 -> 32x32 bilinearly with pixel-centre alignment (src = (i + 0.5) / 4 - 0.5, edge
     samples clamped), i.e. torch ``interpolate(bilinear, align_corners=False)`` and PIL's BILINEAR
     resize, done here in numpy so that no framework version can change it;
  3. round half up once, to uint8;
  4. replicate the gray channel to R, G, B -> uint8 HWC [32, 32, 3], the camera-like input of a
     vitdeploy graph.

Normalisation (x = (p/255 - mean)/std) is not applied here: its per-channel mean/std were measured
on the training split and live only in ``digits.json`` (``preprocessing``).

Nothing here imports torch or scikit-learn at import time.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ConfigError, UserError
from ..lazy import require

HERE = Path(__file__).resolve().parent
WEIGHTS_FILE = "digits.safetensors"
CONFIG_FILE = "digits.json"
SOURCE_SIZE = 8
INPUT_SIZE = 32
SOURCE_MAX = 16.0  # load_digits values run 0..16
SPLIT_SEED = 0
TEST_FRACTION = 0.2
SPLITS = ("train", "test")
LABELS = [str(k) for k in range(10)]


def _bilinear_matrix(src: int, dst: int) -> np.ndarray:
    """[dst, src] weights of a 1-D centre-aligned bilinear upscale (each row sums to 1)."""
    coords = np.clip((np.arange(dst) + 0.5) * (src / dst) - 0.5, 0.0, src - 1)
    lo = np.floor(coords).astype(np.int64)
    hi = np.minimum(lo + 1, src - 1)
    frac = coords - lo
    weights = np.zeros((dst, src), dtype=np.float64)
    weights[np.arange(dst), lo] += 1.0 - frac
    weights[np.arange(dst), hi] += frac
    return weights


def digits_to_rgb32(images: np.ndarray) -> np.ndarray:
    """sklearn digits [N, 8, 8] (or [N, 64]) valued 0..16 -> uint8 RGB [N, 32, 32, 3] (module rule)."""
    arr = np.asarray(images, dtype=np.float64)
    if arr.ndim == 2 and arr.shape[1] == SOURCE_SIZE * SOURCE_SIZE:
        arr = arr.reshape(-1, SOURCE_SIZE, SOURCE_SIZE)
    if arr.ndim != 3 or arr.shape[1:] != (SOURCE_SIZE, SOURCE_SIZE):
        raise UserError(f"expected digits images [N, 8, 8] or [N, 64], got shape {np.shape(images)}")
    if arr.size and (arr.min() < 0 or arr.max() > SOURCE_MAX):
        raise UserError(f"digits values must lie in 0..16, got {arr.min()}..{arr.max()}")
    scaled = arr * (255.0 / SOURCE_MAX)
    rows = _bilinear_matrix(SOURCE_SIZE, INPUT_SIZE)
    # Separable bilinear: out = R @ img @ R^T, one matrix product per axis.
    up = np.einsum("ih,nhw,jw->nij", rows, scaled, rows)
    gray = np.floor(up + 0.5).clip(0, 255).astype(np.uint8)
    return np.repeat(gray[..., None], 3, axis=-1)


@lru_cache(maxsize=1)
def _split_indices() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    datasets = require("sklearn.datasets", "the builtin digits data")
    selection = require("sklearn.model_selection", "the builtin digits split")
    data = datasets.load_digits()
    index = np.arange(len(data.target))
    train_idx, test_idx = selection.train_test_split(
        index, test_size=TEST_FRACTION, stratify=data.target, random_state=SPLIT_SEED
    )
    return data.images, data.target.astype(np.int64), np.sort(train_idx), np.sort(test_idx)


def load_digits_split(split: str = "train") -> tuple[np.ndarray, np.ndarray]:
    """(uint8 images [N, 32, 32, 3], int64 labels [N]) of the fixed 80/20 stratified split."""
    if split not in SPLITS:
        raise UserError(f"unknown digits split {split!r}; use 'train' or 'test'")
    images, labels, train_idx, test_idx = _split_indices()
    idx = train_idx if split == "train" else test_idx
    return digits_to_rgb32(images[idx]), labels[idx].copy()


def split_description() -> dict[str, Any]:
    """The split as recorded in the config (so a reader can rebuild it without this module)."""
    return {
        "dataset": "sklearn.datasets.load_digits",
        "method": "sklearn.model_selection.train_test_split",
        "test_size": TEST_FRACTION,
        "stratify": "target",
        "random_state": SPLIT_SEED,
        "image_rule": "v*255/16, bilinear 8x8->32x32 (align_corners=False), round half up, gray->RGB",
    }


# -- the shipped model ---------------------------------------------------------------------------
def _paths(root: str | Path | None) -> tuple[Path, Path]:
    folder = Path(root) if root is not None else HERE
    return folder / WEIGHTS_FILE, folder / CONFIG_FILE


def load_digits_config(root: str | Path | None = None) -> dict[str, Any]:
    """The model's config: spec, preprocessing, labels and training record (``digits.json``)."""
    _, config_path = _paths(root)
    if not config_path.is_file():
        raise UserError(f"{config_path} is missing; rebuild it with `python scripts/train_digits.py`")
    try:
        config = json.loads(config_path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{config_path} is unreadable or not JSON ({exc}); rebuild it with scripts/train_digits.py") from None
    for key in ("spec", "preprocessing", "labels"):
        if key not in config:
            raise ConfigError(f"{config_path} has no {key!r} entry; rebuild it with scripts/train_digits.py")
    return config


def load_digits_model(root: str | Path | None = None):
    """The trained reference ViT in eval mode (safetensors, no pickle). ``root``: another folder
    holding ``digits.safetensors`` + ``digits.json`` (e.g. a fresh training run)."""
    require("torch", "the builtin digits model")
    safetensors_torch = require("safetensors.torch", "the builtin digits weights")
    from ..model import VisionTransformer, load_weights
    from ..spec import ViTSpec

    weights_path, _ = _paths(root)
    config = load_digits_config(root)
    if not weights_path.is_file():
        raise UserError(f"{weights_path} is missing; rebuild it with `python scripts/train_digits.py`")
    model = VisionTransformer(ViTSpec.from_dict(config["spec"]))
    load_weights(model, safetensors_torch.load_file(str(weights_path)), source=str(weights_path))
    return model.eval()
