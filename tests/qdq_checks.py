"""What a Q/DQ graph quantizes, read from its structure: the Q/DQ nodes are new (named by the quantizer),
so a test asks what their outputs feed, not whether a float node's name became a Q/DQ node."""

from __future__ import annotations

from typing import Any


def dequantized_consumers(model: Any) -> set[str]:
    """The op types that read a DequantizeLinear output."""
    consumers: dict[str, list[Any]] = {}
    for node in model.graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    return {c.op_type for n in model.graph.node if n.op_type == "DequantizeLinear" for c in consumers.get(n.output[0], [])}


def dequantized_inputs(model: Any, names: set[str]) -> list[str]:
    """Nodes among ``names`` that read a DequantizeLinear output."""
    produced_by = {out: node.op_type for node in model.graph.node for out in node.output}
    return [n.name for n in model.graph.node if n.name in names and any(produced_by.get(i) == "DequantizeLinear" for i in n.input)]
