"""vitdeploy.data: images from digits, folders, .npz and .npy, with honest failures, for evaluate, check and calibrate."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from vitdeploy.data import list_images, open_images, open_labelled, subset_indices
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


# -- one loader for check and calibrate too --------------------------------------------------------
def test_folder_walker_skips_hidden_and_non_images(tmp_path: Path) -> None:
    root = tmp_path / "val"
    for rel in ["cat/1.jpg", "cat/2.PNG", "dog/x.png", "dog/deep/d.png", "dog/.y.png", "dog/.cache/z.png", ".hidden/h.png"]:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.zeros((4, 4, 3), np.uint8)).save(root / rel, format="PNG")  # content decides, not the suffix
    (root / "cat" / "readme.txt").write_text("not an image")
    assert [str(p.relative_to(root / "dog")) for p in list_images(root / "dog")] == ["deep/d.png", "x.png"]
    data = open_labelled(str(root), (8, 8), classes=["cat", "dog"])
    assert data.files == ["cat/1.jpg", "cat/2.PNG", "dog/deep/d.png", "dog/x.png"] and data.labels.tolist() == [0, 0, 1, 1]
    assert data.record()["folders"] == ["cat", "dog"]


def test_pixels_only_folder_and_npz(tmp_path: Path) -> None:
    """Calibration's view: any folder layout, no labels needed; failures named with the caller's words."""
    rng = np.random.default_rng(2)
    root = tmp_path / "calib"
    (root / "sub").mkdir(parents=True)
    Image.fromarray(rng.integers(0, 256, (12, 20, 3), dtype=np.uint8)).save(root / "a.png")
    Image.fromarray(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)).save(root / "sub" / "b.png")
    data = open_images(str(root), (8, 8))
    assert data.kind == "folder" and data.labels is None and data.files == ["a.png", "sub/b.png"] and data.images.shape == (2, 8, 8, 3)
    (root / "sub" / "bad.png").write_bytes(b"not a png")
    with pytest.raises(UserError, match=r"1 of 3 calibration images in .* cannot be decoded: sub/bad.png") as info:
        open_images(str(root), (8, 8), noun="calibration images")
    assert "--skip-unreadable" not in str(info.value)  # the caller has no such option: none is offered
    kept = open_images(str(root), (8, 8), skip_unreadable=True)
    assert len(kept) == 2 and kept.record()["unreadable"][0]["file"] == "sub/bad.png"
    (tmp_path / "none" / "sub").mkdir(parents=True)
    with pytest.raises(UserError, match="holds no images"):
        open_images(str(tmp_path / "none"), (8, 8))
    images = rng.integers(0, 256, (7, 8, 8, 3), dtype=np.uint8)
    np.savez(tmp_path / "i.npz", images=images)  # images only
    sub = open_images(str(tmp_path / "i.npz"), (8, 8), limit=4)
    assert sub.labels is None and sub.available == 7 and np.array_equal(sub.images, images[subset_indices(7, 4)])
    with pytest.raises(UserError, match="expected arrays 'images'"):
        open_labelled(str(tmp_path / "i.npz"), (8, 8), classes=LABELS)


def test_npy_is_the_graph_input_as_fed(tmp_path: Path) -> None:
    from vitdeploy.images import to_channel_order

    images = np.random.default_rng(3).integers(0, 256, (5, 8, 8, 3), dtype=np.uint8)
    np.save(tmp_path / "x.npy", images)
    bgr = {"channel_order": "bgr"}
    data = open_labelled(str(tmp_path / "x.npy"), (8, 8), bgr, need_labels=False)
    assert data.labels is None and np.array_equal(data.images, images[..., ::-1])  # RGB inside
    assert np.array_equal(to_channel_order(data.images, bgr), images)  # fed back byte for byte
    sub = open_labelled(str(tmp_path / "x.npy"), (8, 8), need_labels=False, limit=3)
    assert np.array_equal(sub.images, images[subset_indices(5, 3)]) and sub.record()["subset_seed"] == 0
    with pytest.raises(UserError, match=r"expected uint8 \[N,16,16,3\] images at the graph's input size"):
        open_labelled(str(tmp_path / "x.npy"), (16, 16), need_labels=False)


def test_check_reads_through_the_same_loader(digits_bundle, tmp_path: Path) -> None:
    from vitdeploy.evalsets import real_set

    data = open_labelled("digits:test", (32, 32), classes=digits_bundle.labels, limit=50)
    real = real_set(digits_bundle, "digits:test", limit=50)  # --limit: the seeded subset, not the first 50
    assert np.array_equal(real.images, data.images) and real.labels.tolist() == data.labels.tolist()
    assert real.meta["sha256"] == data.sha256 and real.meta["subset_seed"] == 0 and real.meta["count"] == 50
    np.savez(tmp_path / "v.npz", images=data.images[:6], labels=np.array([digits_bundle.labels[k] for k in data.labels[:6]]))
    assert real_set(digits_bundle, str(tmp_path / "v.npz")).labels.tolist() == data.labels[:6].tolist()
    root = tmp_path / "val"
    for name in ("3", "7"):
        (root / name).mkdir(parents=True)
        Image.fromarray(data.images[0]).save(root / name / "ok.png")
    (root / "7" / "broken.jpg").write_bytes(b"not a jpeg")
    with pytest.raises(UserError, match="1 of 3 images in .* cannot be decoded: 7/broken.jpg") as info:
        real_set(digits_bundle, str(root))
    assert "--skip-unreadable" not in str(info.value)
