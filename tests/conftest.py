"""Test-session settings: one BLAS / torch thread per process, and the shared helper modules.

CI runs two pytest workers on two cores. With the libraries' default of a thread per core, each
worker's small float64 products (and every `python -m lucid` a test starts, which inherits the
environment) spend their time waiting for threads the other worker holds; tiny networks gain
nothing from a second thread. Set before numpy or torch is imported by any test module.

Layout: the tests are grouped by the part of `lucid` they test (tests/bounds, tests/verify,
tests/access, tests/solvers, tests/training, tests/baselines, tests/project), each folder's
shared fixtures in its conftest.py. tests/helpers/ holds the modules several folders import
(`from bab_fixtures import write_tiny_run`, the exact references, the synthetic runs); it is put
on sys.path here. The folders are not packages (pytest's default import mode puts each test
file's folder on sys.path), so every test module's file name must be unique across the folders.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

for _name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_name, "1")

HELPERS = Path(__file__).resolve().parent / "helpers"
if str(HELPERS) not in sys.path:
    sys.path.insert(0, str(HELPERS))


@pytest.fixture()
def one_thread():
    """One torch intra-op thread for the test (a module asks for it with
    `pytestmark = pytest.mark.usefixtures("one_thread")`): tiny networks gain nothing from more,
    and on a busy CI box the synchronisation is very slow."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
