"""Calibration data: a fixed set of images at the artifact's input contract.

A :class:`CalibrationSource` is a fixed set of uint8 NHWC images at the artifact's input contract
(its input size and channel order), iterable as batches. It is materialised in memory on purpose:
calibration passes over the data more than once (one pass per method in a sweep, and again to
score), and its sha256 must describe exactly the pixels that were fed.

The images are read by :func:`vitdeploy.data.open_images`, the loader `check` and `evaluate` use
(one decoder, folder walker, resize rule, subset rule and set of error lines):

* ``digits:train`` / ``digits:test`` - the bundled digits split (the default for the digits bundle);
* ``PATH.npy`` - a uint8 [N, H, W, 3] array already at the input contract (loaded without pickle);
* ``PATH.npz`` - its ``images`` array (RGB, any size; labels are not needed);
* ``DIR`` - image files in a folder, flat or ``DIR/<class>/...``, any sizes: decoded upright to RGB,
  resized by the manifest's own host-resize rule and put in the graph's channel order. A file that
  cannot be decoded is an error naming it (calibrating on fewer images than asked is not silent).

With ``samples`` smaller than what the source holds, a seeded random subset is taken
(:func:`vitdeploy.data.subset_indices`: not the first N, since sorted folders would otherwise hand
over the first classes only).

A variable-size bundle (images + valid_hw) gets (images, valid_hw) pairs from the same sources: each
image read at the model's native size, rescaled to a seeded random size and aspect ratio, fitted by
the bundle's host policy and padded into the canvas (as `check` scores it), ``valid_hw`` fed as the
graph's second input.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterator

import numpy as np

from vitdeploy.bundle import Bundle
from vitdeploy.data import SUBSET_SEED, pixels_sha256
from vitdeploy.errors import UserError
from vitdeploy.variable import VALID_INPUT

DEFAULT_BATCH = 16


@dataclass
class CalibrationSource:
    name: str  # what the user gave: "digits:train", "./calib", "images.npy"
    kind: str  # "digits" | "folder" | "npy" | "npz"
    images: np.ndarray  # uint8 [N, H, W, 3] in the graph's channel order and input size
    available: int  # how many images the source holds (>= len(images))
    files: list[str] | None = None  # folder sources: the files used, in order
    # variable-size bundles: each image's (valid height, width) in the canvas, fed as the second input
    valid_hw: np.ndarray | None = None
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

    def feeds(self, input_name: str, batch_size: int = DEFAULT_BATCH) -> Iterator[dict[str, np.ndarray]]:
        """ONNX Runtime feeds of ``batch_size``: the images, and valid_hw for a two-input graph."""
        for start, batch in zip(range(0, len(self.images), batch_size), self.batches(batch_size)):
            feed = {input_name: batch}
            if self.valid_hw is not None:
                feed[VALID_INPUT] = self.valid_hw[start : start + batch_size]
            yield feed

    @property
    def size(self) -> tuple[int, int]:
        return int(self.images.shape[1]), int(self.images.shape[2])

    @property
    def sha256(self) -> str:
        """Hash of exactly the pixels fed (shape included), so a record pins its data."""
        if self._sha256 is None:
            self._sha256 = pixels_sha256(self.images)
            if self.valid_hw is not None:  # the pairs fed: pixels and valid sizes
                import hashlib

                self._sha256 = hashlib.sha256((self._sha256 + ":").encode() + np.ascontiguousarray(self.valid_hw, dtype=np.int32).tobytes()).hexdigest()
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
    from vitdeploy.data import open_images
    from vitdeploy.images import to_channel_order

    spec = spec or default_source(bundle)
    if not spec:
        raise UserError("no calibration data: pass --data DIR (images), --data FILE.npy, or --data digits:train")
    if samples is not None and samples <= 0:
        raise UserError(f"--samples must be positive, got {samples}")
    if bundle.variable_size:
        return _variable(spec, bundle, samples)
    size, pre = input_contract(bundle)
    data = open_images(spec, size, pre, samples, noun="calibration images")
    return CalibrationSource(spec, data.kind, to_channel_order(data.images, pre), available=data.available,
                             files=data.files, details=data.details)


def _variable(spec: str, bundle: Bundle, samples: int | None) -> CalibrationSource:
    """(images, valid_hw) pairs for a variable-size bundle: the source's images at the native size,
    each rescaled to a seeded random size and aspect ratio, fitted into the canvas by the bundle's
    host policy and padded top-left with zeros (as the runtime pads), so the ranges cover the mixed
    sizes the graph serves - the preparation `check` scores with (vitdeploy.variable.mixed_size_images)."""
    from vitdeploy.variable import RESCALE_RULE, mixed_size_images, size_summary
    from vitdeploy.data import open_images
    from vitdeploy.images import to_channel_order
    from vitdeploy.variable import pad_to_canvas

    pre = bundle.preprocessing
    if pre.get("input", "uint8-nhwc") != "uint8-nhwc":
        raise UserError(f"this graph takes {pre.get('input')} input; calibration feeds uint8 NHWC images")
    contract = bundle.variable_size
    policy = contract.get("host_policy", "fit-within")
    data = open_images(spec, tuple(bundle.spec.image_size), pre, samples, noun="calibration images")
    fitted = [to_channel_order(img, pre) for img in mixed_size_images(data.images, pre, SUBSET_SEED, policy)]
    images, valid = pad_to_canvas(fitted, contract["canvas"])
    details = {**data.details, "variable_size": {"policy": policy, "rescale": RESCALE_RULE, "seed": SUBSET_SEED,
                                                 "padding": "zeros (as the runtime pads)", **size_summary(fitted)}}
    return CalibrationSource(spec, data.kind, images, available=data.available, files=data.files, valid_hw=valid, details=details)
