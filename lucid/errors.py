"""User-facing errors.

Anything the user can cause (bad file, bad option, licence too small) is raised as a
`LucidError`; the CLI prints its message as one line on stderr and exits with status 2.
Internal bugs stay ordinary exceptions so they are never mistaken for bad input.
"""


class LucidError(Exception):
    """An error caused by the user's input or environment, shown as one line."""

    exit_code = 2


class SolverError(LucidError):
    """A MILP backend failed in a way the user can act on (missing package, licence, ...)."""


class UnsoundSolverResult(Exception):
    """A solver's proved bound contradicts a replayed witness: never report that bound."""
