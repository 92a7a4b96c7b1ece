"""Scores with their uncertainty: accuracy, 95% Wilson intervals, drop against clean data, top-1
agreement with the reference, and the same stratified per class and per object size.

Everything here works on predictions (int class indices), so one runner pass per condition feeds
every statistic. Wilson's score interval is used rather than the normal approximation because
accuracies near 100% on a few hundred images are the common case here, where p +- 1.96 sqrt(p(1-p)/n)
collapses to zero width or leaves [0, 1].
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ..compare import Z95, wilson  # noqa: F401 - the interval, shared with profile --accuracy

SMALL_STRATUM = 30  # strata with fewer images show their counts next to the accuracy


def accuracy_entry(correct: int, total: int) -> dict[str, Any]:
    lo, hi = wilson(correct, total)
    return {"accuracy": correct / total if total else float("nan"), "ci95": [lo, hi], "correct": int(correct), "n": int(total),
            "small": total < SMALL_STRATUM}


def size_bins(fractions: np.ndarray) -> dict[str, Any]:
    """Object-size strata: tertiles of the clean images' foreground fraction (declared in the report).

    Images whose background is not separable (NaN fraction) form their own stratum ``n/a``."""
    known = fractions[~np.isnan(fractions)]
    if len(known) < 3:
        return {"rule": "foreground fraction not measurable (no separable background)", "edges": [], "names": []}
    lo, hi = (float(v) for v in np.quantile(known, [1 / 3, 2 / 3]))
    return {
        "rule": "object size = foreground fraction of the clean image (background rule of the transforms); "
                "bins = tertiles of this data set",
        "edges": [lo, hi],
        "names": [f"small (<{lo:.2f})", f"medium ({lo:.2f}-{hi:.2f})", f"large (>={hi:.2f})"],
    }


def size_strata(fractions: np.ndarray, bins: dict[str, Any]) -> np.ndarray:
    """Stratum index per image: 0/1/2 by the bins, 3 where the size is unknown."""
    if not bins["edges"]:
        return np.full(len(fractions), 3, dtype=np.int64)
    lo, hi = bins["edges"]
    out = np.where(fractions < lo, 0, np.where(fractions < hi, 1, 2))
    return np.where(np.isnan(fractions), 3, out).astype(np.int64)


def condition_stats(preds: np.ndarray, labels: np.ndarray, classes: Sequence[str], sizes: np.ndarray,
                    size_names: Sequence[str], clean: dict[str, Any] | None = None,
                    reference: np.ndarray | None = None, reference_clean_agreement: float | None = None) -> dict[str, Any]:
    """Accuracy (interval), drop vs clean, agreement with the reference, per class and per size."""
    hit = preds == labels
    entry = accuracy_entry(int(hit.sum()), len(hit))
    if clean is not None:
        entry["drop_pt"] = (clean["accuracy"] - entry["accuracy"]) * 100.0
    if reference is not None:
        agree = preds == reference
        lo, hi = wilson(int(agree.sum()), len(agree))
        entry["agreement"] = float(agree.mean())
        entry["agreement_ci95"] = [lo, hi]
        if reference_clean_agreement is not None:
            entry["agreement_drop_pt"] = (reference_clean_agreement - entry["agreement"]) * 100.0
    per_class = {}
    for index, name in enumerate(classes):
        sel = labels == index
        if sel.any():
            per_class[name] = accuracy_entry(int(hit[sel].sum()), int(sel.sum()))
    entry["per_class"] = per_class
    per_size = {}
    names = list(size_names) + ["n/a"]
    for index, name in enumerate(names):
        sel = sizes == index
        if sel.any():
            per_size[name] = accuracy_entry(int(hit[sel].sum()), int(sel.sum()))
    entry["per_size"] = per_size
    return entry
