"""Process-group liveness: a group whose only members are zombies is finished, not alive."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from evolve.procgroup import group_alive, kill_group


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


def test_a_leader_that_exits_leaving_a_child_on_the_pipe_ends_the_run(tmp_path: Path) -> None:
    """An agent that started a background process holding its stdout is done when it exits: its
    output is drained for a moment, the child is killed with the group, and no timeout is reported."""
    import os
    import sys

    from evolve.procgroup import LINGER_S, Limits, run_group

    script = (
        "import subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        "open(sys.argv[1], 'w').write(str(child.pid))\n"
        "print('started the server', flush=True)\n"
    )
    pid_file = tmp_path / "child.pid"
    started = time.monotonic()
    res = run_group([sys.executable, "-c", script, str(pid_file)], cwd=tmp_path, env=dict(os.environ),
                    limits=Limits(timeout_s=60, idle_timeout_s=30))
    took = time.monotonic() - started
    assert res.returncode == 0 and not res.timed_out and not res.interrupted
    assert "started the server" in res.output_tail
    assert took < LINGER_S + 10, took  # not the 30 s idle timeout
    child = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while Path(f"/proc/{child}").exists() and _state(child) != "Z":
        assert time.monotonic() < deadline, "the background child outlived the run"
        time.sleep(0.05)
