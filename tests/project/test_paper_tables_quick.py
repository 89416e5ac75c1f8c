"""The paper-tables benchmark in --quick mode (keeps benchmarks/paper_tables.py from rotting).

Uses ../shared/data when present, else the script falls back to scikit-learn's breast_cancer."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "paper_tables.py"


def load_script():
    """benchmarks/paper_tables.py as a module."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("paper_tables", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["paper_tables"] = module  # its dataclasses look themselves up there
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules["paper_tables"]
    return module


@pytest.mark.timeout(400)
def test_quick_benchmark_reports_every_method_and_resumes(tmp_path, capsys):
    report = tmp_path / "report.md"
    cmd = [sys.executable, str(SCRIPT), "--quick", "--out", str(tmp_path / "work"), "--report", str(report),
           "--no-progress", "--teachers", "4", "--time-limit", "0.5"]
    first = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr[-3000:]
    text = report.read_text()
    assert (tmp_path / "report.png").stat().st_size > 1000
    for heading in ("Table 1", "Table 2", "Table 3", "Average accuracy loss"):
        assert heading in text
    for method in ("DP-SGD", "ALIBI", "S&A T=4", "Naive-iDP"):
        assert method in text
    assert "--quick" in text and "highs" in text  # command line and solver are recorded
    # Table 1 shows how far each class is from done: sound bounds never put the upper below a replayed leak.
    header, _, *rows = [ln for ln in text.split("## Table 1")[1].split("## Table 2")[0].splitlines() if ln.startswith("|")]
    column = [c.strip() for c in header.strip("|").split("|")].index("upper / lower")
    for row in rows:
        for ratio in row.strip("|").split("|")[column].split(","):
            ratio = ratio.strip()
            assert ratio in ("done", "–") or float(ratio) >= 1.0, row

    caches = sorted((tmp_path / "work" / "cache").glob("*/*.json"))
    workloads = {p.parent.name for p in caches}
    assert workloads and all({p.stem for p in caches if p.parent.name == w} == {"plain", "lucid", "dpsgd", "alibi", "sa4"}
                                for w in workloads)
    for path in caches:
        obj = json.loads(path.read_text())
        if path.stem == "lucid":
            acc = obj["evaluation"]["accuracy"]
            assert set(acc) >= {"plain", "lucid", "naive_noise", "naive_idp"}
            assert all(0 <= v <= 1 for v in acc["lucid"].values())
            # Naive-iDP noises exactly the leaking test inputs; sound bounds make LUCID noise a superset.
            noised = obj["evaluation"]["noised_fraction"]
            assert noised["lucid"] >= noised["naive_idp"]
            assert obj["bounds"] and all("upper" in b for b in obj["bounds"].values())
        else:
            for r in obj["results"]:
                assert r["status"] in ("ok", "unreachable")
                assert r["status"] != "ok" or (0 <= r["accuracy"] <= 1 and r["train_seconds"] >= 0)

    # Resume: a second run finds every (workload, method) in the cache and recomputes nothing (its
    # main() in this process, with the same arguments: the first run went through the command line;
    # CI time: a second interpreter importing torch, lucid and matplotlib)
    capsys.readouterr()
    assert load_script().main(cmd[2:]) == 0
    stdout = capsys.readouterr().out
    assert "running" not in stdout and stdout.count("cached") == len(caches)
    assert report.read_text().split("## Table 1")[1] == text.split("## Table 1")[1]


def test_bound_ratio_says_done_only_for_an_exact_finish():
    ratio = load_script().bound_ratio
    assert ratio({"upper": 0.5, "lower": 0.5, "complete": True, "exact": True}) == "done"
    # finished because every node closed, some within --rel-gap: not exact, so not "done"
    assert ratio({"upper": 0.55, "lower": 0.5, "complete": True, "exact": False,
                  "reason": "all nodes closed, some within the gap"}) == "1.10 (gap)"
    assert ratio({"upper": 0.6, "lower": 0.5, "complete": False, "exact": False}) == "1.20"
    # results cached before bounds.json had "exact": told apart by upper vs lower (plus margins)
    assert ratio({"upper": 0.5000023, "lower": 0.5, "complete": True, "reason": "proved singleton on top"}) == "done"
    assert ratio({"upper": 0.52, "lower": 0.5, "complete": True,
                  "reason": "upper within the gap of the lower bound"}) == "1.04 (gap)"
    assert ratio({"upper": 0.548, "lower": 0.5, "complete": True, "reason": "all nodes closed"}) == "1.10 (gap)"
    assert ratio({"upper": -1.0, "lower": None, "complete": True, "reason": "all nodes closed"}) == "done"
