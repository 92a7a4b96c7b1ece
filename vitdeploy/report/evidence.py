"""The evidence and precision sections: `check` per graph (parity, accuracy, agreement, protocol, the
sha256 each measured, stale when the graph has changed since), and each graph's precision record."""

from __future__ import annotations

from typing import Any

from .html import Markup, el, esc, join, kv, missing, num, ptr, section, short_sha, table
from .sources import Record, Sources

OUTPUTS = ("logits", "embedding", "patch_grid")


def _status(ok: bool | None, stale: bool = False) -> Markup:
    if stale:
        return el("span", "stale", class_="stale", title="measured on a graph that is not the bundle's current one")
    return el("span", "pass", class_="pass") if ok else (el("span", "FAIL", class_="fail") if ok is False else esc("reported"))


def check_section(src: Sources) -> Markup:
    if not src.check:
        return section("evidence", "Evidence: check", missing("check evidence (reports/check.json)", f"vitdeploy check {src.bundle.root}"))
    parts: list[Any] = []
    any_stale, passed = False, True
    for rec in src.check:
        body, stale = _check_record(src, rec)
        any_stale |= stale
        passed &= bool(rec.data.get("passed"))
        parts += body
    status = "stale" if any_stale else ("pass" if passed else "fail")
    return section("evidence", "Evidence: check", *parts, status=status)


def _check_record(src: Sources, rec: Record) -> tuple[list[Any], bool]:
    d = rec.data
    ref = d.get("reference") or {}
    intro = [f"{rec.rel}, written {d.get('created', '?')}: every graph against PyTorch {ref.get('precision', 'fp32')} "
             f"({ref.get('backend', 'torch')}). "]
    for name, acc in (ref.get("accuracy") or {}).items():
        intro += [esc(f"PyTorch accuracy on {name}: "), num(acc, ".2%", ptr(rec.rel, "reference", "accuracy", name)), esc(". ")]
    rows, stale_any = [], False
    for i, art in enumerate(d.get("artifacts") or []):
        precision = art.get("precision")
        if art.get("skipped"):
            rows.append([precision, f"tensorrt {art.get('execution')}", "", "", "", "", "", "", "", el("span", f"skipped: {art['skipped']}", class_="note"), ""])
            continue
        sha = art.get("sha256") or art.get("source_sha256")
        if art.get("backend") == "tensorrt":
            stale = bool(sha) and sha not in src.graph_sha.values()
        else:
            stale = not src.is_current(precision, sha)
        stale_any |= stale
        verdict = _status(art.get("passed") if art.get("gated") else None, stale)
        first = True
        for j, row in enumerate(art.get("sets") or []):
            for name in (n for n in OUTPUTS if n in row):
                s = row[name]
                base = (rec.rel, "artifacts", i, "sets", j, name)
                rows.append([
                    precision if first else "", art.get("execution") if first else "", row.get("set"), name,
                    num(s.get("max_abs"), ".2e", ptr(*base, "max_abs")), num(s.get("cosine_min"), ".6f", ptr(*base, "cosine_min")),
                    num(s.get("top1_agreement"), ".1%", ptr(*base, "top1_agreement")) if name == "logits" else "",
                    num(row.get("accuracy"), ".2%", ptr(rec.rel, "artifacts", i, "sets", j, "accuracy")) if "accuracy" in row and name == "logits" else "",
                    num(row["accuracy_drop"] * 100, "+.2f", None, " pt") if "accuracy_drop" in row and name == "logits" else "",
                    verdict if first else "", short_sha(sha) if first else "",
                ])
                first = False
    out: list[Any] = [el("h3", rec.rel), el("p", join(intro), class_="note"),
                      table(["graph", "execution", "inputs", "output", "max |d|", "worst cosine", "top-1 agreement", "accuracy", "drop",
                             "verdict", "graph sha256 measured"], rows)]
    if stale_any:
        out.append(el("p", "Stale rows measured a graph whose sha256 differs from the manifest's current one: rerun ",
                      el("code", f"vitdeploy check {src.bundle.root}", class_="cmd"), ".", class_="stale"))
    out.append(_protocol(rec))
    failures = d.get("failures") or []
    if failures:
        out.append(el("ul", *(el("li", f) for f in failures), class_="fail"))
    return out, stale_any


def _protocol(rec: Record) -> Markup:
    proto = rec.data.get("protocol") or {}
    rows: list[tuple[str, Any]] = []
    pre = proto.get("preprocessing")
    if pre:
        ok = {True: "ok", False: "FAIL", None: "n/a"}[pre.get("passed")]
        text: list[Any] = [esc(f"{ok}: {pre.get('diagnosis')}")]
        if "max_abs_vs_config" in pre:
            text += [esc(" (max |d| vs the source's config "), num(pre["max_abs_vs_config"], ".2e", ptr(rec.rel, "protocol", "preprocessing", "max_abs_vs_config")), esc(")")]
        rows.append(("preprocessing", join(text)))
    grid = proto.get("patch_grid")
    if grid:
        rows.append(("patch grid", join([esc(f"{'ok' if grid.get('passed') else 'FAIL'}: patchify/unpatchify round trip max |d| "),
                                         num(grid.get("roundtrip_max_abs"), ".1e", ptr(rec.rel, "protocol", "patch_grid", "roundtrip_max_abs"))])))
    lab = proto.get("labels")
    if lab:
        rows.append(("labels", f"{'ok' if lab.get('passed') else 'FAIL'}: {lab.get('count')} labels, head has {lab.get('num_outputs')} outputs"
                     + ("; " + "; ".join(lab["problems"]) if lab.get("problems") else "; order matches the source")))
    return el("div", el("h3", "Protocol diagnoses"), kv(rows)) if rows else esc("")


def check_numbers(src: Sources, precision: str) -> tuple[Record, int, int, dict[str, Any]] | None:
    """The current check row of a graph on its first labelled (else first) set."""
    for rec in src.check:
        for i, art in enumerate(rec.data.get("artifacts") or []):
            if art.get("precision") == precision and art.get("backend") != "tensorrt" and src.is_current(precision, art.get("sha256")):
                sets = art.get("sets") or []
                j = next((k for k, s in enumerate(sets) if "accuracy" in s), 0)
                if sets:
                    return rec, i, j, sets[j]
    return None


def precision_section(src: Sources) -> Markup:
    rows = []
    notes: list[Any] = []
    for precision in src.graph_sha:
        record = src.bundle.artifact_record(precision)
        found = check_numbers(src, precision)
        acc = agr = ""
        if found:
            rec, i, j, row = found
            if "accuracy" in row:
                acc = join([num(row["accuracy"], ".2%", ptr(rec.rel, "artifacts", i, "sets", j, "accuracy")), esc(f" on {row.get('set')}")])
            if "logits" in row:
                agr = num(row["logits"].get("top1_agreement"), ".2%", ptr(rec.rel, "artifacts", i, "sets", j, "logits", "top1_agreement"))
        else:
            acc = el("span", "not checked", class_="note")
        rows.append([precision, record.get("file"), num(record.get("bytes"), ",d", ptr("manifest.json", "artifacts", precision, "bytes")),
                     acc, agr, _kept(record), _recipe(record)])
    if "int8" not in src.graph_sha:
        notes.append(missing("INT8 graph", f"vitdeploy calibrate {src.bundle.root}"))
    if "fp16" not in src.graph_sha:
        notes.append(missing("FP16 graph", f"vitdeploy convert {src.bundle.root} --precision fp16"))
    for rec in src.recipes:
        notes.append(el("p", f"precision recipe: {rec.rel} (vitdeploy debug-precision)", class_="note"))
    return section("precision", "Precision",
                   table(["graph", "file", "bytes", "accuracy (check)", "top-1 agreement with PyTorch", "kept in higher precision", "recipe"], rows),
                   *notes)


def _kept(record: dict[str, Any]) -> str:
    precision = record.get("precision")
    if precision == "fp16":
        parts = [f"op types in fp32: {', '.join(record.get('kept_fp32_op_types') or []) or 'none'}"]
        kept = list(record.get("keep_fp32") or []) + list((record.get("range_pass") or {}).get("kept") or [])
        parts.append(f"{len(kept)} more tensor(s) kept by the range pass or by name" if kept else "nothing else kept")
        if record.get("preprocessing_nodes_fp32"):
            parts.append(f"{record['preprocessing_nodes_fp32']} preprocessing nodes in fp32")
        return "; ".join(parts)
    if precision == "int8":
        placement = record.get("placement") or {}
        ex = record.get("exclusions") or {}
        excluded = [f"{k}: {', '.join(map(str, v))}" for k, v in ex.items() if isinstance(v, list) and v]
        return (f"{placement.get('quantized_layers', '?')} of {placement.get('linear_layers', '?')} linear layers in INT8; "
                f"excluded: {'; '.join(excluded) or 'none'}")
    return "all fp32" if precision in ("fp32", "cpu") else ""


def _recipe(record: dict[str, Any]) -> str:
    if record.get("precision") == "int8":
        cal = record.get("calibration") or {}
        chosen = (record.get("selection") or {}).get("chosen") or {}
        return (f"{record.get('method', chosen.get('method', '?'))} calibration on {cal.get('count', '?')} images of {cal.get('source', '?')}; "
                f"{record.get('weights', '')} weights, {record.get('activations', '')} activations; smoothing {chosen.get('smoothing') or 'none'}")
    if record.get("precision") == "fp16":
        return f"{record.get('converter', 'fp16 pass')} {record.get('converter_version', '')}".strip()
    if record.get("precision") == "cpu":
        return "ONNX Runtime fused attention (convert --target cpu)"
    return "exported"
