"""The bundle's runtime as a Triton model: tensors as `triton-repo` declares them, and the callable.

Nothing here computes anything of its own: ``Classifier.load`` picks the backend exactly as
`vitdeploy predict` does (a TensorRT engine whose fingerprint matches this device, else ONNX
Runtime), and each Triton execution is one call of that classifier's runner on the batch Triton
formed. The inputs and outputs are the graph's own (``vitdeploy.triton.model_tensors``), so a client
written for a production Triton loading the generated repository works here unchanged: one image
input, or for a variable-size bundle ``images`` (each image top-left in the canvas) and ``valid_hw``
(each one's height and width). As a production Triton does, the values go to the graph as sent; the
graph floors and clamps valid sizes (never NaN), and a client fits its images into the canvas as
`predict` does (vitdeploy.contract.InputContract.feeds, or the C++ host library's canvas).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from ..errors import UserError
from ..triton import TritonOptions, model_name, model_tensors
from .options import ServeOptions


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: str  # numpy dtype name
    dims: tuple  # per-sample shape (batch axis dropped), -1 where dynamic


@dataclass(frozen=True)
class ModelSignature:
    name: str
    inputs: List[TensorSpec]
    outputs: List[TensorSpec]


def load_classifiers(opts: ServeOptions) -> List[Any]:
    """One Classifier per Triton instance (an execution context / ORT session each: no lock)."""
    from ..runtime.classifier import Classifier

    first = Classifier.load(opts.bundle, prefer=opts.prefer, precision=opts.precision, threads=opts.threads)
    # The rest on the backend and precision the first one settled on, so instances never differ.
    rest = [
        Classifier.load(first.bundle, prefer=(first.backend,), precision=first.precision, threads=opts.threads)
        for _ in range(opts.instances - 1)
    ]
    return [first] + rest


def signature(clf: Any, opts: ServeOptions) -> ModelSignature:
    """Name, inputs and outputs as `vitdeploy triton-repo` would write them for this backend."""
    if clf.backend == "tensorrt":
        triton_opts = TritonOptions(
            backend="tensorrt", max_batch=opts.max_batch, precision=clf.precision, engine=clf.runner.engine_dir.name, name=opts.name
        )
    else:
        kind = "gpu" if str(getattr(clf.runner.info, "device", "cpu")).startswith("cuda") else "cpu"
        triton_opts = TritonOptions(backend="onnxruntime", max_batch=opts.max_batch, precision=clf.precision, kind=kind, name=opts.name)
    inputs, outputs = model_tensors(clf.bundle, triton_opts)
    if sorted(t.name for t in inputs) != sorted(clf.contract.input_names):
        raise UserError(f"the graph takes inputs ({', '.join(t.name for t in inputs)}); the bundle's manifest describes "
                        f"({', '.join(clf.contract.input_names)}): re-export the bundle")
    for tensor in inputs + outputs:
        if tensor.shape and tensor.shape[0] is not None:
            raise UserError(
                f"tensor {tensor.name!r} has a fixed batch of {tensor.shape[0]}; Triton's batcher needs a dynamic batch axis (re-export the bundle)"
            )
    # (an engine's batch ceiling is checked by model_tensors: --max-batch above it is a UserError)

    def spec(t: Any) -> TensorSpec:
        return TensorSpec(t.name, t.dtype, tuple(-1 if d is None else int(d) for d in t.shape[1:]))

    return ModelSignature(model_name(clf.bundle, triton_opts), [spec(t) for t in inputs], [spec(t) for t in outputs])


class BatchRunner:
    """Triton's infer callable for one instance: requests in, one runner call per batch, split out.

    Triton's dynamic batcher has already grouped requests of equal shape; each request may itself
    carry several images (a client batch). Rows are concatenated, run once, and returned to each
    request in order. Inputs arrive checked against the model config (name, dtype, per-sample
    shape, batch <= max_batch_size) by Triton before they reach this callable.
    """

    def __init__(self, clf: Any, sig: ModelSignature):
        self.clf = clf
        self.inputs = sig.inputs
        self.outputs = sig.outputs

    def __call__(self, requests: Sequence[Dict[str, np.ndarray]]) -> List[Dict[str, np.ndarray]]:
        counts = [len(np.asarray(request[self.inputs[0].name])) for request in requests]
        feeds = {t.name: np.concatenate([np.asarray(request[t.name]) for request in requests], axis=0) if len(requests) > 1
                 else np.asarray(requests[0][t.name]) for t in self.inputs}
        results = self.run(feeds)
        replies = []
        start = 0
        for count in counts:
            replies.append({name: value[start : start + count] for name, value in results.items()})
            start += count
        return replies

    def run(self, feeds: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
        count = self.clf.contract.rows(feeds)
        # an engine profile that needs more rows: padded with copies of the last, then dropped
        padded = self.clf.contract.pad_rows({k: np.ascontiguousarray(v) for k, v in feeds.items()}, self.clf.min_batch)
        produced = self.clf.runner.run(padded)
        missing = [t.name for t in self.outputs if t.name not in produced]
        if missing:
            raise RuntimeError(f"the runner returned no {', '.join(missing)} (it returned {', '.join(sorted(produced))})")
        return {t.name: np.ascontiguousarray(np.asarray(produced[t.name])[:count], dtype=t.dtype) for t in self.outputs}


def describe(clf: Any, sig: ModelSignature, opts: ServeOptions, url_host: Optional[str] = None) -> str:
    """One line for the log: where, what and on which backend."""
    host = url_host or opts.host
    tensors = ", ".join(f"{t.name} {t.dtype}{list(t.dims)}" for t in sig.inputs + sig.outputs)
    batching = f"dynamic batching (max {opts.max_batch}, delay {opts.max_queue_delay_us} us)" if opts.dynamic_batching else f"no dynamic batching (max batch {opts.max_batch})"
    return (
        f"model {sig.name!r} ready: http://{host}:{opts.port} grpc {host}:{opts.grpc_port} metrics http://{host}:{opts.metrics_port}/metrics; "
        f"{clf.backend_reason}; {opts.instances} instance(s), {batching}; {tensors}"
    )
