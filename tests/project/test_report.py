"""`lucid report`: the HTML parses, is self-contained, has every section, and its numbers are
bounds.json's, `lucid evaluate --json`'s and `lucid budget --json`'s; Markdown works; bad input is
one line and exit 2, with no file left behind."""

from __future__ import annotations

import base64
import contextlib
import io
import json
import os
import re
import subprocess
from html.parser import HTMLParser

import numpy as np
import pytest

from bab_fixtures import write_tiny_run
from synthetic_runs import write_bounds, write_synthetic_run
from lucid.report.model import SECTION_IDS

EPS = "0,0.5,1"


def lucid(*argv):
    """`lucid ARGV` in this process (a subprocess costs seconds of imports)."""
    from lucid.cli import main

    out, err, code = io.StringIO(), io.StringIO(), 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main([str(a) for a in argv])
        except SystemExit as exc:
            code = exc.code or 0
    return subprocess.CompletedProcess(argv, code, out.getvalue(), err.getvalue())


class Page(HTMLParser):
    """Checks well-formedness (every element closed, in order) and collects ids, values and URLs."""

    VOID = {"meta", "img", "br", "hr", "link", "input", "source", "col", "wbr"}

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.stack, self.ids, self.values, self.sections, self.imgs, self.text = [], {}, {}, [], [], {}
        self._current = None
        self.feed(text)
        self.close()
        assert not self.stack, f"unclosed elements {self.stack}"

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag not in self.VOID:
            self.stack.append(tag)
        if "id" in a:
            assert a["id"] not in self.ids, f"duplicate id {a['id']}"
            self.ids[a["id"]] = tag
            if tag == "section":
                self.sections.append(a["id"])
        if "data-value" in a:
            self.values[a["id"]] = json.loads(a["data-value"])
            self._current = a["id"]
            self.text[a["id"]] = ""
        if tag == "img":
            self.imgs.append(a["src"])

    def handle_startendtag(self, tag, attrs):
        self.handle_starttag(tag, attrs)

    def handle_endtag(self, tag):
        assert self.stack and self.stack[-1] == tag, f"</{tag}> closes {self.stack[-1:] or 'nothing'}"
        self.stack.pop()
        if tag == "td":
            self._current = None

    def handle_data(self, data):
        if self._current is not None:
            self.text[self._current] += data


@pytest.fixture(scope="module")
def verified(tmp_path_factory):
    """A real, tiny verification (2 classes, 6 leave-one-out networks, a 120-input test split)."""
    from lucid.verify import verify_run

    run = write_synthetic_run(tmp_path_factory.mktemp("report") / "run", num_classes=2, hidden=(4,), train_size=6,
                              test_size=120, perturbation=0.05, seed=3)
    # (without the ReLU-splitting tier, 3 of its 4 s: the report shows what any verification wrote)
    verify_run(run, workers=1, progress=False, time_limit=30, split_time=0)
    return run


def test_html_is_self_contained_and_its_numbers_are_the_commands(verified, tmp_path):
    out = tmp_path / "r.html"
    r = lucid("report", verified, "--out", out, "--epsilon", EPS, "--seed", 3)
    assert r.returncode == 0, r.stderr
    assert str(out) in r.stdout
    text = out.read_text(encoding="utf-8")
    page = Page(text)
    assert tuple(page.sections) == SECTION_IDS
    assert not re.search(r"https?://", text, re.IGNORECASE)  # no network resource, not even a link
    assert not re.search(r"<(script|link)\b", text) and "@import" not in text and "url(" not in text
    assert page.imgs and all(s.startswith("data:image/png;base64,") for s in page.imgs)
    assert all(base64.b64decode(s.split(",", 1)[1])[:8] == b"\x89PNG\r\n\x1a\n" for s in page.imgs)
    assert {"fig-figure6", "fig-accuracy", "fig-anytime"} <= set(page.ids)

    # Bounds: exactly bounds.json's numbers and flags.
    bounds = json.loads((verified / "bounds.json").read_text())["bounds"]
    assert set(bounds) == {"0", "1"}
    for c, e in bounds.items():
        for field in ("upper", "lower", "complete", "exact", "seconds", "nodes", "leaking_row"):
            assert page.values[f"bound-{c}-{field}"] == e[field], field
        assert page.values[f"bound-{c}-ratio"] == pytest.approx(e["upper"] / e["lower"])
        assert page.text[f"bound-{c}-status"] == "proved, exact"
    # The log's node counts reach the table.
    events = [json.loads(line) for line in (verified / "verify.log.jsonl").read_text().splitlines()]
    for c in bounds:
        solved = sum(e["event"] == "solved" and e["class"] == int(c) for e in events)
        assert page.values[f"bound-{c}-log"] == solved and f"{solved} nodes solved" in page.text[f"bound-{c}-log"]

    # Accuracy and noised shares: exactly `lucid evaluate --json` with the same seed.
    ev_path = tmp_path / "e.json"
    r = lucid("evaluate", verified, "--epsilon", EPS, "--seed", 3, "--json", ev_path)
    assert r.returncode == 0, r.stderr
    ev = json.loads(ev_path.read_text())
    for k in EPS.split(","):
        assert page.values[f"acc-plain-{k}"] == ev["accuracy"]["plain"]
        for m in ("lucid", "naive_idp", "naive_noise"):
            assert page.values[f"acc-{m}-{k}"] == ev["accuracy"][m][k]
        assert page.values[f"acc-baselines-{k}"] is None and page.text[f"acc-baselines-{k}"] == "not run"
    for m in ("lucid", "naive_idp", "naive_noise"):
        assert page.values[f"noised-{m}"] == ev["noised_fraction"][m]
    # Figure 6's per-class counts add up to LUCID's noised share, and beta_c is bounds.json's.
    noised = sum(page.values[f"fig6-{c}-noised"] for c in bounds)
    inputs = sum(page.values[f"fig6-{c}-inputs"] for c in bounds)
    assert inputs == 120 and noised / inputs == pytest.approx(ev["noised_fraction"]["lucid"])
    assert all(page.values[f"fig6-{c}-beta"] == bounds[c]["upper"] for c in bounds)

    # No ledger, no baselines: said so in words.
    assert "has not been served" in text and "not run" in text
    assert "t-train_size" in page.values and page.values["t-train_size"] == 6
    assert page.values["t-networks"] == 7


def test_ledger_and_baselines_when_they_exist(verified, tmp_path):
    from lucid.access import ClassifierOptions, LabelOnlyClassifier

    memo = tmp_path / "memo.sqlite"
    x = np.load(verified / "data.npz")["X_test"].astype(np.float64)
    clf = LabelOnlyClassifier.from_run(verified, epsilon=1.0, memo=memo, options=ClassifierOptions(seed=0))
    clf.predict(x[:40], client="alice")
    clf.predict(x[20:70], client="bob")
    clf.close()
    baselines = tmp_path / "b.json"
    baselines.write_text(json.dumps({"run": str(verified), "results": [
        {"method": "plain", "epsilon": None, "accuracy": 0.9, "train_seconds": 1.0, "status": "ok", "message": ""},
        {"method": "dpsgd", "epsilon": 1.0, "accuracy": 0.75, "train_seconds": 1.0, "status": "ok", "message": ""},
        {"method": "dpsgd", "epsilon": 0.5, "accuracy": None, "train_seconds": 0.0, "status": "unreachable",
         "message": "unreachable"},
        {"method": "alibi", "epsilon": 1.0, "accuracy": 0.8, "train_seconds": 1.0, "status": "ok", "message": ""}]}))
    out = tmp_path / "r.html"
    r = lucid("report", verified, "-o", out, "-e", EPS, "--memo", memo, "--baselines", baselines)
    assert r.returncode == 0, r.stderr
    page = Page(out.read_text())

    budget = lucid("budget", verified, "--memo", memo, "--json")
    assert budget.returncode == 0, budget.stderr
    clients = json.loads(budget.stdout)["clients"]
    assert {c["client"] for c in clients} == {"alice", "bob", "*"}
    for c in clients:
        p = f"ledger-{'all' if c['client'] == '*' else c['client']}"
        for field in ("answers", "noised", "refused", "charged", "spent", "spent_tight"):
            assert page.values[f"{p}-{field}"] == c[field], (p, field)

    assert page.values["acc-baseline-dpsgd-1"] == 0.75 and page.values["acc-baseline-alibi-1"] == 0.8
    assert page.text["acc-baseline-dpsgd-0.5"] == "unreachable"
    assert page.text["acc-baseline-alibi-0"] == "not run" and page.values["acc-baseline-alibi-0"] is None
    assert page.values["baseline-0-accuracy"] == 0.9 and "baselines-table" in page.ids


def test_markdown_report_with_figures_beside_it(verified, tmp_path):
    out = tmp_path / "sub" / "report.md"  # the suffix picks Markdown; missing folders are created
    r = lucid("report", verified, "--out", out, "--epsilon", EPS)
    assert r.returncode == 0, r.stderr
    text = out.read_text()
    for sid in SECTION_IDS:
        assert f'<a id="{sid}"></a>' in text
    links = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text)
    assert {"report.figure6.png", "report.accuracy.png", "report.anytime.png"} <= set(links)
    for name in links:
        assert (out.parent / name).read_bytes()[:4] == b"\x89PNG"
    assert not re.search(r"https?://", text)
    bounds = json.loads((verified / "bounds.json").read_text())["bounds"]
    for e in bounds.values():
        assert f"| {e['upper']:.6g} | {e['lower']:.6g} |" in text
    assert sorted(p.name for p in out.parent.iterdir()) == sorted([*links, "report.md"])  # no temporary files
    umask = os.umask(0)
    os.umask(umask)
    assert all(p.stat().st_mode & 0o777 == 0o666 & ~umask for p in out.parent.iterdir())  # shareable, unlike 0600


def test_a_run_without_test_split_or_log(tmp_path):
    run = write_tiny_run(tmp_path / "run", networks=3)  # no test rows, no verification log
    write_bounds(run, {0: 0.25, 1: None}, complete=False)
    r = lucid("report", run)
    assert r.returncode == 0, r.stderr
    text = (run / "report.html").read_text()
    page = Page(text)
    assert tuple(page.sections) == SECTION_IDS
    assert "no test split" in text and "No verification log" in text
    assert page.values["bound-0-upper"] == 0.25 and page.values["bound-1-upper"] is None
    assert page.text["bound-1-upper"] == "nothing proved"


@pytest.fixture(scope="module")
def unverified(tmp_path_factory):
    return write_synthetic_run(tmp_path_factory.mktemp("bad") / "run", num_classes=2, train_size=3, test_size=10)


@pytest.mark.parametrize("case, expected", [
    ("no-run", "does not exist"),
    ("no-bounds", "lucid verify"),
    ("eps-word", "--epsilon"),
    ("eps-negative", "epsilon"),
    ("eps-twice", "twice"),
    ("out-is-dir", "is a directory"),
    ("out-under-file", "not a directory"),
    ("bad-format", "--format"),
    ("missing-memo", "memo"),
    ("bad-baselines", "baseline results"),
])
def test_bad_input_is_one_line_and_exit_2(case, expected, unverified, verified, tmp_path):
    run = verified
    args = []
    if case == "no-run":
        run = tmp_path / "nowhere"
    elif case == "no-bounds":
        run = unverified
    elif case.startswith("eps"):
        args = ["--epsilon", {"eps-word": "0,x", "eps-negative": "-1", "eps-twice": "1,1"}[case]]
    elif case == "out-is-dir":
        (tmp_path / "d").mkdir()
        args = ["--out", tmp_path / "d"]
    elif case == "out-under-file":
        (tmp_path / "f").write_text("x")
        args = ["--out", tmp_path / "f" / "r.html"]
    elif case == "bad-format":
        args = ["--format", "pdf"]
    elif case == "missing-memo":
        args = ["--memo", tmp_path / "none.sqlite"]
    else:
        (tmp_path / "b.json").write_text("{not json")
        args = ["--baselines", tmp_path / "b.json"]
    before = sorted(p.name for p in tmp_path.rglob("*"))
    r = lucid("report", run, *args)
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("lucid: error: ") and expected in lines[0], r.stderr
    assert "Traceback" not in r.stderr and r.stdout == ""
    assert sorted(p.name for p in tmp_path.rglob("*")) == before
    assert not list(run.glob("report*")) if run.is_dir() else True


def test_a_failing_write_leaves_no_file(verified, tmp_path, monkeypatch):
    import errno

    from lucid import atomic

    def full_disk(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(atomic.os, "fsync", full_disk)
    r = lucid("report", verified, "--out", tmp_path / "r.html", "--epsilon", "1")
    assert r.returncode == 2 and r.stderr.strip() == f"lucid: error: cannot write {tmp_path / 'r.html'}: No space left on device"
    assert list(tmp_path.iterdir()) == []


def test_report_is_listed_in_help():
    r = lucid("--help")
    assert r.returncode == 0 and re.search(r"^\s+report\s", r.stdout, re.MULTILINE)


def test_an_imported_run_reports_its_training_from_the_manifest(tmp_path):
    """The manifest's name, version and description stand for T (not lucid train's settings, which an
    import lacks), and a data-derived domain is fixed by re-importing with a public one."""
    from lucid.interop.exporter import export_all
    from lucid.rundir import open_run

    source = write_tiny_run(tmp_path / "source", networks=3)
    manifest_path = export_all(open_run(source), tmp_path / "files")
    manifest = json.loads(manifest_path.read_text())
    manifest["training"] = {"name": "owner-adam", "version": "2.1", "description": "Adam, 30 epochs, seed 7"}
    del manifest["domain"]  # derived from the rows: it reveals their extremes
    with np.load(source / "data.npz") as npz:
        X = npz["X_train"] * 3.0  # outside [0, 1]: the derived domain is the rows' own range
        np.savez(tmp_path / "data.npz", X=X, y=npz["y_train"])
    manifest["scaler"] = {"type": "affine", "offset": [0.0, 0.0], "scale": [1.0, 1.0]}
    manifest_path.write_text(json.dumps(manifest))
    run = tmp_path / "imported"
    assert lucid("import", "--manifest", manifest_path, "--data", tmp_path / "data.npz", "--out", run).returncode == 0
    write_bounds(run, {0: 0.25, 1: 0.5})
    r = lucid("report", run, "--format", "md", "--out", tmp_path / "report.md")
    assert r.returncode == 0, r.stderr
    text = (tmp_path / "report.md").read_text()
    assert "owner-adam 2.1 (trained elsewhere, imported with lucid import)" in text
    assert "Adam, 30 epochs, seed 7" in text and "learning rate" not in text
    assert "public `domain` in the manifest" in text and "retrain with `--domain`" not in text
