"""Test-session settings: one BLAS / torch thread per process.

CI runs two pytest workers on two cores. With the libraries' default of a thread per core, each
worker's small float64 products (and every `python -m lucid` a test starts, which inherits the
environment) spend their time waiting for threads the other worker holds; tiny networks gain
nothing from a second thread. Set before numpy or torch is imported by any test module.
"""

from __future__ import annotations

import os

for _name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_name, "1")
