"""SmoothQuant-style activation smoothing of a ViT's fp32 graph, before it is quantized.

Per-tensor INT8 on a linear layer's input spends its 127 levels on the largest channel; real ViTs'
LayerNorm outputs carry a few channels tens of times larger than the rest (SmoothQuant, Xiao et al.
2023, arXiv:2211.10438, section 3; LLM.int8(), arXiv:2208.07339). SmoothQuant migrates that range
into the weights, which are quantized per output channel and so do not mind: for input channel j,

    s_j = max|X_j|^alpha / max|W_j|^(1 - alpha)          (SmoothQuant eq. 4; alpha = 0.5 by default)
    Y = (X diag(s)^-1) (diag(s) W)                        (the same function)

with ``max|X_j|`` measured on the calibration images and ``max|W_j|`` over every output of the layers
that share the input. Where that input is a LayerNorm's output (``norm1`` -> ``attn.qkv``, ``norm2``
-> ``mlp.fc1``, ``norm`` -> ``head``, through channel-preserving Gather/Slice), 1/s folds into the
LayerNorm's gamma and beta and s into the weight rows: no new node, the graph TensorRT parses has
the same shape (scope ``layernorm``). Where no LayerNorm precedes (``attn.proj`` after the attention
merge, ``mlp.fc2`` after GELU), scope ``all`` adds an explicit per-channel ``Mul`` by 1/s in front of
the layer (a constant pointwise op next to the pointwise GELU or the head merge, which a compiler
can fuse; whether TensorRT does was not measured here, so the ladder tries ``layernorm`` first).

The pass is verified before anything uses it: the smoothed fp32 graph and the original run on the
calibration images and every output must agree to ``VERIFY_RTOL`` relative (max |d| over max |ref|);
weights stay per-channel symmetric in the Q/DQ graph that follows (the quantizer's settings are not
touched). The linear layers of a variable-size graph's valid_hw mask path are never smoothed.

:func:`smooth_graph` returns the record the manifest keeps: alpha, scope, every layer touched (by
``MODULE/ROLE`` name), the scale range per site, and the verification.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import numpy as np

from vitdeploy.errors import InternalError, UserError
from vitdeploy.lazy import require

from .exclusions import GraphIndex, constant_linear, layer_labels

SCOPES = ("layernorm", "all")
DEFAULT_ALPHA = 0.5  # SmoothQuant's default migration strength
VERIFY_RTOL = 1e-5  # smoothed vs original fp32 outputs: max |d| / max |ref|
VERIFY_IMAGES = 64
STATS_BATCH = 16
SCALE_CLAMP = (1e-5, 1e5)  # SmoothQuant clamps the statistics at 1e-5; s stays finite either way
# ops between a LayerNorm and the linear layers it feeds that keep the channel (last) axis intact
_CHANNEL_PRESERVING = ("Identity", "Gather", "Slice")


@dataclass(frozen=True)
class Smoothing:
    alpha: float = DEFAULT_ALPHA
    scope: str = "layernorm"

    def __post_init__(self) -> None:
        if self.scope not in SCOPES:
            raise UserError(f"--smooth must be one of none, {', '.join(SCOPES)}, got {self.scope!r}")
        if not 0.0 <= self.alpha <= 1.0:
            raise UserError(f"--smooth-alpha must lie in 0..1 (SmoothQuant's migration strength), got {self.alpha:g}")

    @property
    def label(self) -> str:
        return f"smooth {self.scope} a={self.alpha:g}"

    def to_dict(self) -> dict[str, Any]:
        return {"alpha": self.alpha, "scope": self.scope}

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> "Smoothing | None":
        return None if not data else cls(float(data.get("alpha", DEFAULT_ALPHA)), str(data.get("scope", "layernorm")))


@dataclass
class Site:
    """One smoothing site: the linear layers that share one input, and where 1/s goes."""

    kind: str  # "layernorm" (folded into gamma/beta) | "mul" (an explicit Mul in front)
    linears: list[Any]  # the MatMul/Gemm nodes whose weight rows get s
    inputs: list[str]  # the tensors those layers read (measured per channel)
    norm: Any | None = None  # the LayerNormalization node (kind "layernorm")
    source: str | None = None  # the tensor the Mul divides (kind "mul")
    stats: np.ndarray | None = field(default=None, repr=False)


def find_sites(model: Any, scope: str = "layernorm") -> list[Site]:
    """Where smoothing can apply in this graph (see the module docstring)."""
    index = GraphIndex.of(model)
    outputs = {o.name for o in model.graph.output}
    from vitdeploy.exporters.mask_path import find_mask_path

    mask = find_mask_path(model)
    never = set(mask.linear) if mask is not None else set()
    linear_ok = {n.name for n in model.graph.node if constant_linear(index, n) and n.name not in never and _weight_2d(index, n)}
    ranks = _ranks(model)
    sites: list[Site] = []
    covered: set[str] = set()
    for node in model.graph.node:
        if node.op_type != "LayerNormalization" or _attr(node, "axis", -1) not in (-1,):
            continue
        if len(node.input) < 2 or not all(index.is_constant(i) for i in node.input[1:3] if i):
            continue
        reached = _foldable_readers(index, node.output[0], linear_ok, outputs, ranks)
        if reached:
            sites.append(Site("layernorm", reached, sorted({n.input[0] for n in reached}), norm=node))
            covered.update(n.name for n in reached)
    if scope == "all":
        by_input: dict[str, list[Any]] = {}
        for node in model.graph.node:
            if node.name in linear_ok and node.name not in covered and node.input[0] not in {i.name for i in model.graph.input}:
                by_input.setdefault(node.input[0], []).append(node)
        for tensor, linears in by_input.items():
            sites.append(Site("mul", linears, [tensor], source=tensor))
    return sites


def _foldable_readers(index: GraphIndex, tensor: str, linear_ok: set[str], outputs: set[str], ranks: dict[str, int]) -> list[Any] | None:
    """The linear layers reading ``tensor`` through channel-preserving ops, or None when anything
    else reads it (a residual, a graph output, a non-constant matmul): then 1/s cannot be folded."""
    found: list[Any] = []
    stack = [tensor]
    while stack:
        t = stack.pop()
        if t in outputs:
            return None
        for reader in index.consumers.get(t, []):
            if reader.name in linear_ok and reader.input[0] == t:
                found.append(reader)
            elif reader.op_type in _CHANNEL_PRESERVING and reader.input[0] == t and _keeps_last_axis(index, reader, ranks.get(t, 0)):
                stack.extend(reader.output)
            else:
                return None
    return found or None


def _keeps_last_axis(index: GraphIndex, node: Any, rank: int) -> bool:
    """Does ``node`` (reading a tensor of ``rank``) leave the channel axis, the last one, whole?"""
    from onnx import numpy_helper

    if node.op_type == "Identity":
        return True
    if rank <= 1:
        return False
    if node.op_type == "Gather":  # e.g. the class token: [B, L, d] -> [B, d]
        axis = _attr(node, "axis", 0)
        return (axis + rank if axis < 0 else axis) < rank - 1
    if node.op_type == "Slice":  # constant axes that exclude the last one (axes given explicitly)
        if len(node.input) < 4 or not node.input[3]:
            return False
        axes = _constant(index, node.input[3], numpy_helper)
        return axes is not None and all((int(a) + rank if int(a) < 0 else int(a)) < rank - 1 for a in np.ravel(axes))
    return False


def _ranks(model: Any) -> dict[str, int]:
    """Rank of every tensor shape inference can tell."""
    onnx = require("onnx")
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    graph = inferred.graph
    return {v.name: len(v.type.tensor_type.shape.dim) for v in list(graph.value_info) + list(graph.input) + list(graph.output)
            if v.type.HasField("tensor_type") and v.type.tensor_type.HasField("shape")}


def _constant(index: GraphIndex, name: str, numpy_helper: Any) -> np.ndarray | None:
    for init in index.model.graph.initializer:
        if init.name == name:
            return numpy_helper.to_array(init)
    node = index.producer.get(name)
    if node is not None and node.op_type == "Constant":
        return numpy_helper.to_array(node.attribute[0].t)
    return None


def _weight_2d(index: GraphIndex, node: Any) -> bool:
    for init in index.model.graph.initializer:
        if init.name == node.input[1]:
            return len(init.dims) == 2
    return False


def _attr(node: Any, name: str, default: int) -> int:
    for attr in node.attribute:
        if attr.name == name:
            return int(attr.i)
    return default


# -- statistics -------------------------------------------------------------------------------
def probe_session(model: Any, tensors: list[str], optimization: str = "basic", threads: int | None = None) -> Any:
    """A CPU session of ``model`` whose outputs also include the named fp32 ``tensors`` (calibration statistics:
    smoothing's channel maxima, FP8's amax). ``optimization``: "basic", or "none" to keep every named tensor."""
    onnx = require("onnx")
    ort = require("onnxruntime", "activation statistics")
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    present = {o.name for o in probe.graph.output}
    for name in tensors:
        if name not in present:
            probe.graph.output.append(onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None))
    options = ort.SessionOptions()
    options.graph_optimization_level = (ort.GraphOptimizationLevel.ORT_ENABLE_BASIC if optimization == "basic"
                                        else ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
    options.log_severity_level = 3
    if threads:
        options.intra_op_num_threads = threads
    return ort.InferenceSession(probe.SerializeToString(), options, providers=["CPUExecutionProvider"])


def channel_absmax(model: Any, feeds: Iterable[dict[str, np.ndarray]], tensors: list[str], threads: int | None = None) -> dict[str, np.ndarray]:
    """max |x| per last-axis channel of each named tensor over every batch of ``feeds``."""
    session = probe_session(model, tensors, "basic", threads)
    result: dict[str, np.ndarray] = {}
    for feed in feeds:
        values = session.run(tensors, feed)
        for name, value in zip(tensors, values):
            flat = np.abs(np.asarray(value, dtype=np.float32)).reshape(-1, value.shape[-1]).max(axis=0)
            result[name] = flat if name not in result else np.maximum(result[name], flat)
    return result


# -- the pass ---------------------------------------------------------------------------------
def smooth_graph(fp32_path: str | Path, out_path: str | Path, source: Any, smoothing: Smoothing,
                 manifest: dict[str, Any] | None = None, threads: int | None = None) -> dict[str, Any]:
    """Write the smoothed fp32 graph of ``fp32_path`` to ``out_path`` (a plain path; calibrate
    works in a temporary folder) after verifying it computes the same function; returns the record."""
    onnx = require("onnx", "activation smoothing")
    from onnx import numpy_helper

    start = time.perf_counter()
    model = onnx.load(str(fp32_path))
    sites = find_sites(model, smoothing.scope)
    if not sites:
        raise UserError("no linear layer of this graph can be smoothed (none reads a LayerNorm through channel-preserving ops"
                        f"{' or any other activation' if smoothing.scope == 'all' else ''}); calibrate without --smooth")
    input_name = model.graph.input[0].name
    tensors = sorted({t for site in sites for t in site.inputs})
    stats = channel_absmax(model, source.feeds(input_name, STATS_BATCH), tensors, threads)
    index = GraphIndex.of(model)
    inits = {i.name: i for i in model.graph.initializer}
    readers: dict[str, int] = {}
    for node in model.graph.node:
        for name in node.input:
            readers[name] = readers.get(name, 0) + 1
    labels = layer_labels(model, (manifest or {}).get("graph") or {}, index)
    records = []
    for number, site in enumerate(sites):
        act = np.max(np.stack([stats[t] for t in site.inputs]), axis=0).astype(np.float64)
        weights = [_weight_rows(inits[n.input[1]], n, numpy_helper) for n in site.linears]
        if any(w.shape[0] != act.shape[0] for w in weights):
            continue  # a layer reads a reshaped view of the channels: leave it to the recipe
        w_max = np.max(np.stack([np.abs(w).max(axis=1) for w in weights]), axis=0)
        scale = np.power(np.clip(act, SCALE_CLAMP[0], None), smoothing.alpha) / np.power(np.clip(w_max, SCALE_CLAMP[0], None), 1.0 - smoothing.alpha)
        scale = np.where((act > 0) & (w_max > 0), np.clip(scale, *SCALE_CLAMP), 1.0).astype(np.float32)
        for node in site.linears:
            name = _own_initializer(model, inits, readers, node, 1)
            _set(inits[name], _scale_rows(numpy_helper.to_array(inits[name]), node, scale), numpy_helper)
        if site.kind == "layernorm":
            for slot in (1, 2):
                if len(site.norm.input) > slot and site.norm.input[slot]:
                    name = _own_initializer(model, inits, readers, site.norm, slot)
                    _set(inits[name], numpy_helper.to_array(inits[name]) / scale, numpy_helper)
        else:
            _insert_mul(model, site, (1.0 / scale).astype(np.float32), number)
        records.append({"kind": site.kind, "layers": [labels.get(n.name, n.name) for n in site.linears],
                        "nodes": [n.name for n in site.linears], "norm": site.norm.name if site.norm is not None else None,
                        "channels": int(scale.size), "scale_min": float(scale.min()), "scale_max": float(scale.max()),
                        "input_absmax_before": float(act.max()), "input_absmax_after": float((act / scale).max())})
    if not records:
        raise UserError("no linear layer of this graph could be smoothed; calibrate without --smooth")
    _topological(model)
    onnx.save(model, str(out_path))
    verification = verify_same_function(fp32_path, out_path, source, threads)
    if not verification["passed"]:
        raise InternalError(f"the smoothing pass changed the fp32 function (max relative difference "
                            f"{verification['max_rel_diff']:.2e} > {VERIFY_RTOL:g} on {verification['output']}); not used")
    layers = [layer for r in records for layer in r["layers"]]
    return {**smoothing.to_dict(), "method": "SmoothQuant per-channel migration (arXiv:2211.10438 eq. 4)",
            "statistics": f"max |x| per input channel over {len(source)} calibration images", "sites": records,
            "layers_touched": len(layers), "layers": layers,
            "new_nodes": sum(1 for r in records if r["kind"] == "mul"), "verification": verification,
            "seconds": round(time.perf_counter() - start, 2)}


def _weight_rows(init: Any, node: Any, numpy_helper: Any) -> np.ndarray:
    """The weight as [input channel, output channel] (Gemm with transB=1 stores it transposed)."""
    w = numpy_helper.to_array(init)
    return w.T if node.op_type == "Gemm" and _attr(node, "transB", 0) else w


def _scale_rows(w: np.ndarray, node: Any, scale: np.ndarray) -> np.ndarray:
    if node.op_type == "Gemm" and _attr(node, "transB", 0):
        return (w * scale[None, :]).astype(w.dtype)
    return (w * scale[:, None]).astype(w.dtype)


def _own_initializer(model: Any, inits: dict[str, Any], readers: dict[str, int], node: Any, slot: int) -> str:
    """The initializer ``node`` reads at ``slot``, copied first when other nodes read it too (a
    simplifier merges equal tensors: every LayerNorm of a random-init model shares gamma = 1)."""
    name = node.input[slot]
    if readers.get(name, 0) <= 1:
        return name
    copy_name = f"{name}__smooth_{node.name}"
    clone = type(inits[name])()
    clone.CopyFrom(inits[name])
    clone.name = copy_name
    model.graph.initializer.append(clone)
    inits[copy_name] = model.graph.initializer[-1]  # append() copies the message: keep the graph's own
    readers[name] -= 1
    readers[copy_name] = 1
    node.input[slot] = copy_name
    return copy_name


def _set(init: Any, value: np.ndarray, numpy_helper: Any) -> None:
    init.CopyFrom(numpy_helper.from_array(value.astype(numpy_helper.to_array(init).dtype), init.name))


def _insert_mul(model: Any, site: Site, inverse: np.ndarray, number: int) -> None:
    onnx = require("onnx")
    from onnx import numpy_helper

    const = f"smooth_{number}_inv_scale"
    out = f"{site.source}__smoothed_{number}"
    model.graph.initializer.append(numpy_helper.from_array(inverse, const))
    mul = onnx.helper.make_node("Mul", [site.source, const], [out], name=f"smooth_{number}_mul")
    for node in site.linears:
        node.input[0] = out
    model.graph.node.append(mul)


def _topological(model: Any) -> None:
    """Re-order nodes so each comes after its inputs' producers (the Muls were appended at the end)."""
    graph = model.graph
    ready = {i.name for i in graph.input} | {i.name for i in graph.initializer} | {""}
    pending = list(graph.node)
    ordered = []
    while pending:
        progressed = False
        rest = []
        for node in pending:
            if all(i in ready for i in node.input):
                ordered.append(node)
                ready.update(node.output)
                progressed = True
            else:
                rest.append(node)
        if not progressed:
            raise InternalError("the smoothed graph has a cycle or a dangling input")
        pending = rest
    copies = [type(n)() for n in ordered]
    for dst, src in zip(copies, ordered):
        dst.CopyFrom(src)
    del graph.node[:]
    graph.node.extend(copies)


def verify_same_function(original: str | Path, smoothed: str | Path, source: Any, threads: int | None = None,
                         images: int = VERIFY_IMAGES) -> dict[str, Any]:
    """Both fp32 graphs on the first ``images`` calibration images: max |d| / max |ref| per output."""
    from vitdeploy.runtime.ort import OrtRunner

    feeds = []
    input_name = None
    for feed in source.feeds("__input__", STATS_BATCH):
        feeds.append(feed)
        if sum(len(f["__input__"]) for f in feeds) >= images:
            break
    worst, worst_name = 0.0, ""
    runners = [OrtRunner(p, optimization="basic", threads=threads, providers=["CPUExecutionProvider"]) for p in (original, smoothed)]
    try:
        input_name = runners[0].session.get_inputs()[0].name
        for feed in feeds:
            feed = {(input_name if k == "__input__" else k): v for k, v in feed.items()}
            ref, got = (dict(zip([o.name for o in r.session.get_outputs()], r.session.run(None, feed))) for r in runners)
            for name, value in ref.items():
                if not np.issubdtype(value.dtype, np.floating):
                    continue
                scale = max(float(np.abs(value).max()), 1e-12)
                rel = float(np.abs(got[name].astype(np.float64) - value).max()) / scale
                if rel > worst:
                    worst, worst_name = rel, name
    finally:
        for r in runners:
            r.close()
    count = sum(len(f["__input__"]) for f in feeds)
    return {"images": count, "max_rel_diff": worst, "output": worst_name or None, "tolerance": VERIFY_RTOL,
            "passed": worst <= VERIFY_RTOL}
