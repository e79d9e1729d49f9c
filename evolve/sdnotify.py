"""systemd notifications (sd_notify(3)) over ``$NOTIFY_SOCKET`` with the standard library only.

``Type=notify`` units learn readiness, liveness (the watchdog), a one-line status and shutdown from
these datagrams. Without ``$NOTIFY_SOCKET`` every call is a no-op, so the daemon runs the same
under systemd, in a terminal or in a test.
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Mapping

# Variables that belong to this process only: children (the agent) must not notify on our behalf.
NOTIFY_VARS = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")


def _address(raw: str) -> str | None:
    if raw.startswith("@"):
        return "\0" + raw[1:]  # abstract namespace
    if raw.startswith("/"):
        return raw
    return None  # vsock: and other transports are not needed here


class Notifier:
    def __init__(self, env: Mapping[str, str] | None = None) -> None:
        env = os.environ if env is None else env
        self.address = _address(env.get("NOTIFY_SOCKET", ""))
        self.watchdog_interval_s = _watchdog_interval_s(env)
        self._lock = threading.Lock()
        self._last_status: str | None = None
        self.sent = 0
        self.errors = 0

    @property
    def enabled(self) -> bool:
        return self.address is not None

    def send(self, message: str) -> bool:
        """One datagram; failures are counted, never raised (systemd may be gone during shutdown)."""
        if self.address is None:
            return False
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
                sock.sendto(message.encode("utf-8", "replace"), self.address)
        except OSError:
            self.errors += 1
            return False
        self.sent += 1
        return True

    def ready(self, status: str = "") -> bool:
        return self.send("READY=1" + (f"\nSTATUS={status}" if status else ""))

    def watchdog(self) -> bool:
        return self.send("WATCHDOG=1") if self.watchdog_interval_s else False

    def status(self, text: str) -> bool:
        """STATUS=, sent only when it changed (it is shown by ``systemctl status``)."""
        line = " ".join(text.split())
        with self._lock:
            if line == self._last_status:
                return False
            self._last_status = line
        return self.send(f"STATUS={line}")

    def stopping(self, status: str = "") -> bool:
        return self.send("STOPPING=1" + (f"\nSTATUS={status}" if status else ""))


def _watchdog_interval_s(env: Mapping[str, str]) -> float | None:
    """Half of ``$WATCHDOG_USEC`` in seconds, when the watchdog is meant for this process."""
    try:
        usec = int(env.get("WATCHDOG_USEC", "0"))
    except ValueError:
        return None
    pid = env.get("WATCHDOG_PID")
    if usec <= 0 or (pid and pid != str(os.getpid())):
        return None
    return usec / 2 / 1_000_000


def child_env(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` without the notification variables."""
    return {k: v for k, v in env.items() if k not in NOTIFY_VARS}
