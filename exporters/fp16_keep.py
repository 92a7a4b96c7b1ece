"""What the fp16 pass keeps in fp32 by name, and how much of a graph ends up fp16.

``--keep-fp32`` takes op types (``Gelu``), PyTorch modules as the manifest maps them (``blocks.3``,
``head``), ViT roles (``mlp-fc2``: every block's) and ``MODULE/ROLE`` cells (``blocks.2/mlp-fc2``),
the names ``vitdeploy debug-precision`` writes its fp16 recipes in. Modules and roles are found
from the graph's structure (calibration/exclusions.py), as for INT8 exclusions. Also the counts
and the one-line summary of an fp16 graph's record.
"""

from __future__ import annotations

from typing import Any, Sequence

from vitdeploy.errors import UserError
from vitdeploy.lazy import require


def resolve_keep(model: Any, graph_meta: dict[str, Any], items: Sequence[str]) -> tuple[list[str], dict[str, list[str]]]:
    """Split ``--keep-fp32`` items into op types and nodes: ``{item: [node names]}`` for modules
    (``blocks.3``, ``head``), roles (``mlp-fc2``) and cells (``blocks.2/mlp-fc2``). A role's node set
    is its linear layers and their bias Adds; a module's is every node it computes."""
    from vitdeploy.calibration.exclusions import CELL_SEP, ROLE_ORDER, ROLES, GraphIndex, module_nodes, role_nodes

    present = {n.op_type for n in model.graph.node}
    op_types = [i for i in items if i in present]
    rest = [i for i in items if i not in present]
    if not rest:
        return op_types, {}
    index = GraphIndex.of(model)
    modules = module_nodes(model, graph_meta, index)
    nodes: dict[str, list[str]] = {}
    unknown = []
    for item in rest:
        module, _, role = item.partition(CELL_SEP)
        if not role and module in ROLES:
            module, role = "", module
        if (module and module not in modules) or (role and role not in ROLES):
            unknown.append(item)
            continue
        chosen = set(modules[module]) if module else None
        if role:
            linear = role_nodes(model, role, index)
            with_bias = set(linear) | {c.name for n in linear for out in _outputs_of(index, n)
                                       for c in index.consumers.get(out, []) if c.op_type == "Add" and any(index.is_constant(i) for i in c.input)}
            chosen = with_bias if chosen is None else chosen & with_bias
        nodes[item] = sorted(chosen)
    if unknown:
        shown = ", ".join(list(modules)[:6]) + (", ..." if len(modules) > 6 else "")
        raise UserError(f"--keep-fp32 names what is not in the graph: {', '.join(unknown)} is neither an op type "
                        f"({', '.join(sorted(present))}) nor a module ({shown}), a role ({', '.join(ROLE_ORDER)}) or MODULE{CELL_SEP}ROLE")
    return op_types, nodes


def _outputs_of(index: Any, name: str) -> list[str]:
    node = next((n for n in index.model.graph.node if n.name == name), None)
    return list(node.output) if node is not None else []


def precision_counts(model: Any) -> dict[str, int]:
    """How many compute nodes (not Casts or shape plumbing) read or write fp16, and how many only fp32."""
    onnx = require("onnx")
    from .onnx_types import tensor_elem_types

    types = tensor_elem_types(model)
    fp16, fp32 = onnx.TensorProto.FLOAT16, onnx.TensorProto.FLOAT
    plumbing = {"Cast", "Shape", "Constant", "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Slice", "Gather", "Concat",
                "Expand", "Identity", "Split", "Flatten"}
    counts = {"fp16": 0, "fp32": 0}
    for node in model.graph.node:
        if node.op_type in plumbing:
            continue
        kinds = {types.get(t) for t in list(node.input) + list(node.output) if t}
        if fp16 in kinds:
            counts["fp16"] += 1
        elif fp32 in kinds:
            counts["fp32"] += 1
    return {"compute_nodes_fp16": counts["fp16"], "compute_nodes_fp32": counts["fp32"]}


def fp16_summary(record: dict[str, Any]) -> str:
    """The line export prints after writing model.fp16.onnx: what stayed fp32, how much is fp16, the gate."""
    kept = record["kept_fp32_op_types"] + list(record.get("user_kept_fp32_modules") or {})
    ranged = len((record.get("range_pass") or {}).get("nodes") or [])
    placement = record.get("placement") or {}
    gate = record.get("gate") or {}
    task = gate.get("task")
    verdict = (f"gate on {task['data']}: fp16 {task['accuracy']:.2%} vs fp32 {task['fp32_accuracy']:.2%}, agreement "
               f"{task['top1_agreement']:.2%}" if task and task.get("accuracy") is not None else "gate: seeded-image numbers")
    return (f"wrote model.fp16.onnx ({', '.join(kept)}, preprocessing{f' and {ranged} range-pass nodes' if ranged else ''} kept in fp32; "
            f"{placement.get('linear_ops_fp16', '?')}/{placement.get('linear_ops', '?')} linear layers in fp16; {verdict})")
