"""Images on the host side of the graph contract: decode a file, apply the model's resize rule, and
hand the graph the uint8 NHWC batch it takes.

Everything pixel-level (cast, scale, mean/std, NCHW) happens inside the exported graph; the host's
only jobs are the ones a graph cannot do well: decoding files, turning photos upright (EXIF),
bringing odd colour modes to RGB, and the source model's eval resize (``preprocessing.host_resize``),
which is the rule the model was validated with (timm's crop_pct + interpolation, Hugging Face's
do_resize/size/resample). Resizing uses Pillow, as timm's and Hugging Face's eval transforms do on
PIL images, so the host produces the pixels those pipelines produce.

Data sources on disk (folders, .npz/.npy, the digits split) are read by :mod:`vitdeploy.data`.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from .errors import ConfigError, UserError
from .lazy import require

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm", ".pgm", ".pnm")

# Names the manifest may use for the resampling filter; Hugging Face configs store PIL's integer
# enum (0 nearest, 1 lanczos, 2 bilinear, 3 bicubic, 4 box, 5 hamming), timm stores names.
_PIL_FILTERS = {"nearest": 0, "lanczos": 1, "bilinear": 2, "bicubic": 3, "box": 4, "hamming": 5}
_DEFAULT_HOST_RESIZE = {"mode": "stretch", "interpolation": "bilinear", "crop_pct": None}
_HOST_RESIZE_MODES = ("stretch", "shorter-side-center-crop")


# -- decoding ---------------------------------------------------------------------------------
def decode_image(path: str | os.PathLike) -> np.ndarray:
    """Read an image file as uint8 RGB [H, W, 3], upright as its EXIF orientation says.

    Colour modes follow the training pipelines (timm, torchvision, Hugging Face all call
    ``convert("RGB")``): grayscale is replicated, alpha is dropped, palettes and CMYK are converted.
    High-bit-depth grayscale (16-bit PNG/TIFF, 12-bit TIFF) is scaled from its declared range to 8
    bits (Pillow's own conversion would clip it at 255). An image over Pillow's decompression-bomb
    limit is refused in one line rather than decoded with a warning.
    """
    import warnings

    image_mod = require("PIL.Image", "decoding images")
    ops = require("PIL.ImageOps", "decoding images")
    path = Path(path)
    if not path.is_file():
        raise UserError(f"image {path} does not exist" if not path.exists() else f"image {path} is not a file")
    try:
        with warnings.catch_warnings():
            # Pillow's own warnings (a truncated TIFF read, an odd EXIF) would print before our one line
            warnings.simplefilter("ignore")
            # it warns above MAX_IMAGE_PIXELS and raises above twice that: both are the same limit here
            warnings.simplefilter("error", image_mod.DecompressionBombWarning)
            with image_mod.open(path) as img:
                img.load()  # decode now, so a truncated file fails here and not later
                upright = ops.exif_transpose(img)
                return _to_rgb_array(upright if upright is not None else img, path)
    except (image_mod.DecompressionBombError, image_mod.DecompressionBombWarning):
        limit = (image_mod.MAX_IMAGE_PIXELS or 0) / 1e6
        raise UserError(f"image {path} is too large to decode safely (over Pillow's {limit:.0f}-megapixel limit); "
                        "downscale it first") from None
    except (OSError, SyntaxError, ValueError, EOFError, MemoryError) as exc:
        # UnidentifiedImageError is an OSError; truncated data raises OSError; odd modes ValueError.
        reason = str(exc).split("\n")[0] or exc.__class__.__name__
        raise UserError(f"cannot read image {path}: {reason}; give a JPEG, PNG, BMP, TIFF or WebP file") from None


# Grayscale modes wider than 8 bits, as Pillow names them (I;16*: unsigned 16-bit; I: 32-bit signed,
# which Pillow uses for some 16-bit PNGs and TIFFs)
WIDE_GRAY_MODES = ("I;16", "I;16L", "I;16B", "I;16N", "I")


def declared_bits(img: Any) -> int:
    """The bit depth an image file declares for its samples: TIFF BitsPerSample (12-bit sensor data is
    stored in 16-bit words), else the mode's own width (16 for I;16 and for Pillow's I from a PNG)."""
    tags = getattr(img, "tag_v2", None)
    if tags is not None and 258 in tags:  # TIFF BitsPerSample
        bits = tags[258]
        bits = bits[0] if isinstance(bits, tuple) else bits
        if isinstance(bits, int) and 1 <= bits <= 32:
            return bits
    return 16


def _to_rgb_array(img: Any, path: Any = "image") -> np.ndarray:
    if img.mode in WIDE_GRAY_MODES:
        bits = declared_bits(img)
        if bits > 16:
            raise UserError(f"cannot read image {path}: {bits}-bit integer samples have no standard display range; "
                            "convert it to 8 or 16 bits")
        gray = np.asarray(img).astype(np.int64)
        top = (1 << bits) - 1  # the format's range, whatever this image happens to hold: monotonic
        gray = (np.clip(gray, 0, top) * 255 + top // 2) // top
        gray = gray.astype(np.uint8)
        return np.ascontiguousarray(np.repeat(gray[:, :, None], 3, axis=2))
    if img.mode == "F":
        raise UserError(f"cannot read image {path}: floating-point samples (Pillow mode F) have no standard range; "
                        "convert it to 8 or 16-bit integers")
    rgb = img if img.mode == "RGB" else img.convert("RGB")
    return np.ascontiguousarray(np.asarray(rgb, dtype=np.uint8))


# -- the model's input size -------------------------------------------------------------------
def model_input_size(
    preprocessing: dict[str, Any],
    resolution: dict[str, Any] | None = None,
    patch_size: Sequence[int] | None = None,
    size: Sequence[int] | None = None,
) -> tuple[int, int]:
    """The (H, W) the host feeds: fixed by a static graph; for a graph that resizes inside, its
    target; for a dynamic-resolution graph, ``size`` or the manifest's default resolution."""
    fixed = preprocessing.get("input_size")
    in_graph = preprocessing.get("in_graph_resize")
    if fixed and not in_graph:
        if size is not None and tuple(int(v) for v in size) != tuple(int(v) for v in fixed):
            raise UserError(
                f"this graph takes {fixed[0]}x{fixed[1]} images only (static resolution); "
                f"export with --dynamic-resolution to run at {size[0]}x{size[1]}"
            )
        return int(fixed[0]), int(fixed[1])
    if in_graph:
        # Any input size is accepted; the best host pixels are the model's own size made with the
        # eval rule (antialiased), which the in-graph bilinear resize then passes through unchanged.
        target = size or in_graph.get("to") or fixed
        return int(target[0]), int(target[1])
    if size is None:
        res = resolution or {}
        if not res.get("height") or not res.get("width"):
            raise UserError("this graph has a dynamic resolution and the manifest names no default size; pass a size (e.g. 224x224)")
        size = (res["height"], res["width"])
    height, width = int(size[0]), int(size[1])
    if patch_size is not None:
        from .spec import check_resolution

        check_resolution(height, width, tuple(patch_size))
    return height, width


# -- the resize rule --------------------------------------------------------------------------
def host_resize_rule(preprocessing: dict[str, Any]) -> dict[str, Any]:
    """The manifest's host_resize with defaults filled in and validated."""
    rule = dict(_DEFAULT_HOST_RESIZE)
    rule.update({k: v for k, v in (preprocessing.get("host_resize") or {}).items() if v is not None})
    if rule["mode"] not in _HOST_RESIZE_MODES:
        raise ConfigError(f"unknown host_resize mode {rule['mode']!r} in the manifest (known: {', '.join(_HOST_RESIZE_MODES)})")
    crop_pct = rule.get("crop_pct")
    if crop_pct is not None and not (0.0 < float(crop_pct) <= 1.0):
        raise ConfigError(f"host_resize crop_pct must be in (0, 1], got {crop_pct}")
    pil_filter(rule["interpolation"])  # validate the name now
    return rule


def pil_filter(interpolation: str | int) -> int:
    if isinstance(interpolation, int) and interpolation in _PIL_FILTERS.values():
        return interpolation
    key = str(interpolation).lower()
    if key not in _PIL_FILTERS:
        raise ConfigError(f"unknown interpolation {interpolation!r} in the manifest (known: {', '.join(_PIL_FILTERS)})")
    return _PIL_FILTERS[key]


def resize_geometry(src_hw: tuple[int, int], rule: dict[str, Any], size: tuple[int, int]) -> tuple[tuple[int, int], tuple[int, int]]:
    """Where the resize rule sends an image: ((resized H, W), (crop top, crop left)).

    Follows timm's eval transform (``transforms_factory.transforms_imagenet_eval``):
    ``scale = floor(size / crop_pct)``; "shorter-side-center-crop" scales keeping the aspect ratio
    until the image covers ``scale`` (torchvision ``Resize(int)`` for square targets, timm
    ``ResizeKeepRatio`` otherwise), "stretch" resizes each edge to ``scale`` (Hugging Face
    ``do_resize`` with height/width; timm's "squash"); then both crop ``size`` from the centre
    (torchvision ``CenterCrop`` offsets). Without crop_pct the crop is a no-op for "stretch".
    """
    h, w = src_hw
    th, tw = size
    crop_pct = rule.get("crop_pct") or 1.0
    sh, sw = math.floor(th / crop_pct), math.floor(tw / crop_pct)
    if rule["mode"] == "stretch":
        new_h, new_w = sh, sw
    elif sh == sw:
        # torchvision Resize(int): the short edge becomes exactly s, the long one is truncated.
        if w <= h:
            new_w, new_h = sh, int(sh * h / w)
        else:
            new_h, new_w = sh, int(sh * w / h)
    else:
        ratio = min(h / sh, w / sw)
        new_h, new_w = round(h / ratio), round(w / ratio)
    top = int(round((new_h - th) / 2.0))
    left = int(round((new_w - tw) / 2.0))
    return (new_h, new_w), (top, left)


def resize_for_model(image: Any, preprocessing: dict[str, Any], size: Sequence[int]) -> np.ndarray:
    """Apply the manifest's host resize rule to one uint8 RGB image (array HWC or PIL image).

    The rule applies at every input size: with crop_pct < 1 even an image already at the model's
    size is scaled up and centre-cropped, as the source model's eval transform does.
    """
    image_mod = require("PIL.Image", "resizing images")
    rule = host_resize_rule(preprocessing)
    th, tw = int(size[0]), int(size[1])
    if isinstance(image, np.ndarray):
        _check_hwc(image)
        img = image_mod.fromarray(np.ascontiguousarray(image))
    else:
        img = image
    (new_h, new_w), (top, left) = resize_geometry((img.height, img.width), rule, (th, tw))
    if (new_h, new_w) != (img.height, img.width):
        img = img.resize((new_w, new_h), resample=pil_filter(rule["interpolation"]))
    arr = np.asarray(img, dtype=np.uint8)
    return np.ascontiguousarray(arr[top : top + th, left : left + tw])


def _check_hwc(image: np.ndarray) -> None:
    if image.dtype != np.uint8:
        raise UserError(f"images must be uint8 pixels, got {image.dtype}; pass the raw image (the graph normalises it)")
    if image.ndim != 3 or image.shape[2] != 3:
        raise UserError(f"an image must be uint8 [H, W, 3], got shape {list(image.shape)}")


def to_channel_order(batch: np.ndarray, preprocessing: dict[str, Any]) -> np.ndarray:
    """RGB pixels -> the graph's channel order (a BGR graph, for OpenCV pipelines, takes BGR)."""
    if preprocessing.get("channel_order", "rgb").lower() == "bgr":
        return np.ascontiguousarray(batch[..., ::-1])
    return batch


def load_images(paths: Sequence[str | os.PathLike], preprocessing: dict[str, Any], size: Sequence[int]) -> np.ndarray:
    """Decode, resize by the manifest's rule and order channels: uint8 [N, H, W, 3] for the graph."""
    if not paths:
        raise UserError("no images given")
    out = np.empty((len(paths), int(size[0]), int(size[1]), 3), dtype=np.uint8)
    for i, path in enumerate(paths):
        out[i] = resize_for_model(decode_image(path), preprocessing, size)
    return to_channel_order(out, preprocessing)
