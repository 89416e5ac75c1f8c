"""How LUCID's command lines end on bad input: one line on stderr and an exit status.

Shared by `lucid` (`lucid.cli`) and `python -m lucid.baselines`, and kept below both: the
baselines are not part of the `lucid` command line and so do not import it (tests/project/test_layering.py).
Apart from `lucid.errors` because it loads click, which the library itself does not need.
"""

from __future__ import annotations

import sys

import click

from lucid.errors import LucidError


def fail(message: str, exit_code: int = LucidError.exit_code) -> None:
    """Print one error line and exit 2 (the contract for every bad input; internal failures that
    must stop a run carry their own status)."""
    click.echo(f"lucid: error: {message}", err=True)
    sys.exit(exit_code)
