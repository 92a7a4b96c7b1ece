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

from typing import Any, Sequence, Tuple

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
