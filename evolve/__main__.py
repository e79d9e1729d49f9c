"""``python -m evolve`` entry point."""

from evolve.cli import entry

entry()
