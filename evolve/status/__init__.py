"""``evolve status`` and ``evolve history``: read-only views of the on-disk state.

- :mod:`evolve.status.snapshot`: the read model, :class:`StatusSnapshot` (metrics, report, doctor);
- :mod:`evolve.status.views`: the terminal views of status and history;
- :mod:`evolve.status.history`: the ledger entries ``evolve history`` shows;
- :mod:`evolve.status.schedule`: the daemon's record (its one writer, ``publish_daemon``) and systemd timers.

Every module here imports only what reading needs (no structlog, no APScheduler, no subprocess
unless systemd runs), so ``evolve status`` answers fast.
"""

from evolve.status.history import history, parse_since
from evolve.status.schedule import (
    NextFire,
    daemon_info,
    parse_next_elapse,
    parse_timer_units,
    publish_daemon,
    systemd_timers,
)
from evolve.status.snapshot import (
    DEGRADED,
    DORMANT,
    HALTED,
    HEALTHY,
    TODAY_SCAN_CAP,
    StatusSnapshot,
    autocompact_info,
    load_config,
    read_snapshot,
    status,
)
from evolve.status.views import SPARKS, render_history, render_status, sparkline, term_safe

__all__ = [
    "DEGRADED",
    "DORMANT",
    "HALTED",
    "HEALTHY",
    "SPARKS",
    "TODAY_SCAN_CAP",
    "NextFire",
    "StatusSnapshot",
    "autocompact_info",
    "daemon_info",
    "history",
    "load_config",
    "parse_next_elapse",
    "parse_since",
    "parse_timer_units",
    "publish_daemon",
    "read_snapshot",
    "render_history",
    "render_status",
    "sparkline",
    "status",
    "systemd_timers",
    "term_safe",
]
