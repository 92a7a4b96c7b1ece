"""Retrieval on a deployed embedding: cosine 1-nearest-neighbour recall@1 (pure numpy + Classifier).

The evidence that a bundle's ``embedding`` output is a usable feature, and that its fp16/int8 graphs
keep it: embed an index split and a query split, find each query's most cosine-similar index image,
and count how often it has the query's label. On the bundled digits model the index is
``digits:train`` and the queries ``digits:test`` (`bench/bench_retrieval.py`, the numbers in
README.md and docs/BENCHMARKS.md, asserted by tests/test_outputs_retrieval.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from .errors import UserError


def l2_normalise(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


def nearest_neighbours(index: np.ndarray, queries: np.ndarray, chunk: int = 1024) -> np.ndarray:
    """Row in ``index`` of each query's most cosine-similar embedding (ties: the lower row)."""
    a, q = l2_normalise(index), l2_normalise(queries)
    out = np.empty(len(q), dtype=np.int64)
    for start in range(0, len(q), chunk):  # bounded memory for large query sets
        out[start:start + chunk] = np.argmax(q[start:start + chunk] @ a.T, axis=1)
    return out


def recall_at_1(index: np.ndarray, index_labels: np.ndarray, queries: np.ndarray, query_labels: np.ndarray) -> float:
    """Share of queries whose cosine nearest neighbour in the index has the same label."""
    if len(index) == 0 or len(queries) == 0:
        raise UserError("retrieval needs at least one index and one query embedding")
    if index.shape[1:] != queries.shape[1:]:
        raise UserError(f"index embeddings {list(index.shape)} and queries {list(queries.shape)} differ in width")
    nn = nearest_neighbours(index, queries)
    return float((np.asarray(index_labels)[nn] == np.asarray(query_labels)).mean())


def labelled_split(name: str) -> tuple[np.ndarray, np.ndarray]:
    """``digits:train`` / ``digits:test``: uint8 NHWC images and int64 labels."""
    if not name.startswith("digits:"):
        raise UserError(f"retrieval data {name!r}: use digits:train or digits:test")
    from .builtin import get_builtin

    images, labels = get_builtin("digits").load_split(name.split(":", 1)[1])
    return images, labels.astype(np.int64)


def bundle_retrieval(bundle: str | Path, precision: str, index: str = "digits:train", queries: str = "digits:test",
                     optimization: str = "all", threads: int | None = None, batch: int = 64) -> dict[str, Any]:
    """Recall@1 of one graph of ``bundle`` (its ``embedding`` output) on ONNX Runtime, index vs queries.

    ``optimization``: "all" (an int8 graph runs this CPU's integer kernels) or "basic" (Q/DQ as
    fake-quant in float: what TensorRT computes), as `check` scores both.
    """
    from .bundle import Bundle
    from .contract import InputContract
    from .runtime.select import onnxruntime_runner

    b = Bundle.open(bundle)
    if "embedding" not in (b.graph.outputs or []):
        raise UserError(f"bundle {b.root} has no embedding output; export it with --outputs logits,probs,embedding")
    idx_images, idx_labels = labelled_split(index)
    q_images, q_labels = labelled_split(queries)
    if b.preprocessing.get("channel_order") == "bgr":  # the digits splits are RGB
        idx_images, q_images = idx_images[..., ::-1].copy(), q_images[..., ::-1].copy()
    contract = InputContract.from_bundle(b)  # the digits images brought to what the graph takes (its size, or its canvas)
    runner = onnxruntime_runner(b, contract, precision, ["CPUExecutionProvider"], threads, optimization, graph=b.artifact_path(precision)).runner
    try:
        idx_emb = runner.run_batched(contract.feeds_for(idx_images), batch, outputs=("embedding",))["embedding"]
        q_emb = runner.run_batched(contract.feeds_for(q_images), batch, outputs=("embedding",))["embedding"]
    finally:
        runner.close()
    return {"precision": precision, "optimization": optimization, "index": index, "queries": queries,
            "index_count": int(len(idx_emb)), "query_count": int(len(q_emb)), "dim": int(idx_emb.shape[1]),
            "recall_at_1": recall_at_1(idx_emb, idx_labels, q_emb, q_labels), "embeddings": (idx_emb, q_emb)}
