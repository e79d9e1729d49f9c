"""pytest wiring: the fixtures live in :mod:`support` so test modules can import its helpers."""

import sys
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, settings
from support import cli, env, fire_inproc  # noqa: F401  (fixtures)

# The suite runs on a loaded 2-core machine: no property test may fail because an example was slow.
settings.register_profile("evolve", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("evolve")


@pytest.fixture(autouse=True)
def _fresh_logging() -> Iterator[None]:
    """Tests point structlog at temp files; put it back on stdout so no test logs to a closed file."""
    yield
    from evolve import log

    log.configure(json=True, stream=sys.stdout)
