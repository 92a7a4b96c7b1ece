"""Read intermediate tensors of an ONNX graph: add them as graph outputs and run ONNX Runtime."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

from ..lazy import require


def tapped_runner(onnx_path: Path, tensor_names: Sequence[str], precision: str = "fp32"):
    """An OrtRunner whose outputs include ``tensor_names`` (those present in the graph)."""
    onnx = require("onnx")
    from ..runtime.ort import OrtRunner

    model = onnx.load(str(onnx_path))
    produced = {out for node in model.graph.node for out in node.output} | {i.name for i in model.graph.input}
    existing = {o.name for o in model.graph.output}
    present = [name for name in tensor_names if name in produced]
    for name in present:
        if name not in existing:
            model.graph.output.append(onnx.helper.make_empty_tensor_value_info(name))
    # "basic" keeps every tapped tensor (and for Q/DQ graphs, the arithmetic TensorRT implements)
    runner = OrtRunner(model.SerializeToString(), precision=precision, optimization="basic")
    return runner, present


def read_initializer(onnx_path: Path, name: str) -> np.ndarray | None:
    onnx = require("onnx")
    from onnx import numpy_helper

    model = onnx.load(str(onnx_path))
    for init in model.graph.initializer:
        if init.name == name:
            return numpy_helper.to_array(init)
    # a weight may also sit behind a Constant node
    for node in model.graph.node:
        if node.op_type == "Constant" and node.output[0] == name:
            return numpy_helper.to_array(node.attribute[0].t)
    return None
