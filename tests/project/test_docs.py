"""The documentation stays true to the repository and to the command line.

- Every relative Markdown link in README.md, docs/*.md and benchmarks/README.md points to an
  existing file, and every `#anchor` to an existing heading (GitHub's slug rules).
- Every `lucid SUB ...` command line in a fenced code block (continuation lines included) names
  an existing subcommand, and every `--flag` it uses appears in `lucid SUB --help`.
- README.md stays short (at most 12 kB) and keeps the set-up lines that `.ci/run` depends on.

The checkers are plain functions so that the last tests can show they really fail on a broken
link, a made-up flag or an unknown subcommand.
"""

from __future__ import annotations

import functools
import re
import unicodedata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
README_LIMIT = 12_000  # bytes, as `wc -c` counts them
TEST_COMMAND = (
    'pip install torch==2.13.0 && pip install -e ".[test]" && ruff check lucid && ruff format --check lucid && mypy'
    " && python -m pytest -q -n 2"
)
QUICK_START = "pip install torch==2.13.0 && pip install -e . && lucid demo"


def doc_files() -> list[Path]:
    return [README, *sorted((ROOT / "docs").glob("*.md")), ROOT / "benchmarks" / "README.md"]


def _name(path: Path) -> str:
    return str(path.relative_to(ROOT))


# ------------------------------------------------------------------------------------ markdown


_FENCE = re.compile(r"^\s*(```+|~~~+)\s*([\w+-]*)")


def split_fences(text: str) -> tuple[list[str], list[tuple[str, list[str]]]]:
    """(the lines outside fenced code blocks, [(language, lines) of each fenced block])."""
    prose: list[str] = []
    blocks: list[tuple[str, list[str]]] = []
    fence = None
    for line in text.splitlines():
        m = _FENCE.match(line)
        if fence is None:
            if m:
                fence = m.group(1)
                blocks.append((m.group(2).lower(), []))
            else:
                prose.append(line)
        elif line.strip().startswith(fence[0] * len(fence)) and line.strip().strip(fence[0]) == "":
            fence = None
        else:
            blocks[-1][1].append(line)
    return prose, blocks


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading: the rendered text, lower-cased, every character that is
    not a letter, digit, mark, space, '-' or '_' dropped, spaces turned into '-' (not collapsed)."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip())  # a link renders as its text
    text = text.lower()
    kept = "".join(ch for ch in text
                   if ch in " -_" or unicodedata.category(ch)[0] in "LNM")
    return kept.replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every heading anchor of a Markdown text; repeated headings get -1, -2, ... as on GitHub."""
    prose, _ = split_fences(text)
    seen: dict[str, int] = {}
    out = set()
    for line in prose:
        m = re.match(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        slug = github_slug(m.group(2))
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_INLINE_CODE = re.compile(r"(`+)(?:(?!\1).)+?\1")


def links(text: str) -> list[str]:
    """The targets of inline links and images, outside fenced blocks and inline code."""
    prose, _ = split_fences(text)
    found = []
    for line in prose:
        found += _LINK.findall(_INLINE_CODE.sub("", line))
    return found


def link_problems(path: Path) -> list[str]:
    """Why each relative link of `path` is broken (empty when all are fine)."""
    text = path.read_text(encoding="utf-8")
    problems = []
    for target in links(text):
        if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target):  # http:, https:, mailto:, ...
            continue
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        if not dest.exists():
            problems.append(f"{target}: {file_part} does not exist")
            continue
        if anchor:
            if dest.is_dir() or dest.suffix.lower() != ".md":
                problems.append(f"{target}: an anchor into something that is not a Markdown file")
            elif anchor not in anchors(dest.read_text(encoding="utf-8")):
                problems.append(f"{target}: no heading with the anchor #{anchor} in {dest.name}")
    return problems


# ------------------------------------------------------------------------------------ commands

_NOT_SHELL = {"python", "py", "json", "jsonc", "toml", "yaml", "yml", "text/markdown"}


def _logical_lines(lines: list[str]) -> list[str]:
    """Join continuation lines: a trailing backslash, or (in a usage synopsis) an indented line
    that starts with '[' or '-' right after a `lucid` line."""
    out: list[str] = []
    pending = None
    for raw in lines:
        line = raw.rstrip()
        if pending is not None:
            pending += " " + line.strip()
        elif (out and re.match(r"^\s+[\[-]", line) and re.search(r"(?:^|\s)lucid\s", out[-1])):
            out[-1] += " " + line.strip()
            continue
        else:
            pending = line
        if pending.endswith("\\"):
            pending = pending[:-1]
            continue
        out.append(pending)
        pending = None
    if pending is not None:
        out.append(pending)
    return out


def _segments(line: str) -> list[str]:
    """Split a shell line at &&, ||, ;, a pipe and a trailing &, outside quotes and brackets
    (so `[--format html|md]` stays whole); drop a trailing # comment."""
    parts, cur, depth, quote = [], "", 0, None
    i = 0
    while i < len(line):
        ch = line[i]
        if quote:
            cur += ch
            if ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
            cur += ch
        elif ch in "[(":
            depth += 1
            cur += ch
        elif ch in "])":
            depth = max(0, depth - 1)
            cur += ch
        elif ch == "#" and (not cur or cur[-1].isspace()) and depth == 0:
            break
        elif depth == 0 and ch in "&|;":
            parts.append(cur)
            cur = ""
            if i + 1 < len(line) and line[i + 1] == ch:
                i += 1
        else:
            cur += ch
        i += 1
    parts.append(cur)
    return [p.strip() for p in parts if p.strip()]


_CALL = re.compile(r"(?:^|\s)lucid\s+([a-z][\w-]*)(?=\s|$)(.*)$")  # `lucid log)` in prose is no call
_FLAG = re.compile(r"(?<![\w-])--[A-Za-z0-9][A-Za-z0-9-]*")


def lucid_commands(text: str) -> list[tuple[str, list[str], str]]:
    """(subcommand, its --flags, the command as written) of every `lucid SUB ...` in fenced blocks."""
    _, blocks = split_fences(text)
    found = []
    for language, lines in blocks:
        if language in _NOT_SHELL:
            continue
        for line in _logical_lines(lines):
            for segment in _segments(line):
                m = _CALL.search(segment)
                if not m:
                    continue
                found.append((m.group(1), _FLAG.findall(m.group(2)), segment))
    return found


@functools.lru_cache(maxsize=None)
def help_text(sub: str) -> str | None:
    """`lucid SUB --help` as printed, or None when there is no such subcommand."""
    from click.testing import CliRunner

    from lucid.cli import cli

    result = CliRunner().invoke(cli, [sub, "--help"], prog_name="lucid")
    return result.output if result.exit_code == 0 else None


def command_problems(sub: str, flags: list[str]) -> list[str]:
    text = help_text(sub)
    if text is None:
        return [f"`lucid {sub}` is not a lucid subcommand"]
    known = set(_FLAG.findall(text))
    return [f"`lucid {sub}` has no option {flag}" for flag in flags if flag not in known]


def all_commands() -> list[tuple[str, str, list[str], str]]:
    out = []
    for path in doc_files():
        for sub, flags, written in lucid_commands(path.read_text(encoding="utf-8")):
            out.append((_name(path), sub, flags, written))
    return out


# ------------------------------------------------------------------------------------ the docs


@pytest.mark.parametrize("path", doc_files(), ids=_name)
def test_relative_links_and_anchors_resolve(path):
    assert path.exists(), f"{_name(path)} is missing"
    assert link_problems(path) == []


@pytest.mark.parametrize("where, sub, flags, written", all_commands(),
                         ids=[f"{w}:{s}:{i}" for i, (w, s, _, _) in enumerate(all_commands())])
def test_documented_commands_exist_with_their_flags(where, sub, flags, written):
    assert command_problems(sub, flags) == [], f"{where}: {written}"


def test_every_doc_page_documents_some_command_or_links():
    """The collectors see the docs at all (an empty collection would pass every test above)."""
    assert len(all_commands()) > 20
    assert sum(len(links(p.read_text(encoding="utf-8"))) for p in doc_files()) > 50


def test_readme_is_short():
    size = len(README.read_bytes())
    assert size <= README_LIMIT, f"README.md is {size} bytes; move detail into docs/ (limit {README_LIMIT})"


def test_readme_keeps_the_set_up_lines():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert TEST_COMMAND in lines  # .ci/run runs exactly this line
    assert QUICK_START in lines
    assert TEST_COMMAND in (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()


def test_readme_links_every_doc_page():
    targets = {t.partition("#")[0] for t in links(README.read_text(encoding="utf-8"))}
    for path in doc_files()[1:]:
        assert _name(path) in targets, f"README.md does not link {_name(path)}"


# ------------------------------------------------------------------------------------ the checkers fail


def test_github_slugs():
    assert github_slug("Group iDP over an AGT box") == "group-idp-over-an-agt-box"
    assert github_slug("The algorithm T (`lucid-loo-sgd/1`)") == "the-algorithm-t-lucid-loo-sgd1"
    assert github_slug("Cutoffs and `--rel-gap`") == "cutoffs-and---rel-gap"
    assert github_slug("`bounds.json`") == "boundsjson"
    assert github_slug("What β means, [in short](x.md)") == "what-β-means-in-short"
    assert anchors("# A\n## A\n```\n# not a heading\n```\n") == {"a", "a-1"}


def test_broken_links_and_anchors_are_reported(tmp_path):
    (tmp_path / "other.md").write_text("# Real heading\n")
    page = tmp_path / "page.md"
    page.write_text(
        "# Title\n\n"
        "[fine](other.md) [fine too](other.md#real-heading) [self](#title) [web](https://example.org/x)\n"
        "[gone](missing.md) [bad anchor](other.md#no-such-heading) [bad self](#nowhere)\n"
        "`[in code](missing-too.md)`\n\n```\n[in a block](missing-three.md)\n```\n"
    )
    problems = link_problems(page)
    assert len(problems) == 3, problems
    assert any("missing.md" in p for p in problems)
    assert any("#no-such-heading" in p for p in problems)
    assert any("#nowhere" in p for p in problems)


def test_made_up_flags_and_subcommands_are_reported():
    text = (
        "```bash\n"
        "lucid verify RUN --time-limit 60 --no-such-flag\n"
        "lucid train DATA --out RUN \\\n    --epochs 3 --made-up-option 1\n"
        "lucid serve RUN --epsilon 1\n            [--clip] [--imaginary FILE]\n"
        "pip install -e . && lucid frobnicate RUN   # a comment --ignored\n"
        "```\n"
        "```python\nlucid nothing --checked\n```\n"
    )
    found = lucid_commands(text)
    assert [sub for sub, _, _ in found] == ["verify", "train", "serve", "frobnicate"]
    problems = [p for sub, flags, _ in found for p in command_problems(sub, flags)]
    assert problems == [
        "`lucid verify` has no option --no-such-flag",
        "`lucid train` has no option --made-up-option",
        "`lucid serve` has no option --imaginary",
        "`lucid frobnicate` is not a lucid subcommand",
    ]


def test_brackets_and_pipes_in_a_synopsis_stay_one_command():
    found = lucid_commands("```\nlucid train DATA --out RUN [--test-fraction 0.2 | --test-data FILE] | tee log\n```\n")
    assert found[0][1] == ["--out", "--test-fraction", "--test-data"]
