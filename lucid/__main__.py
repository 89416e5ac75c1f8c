"""`python -m lucid`: the `lucid` command line (lucid/cli)."""

from lucid.cli import main

main()
