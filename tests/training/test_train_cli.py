"""`lucid train`: resume after an interruption, idempotence, and one-line errors for bad input."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from safetensors.numpy import load_file

from lucid.cli import main
from lucid.errors import LucidError
from lucid.training import train_run
from lucid.training.harness import STOP_AFTER_ENV


def write_csv(path, rows, header="a,b,label"):
    path.write_text(header + "\n" + "\n".join(",".join(str(v) for v in r) for r in rows) + "\n")
    return path


@pytest.fixture
def csv_data(tmp_path):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(24, 2)) * 10
    rows = [(f"{a:.4f}", f"{b:.4f}", "yes" if a > 0 else "no") for a, b in X]
    return write_csv(tmp_path / "d.csv", rows)


def run_cli(args, capsys) -> tuple[int, str]:
    with pytest.raises(SystemExit) as exc:
        main(list(args))
        raise SystemExit(0)
    return int(exc.value.code or 0), capsys.readouterr().err


def test_resume_after_interrupt_is_bit_identical(tmp_path, csv_data, capsys, monkeypatch):
    out = tmp_path / "run"
    args = ["train", str(csv_data), "--arch", "2x6", "--epochs", "3", "--batch-size", "5",
            "--test-fraction", "0.25", "--chunk-size", "4", "--no-progress", "--out", str(out)]
    monkeypatch.setenv(STOP_AFTER_ENV, "1")  # the harness raises KeyboardInterrupt, as Ctrl-C would
    code, err = run_cli(args, capsys)
    assert code == 130 and "re-run the same command to resume" in err
    assert not out.exists()  # never half-written
    partial = tmp_path / "run.partial"
    saved = sorted(p.name for p in partial.glob("chunk-*.safetensors"))
    assert 1 <= len(saved) < 5  # 19 networks in chunks of 4: interrupted part-way
    before = {name: (partial / name).read_bytes() for name in saved}

    monkeypatch.delenv(STOP_AFTER_ENV)
    code, err = run_cli(args, capsys)
    assert code == 0, err
    assert not partial.exists()

    reference = train_run(str(csv_data), tmp_path / "ref", arch="2x6", epochs=3, batch_size=5,
                          test_fraction=0.25, chunk_size=4, progress=False)
    got, want = load_file(str(out / "networks.safetensors")), load_file(str(reference / "networks.safetensors"))
    assert got.keys() == want.keys()
    for key in want:
        np.testing.assert_array_equal(got[key], want[key])  # bit-identical
    assert json.loads((out / "run.json").read_text()) == json.loads((reference / "run.json").read_text())
    # the chunks saved before the interruption are exactly the matching slices of the final run
    from safetensors.numpy import load as load_bytes

    for name, blob in before.items():
        chunk = load_bytes(blob)
        lo = int(chunk["removed"][0]) + 1
        for key, value in chunk.items():
            np.testing.assert_array_equal(value, want[key][lo : lo + len(value)])


def test_rerun_same_command_is_noop_and_keeps_later_stages(tmp_path, csv_data, capsys):
    out = tmp_path / "run"
    args = ["train", str(csv_data), "--out", str(out), "--arch", "1x3", "--epochs", "2", "--batch-size", "8", "--no-progress"]
    code, err = run_cli(args, capsys)
    assert code == 0, err
    assert "networks" in err
    (out / "bounds.json").write_text("{}")  # written by a later stage
    stamp = (out / "networks.safetensors").stat().st_mtime_ns
    code, err = run_cli(args, capsys)
    assert code == 0, err
    assert (out / "bounds.json").exists()
    assert (out / "networks.safetensors").stat().st_mtime_ns == stamp


def bad_inputs(tmp_path, csv_data):
    """(name, DATA, extra options) for every bad input the issue lists."""
    garbage = tmp_path / "garbage.csv"
    garbage.write_bytes(b"\x89PNG\r\n\x1a\n\x00\xff\xfe binary")
    ragged = write_csv(tmp_path / "ragged.csv", [(1, 2, 0), (3, 4)])
    nan = write_csv(tmp_path / "nan.csv", [(0.1, "nan", 0), (0.2, 0.3, 1), (0.5, 0.5, 1)])
    inf = write_csv(tmp_path / "inf.csv", [(0.1, "inf", 0), (0.2, 0.3, 1), (0.5, 0.5, 1)])
    single = write_csv(tmp_path / "single.csv", [(0.1, 0.2, 1), (0.2, 0.3, 1), (0.5, 0.5, 1)])
    one_row = write_csv(tmp_path / "one.csv", [(0.1, 0.2, 1)])
    text_feature = write_csv(tmp_path / "text.csv", [(0.1, "abc", 0), (0.2, 0.3, 1)])
    npz_nan = tmp_path / "nan.npz"
    np.savez(npz_nan, X=np.array([[0.1], [np.nan], [0.3]]), y=np.array([0, 1, 1]))
    bad_domain = tmp_path / "domain.json"
    bad_domain.write_text('{"lower": [0], "upper": [1]}')
    return [
        ("missing file", str(tmp_path / "nope.csv"), []),
        ("binary CSV", str(garbage), []),
        ("ragged CSV", str(ragged), []),
        ("non-numeric feature", str(text_feature), ["--test-fraction", "0"]),
        ("unknown label column", str(csv_data), ["--label", "colour"]),
        ("NaN feature", str(nan), ["--test-fraction", "0"]),
        ("inf feature", str(inf), ["--test-fraction", "0"]),
        ("NaN in npz", str(npz_nan), ["--test-fraction", "0"]),
        ("single class", str(single), ["--test-fraction", "0"]),
        ("fewer than 2 rows", str(one_row), ["--test-fraction", "0"]),
        ("unknown arch", str(csv_data), ["--arch", "2y50"]),
        ("cnn on too few features", str(csv_data), ["--arch", "cnn"]),
        ("zero epochs", str(csv_data), ["--epochs", "0"]),
        ("negative batch size", str(csv_data), ["--batch-size", "-3"]),
        ("zero batch size", str(csv_data), ["--batch-size", "0"]),
        ("non-integer epochs", str(csv_data), ["--epochs", "two"]),
        ("test fraction 1", str(csv_data), ["--test-fraction", "1"]),
        ("unknown sklearn set", "sklearn:mnist", []),
        ("domain of wrong length", str(csv_data), ["--domain", str(bad_domain)]),
        ("no cuda", str(csv_data), ["--device", "cuda"]) if not _cuda() else ("bad device", str(csv_data), ["--device", "tpu"]),
    ]


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def test_bad_inputs_one_line_exit_2_no_output(tmp_path, csv_data, capsys):
    for name, data, extra in bad_inputs(tmp_path, csv_data):
        out = tmp_path / "out"
        code, err = run_cli(["train", data, "--out", str(out), "--epochs", "1", "--no-progress", *extra], capsys)
        assert code == 2, (name, err)
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("lucid: error: "), (name, err)
        assert "Traceback" not in err
        assert not out.exists() and not (tmp_path / "out.partial").exists(), name


def test_output_holding_a_different_run_is_an_error(tmp_path, csv_data, capsys):
    out = tmp_path / "run"
    base = ["train", str(csv_data), "--out", str(out), "--arch", "1x3", "--batch-size", "8", "--no-progress"]
    assert run_cli(base + ["--epochs", "1"], capsys)[0] == 0
    meta = (out / "run.json").read_text()
    code, err = run_cli(base + ["--epochs", "2"], capsys)
    assert code == 2 and "holds a different run" in err and len(err.strip().splitlines()) == 1
    assert (out / "run.json").read_text() == meta  # untouched
    assert not (tmp_path / "run.partial").exists()

    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    code, err = run_cli(["train", str(csv_data), "--out", str(other), "--epochs", "1", "--no-progress"], capsys)
    assert code == 2 and "not empty" in err
    assert (other / "notes.txt").read_text() == "mine"


def test_cli_subprocess_error_is_one_line(tmp_path):
    result = subprocess.run([sys.executable, "-m", "lucid", "train", str(tmp_path / "missing.csv"), "--out",
                             str(tmp_path / "r")], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert result.stderr.strip() == f"lucid: error: data file {tmp_path / 'missing.csv'} does not exist"
    assert not (tmp_path / "r").exists()


def test_settings_object_and_keywords_are_one_api(tmp_path, csv_data):
    """`train_run` takes a `TrainSettings`, its fields as keywords, or both (keywords win); an unknown
    option is one error line; the CLI's defaults are the dataclass's."""
    from dataclasses import fields

    from lucid.cli.train import command
    from lucid.training import TrainSettings

    kw = dict(arch="1x3", epochs=2, batch_size=8, progress=False)
    a = train_run(str(csv_data), tmp_path / "a", **kw)
    b = train_run(str(csv_data), tmp_path / "b", TrainSettings(**kw))
    c = train_run(str(csv_data), tmp_path / "c", TrainSettings(**dict(kw, epochs=5)), epochs=2)
    fingerprints = {json.loads((r / "run.json").read_text())["training"]["fingerprint"] for r in (a, b, c)}
    assert len(fingerprints) == 1
    with pytest.raises(LucidError, match=r"^unknown train option\(s\): colour$"):
        train_run(str(csv_data), tmp_path / "d", colour="red")
    with pytest.raises(LucidError, match=r"^--lr must be a positive number, got -1$"):
        TrainSettings(lr=-1)
    defaults = {p.name: p.default for p in command.params}
    for f in fields(TrainSettings):
        assert defaults[f.name] == f.default, f.name
