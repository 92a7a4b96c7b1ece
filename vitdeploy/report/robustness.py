"""The robustness section: evaluate's shift suite (accuracy with 95% intervals, agreement with the
reference), per class and per object size, and the occlusion maps with what they do not show."""

from __future__ import annotations

from typing import Any

from .html import Markup, el, esc, image, join, missing, num, pct_interval, ptr, section, table, void
from .sources import Record, Sources

OCCLUSION_CAVEAT = ("An occlusion map is a sensitivity, not causality: it shows how this graph's probability for the target "
                    "class falls when this occluder covers each region. The occluder itself is an input the model never "
                    "saw in training, so the map describes the response to this occluder and rule (stated above), not "
                    "which pixels caused the decision.")


def robustness_section(src: Sources) -> Markup:
    root = src.bundle.root
    labelled = bool(src.bundle.labels)
    if src.evaluate is None and not src.occlusion:
        cmd = (f"vitdeploy evaluate {root} --suite jpeg,occlusion,background-solid" if labelled
               else f"vitdeploy evaluate {root} --data DIR  (labelled images; this bundle outputs features, so agreement is what is measured)")
        return section("robustness", "Robustness", missing("evaluation under shift (reports/evaluate.json)", cmd))
    parts: list[Any] = []
    if src.evaluate is not None:
        parts += _evaluate(src, src.evaluate)
    else:
        parts.append(missing("shift-suite evaluation (reports/evaluate.json)", f"vitdeploy evaluate {root} --suite jpeg,occlusion,background-solid"))
    if src.occlusion:
        for rec in src.occlusion:
            parts += _occlusion(src, rec)
    else:
        parts.append(missing("occlusion map", f"vitdeploy evaluate {root} --occlusion-map DATA --limit 16"))
    return section("robustness", "Robustness", *parts)


def _evaluate(src: Sources, rec: Record) -> list[Any]:
    d = rec.data
    data, ref = d.get("data") or {}, d.get("reference") or {}
    stale = [p for p, sha in ((d.get("bundle") or {}).get("graphs") or {}).items() if not src.is_current(p, sha)]
    out: list[Any] = [el("p", f"{rec.rel}, written {d.get('created', '?')}: {data.get('count', '?')} images of {data.get('source', '?')}"
                              f"; agreement is top-1 agreement with {ref.get('agreement_with') or 'no reference'}"
                              + ("" if ref.get("available", True) else f" ({ref.get('note')})")
                              + ". Intervals: 95% Wilson.", class_="note")]
    if stale:
        out.append(el("p", f"stale: the {', '.join(stale)} graph(s) changed since this evaluation; rerun vitdeploy evaluate", class_="stale"))
    results = d.get("results") or {}
    n_images = data.get("count", "?")
    conds = [c for c in d.get("conditions") or [] if any(c["id"] in r for r in results.values())]
    scorers = list(results)
    rows = []
    for c in conds:
        cells: list[Any] = [c["id"]]
        for scorer in scorers:
            r = results[scorer].get(c["id"])
            if r is None:
                cells.append("")
                continue
            base = (rec.rel, "results", scorer, c["id"])
            extra: list[Any] = []
            if r.get("drop_pt"):
                extra.append(esc(f"drop {r['drop_pt']:.1f} pt"))
            if r.get("agreement") is not None:
                extra.append(join([esc("agreement "), num(r["agreement"], ".1%", ptr(*base, "agreement"))]))
            if r.get("flag"):
                extra.append(el("span", "flag", class_="fail", title=str(r["flag"])))
            cells.append(join([num(r.get("accuracy"), ".1%", ptr(*base, "accuracy")), esc(" "), pct_interval(r.get("ci95"), ptr(*base, "ci95")),
                               void("br") if extra else None, el("span", join(extra, " · "), class_="note") if extra else None]))
        rows.append(cells)
    out.append(table(["condition"] + [f"{s} accuracy [95% CI]" for s in scorers], rows,
                     caption=f"Shift suite on {n_images} images: accuracy, drop from clean, top-1 agreement; each condition's rule is in "
                             "evaluate.json (transforms)"))
    for row in (d.get("resolution") or {}).get("rows", []):
        out.append(el("p", f"resolution {row['height']}x{row['width']} ({row['runner']}): accuracy {row['accuracy']:.1%}", class_="note"))
    flags = d.get("flags") or []
    if flags:
        out.append(el("ul", *(el("li", f) for f in flags[:12]), class_="fail"))
    out += _strata(rec, results)
    for name, alt in (("evaluate.png", "accuracy against severity per transform, 95% bands"),
                      ("evaluate_classes.png", "accuracy per class and condition (first graph)")):
        png = src.image(rec.rel.rsplit("/", 1)[0] + "/" + name)
        if png:
            out.append(image(png, f"{name}: {alt}"))
    return out


def _strata(rec: Record, results: dict[str, Any]) -> list[Any]:
    """Per class and per object size on the clean images, one column per graph."""
    out: list[Any] = []
    scorers = [s for s, r in results.items() if "clean" in r]
    for kind, title in (("per_class", "Per class (clean)"), ("per_size", "Per object size (clean; size = foreground fraction)")):
        names = list(dict.fromkeys(n for s in scorers for n in (results[s]["clean"].get(kind) or {})))
        if not names:
            continue
        rows = []
        for name in names:
            cells: list[Any] = [name]
            for s in scorers:
                cell = (results[s]["clean"].get(kind) or {}).get(name)
                if cell is None:
                    cells.append("")
                    continue
                base = (rec.rel, "results", s, "clean", kind, name)
                cells.append(join([num(cell["accuracy"], ".1%", ptr(*base, "accuracy")), esc(f" ({cell['correct']}/{cell['n']}) "),
                                   pct_interval(cell.get("ci95"), ptr(*base, "ci95"))]))
            rows.append(cells)
        out += [el("h3", title), table([kind[4:]] + scorers, rows)]
    return out


def _occlusion(src: Sources, rec: Record) -> list[Any]:
    d = rec.data
    folder = rec.rel.rsplit("/", 1)[0]
    out: list[Any] = [el("h3", f"Occlusion map ({rec.rel})"),
                      el("p", f"{d.get('count')} images of {d.get('source')}, {d.get('precision')} graph {d.get('graph')}. Rule: {d.get('rule')}. "
                              f"Compared: {d.get('compared')}.", class_="note")]
    share = d.get("foreground_above_background")
    if share is not None:
        out.append(el("p", join([esc("Mean sensitivity on the foreground exceeds the background's on "),
                                 num(share, ".1%", ptr(rec.rel, "foreground_above_background")),
                                 esc(f" of {d.get('images_with_separable_background')} images with a separable background.")])))
    overlay = (d.get("files") or {}).get("overlay")
    png = src.image(f"{folder}/{overlay}") if overlay else None
    if png:
        out.append(image(png, f"{overlay}: occlusion sensitivity overlays"))
    out.append(el("p", OCCLUSION_CAVEAT + (f" (evaluate's own note: {d['caveat']}.)" if d.get("caveat") else ""), class_="caveat"))
    return out
