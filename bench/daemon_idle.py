"""CPU and memory of an idle ``evolve daemon``: nothing due for the whole window.

Starts ``python -m evolve --repo R daemon`` the way the systemd unit does (``Type=notify``,
``WatchdogSec=60``: a ``$NOTIFY_SOCKET`` this script reads, ``WATCHDOG_USEC=60000000``) on a git
repository whose ``schedule.cron`` is not due during the window, waits for READY=1, then samples
``/proc/<pid>`` for ``--minutes`` (default 10): CPU time (every thread's, from ``schedstat`` in ns,
plus any waited-for children), RSS, threads and context switches (every thread's). Prints CPU as
seconds and as a percentage of one core, and what the daemon sent to systemd. Exits 1 when the
daemon dies, fires, or does not get READY.

    python bench/daemon_idle.py [--minutes 10]
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    """CPU time of every thread, in ns (schedstat), plus waited-for children (clock ticks, from stat)."""
    ns = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            ns += int((task / "schedstat").read_text().split()[0])
        except (FileNotFoundError, ProcessLookupError):
            pass  # a thread that just ended
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    cutime, cstime = (int(x) for x in fields[13:15])
    return ns / 1e9 + (cutime + cstime) / TICK


def status(pid: int) -> dict[str, int]:
    """Memory and threads of the process; context switches summed over its threads (the daemon has several)."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM", "Threads"):
            out[key] = int(value.split()[0])
    out["voluntary_ctxt_switches"] = out["nonvoluntary_ctxt_switches"] = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            lines = (task / "status").read_text().splitlines()
        except (FileNotFoundError, ProcessLookupError):
            continue  # a thread that just ended
        for line in lines:
            key, _, value = line.partition(":")
            if key in ("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches"):
                out[key] += int(value.split()[0])
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=10.0)
    args = ap.parse_args(argv)
    window = args.minutes * 60

    with tempfile.TemporaryDirectory(prefix="evolve-daemon-idle-") as tmp:
        root = Path(tmp)
        repo = root / "repo"
        repo.mkdir()
        subprocess.run(["git", "init", "-q", str(repo)], check=True)
        (repo / ".agents" / "evolve").mkdir(parents=True)
        (repo / ".agents" / ".gitignore").write_text("*\n")
        month = 7 if time.gmtime().tm_mon == 1 else 1  # never due in the window
        (repo / ".agents" / "evolve" / "config.toml").write_text(
            f'[schedule]\ncron = "0 0 1 {month} *"\ntimezone = "UTC"\n\n[agent]\nrunner = "command"\n'
            f'argv = ["false"]\n')
        sock_path = root / "notify.sock"
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.bind(str(sock_path))
        sock.settimeout(0.5)
        env = {k: v for k, v in os.environ.items() if not k.startswith("EVOLVE_")}
        env.update(XDG_CONFIG_HOME=str(root / "xdg"), NOTIFY_SOCKET=str(sock_path), WATCHDOG_USEC="60000000")
        log = open(root / "daemon.log", "wb")  # noqa: SIM115
        proc = subprocess.Popen([sys.executable, "-m", "evolve", "--repo", str(repo), "daemon"],
                                stdout=log, stderr=subprocess.STDOUT, env=env)
        messages: list[str] = []

        def drain(until: float) -> None:
            while time.monotonic() < until:
                try:
                    messages.append(sock.recv(4096).decode(errors="replace"))
                except TimeoutError:
                    pass
                if proc.poll() is not None:
                    return

        t_start = time.monotonic()
        while not any("READY=1" in m for m in messages) and time.monotonic() - t_start < 30 and proc.poll() is None:
            drain(time.monotonic() + 0.5)
        ready_s = time.monotonic() - t_start
        if not any("READY=1" in m for m in messages):
            proc.kill()
            print(f"FAIL: no READY=1 within {ready_s:.0f}s; exit {proc.poll()}")
            print((root / "daemon.log").read_text()[-2000:])
            return 1
        drain(time.monotonic() + 5)  # let start-up settle
        c0, s0, t0 = cpu_s(proc.pid), status(proc.pid), time.monotonic()
        before = len(messages)
        peak_rss = s0["VmRSS"]
        print(f"python {sys.version.split()[0]}, {os.cpu_count()} cpus; daemon pid {proc.pid} READY after "
              f"{ready_s:.2f}s; start-up CPU {c0:.2f}s; idle window {window / 60:g} min", flush=True)
        while time.monotonic() - t0 < window and proc.poll() is None:
            drain(min(t0 + window, time.monotonic() + 60))
            if proc.poll() is None:
                peak_rss = max(peak_rss, status(proc.pid)["VmRSS"])
                print(f"  {time.monotonic() - t0:6.0f}s  cpu {cpu_s(proc.pid) - c0:6.3f}s", flush=True)
        if proc.poll() is not None:
            print(f"FAIL: the daemon exited ({proc.returncode}) during the window")
            print((root / "daemon.log").read_text()[-2000:])
            return 1
        c1, s1, t1 = cpu_s(proc.pid), status(proc.pid), time.monotonic()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=30)
        log.close()
        sock.close()
        idle = messages[before:]
        fired = (repo / ".agents" / "evolve" / "cycle-history.jsonl").exists()
        used, span = c1 - c0, t1 - t0
        print(f"\nidle {span:.0f}s: CPU {used:.3f}s = {100 * used / span:.4f}% of one core "
              f"({1000 * used / (span / 60):.1f} ms per minute)")
        print(f"RSS {s1['VmRSS'] / 1024:.1f} MB (peak in window {peak_rss / 1024:.1f} MB, high-water "
              f"{s1['VmHWM'] / 1024:.1f} MB); threads {s1['Threads']}")
        vol = s1["voluntary_ctxt_switches"] - s0["voluntary_ctxt_switches"]
        nonvol = s1["nonvoluntary_ctxt_switches"] - s0["nonvoluntary_ctxt_switches"]
        print(f"context switches in the window: {vol} voluntary ({vol / (span / 60):.1f}/min), {nonvol} involuntary")
        print(f"sd_notify datagrams in the window: {len(idle)} "
              f"({sum('WATCHDOG=1' in m for m in idle)} WATCHDOG=1); exit on SIGTERM: {code}")
        if fired:
            print("FAIL: the daemon fired during an idle window")
            return 1
        return 0


if __name__ == "__main__":
    sys.exit(main())
