"""Score a quantized graph: accuracy, top-1 agreement with fp32, and this machine's latency.

An int8 Q/DQ graph is scored in two executions (DESIGN.md): ONNX Runtime with "basic" graph
optimizations runs Q/DQ as fake-quant in float (the arithmetic TensorRT implements) and with "all"
it fuses Q/DQ into integer kernels (how this CPU would execute it). The gate applies to the
execution the graph is meant for: reference semantics for the TensorRT graph, int8 kernels for the
CPU graph.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from vitdeploy.bundle import Bundle

EVAL_BATCH = 32
EXECUTIONS = {"reference": "basic", "this_cpu": "all"}  # name -> ORT graph optimization level
GATED_EXECUTION = {"tensorrt": "reference", "cpu": "this_cpu"}


@dataclass
class EvalData:
    name: str
    images: np.ndarray  # uint8 NHWC at the graph's input contract
    labels: np.ndarray | None
    record: dict[str, Any]


@dataclass(frozen=True)
class Gate:
    """The task gates of `vitdeploy check` for reduced precision, with its defaults (a test keeps
    them equal), so a graph `calibrate` writes is one `check` passes."""

    max_drop_points: float = 1.0  # accuracy may fall at most this many points below fp32
    min_agreement: float = 0.99  # top-1 agreement with the fp32 graph
    min_cosine: float = 0.99  # 1st percentile of the per-image logit cosines with fp32 (as `check`)
    # the same 1st-percentile cosine on the embedding output, when the bundle exports one (as `check`)

    def verdict(self, fp32_accuracy: float | None, scores: dict[str, Any]) -> tuple[bool, list[str]]:
        failures = []
        emb = scores.get("embedding_cosine_p1")
        if emb is not None and emb < self.min_cosine:
            failures.append(f"embedding cosine (1st percentile of images) {emb:.4f} < {self.min_cosine:g}")
        if scores["top1_agreement"] < self.min_agreement:
            failures.append(f"top-1 agreement {scores['top1_agreement']:.2%} < {self.min_agreement:.0%}")
        if scores["cosine_p1"] < self.min_cosine:
            failures.append(f"logit cosine (1st percentile of images) {scores['cosine_p1']:.4f} < {self.min_cosine:g}")
        acc = scores.get("accuracy")
        if fp32_accuracy is not None and acc is not None and (fp32_accuracy - acc) * 100 > self.max_drop_points + 1e-9:
            failures.append(f"accuracy {acc:.2%} is {(fp32_accuracy - acc) * 100:.2f} points below fp32 {fp32_accuracy:.2%} "
                            f"(allowed {self.max_drop_points:g})")
        return not failures, failures

    def to_dict(self) -> dict[str, Any]:
        return {"max_accuracy_drop_points": self.max_drop_points, "min_top1_agreement": self.min_agreement,
                "min_cosine_p1": self.min_cosine}


def default_eval_data(bundle: Bundle) -> str | None:
    """The bundled digits model scores on its held-out test split; others need --eval-data."""
    source = bundle.manifest.get("source", {})
    if source.get("kind") == "builtin" and source.get("name") == "digits":
        return "digits:test"
    return None


def load_eval_data(bundle: Bundle, spec: str | None, limit: int | None = None) -> EvalData | None:
    """Labelled (or unlabelled .npy) images through `check`'s loader, so both score the same pixels."""
    from vitdeploy.checks.inputs import real_set

    spec = spec or default_eval_data(bundle)
    if spec is None:
        return None
    real = real_set(bundle, spec, limit)
    record = {"data": spec, "count": int(real.meta["count"]), "sha256": real.meta["sha256"], "labelled": real.labels is not None}
    return EvalData(spec, real.images, real.labels, record)


def graph_logits(path: str | Path, images: np.ndarray, optimization: str, threads: int | None = None) -> np.ndarray:
    return graph_outputs(path, images, optimization, threads)["logits"]


GATED_OUTPUTS = ("logits", "embedding")  # what the INT8 gate reads (the patch grid is `check`'s)


def graph_outputs(path: str | Path, images: np.ndarray, optimization: str, threads: int | None = None) -> dict[str, np.ndarray]:
    """The gated outputs the graph has: logits, and the embedding when the bundle exports one."""
    from vitdeploy.runtime.ort import OrtRunner

    runner = OrtRunner(path, optimization=optimization, threads=threads, providers=["CPUExecutionProvider"])
    try:
        names = tuple(n for n in GATED_OUTPUTS if n in runner.outputs())
        if "logits" not in names:
            from vitdeploy.errors import UserError

            raise UserError(f"{Path(path).name} has no logits output: the INT8 gate scores accuracy and agreement on logits; "
                            "calibrate without --eval-data, or export the bundle with --outputs logits,probs,embedding")
        return runner.infer_batched(images, EVAL_BATCH, outputs=names)
    finally:
        runner.close()


def scores(logits: Any, labels: np.ndarray | None, fp32_logits: Any) -> dict[str, Any]:
    """Task scores against fp32; ``logits``/``fp32_logits`` may be output dicts (logits, embedding)."""
    from vitdeploy.compare import cosine_percentile, cosine_rows

    extra: dict[str, Any] = {}
    if isinstance(logits, dict):
        if "embedding" in logits and isinstance(fp32_logits, dict) and "embedding" in fp32_logits:
            emb_cos = cosine_rows(fp32_logits["embedding"], logits["embedding"])
            extra = {"embedding_cosine_p1": cosine_percentile(emb_cos), "embedding_cosine_min": float(emb_cos.min()),
                     "embedding_max_abs": float(np.abs(logits["embedding"].astype(np.float64) - fp32_logits["embedding"]).max())}
        logits = logits["logits"]
    if isinstance(fp32_logits, dict):
        fp32_logits = fp32_logits["logits"]
    pred = logits.argmax(axis=1)
    cosine = cosine_rows(fp32_logits, logits)
    return {
        "accuracy": float((pred == labels).mean()) if labels is not None else None,
        "top1_agreement": float((pred == fp32_logits.argmax(axis=1)).mean()),
        "cosine_min": float(cosine.min()),  # one ambiguous image decides it (close logits move most)
        "cosine_p1": cosine_percentile(cosine),  # what the gate reads, as in `check`
        "cosine_mean": float(cosine.mean()),
        "max_abs_logit_diff": float(np.abs(logits.astype(np.float64) - fp32_logits).max()),
        **extra,
    }


def score_graph(path: str | Path, data: EvalData, fp32_logits: np.ndarray, threads: int | None = None) -> dict[str, Any]:
    """Accuracy and agreement of a Q/DQ graph in both executions."""
    out = {}
    for name, level in EXECUTIONS.items():
        out[name] = {"optimization": level, **scores(graph_outputs(path, data.images, level, threads), data.labels, fp32_logits)}
    return out


def latency_ms(path: str | Path, image: np.ndarray, optimization: str = "all", runs: int = 20, warmup: int = 3,
               threads: int | None = None) -> float:
    """Median wall time of one batch on this CPU, in milliseconds."""
    from vitdeploy.runtime.ort import OrtRunner

    runner = OrtRunner(path, optimization=optimization, threads=threads, providers=["CPUExecutionProvider"])
    try:
        for _ in range(warmup):
            runner.infer(image)
        times = []
        for _ in range(runs):
            start = time.perf_counter()
            runner.infer(image)
            times.append(time.perf_counter() - start)
        return float(np.median(times) * 1000.0)
    finally:
        runner.close()
