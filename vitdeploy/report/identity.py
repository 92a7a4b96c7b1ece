"""The first three sections: who the model is (source, weights, versions), what it takes (the input
contract bound into the graph), and what it costs (the analytic cost model, vitdeploy.costs)."""

from __future__ import annotations

from typing import Any

from .. import __version__
from ..costs import costs_table
from ..describe import output_lines, position_line
from ..records import WeightsIdentity
from ..weights import describe_weights, is_random, random_weights_notice
from .html import Markup, el, esc, join, kv, num, section
from .sources import Sources

SHA_SPAN = "sha"


def weights_banner(src: Sources) -> Markup | None:
    notice = random_weights_notice(src.bundle.manifest.get("source"))
    return el("div", "RANDOM WEIGHTS: " + notice, class_="banner", id="random-weights", role="alert") if notice else None


def _sha(value: Any) -> Markup:
    return el("span", value or "–", class_=SHA_SPAN)


def identity_section(src: Sources, created: str) -> Markup:
    m = src.bundle.manifest
    source = m.get("source") or {}
    weights = WeightsIdentity.of_source(source)
    rows: list[tuple[str, Any]] = [("source", f"{source.get('kind')}:{source.get('name')}")]
    if is_random(source):
        rows.append(("weights", el("span", describe_weights(source), class_="fail")))
    else:
        rows.append(("weights", describe_weights(source, with_sha256=False)))
    if weights.repo_id:
        rows.append(("hub repository", f"{weights.repo_id}@{weights.revision or '(no commit recorded)'}"))
    if weights.file:
        rows.append(("weights file", weights.file))
    rows.append(("weights sha256", _sha(weights.sha256)))
    spec = m["spec"]
    rows.append(("architecture", f"{spec.get('family', 'vit')}: patch {spec['patch_size'][0]}x{spec['patch_size'][1]}, d={spec['embed_dim']}, "
                 f"depth {spec['depth']}, heads {spec['num_heads']}, MLP ratio {spec.get('mlp_ratio', 4.0):g}, "
                 f"{spec.get('num_prefix_tokens', 1)} prefix token(s), read-out {spec.get('global_pool')}"))
    files = []
    for precision, sha in src.graph_sha.items():
        record = src.bundle.artifact(precision)
        files.append(el("tr", el("td", precision), el("td", record.file),
                        el("td", num(record.bytes, ",d", f"manifest.json#/artifacts/{precision}/bytes")), el("td", _sha(sha))))
    graphs = el("table", el("thead", el("tr", *(el("th", h, scope="col") for h in ("graph", "file", "bytes", "sha256 (verified now)")))),
                el("tbody", *files))
    graph = m.get("graph") or {}
    versions = [f"exported by vitdeploy {m.get('vitdeploy_version', '?')}"]
    if graph.get("torch_version"):
        versions.append(f"torch {graph['torch_version']} ({graph.get('exporter', 'exporter not recorded')}, opset {graph.get('opset', '?')})")
    if graph.get("simplify_applied"):
        versions.append(f"{graph.get('simplify_simplifier')} {graph.get('simplify_version')}")
    for check in src.check[:1]:
        v = check.data.get("versions") or {}
        versions.append("checked with " + ", ".join(f"{k} {v[k]}" for k in ("onnxruntime", "torch", "numpy", "python") if k in v))
    versions.append(f"this report: vitdeploy {__version__}")
    rows += [("versions", "; ".join(versions)), ("exported", m.get("created", "–")), ("report written", created)]
    return section("identity", "Identity", kv(rows), el("h3", "Graphs"), graphs)


def contract_section(src: Sources) -> Markup:
    m = src.bundle.manifest
    pre, res, graph = m["preprocessing"], m["resolution"], m.get("graph") or {}
    inp = graph.get("input") or {}
    size = pre.get("input_size")
    rows: list[tuple[str, Any]] = [
        ("raw pixels in", f"{inp.get('name', 'images')}: {inp.get('dtype', 'uint8')} {inp.get('layout', 'NHWC')}, "
                          f"{pre.get('channel_order', 'rgb').upper()} channel order, "
                          + (f"{size[0]}x{size[1]} pixels" if size else "any size the patches tile")),
        ("normalisation (in the graph)", join([f"x = (p x {pre.get('scale', '1/255')} - mean) / std; mean ",
                                                _triple(pre["mean"], "mean"), esc(", std "), _triple(pre["std"], "std")])),
        ("resize rule", _resize_rule(pre)),
        ("resolution", f"{res['mode']} {res.get('height')}x{res.get('width')} (native {src.native()[0]}x{src.native()[1]})"),
        ("positions", position_line(m["spec"], res)),
    ]
    if pre.get("variable_size"):
        rows.append(("variable size", ", ".join(f"{k}: {v}" for k, v in pre["variable_size"].items() if not isinstance(v, (dict, list)))))
    for name, line in output_lines(graph):
        rows.append((f"output {name}", line))
    labels = m.get("labels") or []
    if labels:
        rows.append(("labels", join([num(len(labels), "d"), esc(f" classes, first {labels[0]!r}, last {labels[-1]!r} (labels.txt, index order)")])))
    else:
        rows.append(("labels", "none: the graph outputs features (" + ", ".join(graph.get("outputs") or []) + "), not classes"))
    if pre.get("config_source"):
        rows.append(("taken from", pre["config_source"]))
    return section("contract", "Input contract", kv(rows))


def _triple(values: list[float], key: str) -> Markup:
    return join([esc("["), join([num(v, ".4f", f"manifest.json#/preprocessing/{key}/{i}") for i, v in enumerate(values)], ", "), esc("]")])


def _resize_rule(pre: dict[str, Any]) -> str:
    parts = []
    host = pre.get("host_resize")
    if host:
        parts.append("on the host before the graph: " + ", ".join(f"{k} {v}" for k, v in host.items() if not isinstance(v, (dict, list))))
    graph = pre.get("in_graph_resize")
    if graph:
        parts.append("inside the graph: " + ", ".join(f"{k} {v}" for k, v in graph.items() if not isinstance(v, (dict, list))))
    return "; ".join(parts) or "none: the caller feeds the graph's size"


def cost_sizes(src: Sources) -> list[tuple[int, int]]:
    """The native size, and every size that profile or evaluate measured (so latency sits beside its cost)."""
    sizes = [src.native()]
    if src.profile:
        sizes += [(c["height"], c["width"]) for c in src.profile.data.get("cells", []) if c.get("height") and c.get("width")]
    if src.evaluate:
        sizes += [(r["height"], r["width"]) for r in (src.evaluate.data.get("resolution") or {}).get("rows", [])]
    out = []
    for h, w in sizes:
        if (h, w) not in out:
            out.append((int(h), int(w)))
    return sorted(out)


def cost_section(src: Sources) -> Markup:
    spec = src.bundle.spec
    rows = []
    for c in costs_table(spec, cost_sizes(src), 1):
        key = f"cost-model:{c.height}x{c.width}#"
        rows.append([f"{c.height}x{c.width}", f"{c.grid[0]}x{c.grid[1]}", num(c.seq_len, "d", key + "seq_len"),
                     num(c.macs_total / 1e9, ".4f", key + "gmacs"), num(c.attention_share, ".1%", key + "attention_share"),
                     num(c.params / 1e6, ".3f", key + "mparams")])
    from .html import table

    return section("cost", "Cost model",
                   table(["input HxW", "patch grid", "tokens L", "GMACs / image", "attention share", "params (M)"], rows),
                   el("p", f"Analytic count (vitdeploy.costs, `vitdeploy costs`): MACs of the patch embedding, every block's projections, "
                           f"MLP and the two attention matmuls, and the head, batch 1. Attention's share grows with L; it equals "
                           f"projection + MLP at L = (2 + MLP ratio) d = {costs_table(spec, [tuple(spec.image_size)], 1)[0].crossover_seq_len:.0f} tokens.",
                      class_="note"))
