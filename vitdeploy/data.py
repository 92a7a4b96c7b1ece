"""Labelled images at a graph's input contract, from one place.

``evaluate`` (and, over time, ``check`` and ``calibrate``) need the same thing: uint8 RGB images
[N, H, W, 3] at the size the host feeds the graph, an int64 label per image indexing the bundle's
labels, and an honest account of what was read. Sources (:func:`open_labelled`):

* ``digits:test`` / ``digits:train`` - the bundled digits split (:mod:`vitdeploy.builtin.digits`);
* ``DIR`` - one sub-folder per class (``DIR/<class>/<image>``); folder names are matched to the
  bundle's labels, and names that are not labels are refused in one line that lists them;
* ``FILE.npz`` - ``images`` uint8 [N, H, W, 3] (RGB) and ``labels`` (int class indices, or strings
  matched to the bundle's labels); loaded without pickle;
* ``FILE.npy`` - images only (uint8 [N, H, W, 3]); usable where no labels are needed.

Images whose size differs from the requested one are resized by the manifest's host-resize rule
(:func:`vitdeploy.images.resize_for_model`, Pillow), the rule the model was validated with. Images
are kept in RGB here; :func:`vitdeploy.images.to_channel_order` turns them into the graph's order at
the last moment. A file that cannot be decoded is an error naming it, unless ``skip_unreadable`` is
given: then it is left out, and counted and named in :attr:`LabelledData.unreadable` (which every
report carries), never dropped silently. ``limit`` takes a seeded random subset (not the first N:
sorted folders would hand over the first classes only).
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from .errors import UserError

SUBSET_SEED = 0
NAMED_FAILURES = 5  # undecodable files named in an error line (all of them are in the report)


@dataclass
class LabelledData:
    """uint8 RGB images [N, H, W, 3] with labels, and where they came from."""

    source: str  # what the user gave: "digits:test", "./val", "set.npz"
    kind: str  # "digits" | "folder" | "npz" | "npy"
    images: np.ndarray  # uint8 RGB [N, H, W, 3] at the requested size
    labels: np.ndarray | None  # int64 [N] indices into ``classes`` (None: unlabelled .npy)
    classes: list[str]  # label names, index order (the bundle's labels when one was given)
    files: list[str] | None = None  # folder sources: file per image, relative to the folder
    unreadable: list[dict[str, str]] = field(default_factory=list)  # {"file", "reason"} left out
    available: int = 0  # images the source holds (before a subset, including unreadable ones)
    details: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.images.dtype != np.uint8 or self.images.ndim != 4 or self.images.shape[-1] != 3:
            raise UserError(f"images must be uint8 [N,H,W,3], got {self.images.dtype} {list(self.images.shape)}")
        if self.labels is not None and len(self.labels) != len(self.images):
            raise UserError(f"{self.source}: {len(self.images)} images but {len(self.labels)} labels")
        if not self.available:
            self.available = int(len(self.images)) + len(self.unreadable)

    def __len__(self) -> int:
        return int(len(self.images))

    @property
    def size(self) -> tuple[int, int]:
        return int(self.images.shape[1]), int(self.images.shape[2])

    @property
    def sha256(self) -> str:
        """Hash of exactly these pixels and labels (shape included)."""
        digest = hashlib.sha256(repr(tuple(self.images.shape)).encode())
        digest.update(np.ascontiguousarray(self.images).tobytes())
        if self.labels is not None:
            digest.update(np.ascontiguousarray(self.labels, dtype=np.int64).tobytes())
        return digest.hexdigest()

    def record(self) -> dict[str, Any]:
        """What a report says about its data."""
        counts = np.bincount(self.labels, minlength=len(self.classes)).tolist() if self.labels is not None else None
        return {
            "source": self.source,
            "kind": self.kind,
            "count": len(self),
            "available": self.available,
            "size": list(self.size),
            "sha256": self.sha256,
            "subset_seed": SUBSET_SEED if len(self) + len(self.unreadable) < self.available else None,
            "per_class": dict(zip(self.classes, counts)) if counts is not None else None,
            "unreadable_count": len(self.unreadable),
            "unreadable": list(self.unreadable),
            **self.details,
        }


def open_labelled(spec: str, size: Sequence[int], preprocessing: dict[str, Any] | None = None,
                  classes: Sequence[str] | None = None, limit: int | None = None, skip_unreadable: bool = False,
                  need_labels: bool = True) -> LabelledData:
    """Resolve a data source into labelled RGB images of ``size`` (H, W).

    ``classes``: the bundle's labels; folder names and string labels are matched to them and the
    labels returned index them. ``preprocessing``: the manifest block whose host-resize rule brings
    other sizes to ``size`` (default: stretch, bilinear).
    """
    if limit is not None and limit <= 0:
        raise UserError(f"the image limit must be positive, got {limit}")
    size = (int(size[0]), int(size[1]))
    pre = preprocessing or {}
    text = str(spec).strip()
    if text.startswith("digits:"):
        data = _digits(text, classes)
    else:
        path = Path(text).expanduser()
        suffix = path.suffix.lower()
        if path.is_dir():
            data = _folder(text, path, classes, size, pre, skip_unreadable, limit)
        elif suffix == ".npz":
            data = _npz(text, path, classes)
        elif suffix == ".npy":
            data = _npy(text, path, classes)
        elif path.exists():
            raise UserError(f"data {text} is a file but not .npz/.npy; give digits:test, a folder DIR/<class>/<image>, "
                            "or a .npz with images + labels")
        else:
            raise UserError(f"data {text} does not exist; give digits:test, a folder DIR/<class>/<image>, or a .npz with images + labels")
    if need_labels and data.labels is None:
        raise UserError(f"data {text} carries no labels (a .npy holds images only); give a .npz with images + labels "
                        "or a folder DIR/<class>/<image>")
    if data.kind != "folder":  # folders were subset before decoding, to decode only what is used
        index = subset_indices(len(data.images), limit)
        if len(index) < len(data.images):
            data.images = data.images[index]
            data.labels = data.labels[index] if data.labels is not None else None
    if data.size != size:
        data.images = resize_all(data.images, pre, size)
    return data


def subset_indices(available: int, limit: int | None, seed: int = SUBSET_SEED) -> np.ndarray:
    """All indices, or a seeded random subset of ``limit`` of them (sorted)."""
    if limit is None or limit >= available:
        return np.arange(available)
    return np.sort(np.random.default_rng(seed).choice(available, size=limit, replace=False))


def resize_all(images: np.ndarray, preprocessing: dict[str, Any], size: Sequence[int]) -> np.ndarray:
    """Every image through the manifest's host-resize rule (Pillow), to uint8 [N, H, W, 3]."""
    from .images import resize_for_model

    out = np.empty((len(images), int(size[0]), int(size[1]), 3), dtype=np.uint8)
    for i, img in enumerate(images):
        out[i] = resize_for_model(img, preprocessing, size)
    return out


# -- adapters ------------------------------------------------------------------------------------
def _match_classes(names: Sequence[str], classes: Sequence[str] | None, where: str) -> list[int]:
    """Index of each name in ``classes``; names that are not labels -> one line listing them."""
    if classes is None:
        return list(range(len(names)))
    unknown = [n for n in names if n not in classes]
    if unknown:
        shown = ", ".join(unknown[:8]) + (f" and {len(unknown) - 8} more" if len(unknown) > 8 else "")
        raise UserError(f"{where}: {shown} {'is not a label' if len(unknown) == 1 else 'are not labels'} of this model "
                        f"(labels: {', '.join(list(classes)[:12])}{' ...' if len(classes) > 12 else ''}); "
                        "name each class after a label in labels.txt")
    return [list(classes).index(n) for n in names]


def _digits(spec: str, classes: Sequence[str] | None) -> LabelledData:
    from .builtin import get_builtin
    from .builtin.digits import LABELS

    split = spec.split(":", 1)[1]
    images, labels = get_builtin("digits").load_split(split)
    index = _match_classes(LABELS, classes, "digits labels vs the model's labels")
    names = list(classes) if classes is not None else list(LABELS)
    return LabelledData(spec, "digits", images, np.asarray(index, dtype=np.int64)[labels], names, details={"split": split})


def _npz(spec: str, path: Path, classes: Sequence[str] | None) -> LabelledData:
    try:
        with np.load(path, allow_pickle=False) as archive:
            keys = set(archive.files)
            if "images" not in keys or "labels" not in keys:
                raise UserError(f"{spec} holds {', '.join(sorted(keys)) or 'nothing'}; expected arrays 'images' "
                                "(uint8 [N,H,W,3], RGB) and 'labels' ([N] class indices or label names)")
            images, raw_labels = archive["images"], archive["labels"]
    except UserError:
        raise
    except (OSError, ValueError, EOFError) as exc:
        raise UserError(f"{spec} is not a readable .npz archive ({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})") from None
    _check_images(spec, images)
    if raw_labels.ndim != 1 or len(raw_labels) != len(images):
        raise UserError(f"{spec}: 'labels' has shape {list(raw_labels.shape)}; expected [{len(images)}], one per image")
    if raw_labels.dtype.kind in "US":
        names = [str(v) for v in raw_labels.tolist()]
        distinct = sorted(set(names))
        index = dict(zip(distinct, _match_classes(distinct, classes, f"labels in {spec}")))
        labels = np.array([index[n] for n in names], dtype=np.int64)
    elif raw_labels.dtype.kind in "iu":
        labels = raw_labels.astype(np.int64)
        count = len(classes) if classes is not None else int(labels.max(initial=-1)) + 1
        bad = sorted({int(v) for v in labels if v < 0 or v >= count})
        if bad:
            raise UserError(f"{spec}: labels {', '.join(map(str, bad[:8]))} are outside 0..{count - 1} "
                            f"(the model has {count} classes)")
    else:
        raise UserError(f"{spec}: 'labels' is {raw_labels.dtype}; expected integer class indices or label names")
    names = list(classes) if classes is not None else [str(i) for i in range(int(labels.max(initial=-1)) + 1)]
    return LabelledData(spec, "npz", np.ascontiguousarray(images), labels, names)


def _npy(spec: str, path: Path, classes: Sequence[str] | None) -> LabelledData:
    try:
        images = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise UserError(f"{spec} is not a readable .npy array ({str(exc).splitlines()[0]})") from None
    _check_images(spec, images)
    return LabelledData(spec, "npy", np.ascontiguousarray(images), None, list(classes or []))


def _check_images(spec: str, images: np.ndarray) -> None:
    if images.dtype != np.uint8 or images.ndim != 4 or images.shape[-1] != 3:
        raise UserError(f"{spec} holds images {images.dtype} {list(images.shape)}; expected uint8 [N,H,W,3] (RGB)")
    if len(images) == 0:
        raise UserError(f"{spec} holds no images")


def _folder(spec: str, root: Path, classes: Sequence[str] | None, size: tuple[int, int], pre: dict[str, Any],
            skip_unreadable: bool, limit: int | None) -> LabelledData:
    from .images import IMAGE_SUFFIXES, decode_image, resize_for_model

    if not os.access(root, os.R_OK | os.X_OK):
        raise UserError(f"image folder {root} is not readable (permission denied)")
    subdirs = sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not subdirs:
        raise UserError(f"image folder {root} has no class sub-folders; expected DIR/<class>/<image> with one folder per label")
    index = _match_classes(subdirs, classes, f"class folders in {root}")
    files: list[Path] = []
    labels: list[int] = []
    for name, label in zip(subdirs, index):
        found = sorted(p for p in (root / name).rglob("*")
                       if p.is_file() and not p.name.startswith(".") and p.suffix.lower() in IMAGE_SUFFIXES)
        files.extend(found)
        labels.extend([label] * len(found))
    if not files:
        raise UserError(f"image folder {root} has class folders but no images ({', '.join(IMAGE_SUFFIXES)})")
    chosen = subset_indices(len(files), limit)
    out = np.empty((len(chosen), size[0], size[1], 3), dtype=np.uint8)
    kept: list[int] = []
    unreadable: list[dict[str, str]] = []
    for row, i in enumerate(chosen):
        try:
            out[len(kept)] = resize_for_model(decode_image(files[i]), pre, size)
            kept.append(int(i))
        except UserError as exc:
            unreadable.append({"file": str(files[i].relative_to(root)), "reason": _reason(exc)})
    if unreadable and not skip_unreadable:
        named = "; ".join(f"{u['file']} ({u['reason']})" for u in unreadable[:NAMED_FAILURES])
        more = f"; and {len(unreadable) - NAMED_FAILURES} more" if len(unreadable) > NAMED_FAILURES else ""
        raise UserError(f"{len(unreadable)} of {len(chosen)} images in {root} cannot be decoded: {named}{more}; "
                        "remove or replace them, or pass --skip-unreadable to leave them out (they are listed in the report)")
    if not kept:
        raise UserError(f"none of the {len(chosen)} images in {root} can be decoded")
    names = list(classes) if classes is not None else subdirs
    return LabelledData(spec, "folder", out[: len(kept)], np.asarray([labels[i] for i in kept], dtype=np.int64), names,
                        files=[str(files[i].relative_to(root)) for i in kept], unreadable=unreadable, available=len(files),
                        details={"folders": subdirs, "resize": pre.get("host_resize"),
                                 # labels with no folder are allowed (a subset of classes), but said
                                 "labels_without_folder": [c for c in (classes or []) if c not in subdirs]})


def _reason(exc: UserError) -> str:
    # decode_image says "cannot read image PATH: REASON; give a ..." - keep only the reason
    text = str(exc)
    if ": " in text:
        text = text.split(": ", 1)[1]
    return text.split(";")[0]
