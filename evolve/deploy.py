"""Fills the deploy templates: generic ones for `deploy/`, concrete ones for `evolve install` (pure, no I/O).

Apart from the renderers: :func:`evolve_command` and :func:`shell_fire_path` look at this environment
(which evolve runs, what PATH `install` would render; ``evolve doctor`` compares the latter), and
``python -m evolve.deploy DIR`` rewrites the generic files under DIR (the repository's ``deploy/``).
"""

from __future__ import annotations

import math
import re
import shlex
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from evolve import cronexpr
from evolve import deploy_templates as tpl
from evolve.config import Config
from evolve.errors import UsageError

GENERIC_PATH = "%h/.local/bin:/usr/local/bin:/usr/bin:/bin"
# What every rendered PATH ends with when it lacks them: cron's `flock` and `sh` live there.
SYSTEM_PATH = ("/usr/local/bin", "/usr/bin", "/bin")
# The image (Containerfile): evolve in its own virtualenv, run by this absolute path; that venv's bin is
# never on the pod's PATH, which is the image's toolchain: the Claude CLI (the with-claude target) and
# the system directories (the base image's python3, git).
IMAGE_EVOLVE = "/opt/evolve/bin/evolve"
IMAGE_PATH = "/opt/claude/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# The user the Containerfile creates and runs as; the CronJob's securityContext must name the same one.
CONTAINER_UID = 10001
NEED_IMAGE = ("kubernetes needs --image: build the image from the repository's Containerfile and push it "
              "(podman build -f Containerfile -t REGISTRY/evolve:TAG . && podman push REGISTRY/evolve:TAG; "
              "deploy/README.md, Kubernetes)")
GENERIC_IMAGE = "registry.example.com/evolve:latest"
GENERIC_CONFIG = """\
# The repository's .agents/evolve/config.toml (`evolve install kubernetes` puts it here).
[agent]
runner = "claude"
"""
_PLACEHOLDER = re.compile(r"\{\{(\w+)\}\}")
RENDERED_NOTE = "# Rendered by `evolve install` for {repo}; run it again after changes.\n"
USER_SANDBOX_NOTE = "\n# A user unit gets it only with unprivileged user namespaces: on 226/NAMESPACE drop these lines."

# What ends or breaks a line in one of the formats (or in an editor showing them): C0 controls, DEL,
# C1 controls (NEL, U+0085, among them) and the Unicode line and paragraph separators. Tabs too: no
# value here needs one, and a crontab splits its fields on them.
CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")
# Lone surrogates: a path of raw bytes Python could not decode; no unit file or manifest can hold it.
_SURROGATE = re.compile("[\ud800-\udfff]")
_NAME = re.compile(r"[A-Za-z0-9_.:-]+")  # a unit instance and a file name: no "/", no "@"
# POSIX portable user names (plus the "$" of machine accounts): nothing cron or User= reads specially.
_USER = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.@-]*\$?")
_TIMEZONE = re.compile(r"[A-Za-z0-9_+/-]+")  # IANA names: "UTC", "America/New_York", "Etc/GMT+5"
_ENV_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# A systemd word that needs no quotes: no whitespace, quote, backslash or ";" (and "%"/"$" are doubled).
_SD_PLAIN = re.compile(r"[A-Za-z0-9_/.:@+=,%$*-]+")


def shown(value: str, at: int = 0, width: int = 40) -> str:
    """``value`` for a one-line message: ``repr`` escapes every control character, and a long value is
    cut to ``width`` characters either side of index ``at`` (the offending one), ``...`` marking a cut."""
    start, end = max(0, at - width), at + width
    text = repr(value[start:end])
    return ("..." if start else "") + text + ("..." if end < len(value) else "")


def check_text(label: str, value: str, *, show: bool = True) -> None:
    """A UsageError naming ``label`` when ``value`` could break out of its line in any rendered file."""
    bad = CONTROL.search(value) or _SURROGATE.search(value)
    if bad is None:
        return
    char = bad.group()
    what = "is not valid UTF-8" if _SURROGATE.match(char) else f"contains a control character (U+{ord(char):04X})"
    # A remote URL may carry a token: say what is wrong, not the value.
    raise UsageError(f"{label} {what}, which could start a line of its own in a rendered file"
                     + (f": {shown(value, bad.start())}" if show else ""))


def _must_match(pattern: re.Pattern[str], label: str, value: str, allowed: str) -> None:
    if not pattern.fullmatch(value):
        raise UsageError(f"{label} {shown(value)}: use {allowed} only")


@dataclass(frozen=True)
class Target:
    """Everything a template needs about one repository and where it runs."""

    name: str  # unit instance, cron tag, Kubernetes name
    repo: str  # absolute path, or "%f" (the unescaped instance path) in the generic units
    state_dir: str  # evolve's state directory (EVOLVE_DIR), absolute
    evolve: tuple[str, ...]  # the argv that runs evolve (argv[0] absolute outside the generic templates)
    path: str  # PATH for the fire, so for the gate and the agent: scheduled_path(), or --path
    home: str  # "%h" in the generic units
    cron: str  # schedule.cron
    timezone: str = "UTC"
    jitter_s: int = 0
    grace_s: float = 30
    runtime_cap_s: int = 6900
    user: str | None = None  # system units: User=
    user_mode: bool = False  # a user unit (systemctl --user) or a user crontab
    generic: bool = False  # the `deploy/` templates, not a rendering for one repo
    image: str = ""  # kubernetes: the image built from the Containerfile and pushed (required there)
    git_url: str = ""
    config_toml: str = ""  # kubernetes: the repository's config.toml, for the ConfigMap (any text: YAML-escaped)
    extra_env: Mapping[str, str] = field(default_factory=dict)
    # Directories besides the repository and the state directory that the config makes evolve write
    # ([metrics] textfile_dir, the queue's directory, [git] worktree_dir's parent): ReadWritePaths=.
    rw_paths: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        """Every value that goes into a file is checked here, so no renderer can forget one (issue 13)."""
        texts = [("name", self.name), ("repository path", self.repo), ("state directory", self.state_dir),
                 ("PATH", self.path), ("home directory", self.home), ("schedule", self.cron),
                 ("schedule.timezone", self.timezone), ("user", self.user or ""), ("--image", self.image)]
        texts += [(f"evolve command word {i}", w) for i, w in enumerate(self.evolve)]
        texts += [(f"environment {k!r}", f"{k}={v}") for k, v in self.extra_env.items()]
        texts += [("writable directory", p) for p in self.rw_paths]
        for label, value in texts:
            check_text(label, value)
        check_text("git remote origin URL", self.git_url, show=False)
        _must_match(_NAME, "name", self.name, "letters, digits and _ . : -")
        if self.user is not None:
            _must_match(_USER, "user", self.user, "letters, digits and _ . @ - (a final $)")
        if self.timezone:
            _must_match(_TIMEZONE, "schedule.timezone", self.timezone, "a time zone name (letters, digits, _ + - /)")
        for key in self.extra_env:
            _must_match(_ENV_KEY, "environment variable", key, "letters, digits and _")
        if not self.evolve:
            raise UsageError("evolve command: empty")
        if not self.generic:
            # Relative paths would be read against whatever directory cron or systemd starts in.
            for label, value in (("repository path", self.repo), ("state directory", self.state_dir),
                                 ("home directory", self.home), ("evolve command", self.evolve[0]),
                                 *(("writable directory", p) for p in self.rw_paths)):
                if not value.startswith("/"):
                    raise UsageError(f"{label} {shown(value)}: an absolute path is needed")


def fill(template: str, values: Mapping[str, object]) -> str:
    def sub(m: re.Match[str]) -> str:
        return str(values[m.group(1)])

    return _PLACEHOLDER.sub(sub, template)


@dataclass(frozen=True)
class ScheduledPath:
    """The PATH a scheduled fire gets, and what of the operator's was left out and why."""

    value: str
    dropped: tuple[tuple[str, str], ...] = ()  # (entry, why)
    added: tuple[str, ...] = ()


OWN_VENV = "evolve's own virtualenv (evolve runs by its absolute path)"
RELATIVE = "relative (cron and systemd start in the repository, the gate in the agent's worktree)"


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def scheduled_path(shell_path: str, evolve_bins: Iterable[str], repo: str,
                   real: Callable[[str], str] = lambda p: p) -> ScheduledPath:
    """The PATH for the rendered units: the operator's at install time, so a scheduled gate finds the
    programs a hand-run one does (pure; ``real`` canonicalizes a directory for comparisons).

    Left out: relative entries, duplicates, and evolve's own virtualenv's ``bin`` (``evolve_bins``),
    whose ``python`` would shadow the project's: evolve itself is started by its absolute path. A
    virtualenv inside the repository is the project's own (evolve installed into it), so it stays,
    as it does for a hand-run fire. The system directories are appended when missing (cron's line
    runs ``flock``).
    """
    own = {real(b) for b in evolve_bins if not _inside(real(b), real(repo))}
    kept: list[str] = []
    dropped: list[tuple[str, str]] = []
    for entry in shell_path.split(":"):
        if not entry.startswith("/"):
            if entry:
                dropped.append((entry, RELATIVE))
            continue
        if entry in kept:
            continue
        if real(entry) in own:
            dropped.append((entry, OWN_VENV))
            continue
        kept.append(entry)
    added = tuple(d for d in SYSTEM_PATH if d not in kept)
    return ScheduledPath(":".join([*kept, *added]), tuple(dropped), added)


def evolve_command() -> tuple[str, ...]:
    """This environment's ``evolve`` argv (the script next to the running interpreter), never a PATH lookup
    at fire time. An argv, not a string: the renderers quote each word for their format."""
    import os
    import shutil

    beside = Path(sys.executable).parent / "evolve"
    if beside.is_file() and os.access(beside, os.X_OK):
        return (str(beside),)
    found = shutil.which("evolve")
    if found:
        return (str(Path(found).resolve()),)
    return (sys.executable, "-m", "evolve")


def evolve_bins(evolve: tuple[str, ...]) -> list[str]:
    """evolve's own virtualenv(s): the running interpreter's, and the one the evolve command is the
    console script of (``<venv>/bin/evolve``, through a link such as pipx's ``~/.local/bin/evolve``)."""
    out = [str(Path(sys.prefix) / "bin")] if sys.prefix != sys.base_prefix else []
    script = Path(evolve[0]).resolve()
    if (script.parent.parent / "pyvenv.cfg").is_file():
        out.append(str(script.parent))
    return out


def shell_fire_path(repo: Path, env: Mapping[str, str]) -> str:
    """What `evolve install systemd|cron` renders as PATH from this environment."""
    import os

    return scheduled_path(env.get("PATH") or os.defpath, evolve_bins(evolve_command()), str(repo),
                          real=os.path.realpath).value


def check_path_override(value: str) -> str:
    """``--path``: used as given, but every entry absolute (a relative one would be read against the
    repository or the worktree, which the agent controls)."""
    check_text("--path", value)
    entries = value.split(":")
    bad = next((e for e in entries if not e.startswith("/")), None)
    if bad is not None:
        raise UsageError(f"--path {shown(value)}: entry {bad!r} is not an absolute directory")
    return value


# -- reading an installed rendering back (for `evolve doctor`) ---------------------------------------

CRON_DEFAULT_PATH = "/usr/bin:/bin"  # what cron gives a job whose line and crontab set no PATH


def unit_fire_path(text: str) -> tuple[str | None, str | None]:
    """``(WorkingDirectory, PATH)`` of a unit file (its drop-ins appended: the last setting wins, an empty
    ``Environment=`` clears) as systemd reads what :func:`systemd_units` writes (quoted words, ``%%``);
    None for either that it does not set or that does not parse."""
    workdir = path = None
    for line in text.split("\n"):
        # systemd strips ASCII blanks only: a path may end in a no-break space.
        key, sep, value = line.strip(" \t").partition("=")
        if not sep:
            continue
        if key.strip(" \t") == "WorkingDirectory":
            workdir = value.strip(" \t").replace("%%", "%") or None
        elif key.strip(" \t") == "Environment":
            if not value.strip(" \t"):
                path = None
                continue
            try:
                words = shlex.split(value)
            except ValueError:
                continue
            for w in words:
                if w.startswith("PATH="):
                    path = w.removeprefix("PATH=").replace("%%", "%")
    return workdir, path


def cron_fire_path(line: str, variables: list[str] | tuple[str, ...] = ()) -> str:
    """The PATH a crontab job line runs with: its own ``PATH=`` word (what :func:`crontab` writes, ``\\%``
    read as ``%``), else the crontab's last ``PATH=`` setting among ``variables``, else cron's default."""
    try:
        words = shlex.split(line.replace("\\%", "%"))
    except ValueError:
        words = []
    for w in words:
        if w.startswith("PATH="):
            return w.removeprefix("PATH=")
    settings = [v.split("=", 1)[1].strip().strip("\"'") for v in variables if v.strip().startswith("PATH=")]
    return settings[-1] if settings else CRON_DEFAULT_PATH


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


# -- systemd: each value spelled for the setting it goes into (systemd.syntax(7), systemd.service(5)) --


def _sd_raw(value: str) -> str:
    """A value systemd takes verbatim to the end of the line (Description=, WorkingDirectory=).

    ``%`` is a specifier there. The line is stripped and a final backslash joins the next line
    (skipping comments), so a value ending in either gets a ``/``: harmless after a path, and the
    only other raw value is the Description, which reads the same.
    """
    value = value.replace("%", "%%")
    return value + "/" if value.endswith(("\\", " ")) else value


def _sd_word(value: str, *, exec_line: bool = False) -> str:
    """One word of a setting systemd splits and unquotes (ExecStart=, Environment=, ReadWritePaths=).

    ``%`` is a specifier in all of them; ``$`` a variable only on Exec lines (``$$`` is a literal
    one). Anything else special (whitespace, quotes, backslashes, ``;``) goes inside double quotes,
    where systemd reads ``\\\\`` and ``\\"`` back as ``\\`` and ``"``.
    """
    value = value.replace("%", "%%")
    if exec_line:
        value = value.replace("$", "$$")
    if _SD_PLAIN.fullmatch(value):
        return value
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _sd_exec(argv: list[str], generic: bool) -> str:
    """An ExecStart= command line; the generic templates keep their specifiers (``%f``) as they are.

    The executable (the first word) is a path systemd never expands ``$`` in, and it refuses one with
    quotes or backslashes outright ("Executable name contains special characters").
    """
    if generic:
        return " ".join(argv)
    if any(c in "\"'\\" for c in argv[0]):
        raise UsageError(f"evolve command {shown(argv[0])}: systemd cannot run a path with quotes or backslashes")
    return " ".join([_sd_word(argv[0]), *(_sd_word(w, exec_line=True) for w in argv[1:])])


PRIVATE_TMP_OFF = ("# No PrivateTmp: this repository is under /tmp or /var/tmp, which a private one would hide "
                   "(226/NAMESPACE).\nPrivateTmp=no")


def private_tmp(t: Target) -> str:
    """``PrivateTmp=yes`` unless a directory the fire writes (the repository, the state directory, a
    configured one) lives in /tmp or /var/tmp: the service's own empty ones would hide it, and systemd
    fails the unit on its ReadWritePaths=."""
    hidden = any(_inside(p, d) for p in (t.repo, t.state_dir, *t.rw_paths) for d in ("/tmp", "/var/tmp"))
    return PRIVATE_TMP_OFF if hidden and not t.generic else "PrivateTmp=yes"


def writable(t: Target) -> list[str]:
    """ReadWritePaths= of the units, unquoted: the repository (it must exist), the state directory when
    outside it, then each configured directory not already under one of those, prefixed ``-`` (a
    missing one does not stop the unit; the fire reports what it could not write), then the agent's
    own config. With PrivateTmp off (a repository under /tmp) the real /tmp and /var/tmp stay
    writable, as they are to a hand-run fire: the gate's and the agent's temporary files go there."""
    roots = [t.repo]
    if not _inside(t.state_dir, t.repo):
        roots.append(t.state_dir)
    out = list(roots)
    for p in t.rw_paths:
        if not any(_inside(p, r) for r in roots):
            roots.append(p)
            out.append("-" + p)
    if private_tmp(t) != "PrivateTmp=yes":
        out += ["-/tmp", "-/var/tmp"]
    # The operator's trust records (evolve/trusted.py: ~/.local/state/evolve of the service's user): a fire
    # writes the push pin and the guard's record there.
    return [*out, f"-{t.home}/.claude", f"-{t.home}/.claude.json", f"-{t.home}/.local/state/evolve"]


def _unit_ctx(t: Target) -> dict[str, object]:
    g = t.generic
    word = (lambda v: v) if g else _sd_word
    raw = (lambda v: v) if g else _sd_raw
    rw = [word(t.repo), word(f"-{t.home}/.claude"), word(f"-{t.home}/.claude.json"),
          word(f"-{t.home}/.local/state/evolve")] if g else \
        [word(p) for p in writable(t)]
    if t.user_mode:
        user = ""
    elif g:
        user = "# User=evolve   (a dedicated user is best; %h below is then root's home: write that user's home)\n"
    else:
        user = f"User={t.user}\n" if t.user else ""  # _USER: nothing systemd reads specially
    env = "".join(f"Environment={word(f'{k}={v}')}\n" for k, v in t.extra_env.items())
    return {
        "instance": "%i" if g else t.name,
        # Comments are never parsed: the path as it is (Target refused every control character).
        "rendered_note": "" if g else RENDERED_NOTE.format(repo=t.repo),
        "repo_text": t.repo,
        "repo_desc": raw(t.repo),
        "repo_dir": raw(t.repo),
        "path_note": tpl.PATH_NOTE,
        "path_env": word(f"PATH={t.path}"),
        "exec_fire": _sd_exec([*t.evolve, "--repo", t.repo, "fire"], g),
        "exec_daemon": _sd_exec([*t.evolve, "--repo", t.repo, "daemon"], g),
        "network": "" if t.user_mode else "After=network-online.target\nWants=network-online.target\n",
        "user": user,
        "timeout_start": f"{t.runtime_cap_s // 60}min",
        "timeout_stop": f"{int(t.grace_s) + 30}s",
        "wanted_by": "default.target" if t.user_mode else "multi-user.target",
        "sandbox_note": USER_SANDBOX_NOTE if t.user_mode else "",
        # User managers cannot bound capabilities or protect kernel knobs without user namespaces.
        "sandbox": tpl.SANDBOX.format(rw_paths=" ".join(rw), private_tmp=private_tmp(t))
        + ("" if t.user_mode else tpl.HARDENING),
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


# -- cron ------------------------------------------------------------------------------------------


def _cron_word(value: str) -> str:
    """One ``/bin/sh`` word for a crontab command: shell-quoted, with every ``%`` outside the quotes.

    Cron turns an unescaped ``%`` into a newline (the rest becomes stdin) and ``\\%`` into ``%``,
    but a ``\\`` before ``\\%`` is its own escape in Vixie cron and cronie, so a ``%`` inside the
    quotes after a backslash of the value could not be spelled. Outside them ``\\%`` always follows
    the closing quote, and to a cron without ``%`` handling (busybox) the shell reads it as ``%``.
    """
    return "\\%".join(shlex.quote(part) for part in value.split("%"))


def crontab(t: Target, *, system: bool = False) -> dict[str, str]:
    """A user crontab fragment, or (``system``) an ``/etc/cron.d`` file with its user field."""
    spec = cronexpr.parse(t.cron)
    sh = (lambda v: v) if t.generic else _cron_word  # the generic file shows `$HOME` for the reader to edit
    state = t.state_dir
    evolve = " ".join(sh(w) for w in t.evolve)
    # Each assignment one shell word (`NAME='value'`): the environment flock and so evolve start with.
    assigns = "".join(f"{k}={sh(v)} " for k, v in {"PATH": t.path, **t.extra_env}.items())
    command = (
        f"cd {sh(t.repo)} && mkdir -p {sh(state)} && {assigns}"
        f"flock -n -E 75 {sh(state + '/cron.lock')} {evolve} fire >> {sh(state + '/cron.log')} 2>&1"
    )
    ctx = {
        "name": t.name,
        "repo": t.repo,
        "timezone": t.timezone,
        "schedule": cronexpr.crontab_schedule(spec),
        "cron_user": f"{t.user or 'root'} " if system else "",  # _USER: no whitespace, no "%"
        "path_note": tpl.PATH_NOTE,
        "command": command,
    }
    text = fill(tpl.CRONTAB, ctx)
    jobs = [ln for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    if len(jobs) != 1 or "%" in jobs[0].replace("\\%", ""):  # Target and _cron_word make this impossible
        raise AssertionError(f"crontab rendering is not one job line: {jobs!r}")
    name = "evolve.crontab" if t.generic else (cron_d_name(t.name) if system else f"evolve-{t.name}.crontab")
    return {name: text}


def cron_d_name(name: str) -> str:
    """The ``/etc/cron.d`` file name: Debian's cron (run-parts naming) silently skips a file whose name has
    anything but letters, digits, ``_`` and ``-``, so ``evolve-my.app`` would never run."""
    return "evolve-" + re.sub(r"[^A-Za-z0-9_-]", "_", name)


# -- Kubernetes --------------------------------------------------------------------------------------


def yaml_str(value: str) -> str:
    """A YAML double-quoted scalar every YAML 1.1/1.2 parser reads back as ``value``: printable ASCII
    as it is, ``"`` and ``\\`` escaped, everything else as ``\\uXXXX`` or ``\\UXXXXXXXX``."""
    out = []
    for ch in value:
        code = ord(ch)
        if ch in '"\\':
            out.append("\\" + ch)
        elif 0x20 <= code < 0x7F:
            out.append(ch)
        else:
            out.append(f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}")
    return '"' + "".join(out) + '"'


def yaml_block(value: str, indent: int) -> str:
    """A YAML literal block (``|``) at ``indent`` spaces when ``value`` reads back exactly from one, else
    :func:`yaml_str`. A block keeps a config file readable in the manifest; it is used only for printable
    ASCII lines that neither start with a space (the indentation would be misread) nor hold spaces alone
    (a block drops them), and its chomping indicator keeps the final newlines exactly."""
    lines = value.split("\n")
    body = value.rstrip("\n")
    plain = re.fullmatch(r"[\x20-\x7e\n]*", value) is not None
    if not body or not plain or body.startswith(" ") or any(ln.strip() == "" and ln for ln in lines):
        return yaml_str(value)
    trailing = len(value) - len(body)
    chomp = "-" if trailing == 0 else "" if trailing == 1 else "+"
    pad = " " * indent
    kept = body.split("\n") + [""] * (trailing - 1 if trailing > 1 else 0)
    return f"|{chomp}\n" + "\n".join(pad + ln if ln else "" for ln in kept)


def k8s_name(name: str) -> str:
    """A DNS-1123 label short enough for ``evolve-<name>-work``."""
    out = re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-")[:40].strip("-")
    return out or "repo"


def kubernetes(t: Target) -> dict[str, str]:
    spec = cronexpr.parse(t.cron)
    interval = cronexpr.max_interval_s(spec, t.timezone or "UTC")
    name = k8s_name(t.name)
    if not t.image:
        raise UsageError(NEED_IMAGE)
    ctx = {
        "name": name,
        "schedule": yaml_str(cronexpr.crontab_schedule(spec)),
        "timezone": yaml_str(t.timezone or "UTC"),
        "starting_deadline": int(min(3600, max(30, interval // 2))),
        "active_deadline": t.runtime_cap_s,
        "termination_grace": int(t.grace_s) + 15,
        "image": yaml_str(t.image),
        "evolve": IMAGE_EVOLVE,  # a fixed path of the image (no quoting needed: the test checks it)
        "path": yaml_str(t.path),
        "git_url": yaml_str(t.git_url or "https://git.example.com/you/repo.git"),
        "config_toml": yaml_block(t.config_toml or GENERIC_CONFIG, indent=4),
        "uid": CONTAINER_UID,
    }
    return {"cronjob.yaml" if t.generic else f"evolve-{name}.yaml": fill(tpl.KUBERNETES, ctx)}


def generic_targets(cfg: Config | None = None) -> tuple[Target, Target]:
    """The `deploy/` templates: systemd instance = the escaped repository path (``%f``), defaults elsewhere."""
    cfg = cfg or Config()
    base = Target(
        name="repo",
        repo="%f",
        state_dir="%f/.agents/evolve",
        evolve=("/usr/bin/env", "evolve"),
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
        evolve=("evolve",),
        path="$HOME/.local/bin:/usr/local/bin:/usr/bin:/bin",
        user_mode=True,
        image=GENERIC_IMAGE,
    )
    return base, cron


def kubernetes_target(t: Target) -> Target:
    """The generic crontab target as the CronJob template wants it: the pod's PATH (the image's)."""
    return replace(t, path=IMAGE_PATH)


def generic_files() -> dict[str, str]:
    """``{path under deploy/: text}`` for every template file (README.md is written by hand)."""
    units, cron = generic_targets()
    user_units = replace(units, user_mode=True)
    out: dict[str, str] = {}
    for prefix, t in (("systemd/", units), ("systemd/user/", user_units)):
        for daemon in (False, True):
            out.update({prefix + k: v for k, v in systemd_units(t, daemon=daemon).items()})
    out.update({"cron/" + k: v for k, v in crontab(cron).items()})
    out.update({"kubernetes/" + k: v for k, v in kubernetes(kubernetes_target(cron)).items()})
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
