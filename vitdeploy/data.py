"""Images on disk at a graph's input contract, from one place.

``evaluate``, ``check``, ``calibrate`` and ``profile --accuracy`` need the same thing: uint8 RGB
images [N, H, W, 3] at the size the host feeds the graph, an int64 label per image indexing the
bundle's labels where the source has labels, and an honest account of what was read. This module is
the one decoder, folder walker, resizer, subset rule and set of error lines for all of them.

Sources (:func:`open_labelled` needs labels, or takes them where there are some; :func:`open_images`
reads pixels only, for calibration):

* ``digits:test`` / ``digits:train`` - the bundled digits split (:mod:`vitdeploy.builtin.digits`);
* ``DIR`` - labelled: one sub-folder per class (``DIR/<class>/<image>``), folder names matched to
  the bundle's labels, names that are not labels refused in one line that lists them; pixels only:
  every image under ``DIR``, flat or in sub-folders of any depth (:func:`list_images`);
* ``FILE.npz`` - ``images`` uint8 [N, H, W, 3] (RGB) and ``labels`` (int class indices, or strings
  matched to the bundle's labels; not needed for pixels only); loaded without pickle;
* ``FILE.npy`` - images only, the graph's input as fed: uint8 [N, H, W, 3] at the requested size,
  in the graph's channel order (memory-mapped, so only the chosen subset is read).

Images whose size differs from the requested one are resized by the manifest's host-resize rule
(:func:`vitdeploy.images.resize_for_model`, Pillow), the rule the model was validated with. Images
are kept in RGB here (a BGR ``.npy`` is turned back); :func:`vitdeploy.images.to_channel_order` puts
them in the graph's order at the last moment. A file that cannot be decoded is an error naming it,
unless ``skip_unreadable`` is given: then it is left out, and counted and named in
:attr:`LabelledData.unreadable` (which every report carries), never dropped silently. ``limit``
takes a seeded random subset (:func:`subset_indices`; not the first N: sorted folders would hand
over the first classes only), chosen before decoding, so only the images used are decoded.
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
SKIP_FLAG = "--skip-unreadable"  # the option of `evaluate` that leaves undecodable files out

# What a data source may be, per kind of caller: said whenever the source given is none of them.
_GIVE = {
    "labels": "give digits:test, a folder DIR/<class>/<image>, or a .npz with images + labels",
    "optional": "give digits:test, a folder DIR/<class>/<image>, a .npz with images + labels, or a .npy array (uint8 [N,H,W,3])",
    "images": "give a folder of images, a .npy array (uint8 [N,H,W,3]), a .npz with images, or digits:train",
}


@dataclass
class LabelledData:
    """uint8 RGB images [N, H, W, 3], their labels where the source has them, and where they came from."""

    source: str  # what the user gave: "digits:test", "./val", "set.npz"
    kind: str  # "digits" | "folder" | "npz" | "npy"
    images: np.ndarray  # uint8 RGB [N, H, W, 3] at the requested size
    labels: np.ndarray | None  # int64 [N] indices into ``classes`` (None: a source without labels)
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
        return pixels_sha256(self.images, self.labels)

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


def pixels_sha256(images: np.ndarray, labels: np.ndarray | None = None) -> str:
    """sha256 of an image batch's shape and bytes (and its int64 labels, when given): what a record
    pins its data by."""
    digest = hashlib.sha256(repr(tuple(images.shape)).encode())
    digest.update(np.ascontiguousarray(images).tobytes())
    if labels is not None:
        digest.update(np.ascontiguousarray(labels, dtype=np.int64).tobytes())
    return digest.hexdigest()


def default_data(bundle: Any) -> str | None:
    """The labelled data a bundle is scored on when none is given: the bundled digits model's
    held-out split; any other model needs --data (check, evaluate) or --eval-data (calibrate)."""
    source = bundle.manifest.get("source", {})
    if source.get("kind") == "builtin" and source.get("name") == "digits":
        return "digits:test"
    return None


def open_labelled(spec: str, size: Sequence[int], preprocessing: dict[str, Any] | None = None,
                  classes: Sequence[str] | None = None, limit: int | None = None, skip_unreadable: bool = False,
                  need_labels: bool = True, *, skip_flag: str | None = SKIP_FLAG) -> LabelledData:
    """Resolve a data source into labelled RGB images of ``size`` (H, W).

    ``classes``: the bundle's labels; folder names and string labels are matched to them and the
    labels returned index them. ``preprocessing``: the manifest block whose host-resize rule brings
    other sizes to ``size`` (default: stretch, bilinear) and whose channel order a ``.npy`` is in.
    ``need_labels=False`` also takes sources without labels (a ``.npy``; labels are then None).
    ``skip_flag``: the caller's option that leaves undecodable files out, named in the error line
    (None where the caller has none).
    """
    return _open(spec, size, preprocessing, classes, limit, skip_unreadable,
                 "labels" if need_labels else "optional", "images", skip_flag)


def open_images(spec: str, size: Sequence[int], preprocessing: dict[str, Any] | None = None, limit: int | None = None,
                skip_unreadable: bool = False, *, noun: str = "images", skip_flag: str | None = None) -> LabelledData:
    """Pixels only (calibration): a folder is every image under it, flat or nested; ``.npz`` needs
    ``images`` only. Labels are None except for the digits split. ``noun`` names the images in the
    error line ("2 of 5 calibration images ... cannot be decoded")."""
    return _open(spec, size, preprocessing, None, limit, skip_unreadable, "images", noun, skip_flag)


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


def list_images(root: Path) -> list[Path]:
    """Image files under ``root`` at any depth, sorted by path; hidden files and folders skipped."""
    from .images import IMAGE_SUFFIXES

    if not os.access(root, os.R_OK | os.X_OK):
        raise UserError(f"image folder {root} is not readable (permission denied)")
    files: list[Path] = []
    try:
        for dirpath, dirnames, filenames in os.walk(root, onerror=_walk_error):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
            files.extend(Path(dirpath) / f for f in filenames if not f.startswith(".") and Path(f).suffix.lower() in IMAGE_SUFFIXES)
    except PermissionError as exc:
        raise UserError(f"image folder {exc.filename} is not readable (permission denied)") from None
    except OSError as exc:
        raise UserError(f"cannot list image folder {exc.filename} ({exc.strerror or type(exc).__name__})") from None
    return sorted(files)


def _walk_error(exc: OSError) -> None:
    raise exc  # os.walk skips unreadable folders silently by default: a missing class is an error


# -- dispatch ------------------------------------------------------------------------------------
def _open(spec: str, size: Sequence[int], preprocessing: dict[str, Any] | None, classes: Sequence[str] | None,
          limit: int | None, skip_unreadable: bool, want: str, noun: str, skip_flag: str | None) -> LabelledData:
    # want: "labels" (required), "optional" (kept where the source has them), "images" (pixels only)
    if limit is not None and limit <= 0:
        raise UserError(f"the image limit must be positive, got {limit}")
    size = (int(size[0]), int(size[1]))
    pre = preprocessing or {}
    text = str(spec).strip()
    if text.startswith("digits:"):
        data = _digits(text, classes, limit)
    else:
        path = Path(text).expanduser()
        suffix = path.suffix.lower()
        if not path.exists():
            raise UserError(f"data {text} does not exist; {_GIVE[want]}")
        if path.is_dir():
            decode = _Decode(size, pre, skip_unreadable, noun, skip_flag)
            data = _images_folder(text, path, decode, limit) if want == "images" else _class_folder(text, path, classes, decode, limit)
        elif suffix == ".npz":
            data = _npz(text, path, classes, want, limit)
        elif suffix == ".npy":
            if want == "labels":
                raise UserError(f"data {text} carries no labels (a .npy holds images only); give a .npz with images + labels "
                                "or a folder DIR/<class>/<image>")
            data = _npy(text, path, classes, size, pre, limit)
        else:
            raise UserError(f"data {text} is a file but not .npz/.npy; {_GIVE[want]}")
    if data.size != size:
        data.images = resize_all(data.images, pre, size)
    return data


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


def _digits(spec: str, classes: Sequence[str] | None, limit: int | None) -> LabelledData:
    from .builtin import get_builtin
    from .builtin.digits import LABELS

    split = spec.split(":", 1)[1]
    images, labels = get_builtin("digits").load_split(split)
    index = _match_classes(LABELS, classes, "digits labels vs the model's labels")
    names = list(classes) if classes is not None else list(LABELS)
    chosen = subset_indices(len(images), limit)
    return LabelledData(spec, "digits", _take(images, chosen), np.asarray(index, dtype=np.int64)[_take(labels, chosen)], names,
                        available=len(images), details={"split": split})


def _npz(spec: str, path: Path, classes: Sequence[str] | None, want: str, limit: int | None) -> LabelledData:
    try:
        with np.load(path, allow_pickle=False) as archive:
            keys = set(archive.files)
            if "images" not in keys or ("labels" not in keys and want == "labels"):
                raise UserError(f"{spec} holds {', '.join(sorted(keys)) or 'nothing'}; expected arrays 'images' "
                                "(uint8 [N,H,W,3], RGB) and 'labels' ([N] class indices or label names)")
            images = archive["images"]
            raw_labels = archive["labels"] if "labels" in keys and want != "images" else None
    except UserError:
        raise
    except (OSError, ValueError, EOFError) as exc:
        raise UserError(f"{spec} is not a readable .npz archive ({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})") from None
    _check_images(spec, images)
    chosen = subset_indices(len(images), limit)
    if raw_labels is None:
        return LabelledData(spec, "npz", np.ascontiguousarray(_take(images, chosen)), None, list(classes or []), available=len(images))
    labels = _npz_labels(spec, raw_labels, len(images), classes)
    names = list(classes) if classes is not None else [str(i) for i in range(int(labels.max(initial=-1)) + 1)]
    return LabelledData(spec, "npz", np.ascontiguousarray(_take(images, chosen)), _take(labels, chosen), names, available=len(images))


def _npz_labels(spec: str, raw_labels: np.ndarray, count_images: int, classes: Sequence[str] | None) -> np.ndarray:
    if raw_labels.ndim != 1 or len(raw_labels) != count_images:
        raise UserError(f"{spec}: 'labels' has shape {list(raw_labels.shape)}; expected [{count_images}], one per image")
    if raw_labels.dtype.kind in "US":
        names = [str(v) for v in raw_labels.tolist()]
        distinct = sorted(set(names))
        index = dict(zip(distinct, _match_classes(distinct, classes, f"labels in {spec}")))
        return np.array([index[n] for n in names], dtype=np.int64)
    if raw_labels.dtype.kind in "iu":
        labels = raw_labels.astype(np.int64)
        count = len(classes) if classes is not None else int(labels.max(initial=-1)) + 1
        bad = sorted({int(v) for v in labels if v < 0 or v >= count})
        if bad:
            raise UserError(f"{spec}: labels {', '.join(map(str, bad[:8]))} are outside 0..{count - 1} "
                            f"(the model has {count} classes)")
        return labels
    raise UserError(f"{spec}: 'labels' is {raw_labels.dtype}; expected integer class indices or label names")


def _npy(spec: str, path: Path, classes: Sequence[str] | None, size: tuple[int, int], pre: dict[str, Any],
         limit: int | None) -> LabelledData:
    from .images import to_channel_order

    try:
        array = np.load(path, mmap_mode="r", allow_pickle=False)  # a large array: read only the subset
    except (OSError, ValueError) as exc:
        raise UserError(f"{spec} is not a readable .npy array ({str(exc).splitlines()[0]})") from None
    # a .npy is the graph's input as fed: no resize, no channel guess
    if array.dtype != np.uint8 or array.ndim != 4 or tuple(array.shape[1:]) != (size[0], size[1], 3):
        raise UserError(f"{spec} holds {array.dtype} {list(array.shape)}; expected uint8 [N,{size[0]},{size[1]},3] "
                        "images at the graph's input size and channel order")
    if len(array) == 0:
        raise UserError(f"{spec} holds no images")
    # read into memory (np.array copies out of the map); BGR -> RGB is its own inverse
    images = to_channel_order(np.array(_take(array, subset_indices(len(array), limit)), order="C"), pre)
    return LabelledData(spec, "npy", images, None, list(classes or []), available=int(len(array)))


def _take(array: np.ndarray, chosen: np.ndarray) -> np.ndarray:
    """The chosen rows; the array itself (no copy) when all of them are chosen."""
    return array if len(chosen) == len(array) else array[chosen]


def _check_images(spec: str, images: np.ndarray) -> None:
    if images.dtype != np.uint8 or images.ndim != 4 or images.shape[-1] != 3:
        raise UserError(f"{spec} holds images {images.dtype} {list(images.shape)}; expected uint8 [N,H,W,3] (RGB)")
    if len(images) == 0:
        raise UserError(f"{spec} holds no images")


@dataclass
class _Decode:
    """How a folder's files become pixels, and how failures are worded."""

    size: tuple[int, int]
    pre: dict[str, Any]
    skip_unreadable: bool
    noun: str  # "images", "calibration images"
    skip_flag: str | None

    def files(self, root: Path, files: list[Path], limit: int | None) -> tuple[np.ndarray, list[int], list[dict[str, str]]]:
        """Decode a seeded subset of ``files``: (images, index of each kept file, unreadable files)."""
        from .images import decode_image, resize_for_model

        chosen = subset_indices(len(files), limit)
        out = np.empty((len(chosen), self.size[0], self.size[1], 3), dtype=np.uint8)
        kept: list[int] = []
        unreadable: list[dict[str, str]] = []
        for i in chosen:
            try:
                out[len(kept)] = resize_for_model(decode_image(files[i]), self.pre, self.size)
                kept.append(int(i))
            except UserError as exc:
                unreadable.append({"file": str(files[i].relative_to(root)), "reason": _reason(exc)})
        if unreadable and not self.skip_unreadable:
            named = "; ".join(f"{u['file']} ({u['reason']})" for u in unreadable[:NAMED_FAILURES])
            more = f"; and {len(unreadable) - NAMED_FAILURES} more" if len(unreadable) > NAMED_FAILURES else ""
            skip = f", or pass {self.skip_flag} to leave them out (they are listed in the report)" if self.skip_flag else ""
            raise UserError(f"{len(unreadable)} of {len(chosen)} {self.noun} in {root} cannot be decoded: {named}{more}; "
                            f"remove or replace them{skip}")
        if not kept:
            raise UserError(f"none of the {len(chosen)} {self.noun} in {root} can be decoded")
        return out[: len(kept)], kept, unreadable


def _class_folder(spec: str, root: Path, classes: Sequence[str] | None, decode: _Decode, limit: int | None) -> LabelledData:
    from .images import IMAGE_SUFFIXES

    if not os.access(root, os.R_OK | os.X_OK):
        raise UserError(f"image folder {root} is not readable (permission denied)")
    subdirs = sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not subdirs:
        raise UserError(f"image folder {root} has no class sub-folders; expected DIR/<class>/<image> with one folder per label")
    index = _match_classes(subdirs, classes, f"class folders in {root}")
    files: list[Path] = []
    labels: list[int] = []
    for name, label in zip(subdirs, index):
        found = list_images(root / name)
        files.extend(found)
        labels.extend([label] * len(found))
    if not files:
        raise UserError(f"image folder {root} has class folders but no images ({', '.join(IMAGE_SUFFIXES)})")
    images, kept, unreadable = decode.files(root, files, limit)
    names = list(classes) if classes is not None else subdirs
    return LabelledData(spec, "folder", images, np.asarray([labels[i] for i in kept], dtype=np.int64), names,
                        files=[str(files[i].relative_to(root)) for i in kept], unreadable=unreadable, available=len(files),
                        details={"folders": subdirs, "resize": decode.pre.get("host_resize"),
                                 # labels with no folder are allowed (a subset of classes), but said
                                 "labels_without_folder": [c for c in (classes or []) if c not in subdirs]})


def _images_folder(spec: str, root: Path, decode: _Decode, limit: int | None) -> LabelledData:
    from .images import IMAGE_SUFFIXES

    files = list_images(root)
    if not files:
        raise UserError(f"image folder {root} holds no images ({', '.join(IMAGE_SUFFIXES)}); put the {decode.noun} in it")
    images, kept, unreadable = decode.files(root, files, limit)
    return LabelledData(spec, "folder", images, None, [], files=[str(files[i].relative_to(root)) for i in kept],
                        unreadable=unreadable, available=len(files), details={"resize": decode.pre.get("host_resize")})


def _reason(exc: UserError) -> str:
    # decode_image says "cannot read image PATH: REASON; give a ..." - keep only the reason
    text = str(exc)
    if ": " in text:
        text = text.split(": ", 1)[1]
    return text.split(";")[0]
