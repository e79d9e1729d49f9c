"""Fills the deploy templates: generic ones for `deploy/`, concrete ones for `evolve install` (pure, no I/O).

``python -m evolve.deploy DIR`` rewrites the generic files under DIR (the repository's ``deploy/``).
"""

from __future__ import annotations

import math
import re
import shlex
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

import orjson

from evolve import cronexpr
from evolve import deploy_templates as tpl
from evolve.config import Config

GENERIC_PATH = "%h/.local/bin:/usr/local/bin:/usr/bin:/bin"
_PLACEHOLDER = re.compile(r"\{\{(\w+)\}\}")
_SAFE_SHELL = re.compile(r"^[A-Za-z0-9_/.:@+=,-]+$")
_UNSAFE_UNIT = re.compile(r"[\s\"'\\;]")
RENDERED_NOTE = "# Rendered by `evolve install` for {repo}; run it again after changes.\n"
USER_SANDBOX_NOTE = "\n# A user unit gets it only with unprivileged user namespaces: on 226/NAMESPACE drop these lines."


@dataclass(frozen=True)
class Target:
    """Everything a template needs about one repository and where it runs."""

    name: str  # unit instance, cron tag, Kubernetes name
    repo: str  # absolute path, or "%f" (the unescaped instance path) in the generic units
    state_dir: str  # evolve's state directory (EVOLVE_DIR), absolute
    evolve: str  # the command that runs evolve
    path: str  # PATH for the fire: evolve's and the agent's directories first
    home: str  # "%h" in the generic units
    cron: str  # schedule.cron
    timezone: str = "UTC"
    jitter_s: int = 0
    grace_s: float = 30
    runtime_cap_s: int = 6900
    user: str | None = None  # system units: User=
    user_mode: bool = False  # a user unit (systemctl --user) or a user crontab
    generic: bool = False  # the `deploy/` templates, not a rendering for one repo
    image: str = "evolve:latest"
    git_url: str = ""
    extra_env: Mapping[str, str] = field(default_factory=dict)


def fill(template: str, values: Mapping[str, object]) -> str:
    def sub(m: re.Match[str]) -> str:
        return str(values[m.group(1)])

    return _PLACEHOLDER.sub(sub, template)


def runtime_cap_s(cfg: Config) -> int:
    """The longest a legitimate fire can take: its time budget plus one last agent run and gate."""
    budget = cfg.fire.max_minutes * 60 if cfg.fire.max_minutes else 6 * 3600
    total = budget + cfg.agent.timeout_s + cfg.gate.timeout_s
    return int(math.ceil(total / 60) * 60)


def randomized_delay_s(spec: cronexpr.CronSpec, t: Target) -> int:
    """``schedule.jitter_s``, or a tenth of the interval (at most 120 s): a fleet never fires in one second."""
    if t.jitter_s:
        return t.jitter_s
    return int(min(120, cronexpr.max_interval_s(spec, t.timezone or "UTC") / 10))


def _unit_value(value: str) -> str:
    """A path for a unit file: ``%`` is a specifier and ``$`` a variable there."""
    if _UNSAFE_UNIT.search(value):
        raise ValueError(f"{value!r}: a path with spaces, quotes or backslashes cannot go into a unit file")
    return value.replace("%", "%%").replace("$", "$$")


def _unit_ctx(t: Target) -> dict[str, object]:
    u = (lambda v: v) if t.generic else _unit_value
    repo, home = u(t.repo), u(t.home)
    rw = [repo, f"-{home}/.claude", f"-{home}/.claude.json"]
    if not t.generic and not (t.state_dir + "/").startswith(t.repo + "/"):
        rw.insert(1, u(t.state_dir))
    if t.user_mode:
        user = ""
    elif t.generic:
        user = "# User=evolve   (a dedicated user is best; %h below is then root's home: write that user's home)\n"
    else:
        user = f"User={t.user}\n" if t.user else ""
    env = "".join(f'Environment="{k}={v}"\n' for k, v in t.extra_env.items())
    return {
        "instance": "%i" if t.generic else t.name,
        "rendered_note": "" if t.generic else RENDERED_NOTE.format(repo=repo),
        "repo": repo,
        "network": "" if t.user_mode else "After=network-online.target\nWants=network-online.target\n",
        "user": user,
        "path": t.path if t.generic else u(t.path),
        "evolve": t.evolve if t.generic else u(t.evolve),
        "timeout_start": f"{t.runtime_cap_s // 60}min",
        "timeout_stop": f"{int(t.grace_s) + 30}s",
        "wanted_by": "default.target" if t.user_mode else "multi-user.target",
        "sandbox_note": USER_SANDBOX_NOTE if t.user_mode else "",
        # User managers cannot bound capabilities or protect kernel knobs without user namespaces.
        "sandbox": tpl.SANDBOX.format(rw_paths=" ".join(rw)) + ("" if t.user_mode else tpl.HARDENING),
        "extra_env": env,
        "cron": t.cron,
    }


def systemd_units(t: Target, *, daemon: bool = False) -> dict[str, str]:
    """``{file name: text}``: the oneshot service and its timer, or the daemon's notify service."""
    ctx = _unit_ctx(t)
    inst = "" if t.generic else t.name
    if daemon:
        return {f"evolve-daemon@{inst}.service": fill(tpl.DAEMON_SERVICE, ctx)}
    spec = cronexpr.parse(t.cron)
    ctx["oncalendar"] = "\n".join(f"OnCalendar={x}" for x in cronexpr.to_oncalendar(spec, t.timezone))
    ctx["delay"] = f"{randomized_delay_s(spec, t)}s"
    # Timers are accurate to a minute by default, which would merge a seconds schedule's ticks.
    ctx["accuracy"] = "AccuracySec=1s\n" if spec.has_seconds else ""
    return {
        f"evolve@{inst}.service": fill(tpl.FIRE_SERVICE, ctx),
        f"evolve@{inst}.timer": fill(tpl.FIRE_TIMER, ctx),
    }


def _sh(value: str, generic: bool) -> str:
    return value if generic or _SAFE_SHELL.match(value) else shlex.quote(value)


def crontab(t: Target, *, system: bool = False) -> dict[str, str]:
    """A user crontab fragment, or (``system``) an ``/etc/cron.d`` file with its user field."""
    spec = cronexpr.parse(t.cron)
    state = t.state_dir
    sh = {
        k: _sh(v, t.generic)
        for k, v in {
            "repo": t.repo,
            "state": state,
            "lock": f"{state}/cron.lock",
            "log": f"{state}/cron.log",
            "path": t.path,
            "evolve": t.evolve,
        }.items()
    }
    command = (
        f"cd {sh['repo']} && mkdir -p {sh['state']} && PATH={sh['path']} "
        f"flock -n -E 75 {sh['lock']} {sh['evolve']} fire >> {sh['log']} 2>&1"
    )
    ctx = {
        "name": t.name,
        "repo": t.repo,
        "timezone": t.timezone,
        "schedule": cronexpr.crontab_schedule(spec),
        "cron_user": f"{t.user or 'root'} " if system else "",
        "command": command,
    }
    text = fill(tpl.CRONTAB, ctx)
    # In a crontab an unescaped % ends the command; only the command line may contain one.
    lines = [ln if ln.startswith("#") else ln.replace("%", "\\%") for ln in text.splitlines()]
    name = "evolve.crontab" if t.generic else (f"evolve-{t.name}" if system else f"evolve-{t.name}.crontab")
    return {name: "\n".join(lines) + "\n"}


def k8s_name(name: str) -> str:
    """A DNS-1123 label short enough for ``evolve-<name>-work``."""
    out = re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-")[:40].strip("-")
    return out or "repo"


def kubernetes(t: Target) -> dict[str, str]:
    spec = cronexpr.parse(t.cron)
    interval = cronexpr.max_interval_s(spec, t.timezone or "UTC")
    name = k8s_name(t.name)
    ctx = {
        "name": name,
        "schedule": orjson.dumps(cronexpr.crontab_schedule(spec)).decode(),
        "timezone": orjson.dumps(t.timezone or "UTC").decode(),
        "starting_deadline": int(min(3600, max(30, interval // 2))),
        "active_deadline": t.runtime_cap_s,
        "termination_grace": int(t.grace_s) + 15,
        "image": orjson.dumps(t.image).decode(),
        "git_url": orjson.dumps(t.git_url or "https://git.example.com/you/repo.git").decode(),
    }
    return {"cronjob.yaml" if t.generic else f"evolve-{name}.yaml": fill(tpl.KUBERNETES, ctx)}


def generic_targets(cfg: Config | None = None) -> tuple[Target, Target]:
    """The `deploy/` templates: systemd instance = the escaped repository path (``%f``), defaults elsewhere."""
    cfg = cfg or Config()
    base = Target(
        name="repo",
        repo="%f",
        state_dir="%f/.agents/evolve",
        evolve="/usr/bin/env evolve",
        path=GENERIC_PATH,
        home="%h",
        cron=cfg.schedule.cron,
        timezone=cfg.schedule.timezone,
        jitter_s=cfg.schedule.jitter_s,
        grace_s=cfg.daemon.grace_s,
        runtime_cap_s=runtime_cap_s(cfg),
        generic=True,
    )
    cron = replace(
        base,
        repo="/path/to/repo",
        state_dir="/path/to/repo/.agents/evolve",
        evolve="evolve",
        path="$HOME/.local/bin:/usr/local/bin:/usr/bin:/bin",
        user_mode=True,
    )
    return base, cron


def generic_files() -> dict[str, str]:
    """``{path under deploy/: text}`` for every template file (README.md is written by hand)."""
    units, cron = generic_targets()
    user_units = replace(units, user_mode=True)
    out: dict[str, str] = {}
    for prefix, t in (("systemd/", units), ("systemd/user/", user_units)):
        for daemon in (False, True):
            out.update({prefix + k: v for k, v in systemd_units(t, daemon=daemon).items()})
    out.update({"cron/" + k: v for k, v in crontab(cron).items()})
    out.update({"kubernetes/" + k: v for k, v in kubernetes(cron).items()})
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m evolve.deploy DEPLOY_DIR", file=sys.stderr)
        return 2
    root = Path(argv[0])
    for rel, text in generic_files().items():
        target = root / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
        print(f"wrote {target}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
