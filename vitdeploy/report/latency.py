"""The latency and throughput section: profile's table and plots beside the cost model, with the
machine, backend and load they were measured under, and where that makes them true."""

from __future__ import annotations

from typing import Any

from .html import Markup, el, image, kv, missing, num, ptr, section, table
from .sources import Sources


def latency_section(src: Sources) -> Markup:
    rec = src.profile
    if rec is None:
        return section("latency", "Latency and throughput",
                       missing("latency profile (reports/profile.json)", f"vitdeploy profile {src.bundle.root} --batch 1,8 --precision fp32,int8"))
    d = rec.data
    machine, config = d.get("machine") or {}, d.get("config") or {}
    load = machine.get("loadavg") or []
    where = machine.get("gpu") or f"CPU {machine.get('cpu', '?')} ({machine.get('cpu_count', '?')} cores, {machine.get('threads', '?')} thread(s) per runner)"
    jetson = machine.get("jetson")
    verified = (f"measured on this machine only: {where}, {machine.get('platform', '?')}. "
                + ("A Jetson run: " + str(jetson) + ". " if jetson else "")
                + ("" if machine.get("gpu") else "No GPU took part: TensorRT and GPU latency are not measured here; "
                   "profile on the target (vitdeploy profile --on HOST) for those numbers."))
    facts = [("machine", where), ("verified where", verified),
             ("backends", ", ".join(config.get("backends") or [])), ("libraries", ", ".join(f"{k} {machine[k]}" for k in ("onnxruntime", "torch", "numpy") if machine.get(k))),
             ("load average (1/5/15 min)", _load(load, machine.get("cpu_count"))),
             ("timing", f"{config.get('iterations') or config.get('duration_s')} timed calls, {config.get('warmup')} warm-up, "
                        f"{config.get('rounds') or 1} round(s); written {d.get('created', '?')}")]
    rows = []
    for i, c in enumerate(d.get("cells") or []):
        if c.get("status") != "ok":
            continue
        base = (rec.rel, "cells", i)
        rows.append([f"{c['backend']}{' ' + c['torch_mode'] if c.get('torch_mode') else ''}", c.get("precision"), c.get("device"),
                     f"{c['height']}x{c['width']}", num(c.get("batch"), "d"), num(c.get("seq_len"), "d"),
                     num(c.get("p50_ms"), ".3f", ptr(*base, "p50_ms")), num(c.get("p90_ms"), ".3f", ptr(*base, "p90_ms")),
                     num(c.get("throughput_ips"), ",.0f", ptr(*base, "throughput_ips")),
                     num((c.get("macs") or 0) / 1e6, ".2f"), num(c.get("attention_share"), ".1%", ptr(*base, "attention_share")),
                     num(c.get("achieved_gflops"), ".1f", ptr(*base, "achieved_gflops")),
                     el("span", f"unstable (CV {c['cv']:.0%})" if c.get("cv") is not None else "unstable", class_="fail", title=c.get("note") or "")
                     if c.get("unstable") else ""])
    skipped = [c for c in d.get("cells") or [] if c.get("status") != "ok"]
    parts: list[Any] = [kv(facts),
                        table(["backend", "precision", "device", "HxW", "batch", "tokens", "p50 ms", "p90 ms", "images/s", "MMACs / call",
                               "attention share", "GFLOP/s", ""], rows,
                              caption="Measured cells (p50/p90 per call) beside the cost model's MACs and attention share for the same shape")]
    if skipped:
        parts.append(el("p", f"{len(skipped)} cell(s) skipped or failed: "
                             + "; ".join(sorted({f"{c['backend']} {c['precision']}: {c.get('note')}" for c in skipped}))[:600], class_="note"))
    for name, alt in (("profile.png", "latency and throughput against the cost model"), ("profile_accuracy.png", "accuracy per resolution")):
        png = src.image(rec.rel.rsplit("/", 1)[0] + "/" + name)
        if png:
            parts.append(image(png, f"{name}: {alt}"))
    return section("latency", "Latency and throughput", *parts)


def _load(load: list[float], cores: int | None) -> Any:
    if not load:
        return "–"
    text = ", ".join(f"{x:.2f}" for x in load) + " (other processes sharing the cores)"
    if cores and load[0] > cores:
        # a busy machine inflates latency and spreads it: say so beside the numbers, not only in the CV column
        return el("span", text + f": more runnable processes than the {cores} cores, so these latencies are upper bounds", class_="fail")
    return text
