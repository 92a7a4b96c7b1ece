"""Read intermediate tensors of an ONNX graph: add them as graph outputs and run ONNX Runtime."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

from ..lazy import require


def tapped_runner(onnx_path: Path, tensor_names: Sequence[str], precision: str = "fp32"):
    """An OrtRunner whose outputs include ``tensor_names`` (those present in the graph)."""
    onnx = require("onnx")
    from .. import onnx_io
    from ..runtime.ort import OrtRunner

    # the structure only: a graph with external data keeps its weights in the data file, where the
    # session reads them (no copy of the weights in memory, and no 2 GiB limit on the bytes)
    model = onnx_io.load(onnx_path, weights=False)
    produced = {out for node in model.graph.node for out in node.output} | {i.name for i in model.graph.input}
    existing = {o.name for o in model.graph.output}
    present = [name for name in tensor_names if name in produced]
    for name in present:
        if name not in existing:
            model.graph.output.append(onnx.helper.make_empty_tensor_value_info(name))
    # "basic" keeps every tapped tensor (and for Q/DQ graphs, the arithmetic TensorRT implements)
    runner = OrtRunner(model.SerializeToString(), precision=precision, optimization="basic", external_data_dir=Path(onnx_path).parent)
    return runner, present


def read_initializer(onnx_path: Path, name: str) -> np.ndarray | None:
    from onnx import numpy_helper

    from .. import onnx_io

    model = onnx_io.load(onnx_path)
    for init in model.graph.initializer:
        if init.name == name:
            return numpy_helper.to_array(init)
    # a weight may also sit behind a Constant node
    for node in model.graph.node:
        if node.op_type == "Constant" and node.output[0] == name:
            return numpy_helper.to_array(node.attribute[0].t)
    return None
