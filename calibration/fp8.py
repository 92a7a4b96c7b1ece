"""FP8 (E4M3) Q/DQ graphs for ViTs: calibrated activation scales, placement, inspection.

The graph is the fp16 graph (``exporters/fp16.py``: preprocessing, LayerNorm, Softmax, position
machinery and the range pass's overflowing nodes stay fp32) with explicit ``QuantizeLinear`` /
``DequantizeLinear`` pairs of element type ``float8e4m3fn`` (opset 19+) in front of:

* **the linear layers** (MatMul/Gemm with a constant weight: qkv, attn.proj, mlp.fc1, mlp.fc2, the
  head): the activation through Q->DQ at a per-tensor scale ``amax / 448``, the weight stored as E4M3
  with a DequantizeLinear at a **per-tensor** scale ``max|W| / 448``. Per-tensor because every
  TensorRT version that builds FP8 takes it, while per-channel FP8 GEMM scales came in TensorRT 10.6
  and for Hopper only (TensorRT 10.6.0 release notes, "Per-Channel Scaling for FP8 GEMMs",
  https://docs.nvidia.com/deeplearning/tensorrt/latest/getting-started/release-notes-10/10.6.0.html);
  E4M3 is a float format, so one scale per tensor costs relative precision only where a channel is
  2^9 times smaller than the largest (subnormals). The weights are stored pre-quantized with a DQ in
  front ("Quantized Weights", https://docs.nvidia.com/deeplearning/tensorrt/latest/inference-library/
  quantized-types-explicit-quantization.html), so the file is the 8-bit one TensorRT would make.
* **the attention matmuls** (``attention="fp8"``): Q and K^T into the first, the softmax output and V
  into the second, as TensorRT Model Optimizer's ONNX FP8 mode places them so that TensorRT's fused FP8
  multi-head attention engages (https://nvidia.github.io/TensorRT-Model-Optimizer/guides/
  _onnx_quantization.html; without that placement attention stays FP16, NVIDIA/TensorRT#4516). The
  softmax output lies in [0, 1]: its scale is fixed at 1/448, not calibrated. With ``attention="float"``
  the attention matmuls carry no Q/DQ and compute in fp16 (targets whose fused attention does not
  take FP8: ``vitdeploy.engine.fp8_attention``).

Not quantized: the patch-embedding Conv (its input is the fp32 preprocessing; TensorRT's FP8
convolutions are narrower than its FP8 GEMMs, and ModelOpt's ViT recipe gains nothing there) and the
linear layers of a variable-size graph's valid_hw mask path. Biases stay float (TensorRT fuses the
bias Add after the dequantized GEMM). ONNX Runtime's CPU kernels run E4M3 Q/DQ exactly (values
saturate at 448 x scale), so the graph is verified here in reference semantics; nothing here ran on
a GPU.

Why not ``onnxruntime.quantization`` with ``QuantType.QFLOAT8E4M3FN``: ORT 1.32 refuses every calibration
method but ``Distribution`` for float types ("Only Distribution calibration method is supported for float
quantization"), which sets scales from the distribution's spread rather than amax/448, and places Q/DQ by
its own op rules (58 QuantizeLinear on the digits graph where this placement has 33); the ViT placement
and the scales are ours, so the insertion is written here (a few dozen lines over onnx.helper).

Scales come from :func:`collect_amax` on the fp32 graph (the tensor names of the linear layers'
inputs are mapped to the fp16 graph through node names, which the fp16 converter keeps).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable

import numpy as np

from vitdeploy.errors import UserError
from vitdeploy.lazy import require

from .exclusions import GraphIndex, constant_linear

FP8_MAX = 448.0  # largest finite E4M3 value (float8e4m3fn)
FP8_TYPE = "float8e4m3fn"
# amax per activation tensor: the largest |x| seen ("max", ModelOpt's FP8 default), or the largest
# per-batch percentile of |x| ("percentile": clips rare spikes; FP8's range rarely needs it)
FP8_METHODS = ("max", "percentile")
DEFAULT_PERCENTILE = 99.99
ATTENTION_MODES = ("fp8", "float")
SOFTMAX_SCALE = 1.0 / FP8_MAX  # softmax output in [0, 1]: amax 1
MIN_OPSET = 19  # QuantizeLinear/DequantizeLinear with float8 types
_SUFFIX = "/fp8"


@dataclass(frozen=True)
class Fp8Recipe:
    method: str = "max"
    attention: str = "fp8"  # "fp8": Q/DQ on Q, K, V and the softmax output; "float": attention matmuls unquantized (fp16)
    percentile: float = DEFAULT_PERCENTILE

    def __post_init__(self) -> None:
        if self.method not in FP8_METHODS:
            raise UserError(f"FP8 calibration --method must be one of {', '.join(FP8_METHODS)}, got {self.method!r}")
        if self.attention not in ATTENTION_MODES:
            raise UserError(f"--fp8-attention must be one of {', '.join(ATTENTION_MODES)}, got {self.attention!r}")
        if not 50.0 < self.percentile <= 100.0:
            raise UserError(f"the FP8 percentile must be in (50, 100], got {self.percentile}")

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"method": self.method, "attention": self.attention}
        if self.method == "percentile":
            out["percentile"] = self.percentile
        return out


@dataclass
class Sites:
    """Where Q/DQ goes, by node name: linear layers (activation input 0, weight input 1) and the
    attention matmuls (input index -> "softmax" when it is the softmax output, else "calibrated")."""

    linear: list[str]
    attention: dict[str, dict[int, str]]


def find_sites(model: Any, skip: Iterable[str] = ()) -> Sites:
    index = GraphIndex.of(model)
    skipped = set(skip)
    linear = [n.name for n in model.graph.node if constant_linear(index, n) and n.name not in skipped]
    attention: dict[str, dict[int, str]] = {}
    for node in model.graph.node:
        if node.op_type != "MatMul" or any(index.is_constant(i) for i in node.input) or node.name in skipped:
            continue
        attention[node.name] = {i: ("softmax" if _from_softmax(index, t) else "calibrated") for i, t in enumerate(node.input)}
    return Sites(linear, attention)


def _from_softmax(index: GraphIndex, tensor: str, depth: int = 3) -> bool:
    node = index.producer.get(tensor)
    while node is not None and depth > 0:
        if node.op_type == "Softmax":
            return True
        if node.op_type not in ("Cast", "Identity"):
            return False
        node, depth = index.producer.get(node.input[0]), depth - 1
    return False


def calibrated_tensors(model: Any, sites: Sites, attention: str) -> list[str]:
    """The fp32 graph's tensors whose amax sets a scale."""
    nodes = {n.name: n for n in model.graph.node}
    names = [nodes[name].input[0] for name in sites.linear]
    if attention == "fp8":
        names += [nodes[name].input[i] for name, inputs in sites.attention.items() for i, kind in inputs.items() if kind == "calibrated"]
    return list(dict.fromkeys(names))


def collect_amax(model: Any, feeds: Iterable[dict[str, np.ndarray]], tensors: list[str], method: str,
                 percentile: float = DEFAULT_PERCENTILE, threads: int | None = None) -> dict[str, float]:
    """amax of each named fp32 tensor over ``feeds`` (max |x|, or the largest per-batch percentile of |x|)."""
    from .smooth import probe_session

    session = probe_session(model, tensors, "none", threads)  # every named tensor kept
    result = {name: 0.0 for name in tensors}
    for feed in feeds:
        for name, value in zip(tensors, session.run(tensors, feed)):
            mag = np.abs(np.asarray(value, dtype=np.float32))
            if not mag.size:
                continue
            if not np.isfinite(mag).all():
                raise UserError(f"the fp32 graph computes non-finite values at {name} on the calibration images; FP8 scales need finite ranges")
            peak = float(mag.max()) if method == "max" else float(np.percentile(mag, percentile))
            result[name] = max(result[name], peak)
    return result


def scale_of(amax: float) -> float:
    """Per-tensor E4M3 scale: amax maps to 448 (a zero tensor gets scale 1, any value works)."""
    return amax / FP8_MAX if amax > 0 and math.isfinite(amax) else 1.0


def to_fp8_bytes(values: np.ndarray) -> bytes:
    """E4M3 bytes of ``values`` (saturated to +-448, round to nearest even), as ONNX stores float8e4m3fn."""
    ml_dtypes = require("ml_dtypes", "FP8 weights")
    clipped = np.clip(values.astype(np.float32), -FP8_MAX, FP8_MAX)
    return clipped.astype(ml_dtypes.float8_e4m3fn).tobytes()


def insert_qdq(model: Any, sites: Sites, amax: dict[str, float], tensor_of: dict[tuple[str, int], str], attention: str) -> dict[str, Any]:
    """Put E4M3 Q/DQ into ``model`` (the fp16 graph, in place) at ``sites``.

    ``tensor_of[(node, input)]``: the fp32 graph's tensor whose amax scales that input. Returns the
    counts and the per-layer scales for the record.
    """
    onnx = require("onnx", "FP8 quantization")
    from onnx import TensorProto, helper, numpy_helper

    _ensure_opset(model)
    graph = model.graph
    inits = {i.name: i for i in graph.initializer}
    dtypes = _elem_types(model)
    zero = f"fp8_zero_point{_SUFFIX}"
    graph.initializer.append(helper.make_tensor(zero, TensorProto.FLOAT8E4M3FN, [], [0.0]))
    before: dict[str, list[Any]] = {}  # node name -> Q/DQ nodes that must precede it
    weights_done: dict[str, str] = {}
    scales: dict[str, dict[str, float]] = {}
    by_name = {n.name: n for n in graph.node}
    users = _initializer_users(graph)

    def scale_tensor(name: str, value: float, elem: int) -> str:
        np_type = helper.tensor_dtype_to_np_dtype(elem)
        graph.initializer.append(numpy_helper.from_array(np.array(value, dtype=np_type), name))
        return name

    def activation(node: Any, i: int, value: float) -> None:
        src = node.input[i]
        elem = dtypes.get(src, TensorProto.FLOAT)
        base = f"{node.name}/input{i}{_SUFFIX}"
        s = scale_tensor(f"{base}/scale", value, elem)
        q = helper.make_node("QuantizeLinear", [src, s, zero], [f"{base}/q"], name=f"{base}/QuantizeLinear", saturate=1)
        dq = helper.make_node("DequantizeLinear", [f"{base}/q", s, zero], [f"{base}/dq"], name=f"{base}/DequantizeLinear")
        before.setdefault(node.name, []).extend([q, dq])
        node.input[i] = f"{base}/dq"
        dtypes[f"{base}/dq"] = elem

    for name in sites.linear:
        node = by_name.get(name)
        if node is None or node.input[1] not in inits and node.input[1] not in weights_done:
            continue  # the converter put a Cast on a shared weight: left in float, inspection counts it
        a = scale_of(amax[tensor_of[(name, 0)]])
        activation(node, 0, a)
        w_name = node.input[1]
        if w_name not in weights_done:
            w = inits[w_name]
            values = numpy_helper.to_array(w)
            w_scale = scale_of(float(np.abs(values.astype(np.float32)).max()) if values.size else 0.0)
            q_name = f"{w_name}{_SUFFIX}"
            fp8 = TensorProto(name=q_name, data_type=TensorProto.FLOAT8E4M3FN, dims=list(values.shape))
            fp8.raw_data = to_fp8_bytes(values.astype(np.float32) / w_scale)
            graph.initializer.append(fp8)
            s = scale_tensor(f"{q_name}/scale", w_scale, w.data_type)
            dq = helper.make_node("DequantizeLinear", [q_name, s, zero], [f"{q_name}/dq"], name=f"{q_name}/DequantizeLinear")
            before.setdefault(name, []).append(dq)
            weights_done[w_name] = f"{q_name}/dq"
            if users.get(w_name, 0) <= 1 and w_name not in {i.name for i in graph.input}:
                graph.initializer.remove(w)
            scales[name] = {"activation": a, "weight": w_scale}
        node.input[1] = weights_done[w_name]

    attention_fp8 = 0
    if attention == "fp8":
        for name, inputs in sites.attention.items():
            node = by_name.get(name)
            if node is None:
                continue
            for i, kind in inputs.items():
                activation(node, i, SOFTMAX_SCALE if kind == "softmax" else scale_of(amax[tensor_of[(name, i)]]))
            attention_fp8 += 1

    ordered = []
    for node in graph.node:
        ordered.extend(before.get(node.name, []))
        ordered.append(node)
    del graph.node[:]
    graph.node.extend(ordered)
    if model.ByteSize() < (2 << 30) - (64 << 20):  # the checker serialises the model: not past protobuf's 2 GiB
        onnx.checker.check_model(model, full_check=False)
    return {"linear_fp8": len([n for n in sites.linear if n in by_name]), "attention_fp8": attention_fp8, "scales": scales}


def _ensure_opset(model: Any) -> None:
    for opset in model.opset_import:
        if opset.domain in ("", "ai.onnx") and opset.version < MIN_OPSET:
            raise UserError(f"the graph has opset {opset.version}; FP8 Q/DQ needs opset {MIN_OPSET}+ (re-export with a current vitdeploy)")


def _elem_types(model: Any) -> dict[str, int]:
    graph = model.graph
    out = {v.name: v.type.tensor_type.elem_type for v in list(graph.value_info) + list(graph.input) + list(graph.output)}
    out.update({i.name: i.data_type for i in graph.initializer})
    return out


def _initializer_users(graph: Any) -> dict[str, int]:
    counts: dict[str, int] = {}
    for node in graph.node:
        for name in node.input:
            counts[name] = counts.get(name, 0) + 1
    return counts


def inspect_fp8_placement(model: Any) -> dict[str, Any]:
    """Counts and ``violations`` (empty when the placement holds) of an FP8 graph: which linear layers
    and attention matmuls take E4M3 Q/DQ, and no FP8 Q/DQ before LayerNorm, Softmax or a residual Add."""
    require("onnx", "inspecting ONNX graphs")
    from onnx import TensorProto, numpy_helper

    index = GraphIndex.of(model)
    inits = {i.name: i for i in model.graph.initializer}
    violations: list[str] = []
    fp8_dq = {}
    for node in model.graph.node:
        if node.op_type == "DequantizeLinear":
            src = node.input[0]
            q = index.producer.get(src)
            is_fp8 = (src in inits and inits[src].data_type == TensorProto.FLOAT8E4M3FN) or (
                q is not None and q.op_type == "QuantizeLinear" and len(q.input) > 2 and q.input[2] in inits
                and inits[q.input[2]].data_type == TensorProto.FLOAT8E4M3FN)
            if is_fp8:
                fp8_dq[node.output[0]] = node
                scale = inits.get(node.input[1])
                value = numpy_helper.to_array(scale) if scale is not None else None
                if value is None or value.size != 1 or not (np.isfinite(value).all() and float(value.reshape(-1)[0]) > 0):
                    violations.append(f"{node.name}: FP8 scale must be one positive finite value (per-tensor)")
    linear_total = linear_fp8 = attn_total = attn_fp8 = softmax_fixed = 0
    layers: list[str] = []
    for node in model.graph.node:
        if node.op_type not in ("MatMul", "Gemm"):
            if any(i in fp8_dq for i in node.input) and node.op_type not in ("Reshape", "Transpose"):
                violations.append(f"{node.name}: FP8 DequantizeLinear feeds {node.op_type} (only linear layers and attention matmuls take FP8)")
            continue
        weight = node.input[1] if len(node.input) > 1 else ""
        weight_dq = fp8_dq.get(weight)
        is_linear = weight_dq is not None and weight_dq.input[0] in inits or (weight and index.is_constant(weight))
        quantized = all(i in fp8_dq for i in node.input[:2])
        if is_linear:
            linear_total += 1
            if quantized:
                linear_fp8 += 1
                layers.append(node.name)
            elif node.input[0] in fp8_dq or weight_dq is not None:
                violations.append(f"{node.name}: only one input of the linear layer has FP8 Q/DQ")
        else:
            attn_total += 1
            if quantized:
                attn_fp8 += 1
                for i in node.input[:2]:
                    if _from_softmax(index, index.producer[fp8_dq[i].input[0]].input[0]):
                        value = float(numpy_helper.to_array(inits[fp8_dq[i].input[1]]).reshape(-1)[0])
                        softmax_fixed += int(abs(value - SOFTMAX_SCALE) <= 1e-3 * SOFTMAX_SCALE)
    return {"linear_layers": linear_total, "linear_fp8": linear_fp8, "attention_matmuls": attn_total, "attention_fp8": attn_fp8,
            "softmax_fixed_scale": softmax_fixed, "fp8_layers": layers,
            "attention": "fp8" if attn_total and attn_fp8 == attn_total else ("float" if attn_fp8 == 0 else "mixed"),
            "violations": violations}
