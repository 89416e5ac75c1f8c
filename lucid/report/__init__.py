"""`lucid report`: one artefact that shows a reviewer what was proved about a run, and what not.

facts.py     typed, frozen records of everything the report states
gather.py    reading them from a run directory through the loaders the other commands use
sections.py  facts -> a neutral document (sections, tables with stable ids, figures)
figures.py   matplotlib (Agg) figures as PNG bytes, incl. the paper's Figure 6
caveats.py   the threat model in plain words
html.py      one self-contained HTML file (inline CSS, data-URI figures, no network)
markdown.py  Markdown with the figures as PNG files beside it
files.py     atomic writes with ordinary (umask) permissions

The engine's log (lucid/bab) is read by the command line (`lucid/cli/report.py`), which hands its
summary in as `ClassLog`s: only lucid/bab and lucid/cli may import the engine.
"""

from __future__ import annotations

from pathlib import Path

from lucid.errors import LucidError
from lucid.report.facts import ReportFacts
from lucid.report.html import write_html
from lucid.report.markdown import write_markdown
from lucid.report.sections import build_document

FORMATS = ("html", "md")


def write_report(facts: ReportFacts, out: str | Path, fmt: str = "html") -> list[Path]:
    """Render `facts` in `fmt` and write it (atomically) to `out`; return every file written."""
    if fmt not in FORMATS:
        raise LucidError(f"--format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    doc = build_document(facts)
    if fmt == "html":
        return write_html(doc, out)

    return write_markdown(doc, out)
