"""The mask path of a variable-size graph: what is computed from ``valid_hw`` before it meets the image.

A variable-size graph (exporters/variable_size.py) takes (images, valid_hw). Everything computed
from ``valid_hw`` alone - the patch grid, the pixel- and token-validity masks, the -30000 key bias,
the per-sample interpolation matrices and the position tables they resample, the masked-mean
weights and their denominator - is the *mask path*. It meets the image stream at a few *join*
nodes: the Mul that zeroes padding pixels, the Add of the per-sample position table to the patch
tokens, the Add of the key bias into every block's attention scores, the Mul and Div of the masked
mean (GAP read-out).

Found by value flow from the graph inputs, never by node names (they change with the exporter,
timm vs the reference model, and the precision passes' inserted Casts):

* a tensor is *valid-derived* when its value depends on ``valid_hw``, *image-derived* when it
  depends on the images; ``Shape``/``Size`` pass no value (the batch size read off an input is not
  data), as in :mod:`.position_nodes`;
* *mask-path* nodes: some valid-derived input, no image-derived input;
* *join* nodes: read a mask-path tensor and an image-derived tensor;
* *masked reductions*: ReduceSum/ReduceMean reading a join's output (the masked mean's numerator,
  a sum over up to N tokens).

The precision policies use it: the fp16 pass keeps the mask path, the joins and the masked
reductions in fp32 (the bias stays exactly -30000 and is added to fp32 scores, the interpolation
weights keep summing to one, a masked sum over hundreds of tokens cannot overflow fp16's 65504);
INT8 excludes the mask path's linear layers (the per-sample table resampling MatMuls) from Q/DQ, and
both placement inspections re-walk the written graph and report any node that breaks the rule.
This module imports only what it is given (onnx ModelProtos): no torch, no onnxruntime.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from vitdeploy.variable import VALID_INPUT

_SHAPE_OPS = {"Shape", "Size"}
_REDUCTIONS = {"ReduceSum", "ReduceMean"}
LINEAR_OPS = ("MatMul", "Gemm", "Conv")
QDQ_OPS = ("QuantizeLinear", "DequantizeLinear")


@dataclass
class MaskPath:
    """The mask path of one graph (node names in graph order)."""

    source: str
    nodes: list[str] = field(default_factory=list)  # computed from valid_hw (and constants) only
    tensors: set[str] = field(default_factory=set)  # valid_hw and the mask-path nodes' outputs
    joins: list[str] = field(default_factory=list)  # mask-path tensor meets the image stream
    reductions: list[str] = field(default_factory=list)  # masked sums behind a join
    linear: list[str] = field(default_factory=list)  # MatMul/Gemm/Conv on the mask path
    constants: list[str] = field(default_factory=list)  # Constant nodes read only by the above

    @property
    def fp32_nodes(self) -> list[str]:
        """What the fp16 pass keeps in fp32: the path, its joins, the masked reductions, and the
        Constant nodes only they read (an unblocked Constant would be rounded to fp16 and cast back:
        the bias stays exact, but interpolation coefficients would not)."""
        return self.nodes + self.joins + self.reductions + self.constants

    def summary(self) -> dict[str, Any]:
        return {"source": self.source, "mask_path_nodes": len(self.nodes), "joins": len(self.joins),
                "masked_reductions": len(self.reductions), "mask_path_linear": len(self.linear), "constants": len(self.constants)}


def value_flow(model: Any, sources: set[str]) -> set[str]:
    """Tensors whose values depend on ``sources`` (graph order is topological in ONNX)."""
    tainted = set(sources)
    for node in model.graph.node:
        if node.op_type in _SHAPE_OPS:
            continue
        if any(i in tainted for i in node.input if i):
            tainted.update(o for o in node.output if o)
    return tainted


def find_mask_path(model: Any, source: str = VALID_INPUT) -> MaskPath | None:
    """The mask path of ``model``, or None when ``source`` is not one of its inputs."""
    graph = model.graph
    initializers = {i.name for i in graph.initializer}
    inputs = [v.name for v in graph.input if v.name not in initializers]
    if source not in inputs:
        return None
    valid = value_flow(model, {source})
    image = value_flow(model, {name for name in inputs if name != source})
    mask_tensors = valid - image
    path = MaskPath(source, tensors={source})
    join_outputs: set[str] = set()
    for node in graph.node:
        if node.op_type in _SHAPE_OPS:
            continue
        ins = [i for i in node.input if i]
        reads_mask = any(i in mask_tensors for i in ins)
        reads_image = any(i in image for i in ins)
        if reads_mask and not reads_image:
            path.nodes.append(node.name)
            path.tensors.update(o for o in node.output if o)
            if node.op_type in LINEAR_OPS:
                path.linear.append(node.name)
        elif reads_mask and reads_image:
            path.joins.append(node.name)
            join_outputs.update(o for o in node.output if o)
        elif node.op_type in _REDUCTIONS and ins and ins[0] in join_outputs:
            path.reductions.append(node.name)
    kept = set(path.nodes) | set(path.joins) | set(path.reductions)
    readers: dict[str, list[str]] = {}
    for node in graph.node:
        for i in node.input:
            if i:
                readers.setdefault(i, []).append(node.name)
    for node in graph.node:
        if node.op_type == "Constant":
            read_by = [r for o in node.output for r in readers.get(o, [])]
            if read_by and all(r in kept for r in read_by):
                path.constants.append(node.name)
    unnamed = [n for n in path.fp32_nodes if not n]
    if unnamed:
        from vitdeploy.errors import UserError

        raise UserError("the variable-size graph has unnamed nodes on its valid_hw path; re-export it with `vitdeploy export`")
    return path


def qdq_on_mask_path(model: Any, path: MaskPath | None = None) -> list[str]:
    """Q/DQ nodes that read a mask-path tensor or sit on the path (empty when the INT8 rule holds)."""
    path = path or find_mask_path(model)
    if path is None:
        return []
    on_path = set(path.nodes)
    return [n.name or n.op_type for n in model.graph.node
            if n.op_type in QDQ_OPS and (n.name in on_path or any(i in path.tensors for i in n.input if i))]
