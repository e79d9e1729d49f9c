"""Process-group liveness: a group whose only members are zombies is finished, not alive."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from evolve.agent.process import group_alive, kill_group


def _state(pid: int) -> str:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rfind(")") + 2 :].split()[0]


def test_a_group_of_only_zombies_is_not_alive_and_is_not_waited_on() -> None:
    proc = subprocess.Popen(["true"], start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        while _state(proc.pid) != "Z":  # exited, deliberately not reaped: a zombie still in its group
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert not group_alive(proc.pid)
        started = time.monotonic()
        kill_group(proc.pid, grace_s=5.0)
        assert time.monotonic() - started < 2.0  # no grace period spent on a zombie
    finally:
        proc.wait()
    assert not group_alive(proc.pid)


def test_a_group_with_a_running_member_is_alive_until_killed() -> None:
    proc = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        assert group_alive(proc.pid)
        kill_group(proc.pid, grace_s=5.0, reap=proc.poll)
        assert not group_alive(proc.pid)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
