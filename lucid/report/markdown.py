"""Render a report `Document` as Markdown, with its figures as PNG files beside it.

Separate files rather than data URIs because the usual Markdown viewers (GitHub, GitLab, most
editors' previews) refuse or strip `data:` images; a report at `DIR/report.md` writes
`DIR/report.figure6.png` etc. and links them by relative name, so the directory can be moved as a
whole. Figures are written first and the Markdown last, each atomically, so the Markdown never
links a figure that is not there. Section anchors (`<a id=...>`) carry the same ids as the HTML.
"""

from __future__ import annotations

from pathlib import Path

from lucid.report.files import write_file
from lucid.report.model import Bullets, Document, Figure, Heading, Paragraph, Table


def figure_path(report: Path, figure: Figure) -> Path:
    """Where a figure of the report at `report` is written."""
    return report.with_name(f"{report.stem}.{figure.name}.png")


def _cell(text: str) -> str:
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")


def _table(t: Table) -> list[str]:
    lines = ["| " + " | ".join(_cell(h) or " " for h in t.header) + " |", "|" + "---|" * len(t.header)]
    lines += ["| " + " | ".join(_cell(c.text) for c in row) + " |" for row in t.rows]
    if t.caption:
        lines += ["", f"_{t.caption}_"]
    return lines


def render_markdown(doc: Document, report: Path) -> str:
    """The Markdown text of the report that will live at `report` (figure links are relative to it)."""
    out = [f"# {doc.title}", "", doc.subtitle, ""]
    out += ["Sections: " + " · ".join(f"[{s.title}](#{s.id})" for s in doc.sections), ""]
    for s in doc.sections:
        out += [f'<a id="{s.id}"></a>', "", f"## {s.title}", ""]
        for b in s.blocks:
            if isinstance(b, Paragraph):
                out.append({"warning": f"> **{b.text}**", "note": f"_{b.text}_"}.get(b.kind, b.text))
            elif isinstance(b, Bullets):
                out += [f"- **{lead}.** {text}" for lead, text in b.items]
            elif isinstance(b, Heading):
                out.append(f"### {b.text}")
            elif isinstance(b, Table):
                out += _table(b)
            elif isinstance(b, Figure):
                out += [f"![{b.alt}]({figure_path(report, b).name})", "", f"_{b.caption}_"]
            out.append("")
    return "\n".join(out).rstrip() + "\n"


def write_markdown(doc: Document, path: str | Path) -> list[Path]:
    """Write the figures, then the Markdown, each atomically; return every path written."""
    path = Path(path)
    written = [write_file(figure_path(path, fig), fig.png) for fig in doc.figures()]
    return [*written, write_file(path, render_markdown(doc, path).encode("utf-8"))]
