"""pytest wiring: the fixtures live in :mod:`support` so test modules can import its helpers."""

import sys
from collections.abc import Iterator

import pytest
from support import cli, env, fire_inproc  # noqa: F401  (fixtures)


@pytest.fixture(autouse=True)
def _fresh_logging() -> Iterator[None]:
    """Tests point structlog at temp files; put it back on stdout so no test logs to a closed file."""
    yield
    from evolve import log

    log.configure(json=True, stream=sys.stdout)
