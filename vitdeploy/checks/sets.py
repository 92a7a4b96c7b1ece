"""What `check` feeds every artifact: the input contract's sets, as named feeds.

One input size per call (fixed or dynamic graphs): seeded random images at every size the bundle is
verified at (sized by the cost model's budget, vitdeploy.evalsets) and the labelled real images;
each image is judged against PyTorch on that image.

A canvas (variable-size graphs, images + valid_hw): each set runs as padded batches of mixed sizes
with seeded noise in the padding, and each row is judged against PyTorch on its image ALONE at its own
size (the invariance Algorithm 39.1 promises; the reference is the PyTorch runner's per-image mode):

- numbers: seeded random images of mixed whole-patch sizes (the canvas, one patch, portrait,
  landscape, the native size, random);
- task: the labelled set with every image rescaled to a seeded random size and aspect ratio
  (0.5-1.5x the native side, aspect 1:3 to 3:1) and fitted by the bundle's host policy;
- edge: valid_hw of one patch, the full canvas, and values the graph clamps (0, negative, beyond the
  canvas, int32 extremes): no reference, no output may be NaN or inf.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from ..bundle import Bundle
from ..contract import CANVAS, DYNAMIC, FIXED, InputContract

IMAGES = "images"  # each image vs PyTorch on that image
ROWS = "rows"  # each padded row of a mixed-size batch vs PyTorch on its image alone at its own size
FINITE = "finite"  # no reference: every output value must be finite


@dataclass
class CheckSet:
    name: str
    feeds: dict[str, np.ndarray]  # the graph's named inputs
    labels: np.ndarray | None  # int64 class indices into the bundle's labels, or None
    real: bool
    judged: str  # IMAGES, ROWS or FINITE
    meta: dict[str, Any] = field(default_factory=dict)
    what: str = ""  # one phrase for the report ("16 random images of mixed sizes")

    @property
    def images(self) -> np.ndarray:
        return next(iter(self.feeds.values()))

    def record(self) -> dict[str, Any]:
        images = self.images
        return {"name": self.name, "real": self.real, "count": int(len(images)), "height": int(images.shape[1]),
                "width": int(images.shape[2]), "labelled": self.labels is not None, "judged": self.judged, **self.meta}


def check_sets(bundle: Bundle, contract: InputContract, opts: Any, log: Callable[[str], None]) -> list[CheckSet]:
    """The sets of this contract (the module doc), from ``opts`` (random_count, seed, data, limit)."""
    return _SETS[contract.kind](bundle, contract, opts, log)


def image_sets(bundle: Bundle, contract: InputContract, opts: Any, log: Callable[[str], None]) -> list[CheckSet]:
    from ..data import default_data
    from ..evalsets import random_sets, real_set

    found = random_sets(bundle, opts.random_count, opts.seed)
    data = opts.data or default_data(bundle)
    if data:
        found.append(real_set(bundle, data, opts.limit))
    # an embedding model has no classes: its real images judge parity on the embedding, their labels nothing
    keep_labels = not bundle.embedding_model
    return [CheckSet(s.name, contract.feeds(s.images), s.labels if keep_labels else None, s.real, IMAGES, dict(s.meta)) for s in found]


def canvas_sets(bundle: Bundle, contract: InputContract, opts: Any, log: Callable[[str], None]) -> list[CheckSet]:
    from ..data import default_data, open_labelled
    from ..images import to_channel_order
    from ..variable import RESCALE_RULE, VALID_INPUT, edge_valid_hw, mixed_size_images, mixed_sizes, padded_batch, size_summary

    canvas, patch, native = contract.size, contract.patch, contract.native
    sizes = mixed_sizes(canvas, patch, native, max(6, min(opts.random_count, 16)), seed=opts.seed)
    rng = np.random.default_rng(opts.seed)
    crops = [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in sizes]
    batch, valid = padded_batch(crops, canvas, seed=opts.seed + 1)
    name = contract.image_input
    found = [CheckSet("numbers", {name: batch, VALID_INPUT: valid}, None, False, ROWS, {"sizes": [list(s) for s in sizes]},
                      f"{len(sizes)} random images of mixed sizes")]
    data = opts.data or default_data(bundle)
    if data:
        labelled = open_labelled(data, native, contract.preprocessing, classes=bundle.labels, limit=opts.limit)
        fitted = [to_channel_order(img, contract.preprocessing)
                  for img in mixed_size_images(labelled.images, contract.preprocessing, opts.seed, contract.policy)]
        batch, valid = padded_batch(fitted, canvas, seed=opts.seed + 2)
        meta = {"data": labelled.record(), "policy": contract.policy, "rescale": RESCALE_RULE, **size_summary(fitted)}
        found.append(CheckSet("task", {name: batch, VALID_INPUT: valid}, np.asarray(labelled.labels), True, ROWS, meta,
                              f"{len(fitted)} images of {data}"))
        log(f"task set: {len(fitted)} images of {data} at {meta['distinct_sizes']} sizes ({meta['smallest'][0]}x{meta['smallest'][1]} "
            f"to {meta['largest'][0]}x{meta['largest'][1]}, policy {contract.policy})")
    edge = edge_valid_hw(canvas, patch)
    edge_images = np.random.default_rng(opts.seed + 3).integers(0, 256, (len(edge), canvas[0], canvas[1], 3), dtype=np.uint8)
    found.append(CheckSet("edge", {name: edge_images, VALID_INPUT: edge}, None, False, FINITE, {"valid_hw": edge.tolist()},
                          "valid_hw rows of one patch, the full canvas, and values the graph clamps"))
    return found


_SETS = {FIXED: image_sets, DYNAMIC: image_sets, CANVAS: canvas_sets}


# -- what the report adds for a canvas ----------------------------------------------------------------
def canvas_summary(bundle: Bundle, contract: InputContract, sets: list[CheckSet], artifacts: list[dict[str, Any]],
                   ref_acc: dict[str, float], opts: Any) -> dict[str, Any]:
    """The variable-size report's own fields: canvas, rule, and the fp32 graph's numbers and task rows."""
    first = next((a for a in artifacts if a["precision"] == "fp32" and a.get("sets")), next((a for a in artifacts if a.get("sets")), None))
    rows = {row["set"]: row for row in first["sets"]} if first is not None else {}
    by_name = {s.name: s for s in sets}
    numbers: dict[str, Any] = {"sizes": by_name["numbers"].meta["sizes"], "canvas": list(contract.size), "limit_max_abs": opts.gate.fp32_max_abs,
                               "reference": "PyTorch, each image alone at its own size"}
    if "numbers" in rows:
        numbers.update({"precision": first["precision"], **rows["numbers"]["logits"], "passed": rows["numbers"]["passed"]})
    task: dict[str, Any] = {}
    if "task" in by_name:
        task = {**by_name["task"].meta, "reference_accuracy": ref_acc.get("task")}
        if "task" in rows:
            got = rows["task"]
            task.update({"precision": first["precision"], "accuracy": got["accuracy"], "accuracy_drop": got["accuracy_drop"],
                         **{k: got["logits"][k] for k in ("max_abs", "top1_agreement", "cosine_min", "cosine_p1")}})
    return {"kind": "variable-size", "canvas": list(contract.size), "rule": contract.preprocessing["variable_size"]["rule"], "numbers": numbers,
            "task": task, "edge_valid_hw": by_name["edge"].meta["valid_hw"]}


def no_summary(bundle: Bundle, contract: InputContract, sets: list[CheckSet], artifacts: list[dict[str, Any]],
               ref_acc: dict[str, float], opts: Any) -> dict[str, Any]:
    return {}


REPORT_FIELDS = {FIXED: no_summary, DYNAMIC: no_summary, CANVAS: canvas_summary}
