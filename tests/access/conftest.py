"""The access tests' fixtures: the synthetic run most of them answer from."""

from __future__ import annotations

import pytest
from serve_helpers import write_run


@pytest.fixture()
def run_dir(tmp_path):
    """The 2-feature, 3-class run of serve_helpers.write_run (LABELS, OFFSET, SCALE; BOUNDS 0.3,
    none and -1.0: classes 0 and 2 released above a confidence, class 1 always noised). A module
    with a run of its own (test_evaluate.py, test_memo_postgres.py) defines its own `run_dir`."""
    return write_run(tmp_path / "run")
