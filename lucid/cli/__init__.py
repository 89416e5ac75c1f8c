"""The `lucid` command line.

Each subcommand lives in its own module (`lucid/cli/<name>.py`, or `MODULES[name]`, exposing `command`) and is
imported only when used, so `lucid serve` does not pay for torch/solver imports of `verify`.
Every user error (LucidError or a click usage error) becomes one line on stderr and exit 2.
"""

from __future__ import annotations

import importlib
import sys

import click

from lucid.command_errors import fail
from lucid.errors import LucidError

SUBCOMMANDS = {
    "train": "Train N and every leave-one-out network into a run directory.",
    "verify": "Compute per-class iDP decision bounds (branch-and-bound over hyper-networks).",
    "log": "Render a verification log (table, plot, branch-and-bound tree).",
    "evaluate": "Accuracy/latency of LUCID vs the naive mechanisms on the test split.",
    "serve": "Serve label-only, iDP-protected predictions over HTTP.",
    "budget": "Show the privacy ledger: what each client of `lucid serve` has been given.",
    "demo": "Train, verify and evaluate on a bundled data set, end to end.",
    "report": "Write one self-contained HTML (or Markdown) report of what was proved about a run.",
    "import": "Build a run directory from networks trained elsewhere (ONNX or PyTorch state dicts).",
    "export": "Write a run's networks as ONNX, and singleton iDP queries as ONNX + VNN-LIB.",
}
# `import` is a Python keyword, so the interop pair lives in `<name>_cmd.py`.
MODULES = {"import": "import_cmd", "export": "export_cmd"}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(SUBCOMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in SUBCOMMANDS:
            return None
        path = f"lucid.cli.{MODULES.get(name, name)}"
        try:
            module = importlib.import_module(path)
        except ModuleNotFoundError as exc:
            if exc.name == path:
                return None
            raise
        return module.command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        # Help text comes from the table above so `lucid --help` does not import every module.
        with formatter.section("Commands"):
            formatter.write_dl(list(SUBCOMMANDS.items()))


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="lucid-idp")
def cli() -> None:
    """LUCID: individually differentially private label-only access to a classifier."""


def main(argv: list[str] | None = None) -> None:
    try:
        cli.main(args=argv, prog_name="lucid", standalone_mode=False)
    except LucidError as exc:
        fail(str(exc), exc.exit_code)
    except click.exceptions.Abort:
        click.echo("lucid: interrupted", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        fail(exc.format_message())
    except KeyboardInterrupt:
        click.echo(
            "lucid: interrupted (completed work is saved: re-run the same command to resume; for verify add --resume)",
            err=True,
        )
        sys.exit(130)
