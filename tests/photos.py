"""Real photographs for parity tests: the two photos scikit-learn ships (``china.jpg``, ``flower.jpg``,
427x640 JPEGs, https://scikit-learn.org/stable/modules/generated/sklearn.datasets.load_sample_images.html).

Random pixels are a poor probe for a vision model: they have no spatial structure, so a position
table read in the wrong order or a patch grid transposed moves the output little. Photos do have it.
``real_photos`` cuts ``count`` distinct views (offsets, scales, a mirror) out of the two photos and
resizes each to the size asked with PIL's bicubic filter: pixels that a test then feeds to the
source library (its processor with ``do_resize=False``) and to the bundle's graph alike, so the
comparison measures the model and its normalisation, not two resize implementations.
``photo_folder`` writes the same views as PNG files, for commands that take a folder of images.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np


def _sources() -> list[np.ndarray]:
    from sklearn.datasets import load_sample_images

    return [np.asarray(image, dtype=np.uint8) for image in load_sample_images().images]


def real_photos(count: int, height: int, width: int) -> np.ndarray:
    """``count`` distinct uint8 RGB views [count, height, width, 3] of scikit-learn's sample photos."""
    from PIL import Image

    sources = _sources()
    views = []
    for i in range(count):
        photo = sources[i % len(sources)]
        rows, cols = photo.shape[:2]
        step = i // len(sources)
        scale = (1.0, 0.8, 0.6, 0.9, 0.7)[step % 5]  # crop side as a share of the photo
        ch, cw = int(rows * scale), int(cols * scale)
        top = (step * 37) % (rows - ch + 1)
        left = (step * 53) % (cols - cw + 1)
        crop = photo[top:top + ch, left:left + cw]
        if (step // 5) % 2:
            crop = crop[:, ::-1]  # a mirrored view once the scales are used up
        image = Image.fromarray(np.ascontiguousarray(crop)).resize((width, height), Image.BICUBIC)
        views.append(np.asarray(image, dtype=np.uint8))
    return np.stack(views)


def photo_folder(folder: Path, count: int, height: int, width: int) -> Path:
    """The views of ``real_photos`` as PNG files ``photo_00.png`` ... in ``folder`` (made if missing)."""
    from PIL import Image

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for i, view in enumerate(real_photos(count, height, width)):
        Image.fromarray(view).save(folder / f"photo_{i:02d}.png")
    return folder
