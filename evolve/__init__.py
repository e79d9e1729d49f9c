"""evolve: run a coding agent unattended against a git repository, across its context limits."""

__version__ = "0.1.0"
