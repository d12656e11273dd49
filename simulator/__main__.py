"""`python -m simulator` is the same as the `stepsim` command."""

from simulator.cli import entry

entry()
