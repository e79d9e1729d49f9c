"""pytest wiring: the fixtures live in :mod:`support` so test modules can import its helpers."""

from support import cli, env, fire_inproc  # noqa: F401  (fixtures)
