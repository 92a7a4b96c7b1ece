"""The host side of variable-size graphs: fit each image into the canvas, pad, and guard valid_hw.

A variable-size bundle (``vitdeploy export --variable-size --canvas HxW``) takes ``images`` uint8
[B, H_c, W_c, 3] with each image top-left in the canvas and ``valid_hw`` int32 [B, 2]. The graph
floors valid sizes to whole patches; the host must therefore hand it whole-patch sizes, or the
pixels of a partial patch would be dropped silently. The policies, recorded in the manifest:

- ``fit-within`` (default): keep the aspect ratio, scale (up or down) so the image fits the canvas,
  round each side down to whole patches (at least one), resize with the manifest's interpolation;
- ``shrink-within``: the same, but never enlarge (small images keep their scale, rounded to patches);
- ``none``: the caller's pixels as they are: sizes must already be whole patches within the canvas.

No torch here: this runs on the device.
"""

from __future__ import annotations

from typing import Any, Dict, List, Sequence, Tuple

import numpy as np

from .errors import UserError

VALID_INPUT = "valid_hw"
POLICIES = ("fit-within", "shrink-within", "none")


def check_sizes_for_canvas(valid_hw: np.ndarray, canvas: Sequence[int], patch: Sequence[int]) -> None:
    """Refuse, in one line, valid sizes the graph would clamp or floor (Algorithm 39.1's guards)."""
    valid = np.asarray(valid_hw)
    if valid.ndim != 2 or valid.shape[1] != 2:
        raise UserError(f"valid_hw must be [batch, 2] (height, width), got shape {tuple(valid.shape)}")
    if not np.issubdtype(valid.dtype, np.integer):
        raise UserError(f"valid_hw must hold integers (int32), got {valid.dtype}")
    ch, cw = int(canvas[0]), int(canvas[1])
    ph, pw = int(patch[0]), int(patch[1])
    for row, (h, w) in enumerate(valid.tolist()):
        if h <= 0 or w <= 0:
            raise UserError(f"valid_hw row {row} is {h}x{w}: every image needs at least one {ph}x{pw} patch")
        if h > ch or w > cw:
            raise UserError(f"valid_hw row {row} is {h}x{w}, larger than the {ch}x{cw} canvas; resize it to fit (policy fit-within)")
        if h % ph or w % pw:
            raise UserError(
                f"valid_hw row {row} is {h}x{w}, not whole {ph}x{pw} patches; the graph would drop the partial patch "
                f"(use {h - h % ph or ph}x{w - w % pw or pw} or the fit-within policy)"
            )


def fitted_size(src_hw: Tuple[int, int], canvas: Sequence[int], patch: Sequence[int], policy: str) -> Tuple[int, int]:
    """The whole-patch size an image of ``src_hw`` is resized to under ``policy``."""
    h, w = int(src_hw[0]), int(src_hw[1])
    ch, cw = int(canvas[0]), int(canvas[1])
    ph, pw = int(patch[0]), int(patch[1])
    if policy == "none":
        check_sizes_for_canvas(np.array([[h, w]]), canvas, patch)
        return h, w
    if policy not in POLICIES:
        raise UserError(f"unknown variable-size policy {policy!r}; use one of {', '.join(POLICIES)}")
    scale = min(ch / h, cw / w)
    if policy == "shrink-within":
        scale = min(scale, 1.0)
    new_h = max(ph, int(round(h * scale)) // ph * ph)
    new_w = max(pw, int(round(w * scale)) // pw * pw)
    return min(new_h, ch // ph * ph), min(new_w, cw // pw * pw)


def fit_image(image: np.ndarray, preprocessing: dict, policy: str | None = None) -> np.ndarray:
    """One uint8 HWC image resized to its whole-patch size within the canvas (manifest's interpolation)."""
    from .images import host_resize_rule, pil_filter
    from .lazy import require

    contract = preprocessing["variable_size"]
    canvas, patch = contract["canvas"], contract["round_to"]
    policy = policy or contract.get("host_policy", "fit-within")
    if image.ndim != 3 or image.shape[2] != 3 or image.dtype != np.uint8:
        raise UserError(f"expected a uint8 HxWx3 image, got {image.dtype} {tuple(image.shape)}")
    target = fitted_size(image.shape[:2], canvas, patch, policy)
    if target == tuple(image.shape[:2]):
        return image
    pil = require("PIL.Image", "resizing images")
    resample = pil_filter(host_resize_rule(preprocessing)["interpolation"])
    return np.asarray(pil.fromarray(np.ascontiguousarray(image)).resize((target[1], target[0]), resample=resample), dtype=np.uint8)


def pad_to_canvas(images: Sequence[np.ndarray], canvas: Sequence[int], fill: int = 0) -> Tuple[np.ndarray, np.ndarray]:
    """Images (whole-patch sizes within the canvas) top-left into one [B, H_c, W_c, 3] batch + valid_hw."""
    ch, cw = int(canvas[0]), int(canvas[1])
    batch = np.full((len(images), ch, cw, 3), fill, dtype=np.uint8)
    valid = np.zeros((len(images), 2), dtype=np.int32)
    for i, image in enumerate(images):
        h, w = image.shape[:2]
        if h > ch or w > cw:
            raise UserError(f"image {i} is {h}x{w}, larger than the {ch}x{cw} canvas; resize it to fit (policy fit-within)")
        batch[i, :h, :w] = image
        valid[i] = (h, w)
    return batch, valid


def contract_of(preprocessing: dict) -> Any:
    """The manifest's variable-size contract, or None for single-size graphs."""
    return preprocessing.get("variable_size")


def mixed_sizes(canvas: Sequence[int], patch: Sequence[int], native: Sequence[int], count: int, seed: int = 0) -> List[Tuple[int, int]]:
    """Seeded whole-patch sizes spanning the canvas: the canvas itself, the smallest (one patch),
    portrait and landscape extremes, the native size where it fits, then random sizes."""
    grid_h, grid_w = int(canvas[0]) // int(patch[0]), int(canvas[1]) // int(patch[1])
    fixed = [(grid_h, grid_w), (1, 1), (grid_h, max(1, grid_w // 3)), (max(1, grid_h // 3), grid_w)]
    if native[0] <= canvas[0] and native[1] <= canvas[1]:
        fixed.append((int(native[0]) // int(patch[0]), int(native[1]) // int(patch[1])))
    rng = np.random.default_rng(seed)
    while len(fixed) < count:
        fixed.append((int(rng.integers(1, grid_h + 1)), int(rng.integers(1, grid_w + 1))))
    return [(gh * int(patch[0]), gw * int(patch[1])) for gh, gw in fixed[:count]]


def padded_batch(crops: Sequence[np.ndarray], canvas: Sequence[int], seed: int = 1) -> Tuple[np.ndarray, np.ndarray]:
    """Crops placed top-left in canvases whose padding holds seeded noise (the graph must ignore it)."""
    rng = np.random.default_rng(seed)
    batch = rng.integers(0, 256, (len(crops), int(canvas[0]), int(canvas[1]), 3), dtype=np.uint8)
    valid = np.zeros((len(crops), 2), dtype=np.int32)
    for i, crop in enumerate(crops):
        h, w = crop.shape[:2]
        batch[i, :h, :w] = crop
        valid[i] = (h, w)
    return batch, valid


def edge_valid_hw(canvas: Sequence[int], patch: Sequence[int]) -> np.ndarray:
    """valid_hw rows at and beyond the edges of the declared rule: one patch, the full canvas, and
    what the graph clamps (zero, negative, larger than the canvas, int32 extremes). No row may give NaN."""
    ch, cw, ph, pw = int(canvas[0]), int(canvas[1]), int(patch[0]), int(patch[1])
    return np.array([[ph, pw], [ch, cw], [0, 0], [-5, 3], [ch * 10, cw * 10], [2**31 - 1, -(2**31)]], dtype=np.int32)


def run_padded_graph(session: Any, images: np.ndarray, valid_hw: np.ndarray, outputs: Sequence[str] | None = None,
                     batch: int | None = None) -> Dict[str, np.ndarray]:
    """A two-input (images, valid_hw) ONNX Runtime session over ``images`` in chunks of ``batch``
    (all at once when None; 1 runs each image alone). Returns the named outputs (default: all)."""
    names = list(outputs) if outputs else [o.name for o in session.get_outputs()]
    step = int(batch) if batch else max(1, len(images))
    parts: List[List[np.ndarray]] = []
    for start in range(0, len(images), step):
        feeds = {"images": images[start:start + step], VALID_INPUT: np.asarray(valid_hw[start:start + step], dtype=np.int32)}
        parts.append(session.run(names, feeds))
    return {name: np.concatenate([p[i] for p in parts]).astype(np.float32) for i, name in enumerate(names)}


# -- the mixed-size sets `check` scores and `calibrate` calibrates on ---------------------------------
RESCALE_RULE = "seeded random scale 0.5-1.5x and aspect ratio 1:3-3:1 (bilinear), then the bundle's host policy"


def mixed_rescale(image: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """The image at a seeded random scale (0.5-1.5x) and aspect ratio (1:3 to 3:1), bilinear."""
    from PIL import Image

    h, w = image.shape[:2]
    scale = rng.uniform(0.5, 1.5)
    aspect = float(np.exp(rng.uniform(np.log(1 / 3), np.log(3))))
    new_h = max(1, int(round(h * scale / np.sqrt(aspect))))
    new_w = max(1, int(round(w * scale * np.sqrt(aspect))))
    return np.asarray(Image.fromarray(image).resize((new_w, new_h), Image.BILINEAR), dtype=np.uint8)


def mixed_size_images(images: Sequence[np.ndarray], preprocessing: dict, seed: int, policy: str | None = None) -> List[np.ndarray]:
    """Each image rescaled by :func:`mixed_rescale` (seeded) and fitted into the canvas by the host
    policy: the mixed whole-patch sizes `check` scores and `calibrate` calibrates on."""
    rng = np.random.default_rng(seed)
    return [fit_image(mixed_rescale(np.ascontiguousarray(img), rng), preprocessing, policy) for img in images]


def size_summary(images: Sequence[np.ndarray]) -> Dict[str, Any]:
    sizes = sorted({tuple(int(v) for v in i.shape[:2]) for i in images})
    return {"distinct_sizes": len(sizes), "smallest": list(sizes[0]), "largest": list(sizes[-1])}
