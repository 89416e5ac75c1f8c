"""Render a report `Document` as one self-contained HTML file.

Self-contained because the reader may be a regulator's air-gapped machine: the style sheet is
inline, fonts are the system's, and figures are base64 PNG data URIs, so the file references no
URL at all (tests check that no http:// or https:// appears). Every section is a
`<section id=...>` and every number cell carries `id` and `data-value` (its exact value as JSON),
so tools can read the numbers back without scraping the formatted text.
"""

from __future__ import annotations

import base64
import html
import re
from pathlib import Path

from lucid.report.files import write_file
from lucid.report.model import Bullets, Cell, Document, Figure, Heading, Paragraph, Section, Table

_CSS = """
:root { color-scheme: light; }
body { font-family: -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif; color: #1b1f24;
       margin: 0; background: #f6f7f9; line-height: 1.45; font-size: 15px; }
main { max-width: 1120px; margin: 0 auto; padding: 24px 32px 48px; background: #fff; }
header h1 { margin: 0 0 4px; font-size: 26px; }
header p { margin: 0; color: #57606a; font-size: 13px; overflow-wrap: anywhere; }
nav { margin: 14px 0 8px; font-size: 13px; }
nav a { margin-right: 14px; color: #0969da; text-decoration: none; }
section { border-top: 1px solid #d0d7de; padding-top: 6px; margin-top: 22px; }
h2 { font-size: 20px; margin: 8px 0 10px; }
h3 { font-size: 15px; margin: 18px 0 6px; }
p { margin: 6px 0 10px; }
p.note { color: #57606a; font-size: 13px; }
p.warning { background: #fff1f0; border-left: 4px solid #cf222e; padding: 8px 12px; font-weight: 600; }
code { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; font-size: 90%;
       background: #f0f2f4; padding: 1px 4px; border-radius: 3px; overflow-wrap: anywhere; }
.scroll { overflow-x: auto; }
table { border-collapse: collapse; margin: 6px 0 12px; font-size: 13px; }
caption { caption-side: bottom; text-align: left; color: #57606a; font-size: 12px; padding-top: 4px; }
th, td { border: 1px solid #d0d7de; padding: 4px 8px; text-align: left; vertical-align: top; }
th { background: #f0f2f4; font-weight: 600; }
td[data-value] { font-variant-numeric: tabular-nums; }
#accuracy-table td, #noised-table td, #figure6-table td, #ledger-table td, #baselines-table td { white-space: nowrap; }
tbody tr:nth-child(even) td { background: #fafbfc; }
#training-table td:last-child { overflow-wrap: anywhere; max-width: 760px; }
figure { margin: 10px 0 16px; }
figure img { max-width: 100%; height: auto; border: 1px solid #eaeef2; }
figcaption { color: #57606a; font-size: 12px; margin-top: 4px; }
ul.claims { padding-left: 20px; }
ul.claims li { margin-bottom: 8px; }
"""


def _text(s: str) -> str:
    """Escape, then show `backticked` spans as code."""
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", html.escape(s, quote=False))


def _attr_id(element_id: str | None) -> str:
    return "" if element_id is None else f' id="{html.escape(element_id)}"'


def _cell(c: Cell) -> str:
    data = "" if c.id is None else f' data-value="{html.escape(c.data_value)}"'
    return f"<td{_attr_id(c.id)}{data}>{_text(c.text)}</td>"


def _table(t: Table) -> str:
    head = "".join(f"<th>{_text(h)}</th>" for h in t.header)
    body = "\n".join("<tr>" + "".join(_cell(c) for c in row) + "</tr>" for row in t.rows)
    caption = f"<caption>{_text(t.caption)}</caption>" if t.caption else ""
    return (
        f'<div class="scroll"><table{_attr_id(t.id)}>{caption}<thead><tr>{head}</tr></thead>'
        f"<tbody>\n{body}\n</tbody></table></div>"
    )


def _figure(f: Figure) -> str:
    uri = "data:image/png;base64," + base64.b64encode(f.png).decode("ascii")
    return (
        f'<figure id="fig-{html.escape(f.name)}"><img src="{uri}" alt="{html.escape(f.alt)}">'
        f"<figcaption>{_text(f.caption)}</figcaption></figure>"
    )


def _block(b) -> str:
    if isinstance(b, Paragraph):
        cls = "" if b.kind == "text" else f' class="{b.kind}"'
        return f"<p{cls}>{_text(b.text)}</p>"
    if isinstance(b, Bullets):
        items = "\n".join(f"<li><strong>{_text(lead)}.</strong> {_text(text)}</li>" for lead, text in b.items)
        return f'<ul class="claims"{_attr_id(b.id)}>\n{items}\n</ul>'
    if isinstance(b, Heading):
        return f"<h3{_attr_id(b.id)}>{_text(b.text)}</h3>"
    if isinstance(b, Table):
        return _table(b)
    if isinstance(b, Figure):
        return _figure(b)
    raise TypeError(f"unknown block {type(b).__name__}")


def _section(s: Section) -> str:
    body = "\n".join(_block(b) for b in s.blocks)
    return f'<section id="{html.escape(s.id)}">\n<h2>{_text(s.title)}</h2>\n{body}\n</section>'


def render_html(doc: Document) -> str:
    """The complete HTML5 document as a string."""
    nav = "".join(f'<a href="#{html.escape(s.id)}">{_text(s.title)}</a>' for s in doc.sections)
    sections = "\n".join(_section(s) for s in doc.sections)
    return (
        f'<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f'<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>{_text(doc.title)}</title>\n<style>{_CSS}</style>\n</head>\n<body>\n<main>\n"
        f"<header><h1>{_text(doc.title)}</h1><p>{_text(doc.subtitle)}</p></header>\n<nav>{nav}</nav>\n"
        f"{sections}\n</main>\n</body>\n</html>\n"
    )


def write_html(doc: Document, path: str | Path) -> list[Path]:
    """Write the report atomically (a reader sees the old file or the whole new one)."""
    return [write_file(path, render_html(doc).encode("utf-8"))]
