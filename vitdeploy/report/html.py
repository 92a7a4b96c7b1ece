"""The page's building blocks: escaped elements, tables, numbers that name the JSON they come from.

Every text that reaches the page goes through :func:`esc` (``html.escape``): labels, file names and
report strings are data a user or a source model controls. A number is rendered by :func:`num`, which
keeps the raw value and where it came from beside the text (``data-src``, ``data-value``,
``data-fmt``), so a reader (and the browser test) can check the page against the JSON it summarises.
"""

from __future__ import annotations

import base64
import html
import json
import math
from typing import Any, Iterable

Html = str  # already-escaped markup; plain ``str`` values are escaped before they are placed


class Markup(str):
    """A string that is already safe markup (built by this module); adding text to it escapes the text."""

    def __add__(self, other: object) -> "Markup":
        return Markup(str.__add__(self, esc(other)))

    def __radd__(self, other: object) -> "Markup":
        return Markup(str.__add__(esc(other), self))


def esc(value: Any) -> Markup:
    if isinstance(value, Markup):
        return value
    return Markup(html.escape("" if value is None else str(value), quote=True))


def _attrs(attrs: dict[str, Any]) -> str:
    out = []
    for key, value in attrs.items():
        if value is None or value is False:
            continue
        name = key.rstrip("_").replace("_", "-")
        out.append(f" {name}" if value is True else f' {name}="{html.escape(str(value), quote=True)}"')
    return "".join(out)


def el(tag: str, *children: Any, **attrs: Any) -> Markup:
    body = "".join(esc(c) for c in children if c is not None)
    return Markup(f"<{tag}{_attrs(attrs)}>{body}</{tag}>")


def void(tag: str, **attrs: Any) -> Markup:
    return Markup(f"<{tag}{_attrs(attrs)}>")


def join(parts: Iterable[Any], sep: str = "") -> Markup:
    return Markup(esc(sep).join(esc(p) for p in parts if p is not None))


def fmt(value: Any, spec: str) -> str:
    """``format(value, spec)``, with the empty cases said in words."""
    if value is None:
        return "–"
    if isinstance(value, float) and math.isnan(value):
        return "n/a"
    return format(value, spec)


def num(value: Any, spec: str, src: str | None = None, suffix: str = "") -> Markup:
    """A number as text formatted by ``spec``; ``src`` (``FILE#json/pointer``) names the JSON value it shows."""
    text = fmt(value, spec)
    if src is None or not isinstance(value, (int, float)) or isinstance(value, bool):
        return el("span", text + (suffix if value is not None else ""), class_="num")
    return el("span", text, class_="num", data_src=src, data_value=json.dumps(value), data_fmt=spec) + esc(suffix)


def pct_interval(ci: list[float] | None, src: str | None = None) -> Markup:
    if not ci or len(ci) != 2:
        return esc("")
    return join([esc("["), num(ci[0], ".1%", f"{src}/0" if src else None), esc(", "), num(ci[1], ".1%", f"{src}/1" if src else None), esc("]")])


def table(headers: list[str], rows: list[list[Any]], caption: str | None = None, class_: str | None = None) -> Markup:
    head = el("thead", el("tr", *(el("th", h, scope="col") for h in headers)))
    body = el("tbody", *(el("tr", *(el("td", c) for c in row)) for row in rows))
    return el("table", el("caption", caption) if caption else None, head, body, class_=class_)


def kv(rows: list[tuple[str, Any]]) -> Markup:
    """A two-column table of facts: name, value."""
    return el("table", el("tbody", *(el("tr", el("th", k, scope="row"), el("td", v)) for k, v in rows)), class_="facts")


def command(text: str) -> Markup:
    return el("code", text, class_="cmd")


def missing(what: str, cmd: str) -> Markup:
    """What a section would show, and the exact command that would fill it."""
    return el("p", esc(f"No {what} in this bundle yet. Run "), command(cmd), esc(" and then this report again."), class_="missing")


def image(png: bytes, alt: str, width: int | None = None) -> Markup:
    """A PNG inlined as a data: URI: the page stays one file that opens with no connection."""
    uri = "data:image/png;base64," + base64.b64encode(png).decode("ascii")
    return el("figure", void("img", src=uri, alt=alt, style=f"max-width:{width}px" if width else None), el("figcaption", alt))


def section(anchor: str, title: str, *body: Any, status: str | None = None) -> Markup:
    badge = el("span", status, class_=f"badge {status.split()[0]}") if status else None
    return el("section", el("h2", title, esc(" ") if badge else None, badge), *body, id=anchor)


CSS = """
:root{--fg:#1b1f24;--muted:#57606a;--line:#d0d7de;--ok:#1a7f37;--bad:#cf222e;--warn:#9a6700;--bg2:#f6f8fa}
*{box-sizing:border-box}
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif;color:var(--fg);margin:0;background:#fff}
header,main,footer{max-width:1220px;margin:0 auto;padding:0 20px}
header{padding-top:18px;border-bottom:1px solid var(--line)}
h1{font-size:22px;margin:0 0 4px}
h2{font-size:17px;margin:26px 0 8px;padding-bottom:4px;border-bottom:1px solid var(--line)}
h3{font-size:14px;margin:14px 0 6px}
nav ul{list-style:none;padding:0;margin:8px 0 12px;display:flex;flex-wrap:wrap;gap:4px 14px}
nav a{color:#0969da;text-decoration:none}
table{border-collapse:collapse;margin:6px 0 10px;font-variant-numeric:tabular-nums}
th,td{border:1px solid var(--line);padding:3px 8px;text-align:left;vertical-align:top}
thead th{background:var(--bg2)}
table.facts th{background:var(--bg2);font-weight:600;white-space:nowrap}
caption{text-align:left;color:var(--muted);padding:2px 0}
code,.mono{font-family:ui-monospace,"DejaVu Sans Mono",Menlo,monospace;font-size:12.5px}
code.cmd{background:var(--bg2);border:1px solid var(--line);border-radius:4px;padding:1px 5px}
.sha{font-family:ui-monospace,"DejaVu Sans Mono",monospace;font-size:12px;word-break:break-all}
.missing{color:var(--muted);font-style:italic}
.num{white-space:nowrap}
.note{color:var(--muted)}
.banner{background:#ffebe9;border:2px solid var(--bad);color:var(--bad);font-weight:700;padding:10px 14px;margin:12px 0;border-radius:6px}
.caveat{background:#fff8c5;border-left:4px solid var(--warn);padding:6px 10px;margin:8px 0}
.badge{font-size:12px;font-weight:600;border-radius:10px;padding:1px 8px;vertical-align:middle}
.badge.pass,.badge.ok{background:#dafbe1;color:var(--ok)}
.badge.fail,.badge.stale{background:#ffebe9;color:var(--bad)}
.badge.reported,.badge.none{background:var(--bg2);color:var(--muted)}
.stale{color:var(--bad);font-weight:600}
.pass{color:var(--ok);font-weight:600}
.fail{color:var(--bad);font-weight:600}
figure{margin:8px 0 14px}
figure img{max-width:100%;height:auto;border:1px solid var(--line)}
figcaption{color:var(--muted);font-size:12.5px}
/* the first screen: one card per section */
.cards{display:grid;grid-template-columns:repeat(4,1fr);gap:10px;margin:14px 0 6px}
.card{border:1px solid var(--line);border-radius:6px;padding:6px 10px;background:#fff}
.card h3{margin:2px 0 4px;font-size:14px}
.card h3 a{color:var(--fg);text-decoration:none}
.card ul{margin:0;padding-left:16px;font-size:13px}
figure img.wide{max-width:900px}
footer{color:var(--muted);font-size:12px;border-top:1px solid var(--line);margin-top:30px;padding:10px 20px 30px}
"""


def page(title: str, subtitle: Any, nav: list[tuple[str, str]], banner: Any, summary: Any, sections: list[Markup], footer: Any) -> str:
    links = el("nav", el("ul", *(el("li", el("a", name, href=f"#{anchor}")) for anchor, name in nav)))
    return Markup("<!DOCTYPE html>\n") + el(
        "html",
        el("head", void("meta", charset="utf-8"), void("meta", name="viewport", content="width=device-width, initial-scale=1"),
           el("title", title), el("style", Markup(CSS))),
        el("body", el("header", el("h1", title), el("p", subtitle, class_="note"), banner, summary, links),
           el("main", *sections), el("footer", footer)),
        lang="en",
    ) + "\n"


def ptr(rel: str, *parts: Any) -> str:
    """``FILE#/a/0/b``: a JSON pointer (RFC 6901) into the record at ``rel``."""
    return rel + "#/" + "/".join(str(p).replace("~", "~0").replace("/", "~1") for p in parts)


def short_sha(sha: str | None) -> Markup:
    return el("span", (sha or "–")[:12], class_="sha", title=sha or None)
