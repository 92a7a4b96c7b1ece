"""``reports/MODEL_CARD.md``: the Hugging Face model-card convention (YAML front matter, then prose),
written from the same records as the page. ``model-index`` holds only results that were measured:
a dataset a command scored and the metric it reported; a bundle with none has no ``model-index``.

Front matter keys follow https://huggingface.co/docs/hub/model-cards (library_name, tags,
base_model, model-index). Values are written as JSON scalars, which YAML reads unchanged.
"""

from __future__ import annotations

import json
from typing import Any

from ..precisions import REDUCED
from ..records import WeightsIdentity
from ..weights import describe_weights, random_weights_notice
from .sources import Sources


def _q(value: Any) -> str:
    return json.dumps(value)


def _floats(values: list[float]) -> str:
    return "[" + ", ".join(f"{v:.4f}" for v in values) + "]"


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def base_model(source: dict[str, Any]) -> str | None:
    """The hub repository the weights came from, where the manifest records one."""
    weights = WeightsIdentity.of_source(source)
    if weights.random:
        return None
    return weights.repo_id or None


def measured_results(src: Sources) -> list[dict[str, Any]]:
    """(dataset, metric, value, what measured it) from current check and evaluate records only."""
    results = []
    for rec in src.check:
        for art in rec.data.get("artifacts") or []:
            if art.get("backend") == "tensorrt" or not src.is_current(art.get("precision"), art.get("sha256")):
                continue
            for row in art.get("sets") or []:
                if "accuracy" in row and row.get("real"):
                    results.append({"dataset": row["set"], "metric": "accuracy", "value": row["accuracy"],
                                    "name": f"top-1 accuracy, {art['precision']} graph ({art.get('execution')}, vitdeploy check)"})
    ev = src.evaluate
    if ev is not None:
        graphs = (ev.data.get("bundle") or {}).get("graphs") or {}
        current = all(src.is_current(p, sha) for p, sha in graphs.items())
        source = (ev.data.get("data") or {}).get("source")
        # the shifted conditions of the first deployed graph (the fp32 one when present): the others are in the page
        graphs_scored = [s["id"] for s in ev.data.get("scorers") or [] if s.get("kind") == "graph" and s.get("id") in (ev.data.get("results") or {})]
        for scorer in graphs_scored[:1]:
            res = ev.data["results"][scorer]
            for cid, r in res.items():
                if cid == "clean" or not current or r.get("accuracy") is None:
                    continue
                results.append({"dataset": f"{source} ({cid})", "metric": "accuracy", "value": r["accuracy"],
                                "name": f"top-1 accuracy under {cid}, {scorer} (vitdeploy evaluate, {r.get('n')} images)"})
    return results


def model_card(src: Sources, created: str) -> str:
    m = src.bundle.manifest
    source = m.get("source") or {}
    graphs = list(src.graph_sha)
    tags = ["vision-transformer", "onnx", "vitdeploy"] + [p for p in graphs if p in REDUCED]
    if m.get("labels"):
        tags.append("image-classification")
    if src.bundle.engines():
        tags.append("tensorrt")
    name = m.get("name") or src.bundle.root.name
    lines = ["---", "library_name: onnx", "tags:"] + [f"- {_q(t)}" for t in tags]
    if m.get("labels"):
        lines.append("pipeline_tag: image-classification")
    base = base_model(source)
    if base:
        lines.append(f"base_model: {_q(base)}")
    results = measured_results(src)
    if results:
        lines += ["model-index:", f"- name: {_q(name)}", "  results:"]
        for r in results:
            lines += ["  - task:", "      type: image-classification", "    dataset:", f"      name: {_q(r['dataset'])}",
                      f"      type: {_q(r['dataset'].split(' (')[0])}", "    metrics:", f"    - type: {_q(r['metric'])}",
                      f"      value: {round(float(r['value']), 6)}", f"      name: {_q(r['name'])}"]
    lines.append("---")
    out = lines + ["", f"# {name}", ""]
    notice = random_weights_notice(source)
    if notice:
        out += [f"> **RANDOM WEIGHTS**: {notice}", ""]
    spec, pre = m["spec"], m["preprocessing"]
    labels = m.get("labels") or []
    out += [
        f"A vitdeploy bundle of `{source.get('kind')}:{source.get('name')}`: ONNX graphs ({', '.join(graphs)}) that take raw "
        f"{pre.get('input', 'uint8-nhwc')} {pre.get('channel_order', 'rgb').upper()} pixels and carry their own preprocessing"
        + (", label map" if labels else "") + " and architecture.",
        "",
        "## Identity",
        "",
        f"- weights: {describe_weights(source)}",
        f"- architecture: {spec.get('family', 'vit')}, patch {spec['patch_size'][0]}x{spec['patch_size'][1]}, d={spec['embed_dim']}, "
        f"depth {spec['depth']}, heads {spec['num_heads']}",
        f"- input: {pre.get('input_size') or 'any size the patches tile'}, mean {_floats(pre['mean'])}, std {_floats(pre['std'])}, "
        f"scale {pre.get('scale', '1/255')}, channel order {pre.get('channel_order', 'rgb').upper()}",
        f"- labels: {len(labels)} ({labels[0]!r} … {labels[-1]!r})" if labels else f"- outputs: {', '.join((m.get('graph') or {}).get('outputs') or [])} (features, no labels)",
        f"- exported by vitdeploy {m.get('vitdeploy_version', '?')} on {m.get('created', '?')}; card written {created}",
        "",
        "## Evaluation",
        "",
    ]
    if results:
        out += ["| dataset | metric | value | measured by |", "|---|---|---|---|"]
        out += [f"| {_cell(r['dataset'])} | {r['metric']} | {r['value']:.4f} | {_cell(r['name'])} |" for r in results]
    else:
        out.append(f"Nothing measured yet: run `vitdeploy check {src.bundle.root}` (and `vitdeploy evaluate`), then `vitdeploy report` again.")
    out += ["", "Every number above comes from the bundle's reports (reports/check.json, reports/evaluate.json) for the graphs "
                "whose sha256 the manifest holds now; the full page is reports/index.html.", ""]
    limits = []
    shifted = [r for r in results if " (" in r["dataset"]]
    if shifted:
        worst = min(shifted, key=lambda r: r["value"])
        limits.append(f"Accuracy under shift falls to {worst['value']:.1%} at worst ({worst['dataset']}); see the report's robustness section.")
    if src.occlusion:
        limits.append("Occlusion maps in the report are sensitivities of this graph to the stated occluder, not causal attributions.")
    if limits:
        out += ["## Limitations", ""] + [f"- {line}" for line in limits] + [""]
    return "\n".join(out)
