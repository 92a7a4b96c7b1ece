"""The accuracy gate: one value, its thresholds defined here once (issue 37).

`check`, `calibrate`, `convert` (and `export --precision fp16`), `debug-precision`, the variable-size
invariance and the 8.x lowering all judge a graph with a :class:`Gate`; the CLI options that set it
are declared once (vitdeploy/cli/options.py, ``gate_options``) with these defaults. Which thresholds
apply depends on what the judged graph computes in:

* parity (fp32 graphs, and the fused CPU graph, which computes in fp32): max |d| against PyTorch
  within ``fp32_max_abs`` and within a share of the reference's spread across images
  (vitdeploy.compare.parity_gates); the worst per-image cosine of the feature outputs (embedding,
  patch_grid) at least ``fp32_min_cosine``; rows of a mixed-size batch agree 100% with each image
  alone and lose no accuracy;
* task (fp16, int8, and every TensorRT engine: TensorRT may pick TF32 for an fp32 graph): the 1st
  percentile of the per-image cosines at least ``min_cosine`` on every output it scores, top-1
  agreement at least ``min_agreement`` and the accuracy drop at most ``max_drop_points`` on real
  labelled images.

Pure data and arithmetic: no numpy, nothing heavy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .compare import Criterion, parity_gates

# How a graph is judged, by what it computes in (see the module docstring)
PARITY = "parity"
TASK = "task"


@dataclass(frozen=True)
class Gate:
    """The thresholds a graph must meet; the defaults are vitdeploy's gate everywhere."""

    # task (reduced precision)
    min_cosine: float = 0.99  # 1st percentile of per-image (per-row) cosines with the reference, every scored output
    min_agreement: float = 0.99  # top-1 agreement with the reference, on real images
    max_drop_points: float = 1.0  # accuracy may fall at most this many points below the reference
    # parity (fp32)
    fp32_max_abs: float = 1e-4  # max |d| of every output against PyTorch
    fp32_min_cosine: float = 0.9999  # worst per-image cosine of feature outputs and of localised module outputs

    @property
    def max_drop(self) -> float:
        """The accuracy drop limit as a fraction (accuracies are fractions in the reports)."""
        return self.max_drop_points / 100.0

    @staticmethod
    def judged_by(precision: str) -> str:
        """PARITY for a graph that computes in fp32, TASK for reduced precision."""
        return PARITY if precision == "fp32" else TASK  # fp16, int8 and engines: the task thresholds

    def parity(self, precision: str) -> bool:
        return self.judged_by(precision) == PARITY

    # -- the criteria, per kind of evidence ------------------------------------------------------------
    def numeric(self, precision: str, stats: Any, what: str, cosine_name: str, where: str,
                worst_cosine_name: str | None = None) -> list[Criterion]:
        """One output's numbers (``stats``: a compare.OutputStats). Parity: max |d{what}| within the absolute
        limit and the share of the spread, and with ``worst_cosine_name`` (feature outputs) the worst cosine;
        task: the 1st-percentile cosine, named ``cosine_name``. ``where`` ends every name (" on SET")."""
        if self.parity(precision):
            out = parity_gates(what, stats, self.fp32_max_abs, where)
            if worst_cosine_name is not None:
                out.append(Criterion(f"{worst_cosine_name}{where}", stats.cosine_min, self.fp32_min_cosine, ">="))
            return out
        return [Criterion(f"{cosine_name}{where}", stats.cosine_p1, self.min_cosine, ">=")]

    def agreement(self, precision: str, value: float, name: str) -> Criterion:
        """Top-1 agreement: all of it where parity holds (rows vs alone), else ``min_agreement``."""
        return Criterion(name, value, 1.0 if self.parity(precision) else self.min_agreement, ">=")

    def accuracy_drop(self, precision: str, drop: float, name: str) -> Criterion:
        """Accuracy drop as a fraction: none where parity holds, else ``max_drop``."""
        return Criterion(name, drop, 0.0 if self.parity(precision) else self.max_drop, "<=")

    def module_min_cosine(self, precision: str) -> float:
        """The cosine localisation holds each PyTorch module's output to."""
        return self.fp32_min_cosine if self.parity(precision) else self.min_cosine

    # -- the task verdict of a reduced-precision graph on labelled data (calibrate, convert, debug-precision)
    def verdict(self, fp32_accuracy: float | None, scores: dict[str, Any]) -> tuple[bool, list[str]]:
        """Every task threshold on the scores of calibration.evaluate.scores (logits, and the embedding and
        probs outputs when scored): (passed, the failures as phrases)."""
        failures = []
        emb = scores.get("embedding_cosine_p1")
        if emb is not None and emb < self.min_cosine:
            failures.append(f"embedding cosine (1st percentile of images) {emb:.4f} < {self.min_cosine:g}")
        probs = scores.get("probs_cosine_p1")  # variable-size graphs are gated per output
        if probs is not None and probs < self.min_cosine:
            failures.append(f"probs cosine (1st percentile of images) {probs:.4f} < {self.min_cosine:g}")
        agreement = scores.get("top1_agreement")  # None: an embedding model, no classes to agree on
        if agreement is not None and agreement < self.min_agreement:
            failures.append(f"top-1 agreement {agreement:.2%} < {self.min_agreement:.0%}")
        if not scores["cosine_p1"] >= self.min_cosine:
            scored = "embedding" if scores.get("scored") == "embedding" else "logit"
            failures.append(f"{scored} cosine (1st percentile of images) {scores['cosine_p1']:.4f} < {self.min_cosine:g}")
        acc = scores.get("accuracy")
        if fp32_accuracy is not None and acc is not None and (fp32_accuracy - acc) * 100 > self.max_drop_points + 1e-9:
            failures.append(f"accuracy {acc:.2%} is {(fp32_accuracy - acc) * 100:.2f} points below fp32 {fp32_accuracy:.2%} "
                            f"(allowed {self.max_drop_points:g})")
        return not failures, failures

    def rows_cosine_failures(self, outputs: dict[str, dict[str, Any]]) -> list[str]:
        """The variable-size invariance (rows of a padded batch vs each image alone): per output, the
        1st-percentile row cosine against ``min_cosine``."""
        return [f"{name} cosine (1st percentile of rows) {stats['cosine_p1']:.4f} < {self.min_cosine:g}"
                for name, stats in outputs.items() if not stats["cosine_p1"] >= self.min_cosine]

    def to_dict(self) -> dict[str, Any]:
        """The task thresholds as calibrate, convert and debug-precision record them (manifest, recipes)."""
        return {"max_accuracy_drop_points": self.max_drop_points, "min_top1_agreement": self.min_agreement,
                "min_cosine_p1": self.min_cosine}
