"""What `check` feeds an artifact: seeded random uint8 images at every declared size, and real
labelled images (the bundled digits split, an image folder, or a .npy array)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..bundle import Bundle
from ..errors import UserError
from ..preprocess import random_images


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
    pre = bundle.preprocessing
    if pre.get("in_graph_resize"):
        to = pre["in_graph_resize"]["to"]
        sizes = [(to[0] * 3 // 2, to[1] * 5 // 4)]  # camera frames of another size
    else:
        sizes = verification_sizes(bundle)
    return [EvalSet(f"random {h}x{w} (seed {seed + i})", random_images(count, h, w, seed + i), None, False,
                    {"seed": seed + i, "height": h, "width": w}) for i, (h, w) in enumerate(sizes)]


def default_data(bundle: Bundle) -> str | None:
    """The bundled model's own held-out split; other sources need --data."""
    source = bundle.manifest.get("source", {})
    if source.get("kind") == "builtin" and source.get("name") == "digits":
        return "digits:test"
    return None


def real_set(bundle: Bundle, data: str, limit: int | None = None) -> EvalSet:
    """Labelled real images at the artifact's input size, in its channel order."""
    pre = bundle.preprocessing
    size = pre.get("input_size") or pre.get("model_size") or [bundle.resolution["height"], bundle.resolution["width"]]
    if data.startswith("digits:"):
        from ..builtin import get_builtin

        images, labels = get_builtin("digits").load_split(data.split(":", 1)[1])
        if tuple(images.shape[1:3]) != tuple(size):
            from ..images import resize_for_model

            images = np.stack([resize_for_model(img, pre, size) for img in images])
        if pre.get("channel_order") == "bgr":
            images = np.ascontiguousarray(images[..., ::-1])
        labels_out: np.ndarray | None = labels.astype(np.int64)
        meta: dict[str, Any] = {"source": data}
    else:
        path = Path(data)
        if path.suffix == ".npy":
            try:
                images = np.load(path, allow_pickle=False)
            except (OSError, ValueError) as exc:
                raise UserError(f"cannot read {path} as a .npy array ({exc})") from None
            if images.dtype != np.uint8 or images.ndim != 4 or images.shape[-1] != 3:
                raise UserError(f"{path} holds {images.dtype} {list(images.shape)}; expected uint8 [N,H,W,3] in the artifact's channel order")
            labels_out, meta = None, {"source": str(path)}
        elif path.is_dir():
            from ..images import load_image_folder, load_images

            folder = load_image_folder(path)
            names = bundle.labels
            missing = [c for c in folder.classes if c not in names]
            if missing:
                raise UserError(f"class folders {', '.join(missing[:5])} in {path} are not labels of this model; "
                                "name each sub-folder after a label in labels.txt")
            images = load_images(folder.paths, pre, size)
            labels_out = np.array([names.index(folder.classes[i]) for i in folder.labels], dtype=np.int64)
            meta = {"source": str(path), "classes": folder.classes}
        else:
            raise UserError(f"--data {data!r} is neither digits:test|train, a folder DIR/<class>/<image>, nor a .npy array")
    if limit:
        images = images[:limit]
        labels_out = labels_out[:limit] if labels_out is not None else None
    meta["count"] = int(len(images))
    meta["sha256"] = _array_sha(images)
    return EvalSet(data, images, labels_out, True, meta)


def _array_sha(images: np.ndarray) -> str:
    import hashlib

    return hashlib.sha256(np.ascontiguousarray(images).tobytes()).hexdigest()
