"""`lucid demo`: wiring (fast, with stand-ins) and one real, tiny end-to-end run."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import lucid.verify
import lucid.training
from synthetic_runs import write_bounds, write_synthetic_run


def test_demo_wires_train_verify_evaluate(tmp_path, monkeypatch, capsys):
    calls = []

    def fake_train(data, out, **kw):
        calls.append(("train", data, kw["arch"]))
        write_synthetic_run(out, num_classes=2, test_size=80, seed=1)
        return out

    def fake_verify(run_dir, **kw):
        calls.append(("verify", kw["solver"], kw["time_limit"], kw.get("resume", False)))
        write_bounds(run_dir, {0: None, 1: None})  # nothing proved: sound, everything noised
        return {}

    monkeypatch.setattr(lucid.training, "train_run", fake_train)
    monkeypatch.setattr(lucid.verify, "verify_run", fake_verify)
    from lucid.cli import main

    main(["demo", "--out", str(tmp_path / "d"), "--time-limit", "7", "--solver", "highs"])  # returns on success
    out = capsys.readouterr()
    assert calls == [("train", "sklearn:breast_cancer", "2x10"), ("verify", "highs", 7.0, False)]
    assert "| ε | N (no privacy) | LUCID | Naive-Noise | Naive-iDP |" in out.out
    doc = json.loads((tmp_path / "d" / "evaluation.json").read_text())
    assert doc["noised_fraction"]["lucid"] == 1.0 and list(doc["accuracy"]["lucid"]) == ["0", "0.2", "1"]
    assert (tmp_path / "d" / "confidences.png").read_bytes()[:4] == b"\x89PNG"

    # A second run resumes an interrupted verification from its checkpoint.
    (tmp_path / "d" / "run" / "verify.checkpoint.json").write_text("{}")
    calls.clear()
    main(["demo", "--out", str(tmp_path / "d"), "--time-limit", "7"])
    assert calls[1] == ("verify", "highs", 7.0, True)


def test_demo_bad_option_is_one_line(tmp_path, capsys):
    # in this process (the command line itself: test_demo_end_to_end_tiny; CI time)
    from lucid.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["demo", "--out", str(tmp_path), "--time-limit", "-3"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "--time-limit" in err and len(err.strip().splitlines()) == 1


def test_demo_end_to_end_tiny(tmp_path):
    """The real pipeline, shrunk (2 epochs, 2x4, 20 s of verification): bounds must be sound."""
    out = tmp_path / "demo"
    r = subprocess.run(
        [sys.executable, "-m", "lucid", "demo", "--out", str(out), "--epochs", "2", "--arch", "2x4",
         "--time-limit", "20", "--workers", "1"],
        capture_output=True, text=True, timeout=240,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert "| ε | N (no privacy) | LUCID | Naive-Noise | Naive-iDP |" in r.stdout
    # evaluate compares LUCID's releases with the exact leaking set of all n+1 networks.
    assert "UNSOUND" not in r.stderr
    bounds = json.loads((out / "run" / "bounds.json").read_text())
    assert bounds["format"] == "lucid-bounds/1" and set(bounds["bounds"]) == {"0", "1"}
    assert (out / "evaluation.json").exists() and (out / "confidences.png").exists()
