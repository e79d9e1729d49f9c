"""Named points where the crash-consistency harness makes this process die, as SIGKILL or a power
cut would, at exactly the moment it wants to test (``tests/test_crash_harness.py``).

``EVOLVE_CRASHPOINT=name[:n]`` kills the process with SIGKILL the n-th time (default: the first) it
reaches ``name``. Unset, as it always is outside that harness, :func:`reached` is one truth test.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable

ENV = "EVOLVE_CRASHPOINT"

_spec = os.environ.get(ENV, "")
_name, _sep, _nth = _spec.rpartition(":")
if not (_sep and _nth.isdigit()):
    _name, _nth = _spec, "1"
_seen = 0


def reached(name: str, before_death: Callable[[], object] | None = None) -> None:
    """Die here if this is the configured point and occurrence; ``before_death`` leaves its mark first
    (e.g. half of a ledger line, as a write cut short by a power loss would)."""
    global _seen
    if not _spec or name != _name:
        return
    _seen += 1
    if _seen == int(_nth):
        if before_death is not None:
            before_death()
        os.kill(os.getpid(), signal.SIGKILL)
