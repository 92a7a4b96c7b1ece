"""What `inspect` and `costs` print: the bound metadata of an artifact and the cost model's table."""

from __future__ import annotations

import json
from typing import Any

from .bundle import Bundle
from .costs import CostReport, costs_table
from .console import get_console
from .spec import ViTSpec
from .weights import describe_weights, weights_record


def cost_rows(reports: list[CostReport]) -> list[dict[str, Any]]:
    return [r.to_dict() for r in reports]


def print_costs(spec: ViTSpec, resolutions: list[tuple[int, int]], batch: int, title: str) -> None:
    from rich.table import Table

    reports = costs_table(spec, resolutions, batch)
    table = Table(title=f"{title}: analytic cost (MAC = one multiply-add; FLOPs = 2 x MACs), batch {batch}")
    for col in ("HxW", "grid", "N", "L", "L^2/head", "GMACs", "GFLOPs", "attn share", "attn scores fp32/layer", "params"):
        table.add_column(col, justify="right")
    for r in reports:
        table.add_row(
            f"{r.height}x{r.width}", f"{r.grid[0]}x{r.grid[1]}", str(r.num_patches), str(r.seq_len), str(r.attn_scores_per_head),
            f"{r.macs_total / 1e9:.3f}", f"{r.flops_total / 1e9:.3f}", f"{r.attention_share:.1%}",
            _bytes(r.attn_score_bytes_fp32), f"{r.params / 1e6:.2f}M",
        )
    console = get_console()
    console.print(table)
    console.print(f"attention/MLP crossover: L = (2 + rho) d = {reports[0].crossover_seq_len:g} "
                  f"(d = {spec.embed_dim}, rho = {spec.mlp_ratio:g}); below it projections + MLP dominate the MACs")
    if spec.rel_pos_bias or spec.rotary:
        r = reports[-1]
        console.print(f"position terms ({', '.join(spec.position_kinds)}) are element-wise and not in the MACs: at "
                      f"{r.height}x{r.width}, {r.position_mults_per_layer / 1e6:.3f}M multiplies and "
                      f"{r.position_adds_per_layer / 1e6:.3f}M adds per layer"
                      + (" (relative bias: one add per attention score)" if spec.rel_pos_bias else "")
                      + (" (rotary: q and k of every patch token, x cos + rot(x) sin)" if spec.rotary else ""))
    if spec.extra_terms:  # what the family adds beyond the standard ViT (its adapter's spec.extra_terms)
        r = reports[-1]
        console.print(f"family terms in the MACs ({', '.join(str(t.get('name')) for t in spec.extra_terms)}): "
                      f"{r.macs_extra / 1e9:.3f} GMACs at {r.height}x{r.width}")


def _bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def inspect_report(target: str) -> dict[str, Any]:
    """Everything bound into a bundle or a vitdeploy ONNX file, plus the cost at its resolution."""
    bundle = Bundle.open(target)
    res = bundle.resolution
    size = (res["height"], res["width"])
    report = {
        "path": str(target),
        "manifest": bundle.manifest if bundle.bare_onnx is None else None,
        "metadata": bundle.manifest if bundle.bare_onnx is not None else {k: bundle.manifest.get(k) for k in ("source", "spec", "preprocessing", "labels", "resolution", "graph")},
        "precisions": bundle.precisions(),
        "files": graph_files(bundle),
        "weights": weights_record(bundle.manifest.get("source")),
        "costs": costs_table(bundle.spec, [size], 1)[0].to_dict(),
    }
    if bundle.manifest.get("token_merge"):  # issue 40: the merged graph's own token counts and MACs
        from .costs import merge_costs

        report["token_merge"] = merge_costs(bundle.spec, tuple(bundle.manifest["token_merge"]["schedule"]), *size).to_dict()
    return report


def graph_files(bundle: Bundle) -> dict[str, dict[str, Any]]:
    """Per graph: its file and size, and its external data file and size when it has one."""
    from pathlib import Path

    from .onnx_io import referenced_files

    if bundle.bare_onnx is not None:
        path = Path(bundle.bare_onnx)
        entry: dict[str, Any] = {"file": path.name, "bytes": path.stat().st_size}
        data = [p for p in referenced_files(path) if p.is_file()]
        if data:
            entry["data"] = {"file": data[0].name, "bytes": data[0].stat().st_size}
        return {bundle.graph.get("precision", "fp32"): entry}
    files = {}
    for key, record in bundle.artifacts().items():
        if record.file and (bundle.root / record.file).is_file():
            files[key] = {"file": record.file, "bytes": (bundle.root / record.file).stat().st_size,
                          **({"data": {"file": record.data.file, "bytes": record.data.bytes}} if record.data else {})}
    return files


def print_inspect(report: dict[str, Any]) -> None:
    from rich.markup import escape
    from rich.table import Table

    meta = report["metadata"]
    spec, pre, res, src = meta["spec"], meta["preprocessing"], meta["resolution"], meta["source"]
    table = Table(title=f"vitdeploy artifact: {report['path']}", show_header=False)
    table.add_column("key", style="bold")
    table.add_column("value")
    table.add_row("source", f"{src.get('kind')}:{src.get('name')}" + (f" (checkpoint {src['checkpoint']})" if src.get("checkpoint") else ""))
    weights = report.get("weights") or weights_record(src)
    table.add_row("weights", ("[bold red]" + escape(weights["notice"]) + "[/]") if weights.get("notice")
                  else escape(describe_weights(src, with_sha256=False)))
    table.add_row("weights sha256", str(src.get("weights_sha256")))
    table.add_row("architecture", f"{ViTSpec.from_dict(spec).architecture}: patch {spec['patch_size'][0]}x{spec['patch_size'][1]}, d={spec['embed_dim']}, "
                  f"depth {spec['depth']}, heads {spec['num_heads']}, mlp ratio {spec['mlp_ratio']:g}, "
                  f"prefix tokens {spec.get('num_prefix_tokens')}, readout {spec['global_pool']}")
    table.add_row("resolution", f"{res['mode']} {res['height']}x{res['width']} (native {res['native'][0]}x{res['native'][1]})")
    table.add_row("position", position_line(spec, res))
    table.add_row("input", f"{pre['input']} {pre['channel_order'].upper()}, size {pre['input_size'] or 'any valid H/W'}"
                  + (f", resized in graph to {pre['in_graph_resize']['to']}" if pre.get("in_graph_resize") else ""))
    table.add_row("preprocessing", f"x = (p * {pre['scale']} - mean) / std; mean {_fmt(pre['mean'])}, std {_fmt(pre['std'])} (from {pre.get('config_source')})")
    table.add_row("host resize", json.dumps(pre.get("host_resize")))
    labels = meta.get("labels") or []
    table.add_row("labels", f"{len(labels)}: {', '.join(labels[:10])}{' …' if len(labels) > 10 else ''}")
    table.add_row("graphs", ", ".join(report["precisions"]))
    for key, entry in (report.get("files") or {}).items():
        data = entry.get("data")
        table.add_row(f"  {key} files", f"{entry['file']} {_bytes(entry['bytes'])}"
                      + (f" + {data['file']} {_bytes(data['bytes'])} (external data)" if data else " (weights inside)"))
    from rich.markup import escape

    for name, line in output_lines(meta.get("graph") or {}):
        table.add_row(f"output {name}", escape(line))  # shapes like [batch, d] are not markup
    c = report["costs"]
    table.add_row("cost", f"N={c['num_patches']}, L={c['seq_len']}, {c['macs_total'] / 1e9:.3f} GMACs ({c['flops_total'] / 1e9:.3f} GFLOPs), "
                  f"attention {c['attention_share']:.1%}, params {c['params'] / 1e6:.2f}M" + _position_cost(c))
    if report.get("token_merge"):
        table.add_row("token merging", merge_line(report["token_merge"]))
    get_console().print(table)


def merge_line(m: dict[str, Any]) -> str:
    """The merge schedule, the tokens entering each block and the MACs it saves (vitdeploy.costs.merge_costs)."""
    schedule = m["schedule"]
    r = f"r={schedule[0]} per block" if len(set(schedule)) == 1 else f"r={','.join(map(str, schedule))}"
    return (f"{r}; tokens per block {','.join(map(str, m['tokens_per_block']))}; {m['macs_total'] / 1e9:.3f} GMACs of "
            f"{m['macs_unmerged'] / 1e9:.3f} unmerged (saves {m['macs_saved'] / m['macs_unmerged']:.1%}; the merge itself "
            f"{m['macs_merge'] / 1e9:.4f} GMACs); cost-model speed-up {m['predicted_speedup']:.2f}x")


def print_merge_costs(spec: ViTSpec, schedules: list[tuple[int, ...]], height: int, width: int, batch: int) -> None:
    """`costs --merge-tokens`: tokens per block and MACs of each schedule against the unmerged model."""
    from rich.table import Table

    from .costs import merge_costs

    table = Table(title=f"token merging at {height}x{width}, batch {batch} (ToMe; MACs include the merge itself)")
    for col in ("r per block", "tokens per block (in -> out)", "GMACs", "merge GMACs", "saved", "predicted speed-up"):
        table.add_column(col, justify="right")
    for schedule in schedules:
        m = merge_costs(spec, schedule, height, width, batch)
        table.add_row(",".join(map(str, schedule)) if len(set(schedule)) > 1 else str(schedule[0]),
                      " ".join(map(str, m.tokens_per_block)), f"{m.macs_total / 1e9:.3f}", f"{m.macs_merge / 1e9:.4f}",
                      f"{m.macs_saved / m.macs_unmerged:.1%}", f"{m.predicted_speedup:.2f}x")
    get_console().print(table)


def output_lines(graph: dict[str, Any]) -> list[tuple[str, str]]:
    """One line per graph output: shape and meaning (read-out, norm, grid order, dropped tokens)."""
    details = graph.get("output_details") or {}
    lines = []
    for name in graph.get("outputs") or ["logits", "probs"]:
        d = details.get(name)
        if not d:
            lines.append((name, "(no description: exported by an older vitdeploy)"))
            continue
        text = f"[{', '.join(str(x) for x in d['shape'])}] {d['meaning']}"
        if name == "embedding":
            text += (f"; read-out {d['readout']}, final norm {d['final_norm'] or 'none'} ({d['final_norm_where']}), "
                     f"L2-normalised {'yes' if d['l2_normalized'] else 'no'}")
        elif name == "patch_grid":
            dropped = ", ".join(f"{k} {v}" for k, v in d["dropped_tokens"].items() if v) or "none"
            text += (f"; {d['order']}; dropped tokens: {dropped}; final norm {d['final_norm'] or 'none'}"
                     + (f" ({d['note']})" if d.get("note") else ""))
        if d.get("reference"):
            text += f"; PyTorch reference: {d['reference']}"
        lines.append((name, text))
    return lines


def _position_cost(c: dict[str, Any]) -> str:
    """Relative-bias adds and rotary multiplies: element-wise, so outside the MACs but stated."""
    mults, adds = c.get("position_mults_per_layer", 0), c.get("position_adds_per_layer", 0)
    if not (mults or adds):
        return ""
    return f"; position terms per layer (not in the MACs): {mults / 1e6:.3f}M multiplies, {adds / 1e6:.3f}M adds"


def position_line(spec: dict[str, Any], res: dict[str, Any]) -> str:
    """What carries position (absolute table / relative bias table / rotary), each with the rule that
    adapts it to another grid, and where that happens (baked for a static size, in-graph for dynamic)."""
    parsed = ViTSpec.from_dict(spec)
    rules = parsed.position_rules((res.get("pos_embed_interpolation") or {}).get("description"))
    if res.get("mode") == "dynamic":
        where = "recomputed in-graph for each input grid"
        if parsed.max_grid:
            where += f" up to {parsed.max_grid[0]}x{parsed.max_grid[1]} patches"
    else:
        where = f"baked for {res['height']}x{res['width']}"
    return "; ".join(rules) + f" ({where})"


def _fmt(values: list[float]) -> str:
    return "[" + ", ".join(f"{v:.4g}" for v in values) + "]"
