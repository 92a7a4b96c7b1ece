"""The engines section: built TensorRT engines (manifest + engine.json fingerprints), dry-run plans
for other TensorRT versions, and the DLA feasibility report. A bundle without any says what to run."""

from __future__ import annotations

from typing import Any

from .html import Markup, command, el, esc, join, kv, missing, num, ptr, section, short_sha, table
from .sources import Record, Sources


def _profiles(profiles: list[dict[str, Any]] | None) -> str:
    out = []
    for p in profiles or []:
        shapes = p.get("shapes") or {}
        if shapes:
            out.append(" / ".join(f"{k} {'x'.join(map(str, v))}" for k, v in shapes.items()))
        else:
            out.append(", ".join(f"{k} {v}" for k, v in p.items()))
    return "; ".join(out) or "–"


def _portability(plan: dict[str, Any]) -> str:
    flags = [f"hardware compatibility {plan.get('hardware_compatibility') or 'none'}",
             "version-compatible" if plan.get("version_compatible") else "this TensorRT version only",
             "weights stripped (refit on the device)" if plan.get("strip_weights") else "weights inside the plan"]
    return ", ".join(flags)


def engines_section(src: Sources) -> Markup:
    root = src.bundle.root
    parts: list[Any] = []
    built = {target: engine.to_dict() for target, engine in src.bundle.engines().items()}
    if built:
        rows = []
        for target, record in built.items():
            fp = src.engines.get(target)
            data = fp.data if fp else {}
            # the manifest's record, completed by the engine's own fingerprint (engine.json) where it says less
            info = {**data, **{k: v for k, v in record.items() if v is not None}}
            device = data.get("device") or {}
            gpu = info.get("gpu_name") or device.get("gpu_name", "?")
            cc = info.get("compute_capability") or device.get("compute_capability", "?")
            jetpack = info.get("jetpack") or device.get("jetpack")
            stale = info.get("source_sha256") not in src.graph_sha.values()
            rows.append([target, info.get("precision"), info.get("tensorrt"),
                         f"{gpu} (compute capability {cc})" + (f", JetPack {jetpack}" if jetpack else ""),
                         _profiles(info.get("profiles")), _portability({**(data.get("plan") or {}), **info}),
                         join([short_sha(info.get("plan_sha256")), esc(" from "), short_sha(info.get("source_sha256"))]),
                         el("span", "stale", class_="stale") if stale else (esc("no engine.json") if fp is None else esc("current")),
                         info.get("built_at", "")])
        parts.append(table(["target", "precision", "TensorRT", "GPU", "profiles (min/opt/max)", "portability", "plan sha256 / graph",
                            "state", "built"], rows, caption="Engines built (manifest.json engines, engines/<target>/engine.json)"))
    else:
        parts.append(el("p", esc("No TensorRT engine in this bundle yet. Build one on the target GPU with "),
                        command(f"vitdeploy build-engine {root} --precision best"), esc(" (or plan it here, without TensorRT: "),
                        command(f"vitdeploy build-engine {root} --precision int8 --dry-run --trt-version 10.3"), esc(")."),
                        class_="missing", id="no-engines"))
    for rec in src.engine_plans:
        parts.append(_plan(rec))
    if src.dla:
        for rec in src.dla:
            parts.append(_dla(rec))
    else:
        parts.append(missing("DLA feasibility report", f"vitdeploy build-engine {root} --precision fp16 --dla-report"))
    return section("engines", "Engines", *parts)


def _plan(rec: Record) -> Markup:
    d = rec.data
    plan, caps = d.get("plan") or {}, d.get("capabilities") or {}
    lint = d.get("parse_lint") or {}
    findings = lint.get("findings") or []
    rows: list[tuple[str, Any]] = [
        ("target", d.get("target") or plan.get("target") or "(any GPU the plan meets)"),
        ("TensorRT", caps.get("version") or plan.get("trt_version")),
        ("graph", join([esc(f"{plan.get('source_precision')} "), short_sha(plan.get("source_sha256"))])),
        ("precision path", f"{plan.get('precision')} via {plan.get('precision_path')}"),
        ("profiles", _profiles(plan.get("profiles"))),
        ("portability", _portability(plan)),
        ("parse lint", f"{len(findings)} node(s) the parser would refuse" if findings else "every node parses"),
        ("trtexec", el("code", " ".join((d.get("trtexec") or {}).get("argv") or []), class_="mono")),
    ]
    return el("div", el("h3", f"Dry-run plan: {rec.rel} (not built; no GPU verified it)"), kv(rows))


def _dla(rec: Record) -> Markup:
    d = rec.data
    rows = [[f.get("rule"), num(f.get("nodes"), "d"), num(f.get("macs_share"), ".1%", ptr(rec.rel, "fallback", i, "macs_share")),
             ", ".join(f.get("ops") or [])] for i, f in enumerate(d.get("fallback") or [])]
    return el("div", el("h3", f"DLA feasibility: {rec.rel}"),
              el("p", join([esc(f"{d.get('precision')} graph at input {d.get('input_shape')}: "),
                            num(d.get("gpu_share"), ".1%", ptr(rec.rel, "gpu_share")),
                            esc(f" of the MACs fall back to the GPU. Rules: {d.get('rules_source')}.")]), class_="note"),
              table(["why not on DLA", "nodes", "share of MACs", "op types"], rows))
