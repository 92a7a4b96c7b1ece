"""Calibration sources: folders of any image sizes at the graph's input contract, .npy arrays,
the digits split; seeded subsets and the hash that pins the data."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest

from vitdeploy.bundle import Bundle
from vitdeploy.calibration.sources import open_source
from vitdeploy.errors import UserError


def _save(path: Path, array: np.ndarray) -> None:
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(array).save(path)


def test_folder_any_sizes_resized_by_the_manifest_rule(digits_bundle, tmp_path: Path) -> None:
    from vitdeploy.images import resize_for_model

    rng = np.random.default_rng(0)
    shapes = [(40, 60), (32, 32), (17, 90)]
    arrays = [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in shapes]
    _save(tmp_path / "flat.png", arrays[0])
    _save(tmp_path / "a" / "x.png", arrays[1])  # class sub-folders and flat files both count
    _save(tmp_path / "b" / "y.png", arrays[2])
    (tmp_path / ".hidden.png").write_bytes(b"ignored")
    source = open_source(str(tmp_path), digits_bundle)
    assert source.kind == "folder" and len(source) == 3 and source.size == (32, 32)
    assert source.files == ["a/x.png", "b/y.png", "flat.png"]
    expected = [resize_for_model(a, digits_bundle.preprocessing, (32, 32)) for a in (arrays[1], arrays[2], arrays[0])]
    assert np.array_equal(source.images, np.stack(expected))
    assert [b.shape[0] for b in source.batches(2)] == [2, 1]


def test_bgr_graph_gets_bgr_pixels(digits_bundle, tmp_path: Path) -> None:
    image = np.zeros((32, 32, 3), np.uint8)
    image[..., 0] = 200  # red
    _save(tmp_path / "red.png", image)
    bgr = copy.deepcopy(digits_bundle.manifest)
    bgr["preprocessing"]["channel_order"] = "bgr"
    source = open_source(str(tmp_path), Bundle(digits_bundle.root, bgr))
    assert source.images[0, 0, 0].tolist() == [0, 0, 200]


def test_digits_subset_is_seeded_and_hashed(digits_bundle) -> None:
    a = open_source("digits:train", digits_bundle, samples=100)
    b = open_source("digits:train", digits_bundle, samples=100)
    full = open_source("digits:train", digits_bundle)
    assert len(a) == 100 and a.available == len(full) and a.sha256 == b.sha256
    assert a.sha256 != full.sha256 and a.record()["subset_seed"] == 0 and full.record()["subset_seed"] is None
    # spread over the split, not its first 100 images
    assert not np.array_equal(a.images, full.images[:100])


def test_npy_source(digits_bundle, tmp_path: Path) -> None:
    data = np.random.default_rng(1).integers(0, 256, (70, 32, 32, 3), dtype=np.uint8)
    np.save(tmp_path / "c.npy", data)
    source = open_source(str(tmp_path / "c.npy"), digits_bundle, samples=500)
    assert np.array_equal(source.images, data) and source.record()["count"] == 70
    np.save(tmp_path / "f.npy", data.astype(np.float32))
    with pytest.raises(UserError, match="expected uint8"):
        open_source(str(tmp_path / "f.npy"), digits_bundle)
    (tmp_path / "p.npy").write_bytes(b"not numpy")
    with pytest.raises(UserError, match="not a readable .npy"):
        open_source(str(tmp_path / "p.npy"), digits_bundle)


def test_no_default_data_outside_digits(digits_bundle) -> None:
    other = copy.deepcopy(digits_bundle.manifest)
    other["source"] = {"kind": "timm", "name": "vit_small_patch16_224"}
    with pytest.raises(UserError, match="no calibration data"):
        open_source(None, Bundle(digits_bundle.root, other))
    assert open_source(None, digits_bundle).name == "digits:train"


def test_npz_source_and_the_shared_subset_rule(digits_bundle, tmp_path: Path) -> None:
    """Calibration reads through vitdeploy.data: the seeded subset `evaluate` and `check` take, and a
    .npz of images (labels are not needed) at the model's size."""
    from vitdeploy.builtin.digits import load_digits_split
    from vitdeploy.data import subset_indices

    images, _labels = load_digits_split("train")
    subset = open_source("digits:train", digits_bundle, samples=100)
    assert np.array_equal(subset.images, images[subset_indices(len(images), 100)])
    np.savez(tmp_path / "c.npz", images=images[:40])
    source = open_source(str(tmp_path / "c.npz"), digits_bundle, samples=30)
    assert source.kind == "npz" and len(source) == 30 and source.available == 40
    assert np.array_equal(source.images, images[:40][subset_indices(40, 30)]) and source.record()["subset_seed"] == 0
