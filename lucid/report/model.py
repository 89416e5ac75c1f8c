"""A neutral document: sections of paragraphs, bullet lists, tables and figures.

`lucid.report.sections` turns the facts into this structure once; `lucid.report.html` and
`lucid.report.markdown` only render it. So the two formats carry the same numbers and the same
section ids, and a table cell keeps its machine-readable value (`Cell.value`) beside the text a
person reads, which the HTML writes into a `data-value` attribute for tools and tests.
Text may mark code with backticks; renderers show it as code.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Cell:
    text: str
    id: str | None = None  # stable id, e.g. "bound-0-upper", "acc-lucid-0.2"
    value: Any = None  # the exact number/flag behind `text` (JSON-encodable)

    @property
    def data_value(self) -> str:
        """The value as JSON (floats round-trip exactly through Python's repr)."""
        return json.dumps(self.value, allow_nan=False)


@dataclass(frozen=True)
class Table:
    id: str
    header: tuple[str, ...]
    rows: tuple[tuple[Cell, ...], ...]
    caption: str = ""


@dataclass(frozen=True)
class Paragraph:
    text: str
    kind: str = "text"  # "text", "note" (muted) or "warning" (highlighted)


@dataclass(frozen=True)
class Bullets:
    items: tuple[tuple[str, str], ...]  # (bold lead, explanation)
    id: str | None = None


@dataclass(frozen=True)
class Figure:
    name: str  # file-name stem for formats that write figures next to the report
    png: bytes
    caption: str
    alt: str


@dataclass(frozen=True)
class Heading:
    text: str
    id: str | None = None


Block = Paragraph | Bullets | Table | Figure | Heading


@dataclass(frozen=True)
class Section:
    id: str
    title: str
    blocks: tuple[Block, ...]


@dataclass(frozen=True)
class Document:
    title: str
    subtitle: str
    sections: tuple[Section, ...]

    def figures(self) -> tuple[Figure, ...]:
        return tuple(b for s in self.sections for b in s.blocks if isinstance(b, Figure))


SECTION_IDS = ("summary", "training", "bounds", "figure6", "accuracy", "ledger", "caveats")
