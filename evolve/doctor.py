"""``evolve doctor``: preflight checks, each an OK / WARN / FAIL line with the fix.

Checks: the repository is git; the config is valid; the agent binary is found and runnable (and,
for Claude Code, credentials exist and ``CLAUDECODE`` is unset); the work tracker; the state
directory is writable and on a local filesystem (NFS and other network filesystems break the fire
lock); halt markers; the repository's own program-valued git keys (approved or pinned) and whether the
last fire could make its workspace; what the gate will see (its interpreter imports the worktree's
code; setup, links, copies); autocompact; the schedule (daemon, systemd timer or crontab), and whether
the gate's programs resolve under a scheduled fire's PATH as in this shell. Exit 1 when any check
FAILs, else 0. ``--trust-git-config`` approves the repository's git keys first.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from evolve.status.snapshot import StatusSnapshot

OK, WARN, FAIL = "OK", "WARN", "FAIL"
NETWORK_FS = frozenset({
    "nfs", "nfs4", "cifs", "smb3", "smbfs", "ncpfs", "afs", "9p", "ceph", "glusterfs", "lustre", "gpfs",
    "fuse.sshfs", "fuse.glusterfs", "fuse.s3fs", "fuse.rclone", "fuse.gcsfuse", "davfs", "fuse.davfs2",
})


@dataclass(frozen=True)
class Finding:
    check: str
    level: str
    message: str
    fix: str = ""

    def as_json(self) -> dict[str, str]:
        return {"check": self.check, "level": self.level, "message": self.message, "fix": self.fix}

    def line(self) -> str:
        text = f"{self.level:<4}  {self.check:<12} {self.message}"
        if self.fix and self.level != OK:
            text += f"\n      {'':<12} fix: {self.fix}"
        return text


def _run(argv: list[str], *, cwd: Path | None = None, env: Mapping[str, str] | None = None,
         timeout: float = 15) -> tuple[int | None, str]:
    """(exit code or None when it could not run / timed out, first output line)."""
    try:
        p = subprocess.run(argv, cwd=cwd, env=dict(env) if env is not None else None, capture_output=True,
                           text=True, timeout=timeout, check=False, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return None, f"timed out after {timeout:g}s"
    except OSError as exc:
        return None, str(exc)
    out = (p.stdout.strip() or p.stderr.strip()).splitlines()
    return p.returncode, out[0][:200] if out else ""


def _which(cmd: str, env: Mapping[str, str]) -> str | None:
    if os.sep in cmd:
        return cmd if os.path.isfile(cmd) and os.access(cmd, os.X_OK) else None
    return shutil.which(cmd, path=env.get("PATH"))


# -- filesystem ------------------------------------------------------------------------------


def _unescape_mount(field: str) -> str:
    return field.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n").replace("\\134", "\\")


def fs_type(path: Path, mountinfo: str | None = None) -> str | None:
    """The filesystem type holding ``path`` (longest mount point prefix in /proc/self/mountinfo)."""
    if mountinfo is None:
        try:
            mountinfo = Path("/proc/self/mountinfo").read_text(encoding="utf-8", errors="replace")
        except OSError:
            return None
    target = str(path)
    best, best_type = "", None
    for line in mountinfo.splitlines():
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        fields = left.split()
        rfields = right.split()
        if len(fields) < 5 or not rfields:
            continue
        mp = _unescape_mount(fields[4])
        inside = target == mp or target.startswith(mp.rstrip("/") + "/") or mp == "/"
        if inside and len(mp) >= len(best):
            best, best_type = mp, rfields[0]
    return best_type


def check_state_dir(evolve_dir: Path, mountinfo: str | None = None) -> list[Finding]:
    from evolve.errors import UnsafePathError
    from evolve.store.dirfd import open_dir

    out = []
    try:  # the writers refuse a linked state directory (docs/DESIGN.md §2.0): say so up front
        os.close(open_dir(evolve_dir, create=False))
    except UnsafePathError as exc:
        return [Finding("state dir", FAIL, str(exc),
                        "replace the link with a real directory, or point EVOLVE_DIR at the directory itself")]
    except OSError:
        pass  # absent or unreadable: the probes below say which
    probe_dir = evolve_dir
    existing = evolve_dir
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not evolve_dir.exists():
        if not existing.is_dir():
            return [Finding("state dir", FAIL, f"{evolve_dir}: {existing} is not a directory",
                            "point EVOLVE_DIR at a directory, or remove the file in the way")]
        probe_dir = existing
    if not probe_dir.is_dir():
        return [Finding("state dir", FAIL, f"{probe_dir} is not a directory", "remove it, then run `evolve init`")]
    try:
        fd, tmp = tempfile.mkstemp(prefix=".doctor-", dir=probe_dir)
        os.close(fd)
        os.unlink(tmp)
    except OSError as exc:
        return [Finding("state dir", FAIL, f"{probe_dir} is not writable ({exc.strerror})",
                        f"make {probe_dir} writable by this user (chown/chmod), or set EVOLVE_DIR")]
    where = f"{evolve_dir} writable" if probe_dir == evolve_dir else f"{evolve_dir} absent; {probe_dir} writable"
    if probe_dir == evolve_dir:
        out.append(Finding("state dir", OK, where))
    else:
        out.append(Finding("state dir", WARN, where, "run `evolve init` (the first fire also creates it)"))
    kind = fs_type(probe_dir.resolve(), mountinfo)
    if kind is None:
        out.append(Finding("filesystem", WARN, "filesystem type unknown (no /proc/self/mountinfo)",
                           "keep .agents/evolve on a local disk: the fire lock needs local flock"))
    elif kind in NETWORK_FS or kind.startswith("nfs"):
        out.append(Finding("filesystem", WARN, f"{probe_dir} is on {kind}, a network filesystem",
                           "flock is unreliable there: put the repo (or EVOLVE_DIR) on a local disk"))
    else:
        out.append(Finding("filesystem", OK, f"{kind} (local)"))
    return out


# -- the agent -------------------------------------------------------------------------------


def _claude_credentials(env: Mapping[str, str]) -> str | None:
    for name in ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "CLAUDE_CODE_OAUTH_TOKEN"):
        if env.get(name):
            return f"${name}"
    if env.get("CLAUDE_CODE_USE_BEDROCK") or env.get("CLAUDE_CODE_USE_VERTEX"):
        return "cloud provider env"
    config_dir = Path(env["CLAUDE_CONFIG_DIR"]) if env.get("CLAUDE_CONFIG_DIR") else Path(
        env.get("HOME") or Path.home()) / ".claude"
    if (config_dir / ".credentials.json").is_file():
        return str(config_dir / ".credentials.json")
    for settings in (config_dir / "settings.json",):
        try:
            import orjson

            obj = orjson.loads(settings.read_bytes())
        except Exception:
            continue
        if isinstance(obj, dict) and (obj.get("apiKeyHelper") or (obj.get("env") or {}).get("ANTHROPIC_API_KEY")):
            return f"{settings} (apiKeyHelper/env)"
    return None


def check_agent(cfg: Any, repo: Path, env: Mapping[str, str], run: Callable[..., tuple[int | None, str]] = _run
                ) -> list[Finding]:
    from evolve.agent import preflight

    a = cfg.agent
    out: list[Finding] = []
    problems, path = preflight.check(a, env, worktree=cfg.git.isolation == "worktree")  # what every fire checks
    # With the binary found, a problem is the CLI's own configuration (Codex, Gemini): shown as such,
    # beside the CLI's version.
    out.extend(Finding("agent" if path is None else "agent config", FAIL, p.message, p.fix) for p in problems)
    if a.runner == "http":
        if not problems:
            out.append(Finding("agent", OK, f"http runner, {a.base_url}"))
        if not env.get(a.api_key_env):
            out.append(Finding("agent auth", WARN, f"${a.api_key_env} is not set",
                               f"export {a.api_key_env} in the service environment (or change [agent] api_key_env)"))
        return out
    if path is None:
        return out
    binary = a.argv[0]
    if a.runner == "claude":
        code, first = run([path, *a.argv[1:], "--version"], cwd=repo, env={k: v for k, v in env.items()
                                                                            if k != "CLAUDECODE"})
        if code != 0:
            out.append(Finding("agent", FAIL, f"`{binary} --version` failed: {first or 'exit ' + str(code)}",
                               "reinstall Claude Code, or check that node is on PATH"))
        else:
            out.append(Finding("agent", OK, f"{path} ({first})"))
        cred = _claude_credentials(env)
        if cred:
            out.append(Finding("agent auth", OK, f"credentials: {cred}"))
        else:
            out.append(Finding("agent auth", WARN,
                               "no Claude Code credentials found (\"Not logged in\" fails silently)",
                               "run `claude` once as this user and /login, or set ANTHROPIC_API_KEY for the service"))
    elif a.runner in ("codex", "gemini"):
        out += check_cli_runner(cfg, path, repo, env, run, config_failed=bool(problems))
    else:
        out.append(Finding("agent", OK, f"command runner: {path}"))
    return out




def check_cli_runner(cfg: Any, path: str, repo: Path, env: Mapping[str, str],
                     run: Callable[..., tuple[int | None, str]] = _run, *, config_failed: bool = False
                     ) -> list[Finding]:
    """Codex and Gemini: version, the runner's own configuration (provider config, auth, a sandbox or
    approval mode that allows edits: ``config_failed`` when :func:`evolve.agent.preflight.check` already
    reported it), and the CLI's telemetry (reported; off is the operator's call)."""
    from evolve.agent import preflight

    a = cfg.agent
    out: list[Finding] = []
    code, first = run([path, *a.argv[1:], "--version"], cwd=repo, env=dict(env))
    if code != 0:
        out.append(Finding("agent", FAIL, f"`{a.argv[0]} --version` failed: {first or 'exit ' + str(code)}",
                           f"reinstall {preflight.NPM[a.runner]}, or check that node is on PATH"))
    else:
        out.append(Finding("agent", OK, f"{path} ({first})"))
    if not config_failed:
        mode = (preflight.codex_sandbox(a.permission_mode) if a.runner == "codex"
                else preflight.gemini_approval_mode(a.permission_mode))
        where = a.base_url or "the CLI's own provider config"
        out.append(Finding("agent config", OK, f"{a.runner}: {where}; edits allowed ({mode})"))
    out.append(_telemetry(a.runner, env))
    return out


def _telemetry(runner: str, env: Mapping[str, str]) -> Finding:
    import json
    import tomllib

    from evolve.agent.preflight import codex_home, gemini_home

    if runner == "codex":
        home = codex_home(env)
        try:
            with open(home / "config.toml", "rb") as fh:
                on = (tomllib.load(fh).get("analytics") or {}).get("enabled", True) is not False
        except (OSError, tomllib.TOMLDecodeError, AttributeError):
            on = True
        how = f"[analytics] enabled = false in {home}/config.toml"
    else:
        settings = gemini_home(env) / "settings.json"
        try:
            obj = json.loads(settings.read_bytes())
            on = (obj.get("privacy") or {}).get("usageStatisticsEnabled", True) is not False
        except (OSError, ValueError, AttributeError):
            on = True
        how = f'"privacy": {{"usageStatisticsEnabled": false}} in {settings}'
    if on:
        # Reported, not failed: evolve needs nothing from it either way; unattended operators may want it off.
        return Finding("agent telemetry", OK, f"{runner} usage statistics on (the CLI's default); to turn off: {how}")
    return Finding("agent telemetry", OK, f"{runner} usage statistics off")


def check_claudecode(env: Mapping[str, str]) -> Finding:
    if env.get("CLAUDECODE"):
        return Finding("CLAUDECODE", WARN, "CLAUDECODE is set: this shell runs inside a Claude Code session",
                       "run evolve from a plain shell, cron or systemd (evolve strips it from the agent's env)")
    return Finding("CLAUDECODE", OK, "not set")


# -- the rest ----------------------------------------------------------------------------------


def check_tracker(cfg: Any, repo: Path, env: Mapping[str, str]) -> Finding:
    argv = list(cfg.work.beads_command)
    if not argv:
        return Finding("tracker", OK, "disabled ([work] beads_command = [])")
    tool = _which(argv[0], env)
    if tool is None and argv[0] == "bd":
        tool = _which("br", env)
        if tool is not None:
            argv = ["br", *argv[1:]]
    if tool is None:
        has_beads = (repo / ".beads").is_dir()
        level = FAIL if has_beads else WARN
        msg = f"{argv[0]!r} not found" + (" but the repo has .beads/" if has_beads else "; the beads rung stays empty")
        return Finding("tracker", level, msg,
                       "install beads (bd) or set [work] beads_command; harvested work and GOALS still run")
    code, first = _run([tool, *argv[1:]], cwd=repo, env=env, timeout=cfg.work.probe_timeout_s)
    if code != 0:
        return Finding("tracker", FAIL, f"`{' '.join(argv)}` failed: {first or 'exit ' + str(code)}",
                       "run it by hand in the repo and fix what it says (e.g. `bd init`)")
    return Finding("tracker", OK, f"{tool}")


def check_workspace(paths: Any, cfg: Any, env: Mapping[str, str]) -> list[Finding]:
    """What the gate will see (docs/DESIGN.md §8.4): whether it tests the worktree's code, the worktree's
    setup, links and copies; each problem with the exact ``[workspace]`` fix. Read-only."""
    from evolve.cycle import setup as ws_setup
    from evolve.cycle import workspace
    from evolve.git.run import GitError, GitPolicy

    if not cfg.gate.commands and not (cfg.workspace.setup or cfg.workspace.link or cfg.workspace.copy):
        return [Finding("gate sees", OK, "no gate commands ([gate] commands = [])")]
    try:
        ws = workspace.open_workspace(paths.repo, paths, cfg.git, GitPolicy(), _NullLog())
        shown, verdict = ws_setup.Preparer(paths, cfg, env, _NullLog()).describe(ws)
    except (GitError, OSError) as exc:
        return [Finding("gate sees", WARN, f"cannot look at the worktree: {exc}"[:300], "run `evolve fire --dry-run`")]
    out: list[Finding] = []
    setup_state = str(shown["setup"].get("state"))
    last = shown["setup"].get("last") or {}
    if last.get("ok") is False:
        failed = last.get("failed") or {}
        out.append(Finding("setup", FAIL, f"the last setup failed: {failed.get('command')!r} {failed.get('detail')}",
                           "fix it (output in .agents/evolve/runs/workspace-setup.log); the next fire runs it again"))
    elif setup_state != "none configured":
        out.append(Finding("setup", OK, setup_state))
    for link in shown["links"]:
        level = OK if link["state"] in ("linked", "not yet") else WARN
        out.append(Finding("link", level, f"{link['path']} -> {link['target']}: {link['state']}",
                           "the next fire makes the link again"))
    if verdict is None:
        out.append(Finding("gate sees", WARN, str(shown["gate_sees"]["state"]), "run `evolve fire` (or --dry-run)"))
        return out
    sees = shown["gate_sees"]
    for row in sees.get("commands") or []:
        imports = row.get("imports") or {}
        where = ", ".join(f"{n} from the {s.get('place')}" for n, s in imports.items()) or "no project names probed"
        interp = f" ({row['interpreter']})" if row.get("interpreter") else ""
        out.append(Finding("gate sees", OK, f"{row['command']}{interp}: {where}"))
    refusing = verdict.refusing
    for p in refusing:
        out.append(Finding("gate sees", FAIL if cfg.workspace.probe else WARN, p.message,
                           p.fix + ("" if cfg.workspace.probe else " ([workspace] probe = false: fires go on)")))
    for p in verdict.notes:
        out.append(Finding("gate sees", WARN, p.message, p.fix))
    if not refusing and any(r.get("imports") for r in sees.get("commands") or []):
        out.append(Finding("gate sees", OK, f"the gate tests the worktree's code (PATH starts {_first_path(sees)})"))
    return out


def _first_path(sees: Mapping[str, Any]) -> str:
    return str(sees.get("PATH") or "").split(os.pathsep)[0][:200]


class _NullLog:
    """doctor logs nothing: what it finds is its output."""

    def __getattr__(self, name: str) -> Callable[..., None]:
        return lambda *a, **k: None


def check_sandbox(cfg: Any, env: Mapping[str, str]) -> Finding:
    """Which sandbox a fire would run the agent and the gate in (docs/DESIGN.md §8.6): bwrap is started here,
    as each fire starts it, so a host that refuses its namespaces is seen."""
    from evolve import sandbox

    sb = cfg.sandbox
    found = sandbox.Probe(None) if sb.mode == "off" else sandbox.probe(env, sb.network)
    d = sandbox.decide(sb.mode, sb.network, found)
    if d.refuse:
        return Finding("sandbox", FAIL, d.refuse, "fires exit 78 until then")
    if d.warning:
        return Finding("sandbox", WARN, d.warning, sandbox.INSTALL)
    return Finding("sandbox", OK, d.label)


def check_markers(snap: StatusSnapshot | None) -> list[Finding]:
    """Markers that halt fires and an open breaker (nothing when the state could not be read)."""
    if snap is None:
        return []
    out = []
    fixes = {"KILL": "evolve resume --kill", "KILL(global)": "evolve resume --kill", "STOP": "evolve resume"}
    for name, m in snap.markers.items():
        if name in fixes:
            if m.stale:
                out.append(Finding("marker", WARN, f"{name} is older than its TTL and ignored", fixes[name]))
            else:
                out.append(Finding("marker", WARN, f"{name} present: fires halt", fixes[name] + " when ready"))
        elif name == "DORMANT":
            out.append(Finding("marker", WARN, "DORMANT: no work was found three passes in a row",
                               "add work (queue, beads, GOALS); the next fire clears DORMANT by itself"))
    if snap.breaker.state == "open":
        out.append(Finding("breaker", WARN, f"failure breaker open until {snap.breaker.open_until}",
                           "look at `evolve history --result failed`; it closes by itself after the cooldown"))
    return out


def check_autocompact(ac: Mapping[str, Any]) -> Finding:
    """The autocompact preflight of the snapshot (``StatusSnapshot.autocompact``); advisory only."""
    state = str(ac.get("state", "unknown"))
    detail = " ".join(str(ac[k]) for k in ("value", "source", "detail") if ac.get(k))
    text = f"{state}{' (' + detail + ')' if detail else ''}"
    if state == "CONFIGURED":
        return Finding("autocompact", OK, text)
    fix = "evolve setup --autocompact-pct 40 (writes .claude/settings.json); advisory only"
    return Finding("autocompact", WARN, text, fix)


def check_schedule(paths: Any, env: Mapping[str, str]) -> Finding:
    from evolve.status.schedule import cron_next, crontab_lines, daemon_info, systemd_timers
    from evolve.timeutil import utc_iso

    d = daemon_info(paths)
    if d is not None:
        return Finding("schedule", OK, f"evolve daemon pid {d.get('pid')} (next fire {d.get('next_fire_at')})")
    timers = systemd_timers()
    if timers:
        names = ", ".join(f"{t['unit']} ({t['scope']})" for t in timers)
        return Finding("schedule", OK, f"systemd timer(s): {names}")
    lines = crontab_lines(env)
    repo = str(paths.repo)
    mine = [ln for ln in lines if "evolve" in ln and repo in ln]
    if mine:
        nxt = cron_next(lines, repo, time.time())
        when = f" (next fire {utc_iso(nxt[1])})" if nxt else ""
        return Finding("schedule", OK, f"crontab: {mine[0][:160]}{when}")
    if any("evolve" in ln for ln in lines):
        return Finding("schedule", WARN, "a crontab line runs evolve, but not for this repo",
                       f"add `cd {repo} && evolve fire` to the crontab, or `evolve install cron`")
    return Finding("schedule", WARN, "no schedule found (no daemon, systemd timer or crontab line)",
                   "evolve install systemd --user (or cron), or run `evolve daemon`; `evolve fire` by hand works too")


def _scheduled_paths(paths: Any, env: Mapping[str, str], unit_dirs: tuple[Path, ...] | None = None,
                     cron_d: Path = Path("/etc/cron.d")) -> list[tuple[str, str]]:
    """``(where, PATH)`` of each installed trigger for this repository, read from its file: the systemd
    units (user and system) whose WorkingDirectory= is the repository, its crontab line, its ``cron.d``
    file. Reading files only (and ``crontab -l``): cheap enough for every doctor run."""
    from evolve.deploy import cron_fire_path, unit_fire_path
    from evolve.status.schedule import cron_line_for, crontab_lines

    repo = str(paths.repo)
    if unit_dirs is None:
        config = Path(env.get("XDG_CONFIG_HOME") or Path(env.get("HOME") or Path.home()) / ".config")
        unit_dirs = (config / "systemd" / "user", Path("/etc/systemd/system"))
    found: list[tuple[str, str]] = []
    for d in unit_dirs:
        for unit in sorted([*d.glob("evolve@*.service"), *d.glob("evolve-daemon@*.service")]):
            # The unit, then the template's drop-ins and its own (`systemctl edit`), as systemd reads them.
            template = unit.name.split("@", 1)[0] + "@.service.d"
            confs = [c for dd in (d / template, d / f"{unit.name}.d") for c in sorted(dd.glob("*.conf"))]
            try:
                text = "\n".join(f.read_text(encoding="utf-8", errors="replace") for f in (unit, *confs))
            except OSError:
                continue
            workdir, path = unit_fire_path(text)
            if workdir is not None and path is not None and os.path.normpath(workdir) == repo:
                found.append((str(unit), path))
    lines = crontab_lines(env)
    line = cron_line_for(lines, repo)
    if line is not None:
        found.append(("your crontab", cron_fire_path(line, [ln for ln in lines if "=" in ln.split()[0]])))
    for f in sorted(cron_d.glob("evolve-*")):
        try:
            text = [ln for ln in f.read_text(encoding="utf-8", errors="replace").splitlines()
                    if ln.strip() and not ln.lstrip().startswith("#")]
        except OSError:
            continue
        line = cron_line_for(text, repo)
        if line is not None:
            found.append((str(f), cron_fire_path(line, [ln for ln in text if "=" in ln.split()[0]])))
    return found


def _program(name: str, path: str) -> str | None:
    """Where ``name`` resolves on ``path``, its directory canonical (a venv's ``python`` is a link to the
    system one, and must stay told apart from it; ``/bin`` and ``/usr/bin`` may be one directory)."""
    found = shutil.which(name, path=path)
    return None if found is None else os.path.join(os.path.realpath(os.path.dirname(found)), os.path.basename(found))


def check_scheduled_path(cfg: Any, paths: Any, env: Mapping[str, str], **where: Any) -> list[Finding]:
    """The PATH a scheduled fire gets against this shell's: a gate program (or the agent) that resolves to
    another program under the two is a gate green by hand and red on schedule (issue 22). The PATH is the
    installed unit's or crontab line's, else what `evolve install` would render from this shell."""
    sources = _scheduled_paths(paths, env, **where)
    if not sources:
        from evolve.deploy import shell_fire_path

        sources = [("what `evolve install systemd|cron` would render", shell_fire_path(paths.repo, env))]
    roles = {argv[0]: "gate program" for argv in cfg.gate.commands if argv and "/" not in argv[0]}
    agent = cfg.agent.argv[0] if cfg.agent.runner != "http" and cfg.agent.argv else ""
    if agent and "/" not in agent:
        roles.setdefault(agent, "agent")
    # Under either trigger the fire puts [workspace] path (directories of the agent's tree) first.
    if cfg.git.isolation == "none":
        tree = paths.repo
    else:
        tree = paths.repo / Path(cfg.git.worktree_dir).expanduser() if cfg.git.worktree_dir \
            else paths.evolve_dir / "worktree"
    first = [str(tree / d) for d in cfg.workspace.path]
    shell = env.get("PATH") or os.defpath
    fix = ("run `evolve install ...` again from the shell whose gate is green (it renders that PATH), or pass "
           "--path; or name the program by its absolute path in [gate] commands / [agent] argv")
    out: list[Finding] = []
    same: list[str] = []
    for source, scheduled in dict.fromkeys(sources):
        for name, role in roles.items():
            here = _program(name, ":".join([*first, shell]))
            there = _program(name, ":".join([*first, scheduled]))
            if here == there and here is not None:
                same.append(f"{name!r} ({here})")
                continue
            if here == there and role == "agent":  # found nowhere: the agent check says so
                continue
            if here == there:
                out.append(Finding("sched PATH", WARN, f"{role} {name!r} is on neither this shell's PATH nor a "
                                   f"scheduled fire's ({source}): the gate cannot start",
                                   "install it, or fix [gate] commands"))
                continue
            msg = (f"{role} {name!r}: a scheduled fire runs {there or 'nothing (not found)'}, this shell "
                   f"{here or 'nothing (not found)'} (PATH from {source}: {scheduled})")
            out.append(Finding("sched PATH", WARN, msg, fix))
    if not out:
        what = "same as this shell: " + ", ".join(dict.fromkeys(same)) if same else "no gate program to compare"
        out.append(Finding("sched PATH", OK, f"{what} (PATH from {sources[0][0]})"))
    return out


def check_schedule_config(cfg: Any) -> list[Finding]:
    """``schedule.cron`` and ``schedule.timezone`` as the daemon and ``evolve install`` will read them.

    The config loader takes them as strings; a bad one used to surface only when the daemon started
    (exit 78) or a rendering was refused, so doctor parses them here.
    """
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    from evolve import cronexpr

    out = []
    sched = cfg.schedule
    try:
        cronexpr.parse(sched.cron)
        out.append(Finding("schedule.cron", OK, repr(sched.cron)))
    except ValueError as exc:
        out.append(Finding("schedule.cron", FAIL, f"{sched.cron!r}: {exc}",
                           "five fields (minute hour day month weekday), six with seconds first, or @hourly/@daily;"
                           " e.g. \"*/30 * * * *\""))
    try:
        ZoneInfo(sched.timezone)
        out.append(Finding("schedule.tz", OK, repr(sched.timezone)))
    except (ZoneInfoNotFoundError, ValueError):
        out.append(Finding("schedule.tz", FAIL, f"schedule.timezone {sched.timezone!r} is not a known time zone",
                           "an IANA name such as \"UTC\" or \"Europe/Berlin\" (see /usr/share/zoneinfo)"))
    return out


def _git(repo: Path, *args: str) -> tuple[int | None, str, str]:
    """(exit code or None, first output line, stdout) of evolve's own git (gitrun.run_git: no hooks, no fsmonitor)."""
    from evolve.git.run import GitTimeout, run_git

    try:
        p = run_git(repo, *args, timeout=10)
    except GitTimeout:
        return None, "timed out after 10s", ""
    except OSError as exc:
        return None, str(exc), ""
    out = (p.stdout.strip() or p.stderr.strip()).splitlines()
    return p.returncode, out[0][:200] if out else "", p.stdout


LOCK_STALE_S = 600.0  # a git holding index.lock this long with no git process left is gone, not slow


def _git_processes(repo: Path, proc: Path = Path("/proc")) -> list[float]:
    """Start times (epoch s) of running ``git`` processes whose cwd is inside ``repo``."""
    try:
        btime = next(float(ln.split()[1]) for ln in (proc / "stat").read_text().splitlines() if ln.startswith("btime"))
        hz = os.sysconf("SC_CLK_TCK")
    except (OSError, StopIteration, ValueError):
        return []
    top, out = repo.resolve(), []
    for d in proc.iterdir():
        if not d.name.isdigit():
            continue
        try:
            if (d / "comm").read_text().strip() != "git":
                continue
            cwd = Path(os.readlink(d / "cwd"))
            if cwd != top and top not in cwd.parents:
                continue
            ticks = float((d / "stat").read_text().rsplit(")", 1)[1].split()[19])  # field 22: starttime
        except (OSError, ValueError, IndexError):
            continue  # gone, or not ours to read
        out.append(btime + ticks / hz)
    return out


def check_index_lock(repo: Path, now: float | None = None, proc: Path = Path("/proc")) -> Finding | None:
    """A leftover ``index.lock`` (a killed git) makes every commit fail: name it and the fix (issue 15)."""
    code, first, _ = _git(repo, "rev-parse", "--git-path", "index.lock")
    if code != 0 or not first:
        return None
    lock = Path(first) if Path(first).is_absolute() else repo / first
    try:
        mtime = lock.stat().st_mtime
    except OSError:
        return None
    age = (time.time() if now is None else now) - mtime
    starts = _git_processes(repo, proc)
    # Stale: no git runs in the repo, or every one that runs started after the lock was made.
    if not starts or (min(starts) > mtime and age > LOCK_STALE_S):
        return Finding("git", FAIL, f"{lock} exists ({age:.0f}s old) and no git process holds it: "
                       "every commit fails (the last cycle is `failed`, error_class commit_failed)",
                       f"remove it with `rm {lock}` after checking no git is running")
    return Finding("git", WARN, f"{lock} exists ({age:.0f}s old) with git running in the repo",
                   f"if it is still there when no git runs, remove it with `rm {lock}`")


def check_git(repo: Path, env: Mapping[str, str]) -> list[Finding]:
    code, first, _ = _git(repo, "rev-parse", "--show-toplevel")
    if code != 0:
        return [Finding("git", FAIL, f"{repo} is not a git repository ({first})",
                        "run evolve inside a git work tree, or pass --repo PATH (git init if it is new)")]
    out = [Finding("git", OK, f"work tree {first}")]
    code, _, _ = _git(repo, "rev-parse", "--verify", "-q", "HEAD")
    if code != 0:
        out.append(Finding("git", WARN, "no commits yet", "make a first commit: evolve reverts and diffs against HEAD"))
    lock = check_index_lock(repo)
    if lock is not None:
        out.append(lock)
    _, _, status = _git(repo, "status", "--porcelain", "--untracked-files=no")
    dirty = [ln for ln in status.splitlines() if ln.strip()]
    if dirty:
        out.append(Finding("git", WARN, f"{len(dirty)} tracked file(s) modified",
                           "commit or stash them: evolve never commits paths that were dirty before a cycle"))
    return out


def check_git_config(paths: Any, snap: StatusSnapshot | None = None) -> list[Finding]:
    """The repository's own program-valued git keys (docs/DESIGN.md §8.1): the approved ones evolve's git
    runs, the others it pins (WARN, with the one command that approves them), and whether the last
    fire could make its workspace (FAIL with the cause and the fix when it could not)."""
    from evolve.git import approve, trust
    from evolve.git.run import GitError

    out = []
    try:
        seen = approve.observe(paths.repo, paths.git_trust, trust.roots_of(paths.repo, paths.evolve_dir))
    except (GitError, OSError) as exc:
        return [Finding("git config", WARN, f"cannot read the repository's git config: {exc}"[:300])]
    if seen.trusted:
        out.append(Finding("git config", OK, "evolve's git runs the approved " + ", ".join(
            f"{k} = {' | '.join(v)}" for k, v in seen.trusted.items())))
    if seen.unapproved:
        shown = "; ".join(f"{k} = {' | '.join(v)}" for k, v in seen.unapproved.items())
        out.append(Finding("git config", WARN, f"not approved, so evolve's git does not run them: {shown}",
                           "if these are yours (git-crypt, git lfs install --local): evolve doctor --trust-git-config;"
                           " if not, the agent may have written them: remove them from .git/config"))
    for key, why in seen.refused.items():
        out.append(Finding("git config", WARN, f"{key} is never run by evolve's git: {why}",
                           "set it in your global git config, or point it at a program outside the repository"))
    if not out:
        out.append(Finding("git config", OK, "no program-valued keys in the repository's own config"))
    if snap is not None and snap.workspace:
        from evolve.status.snapshot import workspace_error
        from evolve.store.atomic import read_json

        failed = workspace_error(snap.workspace, read_json(paths.git_trust))
        if failed:
            out.append(Finding("workspace", FAIL, f"the last fire could not make its workspace: {failed[0]}",
                               failed[1]))
    return out


def approve_git_config(paths: Any, cfg: Any | None = None) -> list[Finding]:
    """``evolve doctor --trust-git-config``: approve exactly what the repository's own config holds now
    (the record is replaced), each key and value shown."""
    from evolve.git import approve, trust
    from evolve.git.run import GitError

    more = [Path(cfg.git.worktree_dir).expanduser()] if cfg is not None and cfg.git.worktree_dir else []
    try:
        done = approve.approve(paths.repo, paths.git_trust, trust.roots_of(paths.repo, paths.evolve_dir, *more),
                             by="evolve doctor --trust-git-config")
    except (GitError, OSError) as exc:
        return [Finding("git trust", FAIL, f"cannot approve the repository's git config: {exc}"[:300],
                        "fix what it says and run `evolve doctor --trust-git-config` again")]
    out = [Finding("git trust", OK, f"approved {k} = {' | '.join(v)}") for k, v in done.trusted.items()]
    out += [Finding("git trust", WARN, f"not approved {k}: {why}",
                    "set it in your global git config, or point it at a program outside the repository")
            for k, why in done.refused.items()]
    if not out:
        out.append(Finding("git trust", OK, f"nothing to approve; {paths.git_trust} now trusts no key"))
    return out


def check_trust(paths: Any, loaded: Any) -> list[Finding]:
    """The repository's tracked config (docs/DESIGN.md §8.5): FAIL until the operator trusts its bytes."""
    if loaded.repo is None:
        return []
    if loaded.refusal:
        return [Finding("config trust", FAIL, loaded.refusal + "; none of it applies, fires exit 78",
                        "review it (`evolve trust --show`), then `evolve trust`; or untrack it and keep your own")]
    return [Finding("config trust", OK, f"the repository's {loaded.repo.rel} is trusted (sha256 "
                                        f"{(loaded.repo.sha256 or '')[:12]})")]


def check_guard(paths: Any) -> list[Finding]:
    """A change the guard refused that is still as it was left (docs/DESIGN.md §8.5): fires exit 78."""
    from evolve.cycle import guard

    left = guard.outstanding(paths)
    if not left:
        return []
    return [Finding("guard", FAIL, guard.describe(left) + "; fires exit 78 until then",
                    "look at the change: put it back, or `evolve trust` to make it yours")]


def check_agent_settings(paths: Any, cfg: Any) -> list[Finding]:
    """Which of its CLI's project settings the agent gets (§8.5): the repository's only once trusted."""
    from evolve.agent import settings as agentsettings

    s = agentsettings.for_config(paths, cfg)
    if cfg.agent.runner not in agentsettings.FILES:
        return []
    if s.refusal:
        return [Finding("agent settings", FAIL, s.refusal, "review it (`evolve trust --show`), then `evolve trust`")]
    if s.untrusted:
        return [Finding("agent settings", WARN, s.describe(),
                        "review them (`evolve trust --show`), then `evolve trust`")]
    return [Finding("agent settings", OK, s.describe())]


def diagnose(repo: Path, env: Mapping[str, str]) -> list[Finding]:
    """Every check, in order; never raises for a broken setup (that is what it reports)."""
    from evolve import configtrust
    from evolve.config import Config
    from evolve.errors import ConfigError
    from evolve.git import trust
    from evolve.paths import Paths
    from evolve.status.snapshot import read_snapshot

    paths = Paths.for_repo(repo, env=env)
    trust.adopt_legacy(paths.git_trust, paths.git_trust_legacy)
    trust.register(repo, paths.git_trust)  # doctor's git runs what a fire's would (§8.1)
    findings = check_git(repo, env)
    if findings[0].level == FAIL:
        return findings
    try:
        loaded = configtrust.load(paths, env)
        cfg = loaded.cfg
        shown = " + ".join(loaded.layers) if loaded.layers else f"{paths.config} (defaults)"
        findings.append(Finding("config", OK, shown))
        findings += check_trust(paths, loaded)
    except ConfigError as exc:
        cfg = Config()
        findings.append(Finding("config", FAIL, " ".join(str(exc).split())[:300],
                                "fix that key (see .agents/evolve/config.toml comments); fires exit 78 until then"))
    findings += check_guard(paths)
    findings += check_schedule_config(cfg)
    findings += check_agent(cfg, repo, env)
    findings += check_agent_settings(paths, cfg)
    claude = cfg.agent.runner == "claude"  # CLAUDECODE and autocompact concern Claude Code only
    if claude:
        findings.append(check_claudecode(env))
    findings.append(check_tracker(cfg, repo, env))
    findings += check_workspace(paths, cfg, env)
    findings += check_state_dir(paths.evolve_dir)
    findings.append(check_sandbox(cfg, env))
    if cfg.metrics.textfile_dir:
        from evolve.metrics import textfile_dir

        d = textfile_dir(paths, cfg.metrics.textfile_dir)
        ok = d.is_dir() and os.access(d, os.W_OK)
        findings.append(Finding("metrics", OK if ok else FAIL, f"textfile_dir {d}" + ("" if ok else " not writable"),
                                "create it and make it writable, or clear [metrics] textfile_dir"))
    if cfg.notify.command:
        tool = _which(cfg.notify.command[0], env)
        findings.append(Finding("notify", OK if tool else FAIL, f"command {cfg.notify.command[0]!r}"
                                + ("" if tool else " not found"), "fix [notify] command (an argv, not a shell line)"))
    snap = None
    try:
        snap = read_snapshot(paths, recent=1, env=env, probe_schedule=False)
    except Exception as exc:  # a doctor reports, it does not crash
        findings.append(Finding("status", FAIL, f"cannot read the state: {type(exc).__name__}: {exc}"[:300],
                                "look at .agents/evolve/session-state.json and cycle-history.jsonl"))
    findings += check_markers(snap)
    findings += check_git_config(paths, snap)
    if claude:
        findings.append(check_autocompact(snap.autocompact if snap is not None else {}))
    findings.append(check_schedule(paths, env))
    findings += check_scheduled_path(cfg, paths, env)
    return findings


def exit_code(findings: list[Finding]) -> int:
    return 1 if any(f.level == FAIL for f in findings) else 0
