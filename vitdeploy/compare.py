"""Numeric and task evidence between a reference and a candidate (pure numpy).

Numeric: max |d|, max relative d (scaled by the reference's magnitude), max |d| over the reference's
spread across images, mean |d|, cosine similarity (per sample, worst and mean), top-1 / top-5
agreement. Task: accuracy against labels.

Why the spread: an absolute limit means nothing without the scale of the signal. A random-weight timm
ViT's logits are ~1.7e-3 and move ~1.5e-5 between images; a graph with every MLP removed is off by
7e-7 there (max |d| <= 1e-4 passes it), yet that is 5% of how much the output moves between images.
Judged against the spread, it fails as it would on trained weights, while fp32 rounding stays ~1e-4
of it (measured: DeiT-III-S fp32 vs fp64 1.0e-4, MLPs removed 4.7e-2, every block removed 5.1).
Like Optimum's validate_model_outputs, criteria collect every failure before one verdict.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np


# fp32 parity: max |d| within this share of the reference's spread across images (see module docstring)
FP32_SPREAD_LIMIT = 1e-2
# Outputs that barely move between images would demand more than fp32 can resolve: ONNX Runtime and
# PyTorch round differently by ~1e-6 of an output's magnitude, so the spread is taken to be at least
# this share of the magnitude (~1000 fp32 epsilons). Measured: a random-weight model's probs (~0.1,
# moving 1e-6 between images) differ by 1.5e-8 between the two runtimes, 2 ulps: 1.5% of the raw spread.
SPREAD_FLOOR_REL = 1e-4


def reference_spread(ref: np.ndarray) -> float:
    """How much the reference moves between images: the RMS over output elements of each element's standard
    deviation across the batch (0.0 for one image), at least SPREAD_FLOOR_REL of the output's magnitude."""
    ref = np.asarray(ref, dtype=np.float64).reshape(len(ref), -1)
    if len(ref) < 2:
        return 0.0
    return max(float(np.sqrt(ref.var(axis=0).mean())), SPREAD_FLOOR_REL * float(np.abs(ref).max()))


@dataclass
class OutputStats:
    name: str
    max_abs: float
    max_rel: float  # max |d| / max |ref|
    mean_abs: float
    cosine_min: float  # worst per-sample cosine similarity
    cosine_p1: float  # 1st percentile of the per-sample cosines: what reduced precision is gated on
    cosine_mean: float
    top1_agreement: float
    top5_agreement: float
    count: int
    spread: float = 0.0  # reference_spread(ref): 0.0 for a single image
    max_abs_over_spread: float | None = None  # max |d| / spread; None without a spread (one image)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def cosine_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a = a.reshape(len(a), -1).astype(np.float64)
    b = b.reshape(len(b), -1).astype(np.float64)
    num = (a * b).sum(axis=1)
    den = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        cos = np.where(den > 0, num / np.where(den > 0, den, 1), np.where(np.abs(a - b).max(axis=1) == 0, 1.0, 0.0))
    return cos


def cosine_percentile(cos: np.ndarray, q: float = 1.0) -> float:
    """The q-th percentile (lower interpolation) of per-sample cosines.

    Reduced precision is gated here rather than on the single worst image: like the 99% top-1
    agreement gate, it lets 1% of images be outliers. On the trained digits model the worst-image
    cosine of correct int8 graphs swings between 0.968 and 0.994 with the calibration recipe, set by
    one ambiguous image whose two top logits are close, while accuracy and agreement do not move.
    """
    return float(np.percentile(cos, q, method="lower"))


def topk_agreement(ref: np.ndarray, cand: np.ndarray, k: int) -> float:
    """Share of samples whose reference top-1 class is within the candidate's top-k."""
    k = min(k, ref.shape[-1])
    ref_top1 = ref.argmax(axis=-1)
    cand_topk = np.argsort(-cand, axis=-1)[:, :k]
    return float((cand_topk == ref_top1[:, None]).any(axis=1).mean())


def compare_outputs(name: str, ref: np.ndarray, cand: np.ndarray) -> OutputStats:
    ref = np.asarray(ref, dtype=np.float64)
    cand = np.asarray(cand, dtype=np.float64)
    if ref.shape != cand.shape:
        raise ValueError(f"output {name}: shapes differ, reference {ref.shape} vs candidate {cand.shape}")
    diff = np.abs(ref - cand)
    scale = float(np.abs(ref).max()) or 1.0
    spread = reference_spread(ref)
    cos = cosine_rows(ref, cand)
    return OutputStats(
        name=name,
        max_abs=float(diff.max()),
        max_rel=float(diff.max() / scale),
        mean_abs=float(diff.mean()),
        cosine_min=float(cos.min()),
        cosine_p1=cosine_percentile(cos),
        cosine_mean=float(cos.mean()),
        # class agreement is read on [B, K] scores; feature outputs ([B, d, G_h, G_w]) are flattened
        # per sample so the call is defined (their gates read max |d| and the cosines, not this)
        top1_agreement=topk_agreement(ref.reshape(len(ref), -1), cand.reshape(len(cand), -1), 1),
        top5_agreement=topk_agreement(ref.reshape(len(ref), -1), cand.reshape(len(cand), -1), 5),
        count=len(ref),
        spread=spread,
        max_abs_over_spread=float(diff.max() / spread) if spread > 0 else None,
    )


Z95 = 1.959963984540054


def wilson(correct: int, total: int, z: float = Z95) -> tuple[float, float]:
    """95% Wilson score interval for ``correct`` successes out of ``total`` (evaluate, profile --accuracy):
    near 100% on a few hundred images the normal approximation collapses to zero width."""
    if total <= 0:
        return (float("nan"), float("nan"))
    p = correct / total
    denom = 1.0 + z * z / total
    centre = (p + z * z / (2 * total)) / denom
    half = z * math.sqrt(p * (1 - p) / total + z * z / (4 * total * total)) / denom
    return (max(0.0, centre - half), min(1.0, centre + half))


def accuracy(logits: np.ndarray, labels: np.ndarray) -> float:
    return float((np.asarray(logits).argmax(axis=-1) == np.asarray(labels)).mean())


@dataclass
class Criterion:
    """One pass/fail rule: ``value`` compared with ``limit`` (``<=`` or ``>=``). The thresholds a graph is
    held to are vitdeploy.gate.Gate; each judgement it makes is one Criterion."""

    name: str
    value: float
    limit: float
    op: str  # "<=" or ">="
    passed: bool = field(init=False)

    def __post_init__(self) -> None:
        self.passed = bool(self.value <= self.limit) if self.op == "<=" else bool(self.value >= self.limit)

    def describe(self) -> str:
        return f"{self.name} = {self.value:.4g} (limit {self.op} {self.limit:g})"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def parity_gates(what: str, stats: OutputStats, max_abs: float, where: str = "",
                 spread_limit: float = FP32_SPREAD_LIMIT) -> list[Criterion]:
    """fp32 parity of one output on one set: max |d| within the absolute limit and within ``spread_limit``
    of the reference's spread across images (the second only where there are two images or more)."""
    gates = [Criterion(f"max |d{what}|{where}", stats.max_abs, max_abs, "<=")]
    if stats.max_abs_over_spread is not None:
        gates.append(Criterion(f"max |d{what}| / spread across images{where}", stats.max_abs_over_spread, spread_limit, "<="))
    return gates
