"""User-facing errors.

Anything the user can cause (bad file, bad option, licence too small) is raised as a
`LucidError`; the CLI prints its message as one line on stderr and exits with status 2.
Internal bugs stay ordinary exceptions so they are never mistaken for bad input.
"""

import math


class LucidError(Exception):
    """An error caused by the user's input or environment, shown as one line."""

    exit_code = 2


def non_negative_number(value: object, what: str) -> float:
    """`value` as a float if it is a finite number >= 0; else one line naming `what` and `value`."""
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise LucidError(f"{what} must be a number, got {value!r}") from None
    if not math.isfinite(number) or number < 0:
        raise LucidError(f"{what} must be a finite number >= 0, got {value!r}")
    return number


class SolverError(LucidError):
    """A MILP backend failed in a way the user can act on (missing package, licence, ...)."""


class UnsoundSolverResult(Exception):
    """A solver's proved bound contradicts a replayed witness: never report that bound."""


class InconsistentBounds(LucidError):
    """A proved upper bound fell below a replayed leak: some tier was unsound. Never a result.

    Shown as one line like a user error (the run stops, nothing is written), with its own exit
    status: it is LUCID's failure, not the input's."""

    exit_code = 3
