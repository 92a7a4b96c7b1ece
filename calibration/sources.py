"""Calibration data: one abstraction, three adapters.

A :class:`CalibrationSource` is a fixed set of uint8 NHWC images at the artifact's input contract
(its input size and channel order), iterable as batches. It is materialised in memory on purpose:
calibration passes over the data more than once (one pass per method in a sweep, and again to
score), and its sha256 must describe exactly the pixels that were fed.

Adapters (``open_source(spec, bundle)``):

* ``digits:train`` / ``digits:test`` - the bundled digits split (the default for the digits bundle);
* ``PATH.npy`` - a uint8 [N, H, W, 3] array already at the input contract (loaded without pickle);
* ``DIR`` - image files in a folder, flat or ``DIR/<class>/...``, any sizes: decoded upright to RGB,
  resized by the manifest's own host-resize rule and put in the graph's channel order
  (:mod:`vitdeploy.images`, the same code `check` and `predict` use).

With ``samples`` smaller than what the source holds, a seeded random subset is taken (not the first
N: sorted folders would otherwise hand over the first classes only).
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from vitdeploy.bundle import Bundle
from vitdeploy.errors import UserError

DEFAULT_BATCH = 16
SUBSET_SEED = 0
_NAMED_FAILURES = 5  # undecodable files named in the error line


@dataclass
class CalibrationSource:
    name: str  # what the user gave: "digits:train", "./calib", "images.npy"
    kind: str  # "digits" | "folder" | "npy"
    images: np.ndarray  # uint8 [N, H, W, 3] in the graph's channel order and input size
    available: int  # how many images the source holds (>= len(images))
    files: list[str] | None = None  # folder sources: the files used, in order
    details: dict[str, Any] = field(default_factory=dict)
    _sha256: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.images.dtype != np.uint8 or self.images.ndim != 4 or self.images.shape[-1] != 3:
            raise UserError(f"calibration images must be uint8 [N,H,W,3], got {self.images.dtype} {list(self.images.shape)}")

    def __len__(self) -> int:
        return int(len(self.images))

    def __iter__(self) -> Iterator[np.ndarray]:
        return self.batches(DEFAULT_BATCH)

    def batches(self, batch_size: int = DEFAULT_BATCH) -> Iterator[np.ndarray]:
        """Consecutive batches of ``batch_size`` (the last one may be shorter)."""
        if batch_size <= 0:
            raise UserError(f"batch size must be positive, got {batch_size}")
        for start in range(0, len(self.images), batch_size):
            yield self.images[start : start + batch_size]

    @property
    def size(self) -> tuple[int, int]:
        return int(self.images.shape[1]), int(self.images.shape[2])

    @property
    def sha256(self) -> str:
        """Hash of exactly the pixels fed (shape included), so a record pins its data."""
        if self._sha256 is None:
            digest = hashlib.sha256(repr(tuple(self.images.shape)).encode())
            digest.update(np.ascontiguousarray(self.images).tobytes())
            self._sha256 = digest.hexdigest()
        return self._sha256

    def record(self) -> dict[str, Any]:
        return {
            "source": self.name,
            "kind": self.kind,
            "count": len(self),
            "available": self.available,
            "size": list(self.size),
            "sha256": self.sha256,
            "subset_seed": SUBSET_SEED if len(self) < self.available else None,
            **self.details,
        }


def input_contract(bundle: Bundle) -> tuple[tuple[int, int], dict[str, Any]]:
    """(H, W) the host feeds this bundle's graphs, and its preprocessing block."""
    from vitdeploy.images import model_input_size

    pre = bundle.preprocessing
    if pre.get("input", "uint8-nhwc") != "uint8-nhwc":
        raise UserError(f"this graph takes {pre.get('input')} input; calibration feeds uint8 NHWC images (export with --input uint8-nhwc)")
    size = model_input_size(pre, bundle.resolution, bundle.spec.patch_size)
    return size, pre


def default_source(bundle: Bundle) -> str | None:
    """The bundled digits model calibrates on its own training split; other bundles need --data."""
    source = bundle.manifest.get("source", {})
    if source.get("kind") == "builtin" and source.get("name") == "digits":
        return "digits:train"
    return None


def open_source(spec: str | None, bundle: Bundle, samples: int | None = None) -> CalibrationSource:
    """Resolve ``--data`` (or the bundle's default) into a CalibrationSource at its input contract."""
    spec = spec or default_source(bundle)
    if not spec:
        raise UserError("no calibration data: pass --data DIR (images), --data FILE.npy, or --data digits:train")
    if samples is not None and samples <= 0:
        raise UserError(f"--samples must be positive, got {samples}")
    size, pre = input_contract(bundle)
    if spec.startswith("digits:"):
        return _digits(spec, size, pre, samples)
    path = Path(spec).expanduser()
    if path.suffix.lower() == ".npy":
        return _npy(spec, path, size, samples)
    if path.is_dir():
        return _folder(spec, path, size, pre, samples)
    if path.exists():
        raise UserError(f"--data {spec} is a file but not a .npy array; give a folder of images, a .npy array or digits:train")
    raise UserError(f"--data {spec} does not exist; give a folder of images, a .npy array (uint8 [N,H,W,3]) or digits:train")


def _subset(available: int, samples: int | None) -> np.ndarray:
    if samples is None or samples >= available:
        return np.arange(available)
    chosen = np.random.default_rng(SUBSET_SEED).choice(available, size=samples, replace=False)
    return np.sort(chosen)


def _digits(spec: str, size: tuple[int, int], pre: dict[str, Any], samples: int | None) -> CalibrationSource:
    from vitdeploy.builtin import get_builtin
    from vitdeploy.images import resize_for_model, to_channel_order

    split = spec.split(":", 1)[1]
    images, _labels = get_builtin("digits").load_split(split)
    total = len(images)
    images = images[_subset(total, samples)]
    if tuple(images.shape[1:3]) != tuple(size):
        images = np.stack([resize_for_model(img, pre, size) for img in images])
    return CalibrationSource(spec, "digits", to_channel_order(images, pre), available=total,
                             details={"split": split})


def _npy(spec: str, path: Path, size: tuple[int, int], samples: int | None) -> CalibrationSource:
    if not path.is_file():
        raise UserError(f"--data {spec} does not exist")
    try:
        data = np.load(path, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise UserError(f"--data {spec} is not a readable .npy array ({str(exc).splitlines()[0]})") from None
    want = (size[0], size[1], 3)
    if data.dtype != np.uint8 or data.ndim != 4 or tuple(data.shape[1:]) != want:
        raise UserError(f"--data {spec} holds {data.dtype} {list(data.shape)}; expected uint8 [N,{size[0]},{size[1]},3] "
                        "images at the graph's input size and channel order")
    if len(data) == 0:
        raise UserError(f"--data {spec} holds no images")
    index = _subset(len(data), samples)
    return CalibrationSource(spec, "npy", np.ascontiguousarray(data[index]), available=int(len(data)))


def list_images(root: Path) -> list[Path]:
    """Image files under ``root`` (flat or in sub-folders), sorted; hidden files skipped."""
    from vitdeploy.images import IMAGE_SUFFIXES

    if not os.access(root, os.R_OK | os.X_OK):
        raise UserError(f"calibration folder {root} is not readable (permission denied)")
    files: list[Path] = []
    try:
        for dirpath, dirnames, filenames in os.walk(root, onerror=_walk_error):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
            files.extend(Path(dirpath) / f for f in filenames if not f.startswith(".") and Path(f).suffix.lower() in IMAGE_SUFFIXES)
    except PermissionError as exc:
        raise UserError(f"calibration folder {exc.filename} is not readable (permission denied)") from None
    return sorted(files)


def _walk_error(exc: OSError) -> None:
    raise exc


def _folder(spec: str, root: Path, size: tuple[int, int], pre: dict[str, Any], samples: int | None) -> CalibrationSource:
    from vitdeploy.images import IMAGE_SUFFIXES, decode_image, resize_for_model, to_channel_order

    files = list_images(root)
    if not files:
        raise UserError(f"calibration folder {root} holds no images ({', '.join(IMAGE_SUFFIXES)}); put calibration images in it")
    chosen = [files[i] for i in _subset(len(files), samples)]
    out = np.empty((len(chosen), size[0], size[1], 3), dtype=np.uint8)
    failures: list[str] = []
    for i, path in enumerate(chosen):
        try:
            out[i] = resize_for_model(decode_image(path), pre, size)
        except UserError as exc:
            failures.append(f"{path.relative_to(root)} ({_reason(exc)})")
    if failures:
        named = "; ".join(failures[:_NAMED_FAILURES]) + (f"; and {len(failures) - _NAMED_FAILURES} more" if len(failures) > _NAMED_FAILURES else "")
        raise UserError(f"{len(failures)} of {len(chosen)} calibration images in {root} cannot be decoded: {named}; remove or replace them")
    rel = [str(p.relative_to(root)) for p in chosen]
    return CalibrationSource(spec, "folder", to_channel_order(out, pre), available=len(files), files=rel,
                             details={"resize": pre.get("host_resize")})


def _reason(exc: UserError) -> str:
    # decode_image says "cannot read image PATH: REASON; give a ..." - keep only the reason
    text = str(exc)
    if ": " in text:
        text = text.split(": ", 1)[1]
    return text.split(";")[0]
