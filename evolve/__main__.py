"""``python -m evolve`` entry point."""

from evolve.cli import main

raise SystemExit(main())
