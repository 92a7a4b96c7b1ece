"""vitdeploy.data: labelled images from digits, class folders and .npz, with honest failures."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from vitdeploy.data import open_labelled, subset_indices
from vitdeploy.errors import UserError

LABELS = ["cat", "dog", "fox"]


def make_folder(root: Path, counts: dict[str, int], size: tuple[int, int] = (20, 28)) -> Path:
    rng = np.random.default_rng(0)
    for name, count in counts.items():
        (root / name).mkdir(parents=True)
        for i in range(count):
            Image.fromarray(rng.integers(0, 256, (*size, 3), dtype=np.uint8)).save(root / name / f"{i}.png")
    return root


def test_digits_split() -> None:
    data = open_labelled("digits:test", (32, 32), classes=[str(k) for k in range(10)])
    assert len(data) == 360 and data.images.shape == (360, 32, 32, 3) and data.labels.dtype == np.int64
    assert data.record()["per_class"]["0"] == 36 and data.record()["unreadable_count"] == 0
    small = open_labelled("digits:test", (16, 16), limit=50)
    assert small.images.shape == (50, 16, 16, 3)
    np.testing.assert_array_equal(small.labels, data.labels[subset_indices(360, 50)])  # seeded subset, same images


def test_folder_matches_class_names_and_resizes(tmp_path: Path) -> None:
    root = make_folder(tmp_path / "val", {"dog": 3, "cat": 2})
    data = open_labelled(str(root), (16, 16), classes=LABELS)
    assert data.images.shape == (5, 16, 16, 3)
    assert data.labels.tolist() == [0, 0, 1, 1, 1]  # indices into the bundle's labels, not folder order
    assert data.files[0] == "cat/0.png" and data.classes == LABELS


def test_folder_errors_are_one_line(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="no class sub-folders"):
        open_labelled(str(tmp_path / "empty"), (16, 16), classes=LABELS)
    root = make_folder(tmp_path / "bad", {"cat": 1, "wolf": 1, "bear": 1})
    with pytest.raises(UserError, match="bear, wolf are not labels of this model") as info:
        open_labelled(str(root), (16, 16), classes=LABELS)
    assert "\n" not in str(info.value)
    (tmp_path / "noimg" / "cat").mkdir(parents=True)
    with pytest.raises(UserError, match="no images"):
        open_labelled(str(tmp_path / "noimg"), (16, 16), classes=LABELS)


def test_unreadable_images_are_named_or_counted(tmp_path: Path) -> None:
    root = make_folder(tmp_path / "val", {"cat": 2, "dog": 2})
    (root / "dog" / "broken.jpg").write_bytes(b"not a jpeg at all")
    with pytest.raises(UserError, match=r"1 of 5 images .* cannot be decoded: dog/broken.jpg") as info:
        open_labelled(str(root), (16, 16), classes=LABELS)
    assert "--skip-unreadable" in str(info.value)
    data = open_labelled(str(root), (16, 16), classes=LABELS, skip_unreadable=True)
    assert len(data) == 4 and data.available == 5
    record = data.record()
    assert record["unreadable_count"] == 1 and record["unreadable"][0]["file"] == "dog/broken.jpg"


def test_npz_with_index_or_name_labels(tmp_path: Path) -> None:
    images = np.random.default_rng(1).integers(0, 256, (6, 8, 8, 3), dtype=np.uint8)
    np.savez(tmp_path / "a.npz", images=images, labels=np.array([0, 1, 2, 0, 1, 2]))
    data = open_labelled(str(tmp_path / "a.npz"), (8, 8), classes=LABELS)
    np.testing.assert_array_equal(data.images, images)
    assert data.labels.tolist() == [0, 1, 2, 0, 1, 2]
    np.savez(tmp_path / "b.npz", images=images, labels=np.array(["fox", "cat", "fox", "dog", "cat", "cat"]))
    assert open_labelled(str(tmp_path / "b.npz"), (8, 8), classes=LABELS).labels.tolist() == [2, 0, 2, 1, 0, 0]
    np.savez(tmp_path / "c.npz", images=images, labels=np.array([0, 1, 7, 0, 1, 2]))
    with pytest.raises(UserError, match="labels 7 are outside 0..2"):
        open_labelled(str(tmp_path / "c.npz"), (8, 8), classes=LABELS)
    np.savez(tmp_path / "d.npz", images=images)
    with pytest.raises(UserError, match="expected arrays 'images'"):
        open_labelled(str(tmp_path / "d.npz"), (8, 8), classes=LABELS)
    np.savez(tmp_path / "e.npz", images=images.astype(np.float32), labels=np.zeros(6, dtype=int))
    with pytest.raises(UserError, match="expected uint8"):
        open_labelled(str(tmp_path / "e.npz"), (8, 8), classes=LABELS)
    np.save(tmp_path / "f.npy", images)
    with pytest.raises(UserError, match="carries no labels"):
        open_labelled(str(tmp_path / "f.npy"), (8, 8), classes=LABELS)
    with pytest.raises(UserError, match="does not exist"):
        open_labelled(str(tmp_path / "missing"), (8, 8))
