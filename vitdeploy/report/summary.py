"""The page's first screen: one card per section with its headline numbers (each still naming its
JSON source), so the top of the page answers "can this ship?" before the detail below."""

from __future__ import annotations

from typing import Any

from ..costs import vit_costs
from ..records import ArtifactRecord, WeightsIdentity
from ..weights import is_random
from .html import Markup, el, esc, join, num, ptr
from .sources import Sources


def _card(anchor: str, title: str, lines: list[Any], state: str | None = None) -> Markup:
    head = el("h3", el("a", title, href=f"#{anchor}"), esc(" ") if state else None,
              el("span", state, class_="badge " + {"pass": "pass", "none": "none"}.get(state or "", "fail")) if state else None)
    return el("div", head, el("ul", *(el("li", line) for line in lines if line is not None)), class_="card")


def summary(src: Sources) -> Markup:
    cards = [_identity(src), _contract(src), _cost(src), _evidence(src), _precision(src), _robustness(src), _latency(src), _engines(src)]
    return el("div", *cards, class_="cards", id="summary")


def _identity(src: Sources) -> Markup:
    source = src.bundle.manifest.get("source") or {}
    weights = WeightsIdentity.of_source(source)
    sha = weights.sha256
    where = weights.repo_id and f"{weights.repo_id}@{(weights.revision or '?')[:12]}"
    return _card("identity", "Identity", [
        f"{source.get('kind')}:{source.get('name')}",
        el("span", "RANDOM weights", class_="fail") if is_random(source) else (where or f"weights {weights.file or weights.origin or '?'}"),
        join([esc("sha256 "), el("span", (sha or "–")[:16], class_="sha")]),
    ], "random" if is_random(source) else None)


def _contract(src: Sources) -> Markup:
    m = src.bundle.manifest
    pre, graph = m["preprocessing"], m.get("graph") or {}
    size = pre.get("input_size")
    labels = m.get("labels") or []
    return _card("contract", "Input contract", [
        f"{pre.get('input', 'uint8-nhwc')} {pre.get('channel_order', 'rgb').upper()}" + (f", {size[0]}x{size[1]}" if size else ", any size"),
        f"mean {', '.join(f'{v:.3f}' for v in pre['mean'])}; std {', '.join(f'{v:.3f}' for v in pre['std'])}",
        f"{len(labels)} labels, {labels[0]!r} … {labels[-1]!r}" if labels else f"features: {', '.join(graph.get('outputs') or [])} (no labels)",
    ])


def _cost(src: Sources) -> Markup:
    h, w = src.native()
    c = vit_costs(src.bundle.spec, h, w, 1)
    key = f"cost-model:{h}x{w}#"
    return _card("cost", "Cost model", [
        f"native {h}x{w}: {c.grid[0]}x{c.grid[1]} patches",
        join([num(c.macs_total / 1e9, ".4f", key + "gmacs"), esc(" GMACs / image, "), num(c.seq_len, "d", key + "seq_len"), esc(" tokens")]),
        join([esc("attention "), num(c.attention_share, ".1%", key + "attention_share"), esc(" of the MACs")]),
    ])


def _evidence(src: Sources) -> Markup:
    if not src.check:
        return _card("evidence", "Evidence", [f"not checked: vitdeploy check {src.bundle.root}"], "none")
    rec = src.check[0]
    arts = [a for a in rec.data.get("artifacts") or [] if not a.get("skipped")]
    stale = [a["precision"] for a in arts if a.get("backend") != "tensorrt" and not src.is_current(a.get("precision"), a.get("sha256"))]
    lines: list[Any] = [f"{len(arts)} graph run(s) against PyTorch" + (f"; stale: {', '.join(sorted(set(stale)))}" if stale else "")]
    for name, acc in (rec.data.get("reference", {}).get("accuracy") or {}).items():
        lines.append(join([esc(f"PyTorch on {name}: "), num(acc, ".2%", ptr(rec.rel, "reference", "accuracy", name))]))
    proto = rec.data.get("protocol") or {}
    lines.append(f"protocol: {'ok' if proto.get('passed') else 'FAIL'} (preprocessing, patch grid, labels)")
    state = "stale" if stale else ("pass" if rec.data.get("passed") else "fail")
    return _card("evidence", "Evidence", lines, state)


def _precision(src: Sources) -> Markup:
    from .evidence import check_numbers

    lines: list[Any] = []
    for precision in src.graph_sha:
        size = (src.bundle.artifact(precision) or ArtifactRecord()).bytes or 0
        found = check_numbers(src, precision)
        acc: Any = esc("not checked")
        if found and "accuracy" in found[3]:
            rec, i, j, row = found
            acc = num(row["accuracy"], ".2%", ptr(rec.rel, "artifacts", i, "sets", j, "accuracy"))
        lines.append(join([esc(f"{precision}: {size / 1024:.0f} KiB, "), acc]))
    return _card("precision", "Precision", lines)


def _robustness(src: Sources) -> Markup:
    ev = src.evaluate
    if ev is None:
        return _card("robustness", "Robustness", [f"not evaluated: vitdeploy evaluate {src.bundle.root}"], "none")
    results = ev.data.get("results") or {}
    scorer = next(iter(results), None)
    lines: list[Any] = [f"{(ev.data.get('data') or {}).get('count')} images of {(ev.data.get('data') or {}).get('source')}"]
    if scorer:
        res = results[scorer]
        if "clean" in res:
            lines.append(join([esc(f"{scorer} clean "), num(res["clean"]["accuracy"], ".1%", ptr(ev.rel, "results", scorer, "clean", "accuracy"))]))
        worst = min((c for c in res if c != "clean"), key=lambda c: res[c]["accuracy"], default=None)
        if worst:
            lines.append(join([esc(f"worst: {worst} "), num(res[worst]["accuracy"], ".1%", ptr(ev.rel, "results", scorer, worst, "accuracy"))]))
    flags = len(ev.data.get("flags") or [])
    lines.append(f"{flags} flag(s)" + (f"; occlusion map of {src.occlusion[0].data.get('count')} images" if src.occlusion else ""))
    return _card("robustness", "Robustness", lines, "flagged" if flags else None)


def _latency(src: Sources) -> Markup:
    rec = src.profile
    if rec is None:
        return _card("latency", "Latency", [f"not profiled: vitdeploy profile {src.bundle.root}"], "none")
    cells = [(i, c) for i, c in enumerate(rec.data.get("cells") or []) if c.get("status") == "ok"]
    machine = rec.data.get("machine") or {}
    load = machine.get("loadavg") or []
    busy = bool(load and machine.get("cpu_count") and load[0] > machine["cpu_count"])
    lines: list[Any] = [f"on {machine.get('gpu') or 'CPU ' + str(machine.get('cpu', '?'))}, load {', '.join(f'{x:.1f}' for x in load)}"
                        + (" (busy: upper bounds)" if busy else "")]
    native = src.native()
    at_native = [(i, c) for i, c in cells if (c["height"], c["width"]) == native and c["batch"] == 1] or cells
    if at_native:
        i, c = min(at_native, key=lambda ic: ic[1]["p50_ms"])
        lines.append(join([esc(f"fastest at {c['height']}x{c['width']} b{c['batch']}: {c['backend']} {c['precision']} "),
                           num(c["p50_ms"], ".3f", ptr(rec.rel, "cells", i, "p50_ms")), esc(" ms p50")]))
        i, c = max(cells, key=lambda ic: ic[1].get("throughput_ips") or 0)
        lines.append(join([esc("peak "), num(c["throughput_ips"], ",.0f", ptr(rec.rel, "cells", i, "throughput_ips")),
                           esc(f" images/s ({c['backend']} {c['precision']} {c['height']}x{c['width']} b{c['batch']})")]))
    return _card("latency", "Latency", lines)


def _engines(src: Sources) -> Markup:
    built = {target: engine.to_dict() for target, engine in src.bundle.engines().items()}
    lines: list[Any] = []
    if built:
        for target, record in built.items():
            fp = src.engines.get(target)
            data = fp.data if fp else {}
            info = {**(data.get("device") or {}), **data, **{k: v for k, v in record.items() if v is not None}}
            lines.append(f"{target}: TensorRT {info.get('tensorrt')} on {info.get('gpu_name')} (compute capability {info.get('compute_capability')})")
    else:
        lines.append(f"none built: vitdeploy build-engine {src.bundle.root}")
    if src.engine_plans:
        versions = ", ".join(str((p.data.get("capabilities") or {}).get("version")) for p in src.engine_plans)
        lines.append(f"{len(src.engine_plans)} dry-run plan(s): TensorRT {versions}")
    for rec in src.dla[:1]:
        lines.append(join([esc(f"DLA ({rec.data.get('precision')}): "), num(rec.data.get("gpu_share"), ".1%", ptr(rec.rel, "gpu_share")),
                           esc(" of MACs on the GPU")]))
    return _card("engines", "Engines", lines, None if built else "none")
