"""`vitdeploy report` as one library call: read the bundle and its records, render the page and the
model card, write both atomically."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from ..errors import UserError
from ..fileio import atomic_write_text, ensure_writable_dir
from .card import model_card
from .engines import engines_section
from .evidence import check_section, precision_section
from .html import el, esc, page
from .identity import contract_section, cost_section, identity_section, weights_banner
from .latency import latency_section
from .robustness import robustness_section
from .sources import open_sources
from .summary import summary

INDEX = "index.html"
CARD = "MODEL_CARD.md"
SECTIONS = (("identity", "Identity"), ("contract", "Input contract"), ("cost", "Cost model"), ("evidence", "Evidence"),
            ("precision", "Precision"), ("robustness", "Robustness"), ("latency", "Latency and throughput"), ("engines", "Engines"))


@dataclass
class ReportOutcome:
    page: Path
    card: Path
    random_weights: bool
    unreadable: list[str]


def render(path: str | Path) -> tuple[str, str, bool, list[str]]:
    """The page and the model card of the bundle at ``path``, as text (nothing written)."""
    src = open_sources(path)
    created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    m = src.bundle.manifest
    sections = [identity_section(src, created), contract_section(src), cost_section(src), check_section(src),
                precision_section(src), robustness_section(src), latency_section(src), engines_section(src)]
    banner = weights_banner(src)
    if src.unreadable:
        sections.append(el("section", el("h2", "Unreadable records"), el("ul", *(el("li", u) for u in src.unreadable)), id="unreadable"))
    source = m.get("source") or {}
    title = f"vitdeploy report: {src.bundle.name}"
    subtitle = f"{source.get('kind')}:{source.get('name')}, graphs {', '.join(src.graph_sha)}; bundle {src.bundle.root}"
    footer = el("p", esc(f"Written {created} by `vitdeploy report` from manifest.json and reports/. "
                         "Every number carries data-src: the record and JSON pointer it shows."))
    html = page(title, subtitle, list(SECTIONS), banner, summary(src), sections, footer)
    return html, model_card(src, created), banner is not None, src.unreadable


def write_report(path: str | Path, out: str | Path | None = None) -> ReportOutcome:
    """Render, then write the model card and the page, each atomically (temp file + rename): a bad bundle,
    a tampered graph or a folder that cannot be written leaves nothing behind."""
    from ..bundle import Bundle

    target = Path(out) if out is not None else Bundle.open(path).root / "reports" / INDEX
    if target.is_dir():
        raise UserError(f"{target} is a folder; give -o a file name such as {target / INDEX}")
    html, card, random_weights, unreadable = render(path)
    ensure_writable_dir(target.parent)
    card_path = target.parent / CARD
    atomic_write_text(card_path, card)
    atomic_write_text(target, html)
    return ReportOutcome(target, card_path, random_weights, unreadable)
