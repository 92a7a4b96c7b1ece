"""Score a quantized graph: accuracy, top-1 agreement with fp32, and this machine's latency.

An int8 Q/DQ graph is scored in two executions (DESIGN.md): ONNX Runtime with "basic" graph
optimizations runs Q/DQ as fake-quant in float (the arithmetic TensorRT implements) and with "all"
it fuses Q/DQ into integer kernels (how this CPU would execute it). The gate applies to the
execution the graph is meant for: reference semantics for the TensorRT graph, int8 kernels for the
CPU graph.

A variable-size graph (images + valid_hw) is scored on the invariance: the labelled images at mixed
sizes in padded batches (seeded noise in the padding) against the fp32 graph on each image alone,
with the gate applied to each output (logits and probs).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from vitdeploy.bundle import Bundle
from vitdeploy.data import default_data

EVAL_BATCH = 32
EXECUTIONS = {"reference": "basic", "this_cpu": "all"}  # name -> ORT graph optimization level
GATED_EXECUTION = {"tensorrt": "reference", "cpu": "this_cpu"}


@dataclass
class EvalData:
    name: str
    images: np.ndarray  # uint8 NHWC at the graph's input contract
    labels: np.ndarray | None
    record: dict[str, Any]
    # variable-size bundles: each padded row's valid (height, width), fed as the second input; the
    # fp32 reference then runs each image alone (the invariance: rows of a mixed batch vs alone)
    valid_hw: np.ndarray | None = None


def load_eval_data(bundle: Bundle, spec: str | None, limit: int | None = None) -> EvalData | None:
    """Labelled (or unlabelled .npy) images through `check`'s loader, so both score the same pixels."""
    from vitdeploy.evalsets import real_set

    spec = spec or default_data(bundle)
    if spec is None:
        return None
    if bundle.variable_size:
        return _variable_eval_data(bundle, spec, limit)
    real = real_set(bundle, spec, limit)
    record = {"data": spec, "count": int(real.meta["count"]), "sha256": real.meta["sha256"], "labelled": real.labels is not None}
    return EvalData(spec, real.images, real.labels, record)


def graph_logits(path: str | Path, images: np.ndarray, optimization: str, threads: int | None = None) -> np.ndarray:
    return graph_outputs(path, images, optimization, threads)["logits"]


GATED_OUTPUTS = ("logits", "embedding")  # what the INT8 gate reads (the patch grid is `check`'s)
# a variable-size graph is gated per output on both of its outputs (check's per-output gates)
VARIABLE_GATED_OUTPUTS = ("logits", "probs")


def graph_outputs(path: str | Path, images: np.ndarray, optimization: str, threads: int | None = None,
                  valid_hw: np.ndarray | None = None, alone: bool = False) -> dict[str, np.ndarray]:
    """The gated outputs the graph has: logits, and the embedding when the bundle exports one.

    ``valid_hw``: a variable-size graph's second input (its logits and probs are gated); ``alone``
    runs each image in a batch of its own (the reference side of the invariance).
    """
    from vitdeploy.runtime.ort import OrtRunner

    runner = OrtRunner(path, optimization=optimization, threads=threads, providers=["CPUExecutionProvider"])
    try:
        gated = VARIABLE_GATED_OUTPUTS if valid_hw is not None else GATED_OUTPUTS
        names = tuple(n for n in gated if n in runner.outputs())
        if not names:  # an embedding model (a CLIP/SigLIP tower, a headless DINO) is gated on its embedding
            from vitdeploy.errors import UserError

            raise UserError(f"{Path(path).name} has neither a logits nor an embedding output: the gate scores one of them; "
                            "calibrate without --eval-data, or export the bundle with --outputs logits,probs,embedding")
        if valid_hw is not None:
            from vitdeploy.variable import run_padded_graph

            return run_padded_graph(runner.session, images, valid_hw, names, batch=1 if alone else EVAL_BATCH)
        return runner.infer_batched(images, EVAL_BATCH, outputs=names)
    finally:
        runner.close()


def scores(logits: Any, labels: np.ndarray | None, fp32_logits: Any) -> dict[str, Any]:
    """Task scores against fp32; ``logits``/``fp32_logits`` may be output dicts (logits, embedding, probs).

    An embedding model's dict has no logits: its embedding is then the scored output (cosine per
    image, as `check` gates it), and accuracy and top-1 agreement are None - there are no classes."""
    from vitdeploy.compare import cosine_percentile, cosine_rows

    extra: dict[str, Any] = {}
    if isinstance(logits, dict) and "logits" not in logits:
        return embedding_scores(logits["embedding"], fp32_logits["embedding"])
    if isinstance(logits, dict):
        for name in ("embedding", "probs"):
            if name in logits and isinstance(fp32_logits, dict) and name in fp32_logits:
                cos = cosine_rows(fp32_logits[name], logits[name])
                extra.update({f"{name}_cosine_p1": cosine_percentile(cos), f"{name}_cosine_min": float(cos.min()),
                              f"{name}_max_abs": float(np.abs(logits[name].astype(np.float64) - fp32_logits[name]).max())})
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


def embedding_scores(embedding: np.ndarray, fp32_embedding: np.ndarray) -> dict[str, Any]:
    """An embedding model's scores against fp32: the per-image cosine (the gate reads its 1st percentile);
    no accuracy and no agreement. The nearest-neighbour agreement (each image's most similar other image
    in the set, fp32 vs this graph) is reported for retrieval users; it is not gated: a set of similar
    images (or random weights) has near-ties that any rounding flips."""
    from vitdeploy.compare import cosine_percentile, cosine_rows

    cosine = cosine_rows(fp32_embedding, embedding)
    return {
        "scored": "embedding",
        "accuracy": None,
        "top1_agreement": None,
        "cosine_min": float(cosine.min()),
        "cosine_p1": cosine_percentile(cosine),
        "cosine_mean": float(cosine.mean()),
        "max_abs_embedding_diff": float(np.abs(embedding.astype(np.float64) - fp32_embedding).max()),
        "neighbour_agreement": neighbour_agreement(fp32_embedding, embedding),
    }


def neighbour_agreement(reference: np.ndarray, candidate: np.ndarray) -> float | None:
    """Share of images whose most similar other image (cosine) is the same in both sets of embeddings."""
    if len(reference) < 3:
        return None

    def nearest(e: np.ndarray) -> np.ndarray:
        unit = e.astype(np.float64).reshape(len(e), -1)
        unit = unit / np.maximum(np.linalg.norm(unit, axis=1, keepdims=True), 1e-12)
        sim = unit @ unit.T
        np.fill_diagonal(sim, -np.inf)
        return sim.argmax(axis=1)

    return float((nearest(reference) == nearest(candidate)).mean())


def fp32_accuracy_of(fp32_outputs: dict[str, np.ndarray], labels: np.ndarray | None) -> float | None:
    """The fp32 graph's accuracy on labelled data, or None (no labels, or an embedding model: no classes)."""
    if labels is None or "logits" not in fp32_outputs:
        return None
    return float((fp32_outputs["logits"].argmax(1) == labels).mean())


def percent(value: float | None) -> str:
    """A share as a percentage for tables and log lines; "n/a" where it does not apply (embedding models)."""
    return "n/a" if value is None else f"{value:.2%}"


def score_graph(path: str | Path, data: EvalData, fp32_logits: np.ndarray, threads: int | None = None,
                executions: tuple[str, ...] | None = None) -> dict[str, Any]:
    """Accuracy and agreement of a Q/DQ graph in both executions (or the ``executions`` named)."""
    out = {}
    for name, level in EXECUTIONS.items():
        if executions is not None and name not in executions:
            continue
        got = graph_outputs(path, data.images, level, threads, valid_hw=data.valid_hw)
        out[name] = {"optimization": level, **scores(got, data.labels, fp32_logits)}
    return out


def latency_ms(path: str | Path, image: np.ndarray, optimization: str = "all", runs: int = 20, warmup: int = 3,
               threads: int | None = None, valid_hw: np.ndarray | None = None) -> float:
    """Median wall time of one batch on this CPU, in milliseconds (``valid_hw``: a variable-size graph's)."""
    from vitdeploy.runtime.ort import OrtRunner

    runner = OrtRunner(path, optimization=optimization, threads=threads, providers=["CPUExecutionProvider"])
    if valid_hw is not None:
        from vitdeploy.variable import run_padded_graph

        def once() -> None:
            run_padded_graph(runner.session, image, valid_hw, ("logits",))
    else:
        def once() -> None:
            runner.infer(image)
    try:
        for _ in range(warmup):
            once()
        times = []
        for _ in range(runs):
            start = time.perf_counter()
            once()
            times.append(time.perf_counter() - start)
        return float(np.median(times) * 1000.0)
    finally:
        runner.close()


def _variable_eval_data(bundle: Bundle, spec: str, limit: int | None) -> EvalData:
    """The labelled set as `check` scores a variable-size bundle: every image rescaled to a seeded
    random size and aspect ratio, fitted by the host policy, padded with seeded noise (the graph must
    ignore it); the fp32 reference then runs each image alone."""
    import hashlib

    from vitdeploy.variable import RESCALE_RULE, mixed_size_images, size_summary
    from vitdeploy.data import open_labelled
    from vitdeploy.images import to_channel_order
    from vitdeploy.variable import padded_batch

    contract = bundle.variable_size
    policy = contract.get("host_policy", "fit-within")
    labelled = open_labelled(spec, tuple(bundle.spec.image_size), bundle.preprocessing, classes=bundle.labels, limit=limit,
                             need_labels=False)
    fitted = [to_channel_order(img, bundle.preprocessing) for img in mixed_size_images(labelled.images, bundle.preprocessing, 0, policy)]
    images, valid = padded_batch(fitted, contract["canvas"], seed=2)
    digest = hashlib.sha256(np.ascontiguousarray(images).tobytes())
    digest.update(valid.tobytes())
    labels = None if labelled.labels is None else np.asarray(labelled.labels, dtype=np.int64)
    record = {"data": spec, "count": int(len(images)), "sha256": digest.hexdigest(), "labelled": labels is not None,
              "variable_size": {"policy": policy, "rescale": RESCALE_RULE, "padding": "seeded noise", **size_summary(fitted),
                                "reference": "fp32 graph, each image alone (batch of one)",
                                "candidate": "padded batches of mixed sizes"}}
    return EvalData(spec, images, labels, record, valid_hw=valid)
