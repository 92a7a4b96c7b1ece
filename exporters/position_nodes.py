"""Find the position machinery in an exported ONNX graph, for the precision policies (issue 17).

Two structural sets, the same for static and dynamic graphs, whatever names the exporter or the
simplifier gave the nodes:

* the *position subgraph*: nodes none of whose inputs depends on the image data, only on
  constants and on the input's *shape* (tensor values flow from the graph input through every op
  except ``Shape``/``Size``). In a dynamic graph this is where the absolute table is resampled,
  BEiT's bias table is re-sampled and gathered through the rebuilt index, and the rotary sin/cos
  are computed for the input's grid; in a static graph it is folded into constants;
* the *rotary application*: ``x cos + rot(x) sin`` on q and k, i.e. the ``Mul`` nodes that scale
  an activation by a position tensor (a position-subgraph output, or a baked constant of rank >= 2:
  sin/cos tables are [N, head_dim]; layer scales, attention scales and biases are rank <= 1), and
  the ``Add`` that joins two such products.

The fp16 pass keeps both in fp32 (timm computes sin/cos and the rotation in fp32 under autocast;
an fp16 angle table loses ~1e-3 of every rotation). Neither contains a MatMul/Gemm/Conv fed by
activations, so the INT8 Q/DQ policy (linear-layer inputs only) leaves them, and BEiT's bias adds,
in float by construction; :func:`position_linear_nodes` names any linear node inside the position
subgraph so the quantizer can keep it out as well.
"""

from __future__ import annotations

from typing import Any

_SHAPE_OPS = {"Shape", "Size"}
_ROTARY_MIN_RANK = 2


def data_tensors(model: Any) -> set[str]:
    """Tensors whose values depend on the image data (not only on its shape)."""
    graph = model.graph
    data = {v.name for v in graph.input}
    initializers = {i.name for i in graph.initializer}
    data -= initializers
    for node in graph.node:  # topological order
        if node.op_type in _SHAPE_OPS:
            continue
        if any(i in data for i in node.input if i):
            data.update(o for o in node.output if o)
    return data


def position_subgraph_nodes(model: Any) -> list[str]:
    """Nodes computed from constants and the input's shape only (see the module doc)."""
    data = data_tensors(model)
    shape_fed: set[str] = set()
    names = []
    for node in model.graph.node:
        if node.op_type in _SHAPE_OPS:
            shape_fed.update(node.output)
            continue
        if node.op_type == "Constant" or any(i in data for i in node.input if i):
            continue
        if any(i in shape_fed for i in node.input if i):
            shape_fed.update(node.output)
            names.append(node.name)
    return names


def _ranks(model: Any) -> dict[str, int]:
    from vitdeploy import onnx_io

    ranks = {i.name: len(i.dims) for i in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Constant":
            for attr in node.attribute:
                if attr.name == "value":
                    ranks[node.output[0]] = len(attr.t.dims)
    try:
        inferred = onnx_io.infer_shapes(model)  # on a weightless copy: no 2 GiB limit, no copy of the weights
    except Exception:  # shape inference is a refinement here, not a requirement
        return ranks
    for value in list(inferred.graph.value_info) + list(inferred.graph.output):
        if value.type.tensor_type.HasField("shape"):
            ranks.setdefault(value.name, len(value.type.tensor_type.shape.dim))
    return ranks


def rotary_application_nodes(model: Any) -> list[str]:
    """The Mul nodes that rotate q/k by sin/cos, and the Add joining the two products."""
    graph = model.graph
    data = data_tensors(model)
    ranks = _ranks(model)
    shape_fed = {o for n in graph.node if n.name in set(position_subgraph_nodes(model)) for o in n.output}
    rotary_muls: set[str] = set()
    products: set[str] = set()
    for node in graph.node:
        if node.op_type != "Mul" or len(node.input) != 2:
            continue
        a, b = node.input
        for act, other in ((a, b), (b, a)):
            if act in data and other not in data and ranks.get(other, _ROTARY_MIN_RANK if other in shape_fed else 0) >= _ROTARY_MIN_RANK:
                rotary_muls.add(node.name)
                products.update(node.output)
    joins = [n.name for n in graph.node if n.op_type == "Add" and len(n.input) == 2 and all(i in products for i in n.input)]
    return sorted(rotary_muls) + joins


def fp32_position_nodes(model: Any) -> list[str]:
    """Every node the fp16 pass keeps in fp32 for position's sake."""
    return sorted(set(position_subgraph_nodes(model)) | set(rotary_application_nodes(model)))


def position_linear_nodes(model: Any) -> list[str]:
    """MatMul/Gemm/Conv nodes inside the position subgraph (never activations: keep them float)."""
    names = set(position_subgraph_nodes(model))
    return [n.name for n in model.graph.node if n.name in names and n.op_type in ("MatMul", "Gemm", "Conv")]
