"""What a verification feeds an artifact: seeded random uint8 images at every declared size (sized by
the cost model's budget), and real images through :mod:`vitdeploy.data` (the bundled digits split,
DIR/<class>/<image>, a .npz with labels, or a .npy array at the input contract).

In the core, below every step that verifies a graph: export's verification, `check`, calibration's
evaluation, the fused CPU graph's gate and the 8.x lowering all draw their images here."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .bundle import Bundle
from .preprocess import random_images


@dataclass
class EvalSet:
    name: str  # "random 224x224 (seed 0)", "digits:test", "folder ./val"
    images: np.ndarray  # uint8 NHWC in the artifact's channel order
    labels: np.ndarray | None  # int64 class indices into the bundle's labels, or None
    real: bool
    meta: dict[str, Any] = field(default_factory=dict)


def verification_sizes(bundle: Bundle) -> list[tuple[int, int]]:
    """Sizes an artifact is verified at: its one size, or for dynamic graphs the native size, four
    patches smaller and larger, and a non-square one (224 -> 160, 288, 224x320 for patch 16)."""
    res = bundle.resolution
    h, w = res["height"], res["width"]
    if res["mode"] != "dynamic":
        return [(h, w)]
    ph, pw = bundle.spec.patch_size
    sizes = [(h, w), (h - 4 * ph, w - 4 * pw), (h + 4 * ph, w + 4 * pw), (h, w + 6 * pw)]
    return [s for s in sizes if s[0] > 0 and s[1] > 0]


def random_sets(bundle: Bundle, count: int, seed: int) -> list[EvalSet]:
    """Seeded random images at every size: ``count`` per size at most, cut by the cost model's budget as
    export's verification is (vitdeploy.budget), so checking a ViT-B/16 costs what verifying it did."""
    from .budget import DEFAULT_BUDGET_GMACS, plan_verification

    pre = bundle.preprocessing
    model_size = None
    if pre.get("in_graph_resize"):
        to = pre["in_graph_resize"]["to"]
        sizes = [(to[0] * 3 // 2, to[1] * 5 // 4)]  # camera frames of another size
        model_size = (int(to[0]), int(to[1]))
    else:
        sizes = verification_sizes(bundle)
    plans = plan_verification(bundle.spec, sizes, count, model_size=model_size)
    return [EvalSet(f"random {h}x{w} (seed {seed + i})", random_images(plan.images, h, w, seed + i), None, False,
                    {"seed": seed + i, "height": h, "width": w, "requested": count, "gmacs_per_image": plan.gmacs_per_image,
                     "budget_gmacs_per_runtime": DEFAULT_BUDGET_GMACS})
            for i, ((h, w), plan) in enumerate(zip(sizes, plans))]


def real_set(bundle: Bundle, data: str, limit: int | None = None) -> EvalSet:
    """Real images at the artifact's input size, in its channel order, with labels where the source
    has them: read by :func:`vitdeploy.data.open_labelled` (``evaluate``'s and ``calibrate``'s
    loader), so ``limit`` is its seeded subset and the record is its record."""
    from .data import open_labelled
    from .images import to_channel_order

    pre = bundle.preprocessing
    size = pre.get("input_size") or pre.get("model_size") or [bundle.resolution["height"], bundle.resolution["width"]]
    # check has no --skip-unreadable: an undecodable file is an error naming it
    loaded = open_labelled(data, size, pre, bundle.labels or None, limit, need_labels=False, skip_flag=None)
    return EvalSet(data, to_channel_order(loaded.images, pre), loaded.labels, True, loaded.record())
