"""Read a Q/DQ graph back and check the ViT-aware INT8 placement.

Called after every quantization (a graph that breaks the policy is not written), by the tests, and
by ``vitdeploy check``. The rules:

* no QuantizeLinear/DequantizeLinear output feeds a LayerNormalization or a Softmax (they run on
  float inputs; Q/DQ belongs on the inputs of the linear layers, not in front of normalisation);
* every MatMul/Gemm/Conv that is not excluded reads dequantized inputs, and its weight is int8,
  quantized per output channel (one scale per output channel on the right axis);
* an excluded layer reads no Q/DQ at all;
* for TensorRT (``target="tensorrt"``): every Q/DQ is symmetric int8 (zero point 0) and no
  DequantizeLinear reads int32 (TensorRT's parser accepts only int8/fp8/int4 inputs to DQ, so biases
  stay float);
* in a variable-size graph, no Q/DQ reads or sits on the valid_hw mask path
  (:mod:`vitdeploy.exporters.mask_path`).

GELU and the residual Adds reading Q/DQ outputs are counted (they stay float either way).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable

import numpy as np

from vitdeploy.lazy import require

from .exclusions import QUANTIZABLE_OPS, GraphIndex

FLOAT_ONLY_OPS = ("LayerNormalization", "Softmax")
COUNTED_FLOAT_OPS = ("Gelu", "Add")
QDQ_OPS = ("QuantizeLinear", "DequantizeLinear")


def inspect_qdq_placement(model: Any, excluded_nodes: Iterable[str] = (), target: str = "tensorrt") -> dict[str, Any]:
    """Counts and ``violations`` (empty when the placement is right) for a Q/DQ graph or its path."""
    onnx = require("onnx", "inspecting ONNX graphs")
    from onnx import numpy_helper

    if isinstance(model, (str, Path)):
        model = onnx.load(str(model))
    index = GraphIndex.of(model)
    inits = {i.name: i for i in model.graph.initializer}
    excluded = set(excluded_nodes)
    violations: list[str] = []

    def const_array(name: str) -> np.ndarray | None:
        if name in inits:
            return numpy_helper.to_array(inits[name])
        node = index.producer.get(name)
        if node is not None and node.op_type == "Constant":
            for attr in node.attribute:
                if attr.name == "value":
                    return numpy_helper.to_array(attr.t)
        return None

    def dq_of(tensor: str) -> Any | None:
        node = index.producer.get(tensor)
        return node if node is not None and node.op_type == "DequantizeLinear" else None

    # 1. nothing quantized feeds LayerNorm / Softmax
    fed = {op: 0 for op in COUNTED_FLOAT_OPS}
    float_only = {op: 0 for op in FLOAT_ONLY_OPS}
    for node in model.graph.node:
        qdq_inputs = [i for i in node.input if i and index.producer.get(i) is not None and index.producer[i].op_type in QDQ_OPS]
        if node.op_type in FLOAT_ONLY_OPS:
            float_only[node.op_type] += 1
            if qdq_inputs:
                violations.append(f"{node.op_type} {node.name} reads a Q/DQ output ({qdq_inputs[0]})")
        elif node.op_type in COUNTED_FLOAT_OPS and qdq_inputs:
            fed[node.op_type] += 1

    # 2. linear layers: quantized inputs, per-channel int8 weights; excluded ones untouched
    linear = [n for n in model.graph.node if n.op_type in QUANTIZABLE_OPS]
    quantized = per_channel = 0
    for node in linear:
        data_inputs = [i for i in node.input[:2] if i]
        if node.name in excluded:
            if any(dq_of(i) for i in data_inputs):
                violations.append(f"excluded {node.op_type} {node.name} still reads Q/DQ inputs")
            continue
        missing = [i for i in data_inputs if dq_of(i) is None]
        if missing:
            violations.append(f"{node.op_type} {node.name} is not quantized (input {missing[0]} is float)")
            continue
        quantized += 1
        weight_dq = dq_of(node.input[1])
        weight = const_array(weight_dq.input[0])
        if weight is None:
            continue  # activation x activation matmul (attention): per-tensor on both sides
        expected_axis = _output_channel_axis(node, weight.ndim)
        scale = const_array(weight_dq.input[1])
        axis = _attr(weight_dq, "axis", 1)
        axis = axis + weight.ndim if axis < 0 else axis
        if weight.dtype not in (np.int8, np.uint8):
            violations.append(f"{node.op_type} {node.name} weight is {weight.dtype}, not 8-bit")
        elif scale is None or scale.ndim != 1 or scale.size != weight.shape[expected_axis] or axis != expected_axis:
            got = "per-tensor" if scale is None or scale.size == 1 else f"axis {axis}, {scale.size} scales"
            violations.append(f"{node.op_type} {node.name} weight is not per-channel on axis {expected_axis} ({got})")
        else:
            per_channel += 1

    # 4. variable-size graphs: no Q/DQ reads or sits on the valid_hw mask path
    from vitdeploy.exporters.mask_path import find_mask_path, qdq_on_mask_path

    mask = find_mask_path(model)
    for name in qdq_on_mask_path(model, mask) if mask is not None else ():
        violations.append(f"{name} is on the valid_hw mask path (Q/DQ must not touch what is computed from valid_hw before it meets the image)")

    # 3. what TensorRT accepts
    q_nodes = [n for n in model.graph.node if n.op_type in QDQ_OPS]
    dtypes: set[str] = set()
    for node in q_nodes:
        zp_name = node.input[2] if len(node.input) > 2 else ""
        zp = const_array(zp_name) if zp_name else None
        if node.op_type == "DequantizeLinear":
            x = const_array(node.input[0])
            if x is not None:
                dtypes.add(str(x.dtype))
        if zp is not None:
            dtypes.add(str(zp.dtype))
        if target == "tensorrt":
            if zp is not None and (zp.dtype != np.int8 or np.any(zp != 0)):
                violations.append(f"{node.op_type} {node.name} is not symmetric int8 (zero point {zp.dtype} {np.unique(zp)[:3]})")
            if node.op_type == "DequantizeLinear":
                x = const_array(node.input[0])
                if x is not None and x.dtype == np.int32:
                    violations.append(f"DequantizeLinear {node.name} reads int32 (a quantized bias): TensorRT rejects it")

    return {
        "target": target,
        "qdq_nodes": len(q_nodes),
        "linear_layers": len(linear),
        "quantized_layers": quantized,
        "excluded_layers": sum(1 for n in linear if n.name in excluded),
        "per_channel_weights": per_channel,
        "float_only_ops": float_only,
        "float_ops_reading_qdq": fed,
        "quantized_dtypes": sorted(dtypes),
        **({"mask_path": mask.summary()} if mask is not None else {}),
        "violations": violations,
    }


def _output_channel_axis(node: Any, ndim: int) -> int:
    """Axis of a weight that indexes output channels: Conv [out, in, kh, kw] -> 0;
    MatMul B [.., in, out] -> last; Gemm B [in, out] -> 1, or 0 when transB=1."""
    if node.op_type == "Conv":
        return 0
    if node.op_type == "Gemm":
        return 0 if _attr(node, "transB", 0) else 1
    return ndim - 1


def _attr(node: Any, name: str, default: int) -> int:
    for attr in node.attribute:
        if attr.name == name:
            return int(attr.i)
    return default


def bundle_placement(bundle: Any, precision: str) -> dict[str, Any]:
    """The placement report of a bundle's fp16 or int8 graph, with the options it was made with
    (the int8 record's excluded nodes and target; the fp16 record's extra fp32 op types)."""
    path = bundle.artifact_path(precision)
    record = bundle.artifact_record(precision)
    if precision == "int8":
        excluded = (record.get("exclusions") or {}).get("nodes", [])
        return inspect_qdq_placement(path, excluded, record.get("target", "tensorrt"))
    if precision == "fp16":
        from vitdeploy.exporters.fp16 import inspect_fp16_placement

        return inspect_fp16_placement(path, extra_fp32_ops=record.get("user_kept_fp32_op_types", []))
    if precision == "fp8":
        from .fp8 import inspect_fp8_placement

        return inspect_fp8_placement(require("onnx").load(str(path)))
    raise ValueError(f"no placement policy for {precision} graphs")
