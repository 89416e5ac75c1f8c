"""Settings dataclasses from keyword options, and their defaults for the command line.

`VerifySettings` and `TrainSettings` are built the same way from `verify_run(run, **options)`,
`train_run(..., **options)` and the command lines: an unknown option name is one error line, and
every default is written once, in its dataclass (`default_of`).
"""

from __future__ import annotations

from dataclasses import MISSING, fields
from typing import Any

from lucid.errors import LucidError


def default_of(settings_class: type, name: str) -> Any:
    """The default of field `name` of a settings dataclass, for a command-line option to use and show:
    the dataclass is then the one place that default is written."""
    for f in fields(settings_class):
        if f.name == name and f.default is not MISSING:
            return f.default
    raise ValueError(f"{settings_class.__name__} has no field {name!r} with a default")


def settings_from_options(settings_class: type, what: str, options: dict[str, Any]) -> Any:
    """A settings dataclass from keyword options; an unknown name is one error line (naming `what`
    options), not a TypeError."""
    unknown = sorted(set(options) - {f.name for f in fields(settings_class)})
    if unknown:
        raise LucidError(f"unknown {what} option(s): {', '.join(unknown)}")
    return settings_class(**options)


def settings_with_options(settings: Any, what: str, options: dict[str, Any]) -> Any:
    """`settings` with some fields replaced by keyword options, checked like `settings_from_options`."""
    current = {f.name: getattr(settings, f.name) for f in fields(settings)}
    return settings_from_options(type(settings), what, {**current, **options})
