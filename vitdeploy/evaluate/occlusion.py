"""Occlusion sensitivity computed by the deployed graph.

Rule (written into every report): a square of ``patch`` x ``patch`` pixels, filled by the fill rule
(default ``mean``: the preprocessing mean as pixels, i.e. zero input after normalisation), slides
over the image with ``stride`` (the last position is added so the square reaches the right and
bottom edges). For each position the graph scores the occluded image, and the sensitivity of that
position is p(target | clean) - p(target | occluded), where target is the image's label when the
data carries one, else the class the graph predicts on the clean image. A pixel's sensitivity is
the mean, over every position whose square covers it, of the positive part of that drop (evidence
for the target removed by hiding the neighbourhood); positions whose occlusion raised the target
probability count as zero there, and the signed mean is kept beside it (``signed``). Why the
positive part: a confident model (the digits model sits at p = 0.91, its label-smoothing ceiling)
answers most occlusions with changes of +-0.005 of either sign, and averaging those signed values
over ink lets a few "erasing this stroke helps" positions cancel the "erasing this stroke hurts"
ones; the signed map is saved so a reader can see both.

What this is not: occlusion changes the input distribution (the model never saw grey squares), so
a map says how this graph responds to this occluder, not which pixels "cause" the decision; a
different fill or patch size gives a different map, which is why both are recorded. Attention
weights are not used: they are not causal importance.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from ..errors import UserError
from .transforms import Context, fill_colour


def positions(size: int, patch: int, stride: int) -> list[int]:
    """Top (or left) offsets of the sliding square; the last one is flush with the far edge."""
    out = list(range(0, size - patch + 1, stride))
    if out[-1] != size - patch:
        out.append(size - patch)
    return out


def occlusion_rule(patch: int, stride: int, fill: str, fill_rgb: Any) -> str:
    colour = "(each image's border median colour, i.e. erased to background)" if fill == "border" else str([int(v) for v in fill_rgb])
    return (f"a {patch}x{patch} px square filled with {fill} {colour} slides with stride {stride} px "
            "(last position flush with the edge); sensitivity of a position = p(target | clean) - p(target | occluded), computed "
            "by the deployed graph; target = the label when known, else the graph's clean top-1; a pixel's sensitivity = mean over "
            "the positions whose square covers it of max(0, drop) (occlusion.npy); the signed mean is in occlusion_signed.npy")


def occlusion_maps(predict_probs: Callable[[np.ndarray], np.ndarray], images: np.ndarray, targets: np.ndarray | None,
                   patch: int, stride: int, ctx: Context, to_graph: Callable[[np.ndarray], np.ndarray] = lambda x: x,
                   chunk: int = 4096, on_image: Callable[[int], None] | None = None) -> dict[str, np.ndarray]:
    """Sensitivity maps [N, H, W] for uint8 RGB ``images`` (all positions of several images batched).

    ``predict_probs``: graph input (already in its channel order) -> probabilities [B, classes].
    Returns maps, targets, clean target probabilities and the per-position drops [N, Py, Px]."""
    n, height, width, _ = images.shape
    if patch < 1 or patch > min(height, width):
        raise UserError(f"occlusion patch must be 1..{min(height, width)} px for {height}x{width} images, got {patch}")
    if stride < 1:
        raise UserError(f"occlusion stride must be >= 1 px, got {stride}")
    tops, lefts = positions(height, patch, stride), positions(width, patch, stride)
    per_image = len(tops) * len(lefts)
    fill = fill_colour(ctx, images)
    clean = predict_probs(to_graph(images))
    if targets is None:
        targets = clean.argmax(axis=-1)
    targets = np.asarray(targets, dtype=np.int64)
    clean_p = clean[np.arange(n), targets]
    drops = np.empty((n, len(tops), len(lefts)), dtype=np.float64)
    # Several images' occluded copies share a batch: chunk images so one batch holds ~`chunk` inputs.
    step = max(1, chunk // per_image)
    for start in range(0, n, step):
        block = images[start:start + step]
        copies = np.repeat(block, per_image, axis=0).reshape(len(block), len(tops), len(lefts), height, width, 3)
        for a, top in enumerate(tops):
            for b, left in enumerate(lefts):
                copies[:, a, b, top:top + patch, left:left + patch] = fill[start:start + len(block), None, None, :]
        probs = predict_probs(to_graph(copies.reshape(-1, height, width, 3)))
        idx = np.repeat(targets[start:start + len(block)], per_image)
        occluded_p = probs[np.arange(len(idx)), idx].reshape(len(block), len(tops), len(lefts))
        drops[start:start + len(block)] = clean_p[start:start + len(block), None, None] - occluded_p
        if on_image is not None:
            on_image(len(block))
    total = np.zeros((n, height, width), dtype=np.float64)
    signed = np.zeros((n, height, width), dtype=np.float64)
    count = np.zeros((height, width), dtype=np.float64)
    for a, top in enumerate(tops):
        for b, left in enumerate(lefts):
            total[:, top:top + patch, left:left + patch] += np.maximum(drops[:, a, b], 0.0)[:, None, None]
            signed[:, top:top + patch, left:left + patch] += drops[:, a, b, None, None]
            count[top:top + patch, left:left + patch] += 1
    return {"maps": (total / count).astype(np.float32), "signed": (signed / count).astype(np.float32), "targets": targets,
            "clean_prob": clean_p.astype(np.float32), "drops": drops.astype(np.float32), "tops": np.asarray(tops),
            "lefts": np.asarray(lefts)}


def write_overlays(images: np.ndarray, maps: np.ndarray, titles: list[str], target: Any, columns: int = 8) -> Any:
    """A grid of images with their sensitivity maps overlaid (red: positive drop), one PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ..fileio import atomic_path

    n = len(images)
    cols = min(columns, n)
    rows = int(np.ceil(n / cols))
    fig, axes = plt.subplots(rows, cols, figsize=(1.9 * cols, 2.3 * rows), squeeze=False)
    for i in range(rows * cols):
        ax = axes[i // cols][i % cols]
        ax.axis("off")
        if i >= n:
            continue
        ax.imshow(images[i], interpolation="nearest")
        # Per-image scale (a confident image's map is 100x weaker than an ambiguous one's); zero = clear.
        top = float(maps[i].max())
        overlay = np.zeros(maps[i].shape + (4,))
        overlay[..., 0] = 1.0  # red, opacity proportional to the sensitivity
        overlay[..., 3] = 0.85 * np.clip(maps[i] / (top or 1.0), 0.0, 1.0)
        ax.imshow(overlay, interpolation="nearest")
        ax.set_title(f"{titles[i]}\nmax {top:.3f}", fontsize=6.5)
    fig.suptitle("occlusion sensitivity: mean positive drop of the target probability (red opacity, per-image scale; "
                 "max under each image; clear = no drop)", fontsize=9)
    fig.tight_layout()
    with atomic_path(target, suffix=".png") as tmp:
        fig.savefig(tmp, dpi=110, format="png")
    plt.close(fig)
    return target
