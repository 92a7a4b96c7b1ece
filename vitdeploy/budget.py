"""How many images a verification runs, from the cost model: shared by export's verification
(exporters/verify.py, whose docstring gives the reasoning) and `vitdeploy check`, so a ViT-B/16 is
never checked on more forward passes than it was verified on at export.

The plan depends only on the model and the sizes, never on the machine's speed or load, so a record
is reproducible.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from .costs import memory_estimate, vit_costs
from .spec import ViTSpec

MIN_IMAGES = 2  # per size: two images in one call exercise the batch axis
MAX_BATCH = 16
DEFAULT_BUDGET_GMACS = 200.0  # per runtime, whole verification: ~5 s of PyTorch on a 2-core VM (ViT-S rates)
DEFAULT_MEMORY_BUDGET_MB = 512.0  # activations of one batch, by the cost model's estimate


@dataclass
class SizePlan:
    height: int
    width: int
    images: int
    batch: int
    gmacs_per_image: float
    activation_mb_per_image: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def plan_verification(spec: ViTSpec, sizes: list[tuple[int, int]], requested: int, budget_gmacs: float = DEFAULT_BUDGET_GMACS,
                      memory_budget_mb: float = DEFAULT_MEMORY_BUDGET_MB, model_size: tuple[int, int] | None = None) -> list[SizePlan]:
    """Images and batch per size from the cost model (see the module docstring).

    ``model_size``: where an in-graph resize runs the model at one size whatever the input.
    """
    costs = []
    for h, w in sizes:
        mh, mw = model_size or (h, w)
        costs.append((vit_costs(spec, mh, mw, 1).macs_total / 1e9, memory_estimate(spec, mh, mw, 1).total_bytes / 2**20))
    per_set = sum(g for g, _ in costs)  # one image at every size
    fit = int(budget_gmacs // per_set) if per_set > 0 else requested
    images = max(min(requested, MIN_IMAGES), min(requested, fit))  # the same count at every size
    plans = []
    for (h, w), (gmacs, act_mb) in zip(sizes, costs):
        batch = max(1, min(MAX_BATCH, images, int(memory_budget_mb // act_mb) if act_mb > 0 else MAX_BATCH))
        if images >= MIN_IMAGES:
            batch = max(batch, MIN_IMAGES)  # the batch axis is exercised at every size
        plans.append(SizePlan(h, w, images, batch, round(gmacs, 3), round(act_mb, 1)))
    return plans
