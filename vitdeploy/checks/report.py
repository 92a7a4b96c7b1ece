"""The check report on the terminal."""

from __future__ import annotations

from typing import Any

from ..console import get_console


def print_report(report: dict[str, Any]) -> None:
    from rich.table import Table

    console = get_console()
    for line in _canvas_lines(report):
        console.print(line, markup=False, highlight=False)
    table = Table(title=f"vitdeploy check: {report['bundle']}")
    for col in ("graph", "execution", "inputs", "output", "max |d|", "max rel", "worst cos", "cos p1", "top-1 agr", "top-5 agr", "accuracy", "drop", "verdict"):
        table.add_column(col, justify="right" if col not in ("graph", "execution", "inputs", "output", "verdict") else "left")
    for ref_set, acc in report["reference"]["accuracy"].items():
        table.add_row("PyTorch fp32", "reference", ref_set, "", "", "", "", "", "", "", f"{acc:.2%}", "", "")
    for art in report["artifacts"]:
        if art.get("skipped"):
            table.add_row(art["precision"], f"tensorrt {art['execution']}", "", "", "", "", "", "", "", "", "", "", f"skipped: {art['skipped']}")
            continue
        verdict = "pass" if art["passed"] else ("FAIL" if art["gated"] else "reported (not gated)")
        first = True
        for row in art["sets"]:
            # logits, then the feature outputs the graph declares (embedding, patch_grid); probs where they are gated (canvas rows)
            shown = ("logits", "probs") if "what" in row else ("logits", "embedding", "patch_grid")
            for j, name in enumerate(n for n in shown if n in row):
                s = row[name]
                table.add_row(
                    art["precision"] if first else "", art["execution"] if first else "", row["set"] if j == 0 else "", name,
                    f"{s['max_abs']:.2e}", f"{s['max_rel']:.2e}", f"{s['cosine_min']:.6f}", f"{s['cosine_p1']:.6f}",
                    f"{s['top1_agreement']:.1%}" if name == "logits" else "", f"{s['top5_agreement']:.1%}" if name == "logits" else "",
                    f"{row['accuracy']:.2%}" if "accuracy" in row and name == "logits" else "",
                    f"{row['accuracy_drop'] * 100:+.2f} pt" if "accuracy_drop" in row and name == "logits" else "", verdict if first else "",
                )
                first = False
    console.print(table)
    for art in report["artifacts"]:
        if art.get("edge"):
            console.print(f"edge valid_hw rows ({art['precision']} / {art['execution']}): {art['edge']['rows']} rows, "
                          f"{art['edge']['nonfinite']} non-finite output values", markup=False, highlight=False)
    proto = report["protocol"]
    pre = proto.get("preprocessing", {})
    console.print(f"protocol - preprocessing: {'ok' if pre.get('passed') else ('n/a' if pre.get('passed') is None else 'FAIL')}: "
                  f"{pre.get('diagnosis')}" + (f" (max |d| vs config {pre['max_abs_vs_config']:.2e})" if "max_abs_vs_config" in pre else ""))
    grid = proto.get("patch_grid")
    if grid:
        console.print(f"protocol - patch grid: {'ok' if grid['passed'] else 'FAIL'}: patchify/unpatchify round trip max |d| "
                      f"{grid['roundtrip_max_abs']:.1e}; tokens vs patchify+linear rel {grid.get('tokens_vs_linear_rel', float('nan')):.1e}")
    lab = proto["labels"]
    if lab.get("skipped"):
        console.print(f"protocol - labels: skipped: {lab['skipped']}", markup=False, highlight=False)
    else:
        console.print(f"protocol - labels: {'ok' if lab['passed'] else 'FAIL'}: {lab['count']} labels, head has {lab['num_outputs']} outputs"
                      + ("; " + "; ".join(lab["problems"]) if lab["problems"] else "; order matches the source"))
    for art in report["artifacts"]:
        loc = art.get("localisation")
        if loc and loc.get("available"):
            worst = ", ".join(f"{r['module']} {r['cosine_min']:.5f}" for r in loc["modules"] if r.get("cosine_min") is not None)
            console.print(f"localisation ({art['precision']}): first divergence: {loc['first_divergence'] or 'none'} "
                          f"(cosine < {loc['cosine_limit']}); per module: {worst}")
        elif loc:
            console.print(f"localisation ({art['precision']}): {loc['reason']}")
    if report["passed"]:
        console.print("[bold green]PASS[/]: every gated artifact matches PyTorch and the protocol checks hold")
    else:
        console.print("[bold red]FAIL[/]:")
        for failure in report["failures"]:
            console.print(f"  - {failure}")


def _canvas_lines(report: dict[str, Any]) -> list[str]:
    """What a variable-size report says before its table: the canvas, the rule, what the sets hold."""
    if report.get("kind") != "variable-size":
        return []
    numbers, task = report["numbers"], report["task"]
    lines = [f"vitdeploy check (variable size, canvas {report['canvas'][0]}x{report['canvas'][1]}): {report['bundle']}",
             f"  rule: {report['rule']}",
             f"  numbers: {len(numbers['sizes'])} random images of mixed sizes padded into one batch, each row vs the image alone "
             "(PyTorch at its own size); edge valid_hw rows: one patch, the full canvas, values the graph clamps"]
    if task:
        lines.append(f"  task: {task['data']['count']} images of {task['data']['source']} at {task['distinct_sizes']} sizes "
                     f"(policy {task['policy']}), PyTorch alone {task['reference_accuracy']:.2%}")
    return lines
