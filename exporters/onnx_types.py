"""Element types of an ONNX graph's tensors: what the fp16 pass, its gate, its keep-list and the precision
search read (below all of them, so none imports another for it)."""

from __future__ import annotations

from typing import Any

from vitdeploy import onnx_io


def tensor_elem_types(model: Any) -> dict[str, int]:
    """ONNX element type of every tensor (graph inputs/outputs, initializers, inferred values)."""
    inferred = onnx_io.infer_shapes(model, strict_mode=False)  # on a weightless copy: graphs past 2 GiB too
    types: dict[str, int] = {}
    graph = inferred.graph
    for value in list(graph.input) + list(graph.output) + list(graph.value_info):
        if value.type.HasField("tensor_type"):
            types[value.name] = value.type.tensor_type.elem_type
    for init in graph.initializer:
        types[init.name] = init.data_type
    for node in graph.node:  # Constant nodes carry their type in the attribute
        if node.op_type == "Constant":
            for attr in node.attribute:
                if attr.name == "value":
                    types[node.output[0]] = attr.t.data_type
    return types
