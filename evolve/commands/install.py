"""`evolve install systemd|cron|kubernetes`: the deploy templates rendered for this repository.

Absolute paths, this environment's ``evolve``, and ``schedule.cron`` (or ``--schedule``) converted
for the target; written where the target reads them, or printed with ``--print``. Standard library
only at import time; the config and the templates are imported inside ``run``.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from evolve.commands._common import repo_of
from evolve.errors import ConfigError, UsageError

if TYPE_CHECKING:
    from evolve.config import Config
    from evolve.paths import Paths


def add_arguments(p: argparse.ArgumentParser, name: str) -> None:
    p.description = ("Render the deploy templates for this repository and write them where they belong "
                     "(or print them with --print), then say the one command that enables them.")
    p.add_argument("kind", choices=["systemd", "cron", "kubernetes"])
    p.add_argument("--user", action="store_true", help="systemd user units / a user crontab (default: system-wide)")
    p.add_argument("--print", dest="print_only", action="store_true",
                   help="print each file after a line `# <file name>`; write nothing")
    p.add_argument("--schedule", metavar="CRON", default=None, help="a cron expression instead of schedule.cron")
    p.add_argument("--daemon", action="store_true",
                   help="systemd: the long-running `evolve daemon` unit instead of a timer and a oneshot service")
    p.add_argument("--name", default=None, help="instance / job name (default: the repository directory's name)")
    p.add_argument("--dest", type=Path, default=None, metavar="DIR", help="write into DIR instead")
    p.add_argument("--image", default="", metavar="IMAGE",
                   help="kubernetes (required): the image built from the Containerfile and pushed, e.g. "
                        "registry.example.com/evolve:0.1.0")
    p.add_argument("--path", default=None, metavar="DIRS",
                   help="the PATH scheduled fires (their gate and agent) get, absolute directories joined by ':' "
                        "(default: this shell's PATH less evolve's own virtualenv; kubernetes: the image's)")


def _fire_path(args: argparse.Namespace, repo: Path, evolve: tuple[str, ...], env: dict[str, str]
               ) -> tuple[str, list[str]]:
    """The PATH the rendered files give every fire (docs/DESIGN.md §9) and what to say about it: ``--path``,
    the image's for Kubernetes, else this shell's less evolve's own virtualenv (naming what was left out)."""
    from evolve import deploy

    if args.path is not None:
        return deploy.check_path_override(args.path), []
    if args.kind == "kubernetes":
        return deploy.IMAGE_PATH, []
    plan = deploy.scheduled_path(env.get("PATH") or os.defpath, deploy.evolve_bins(evolve), str(repo),
                                 real=os.path.realpath)
    return plan.value, [f"PATH: left out {entry!r}: {why}" for entry, why in plan.dropped]


def _path_notes(value: str, evolve: tuple[str, ...], cfg: Config, kubernetes: bool) -> list[str]:
    """What an operator should know about the rendered PATH: its value, and what is not on it."""
    import shutil

    where = "in the pod" if kubernetes else "for scheduled fires"
    notes = [f"PATH {where} (their gate and agent): {value} (change it with --path)"]
    if kubernetes:
        return notes  # the image's directories: nothing on this machine to look them up in
    if shutil.which("evolve", path=value) is None:
        notes.append(f"note: `evolve` is not on that PATH (fires start {evolve[0]} by its absolute path); what "
                     "runs `evolve` by name (the hooks of `evolve setup --hooks`) needs it linked into a directory "
                     "on it, e.g. ~/.local/bin")
    agent = cfg.agent
    if agent.runner != "http" and agent.argv and "/" not in agent.argv[0] \
            and shutil.which(agent.argv[0], path=value) is None:
        notes.append(f"warning: the agent {agent.argv[0]!r} is not on that PATH: scheduled fires cannot start it "
                     "(give [agent] argv an absolute path, or use --path)")
    return notes


def _carried_env(paths: Paths, env: dict[str, str]) -> dict[str, str]:
    """What a hand-run fire takes from this shell besides PATH and a scheduled one would lack: EVOLVE_DIR,
    EVOLVE_NEXTWORK and EVOLVE_CONFIG (absolute: else it reads and writes another state directory and queue,
    or loses the operator's config layer, docs/DESIGN.md §8.5), and the
    locale and TZ the gate's tests run under (cron sets no LANG). Only what is set, nothing secret:
    identity (HOME, USER, LOGNAME) is the unit's user, and credentials go in the service's own environment."""
    out = {}
    if env.get("EVOLVE_DIR"):
        out["EVOLVE_DIR"] = str(paths.evolve_dir)
    if env.get("EVOLVE_NEXTWORK"):
        out["EVOLVE_NEXTWORK"] = str(paths.nextwork)
    if env.get("EVOLVE_CONFIG"):  # the operator's own config (--config): every scheduled fire layers it too
        out["EVOLVE_CONFIG"] = os.path.abspath(env["EVOLVE_CONFIG"])
    for key in ("LANG", "LANGUAGE", *sorted(k for k in env if re.fullmatch(r"LC_[A-Z_]+", k)), "TZ"):
        if env.get(key):
            out[key] = env[key]
    return out


def _written_dirs(paths: Paths, cfg: Config) -> tuple[str, ...]:
    """Directories besides the repository and the state directory that the config makes a fire write:
    ``[metrics] textfile_dir``, the queue's, and the parent of ``[git] worktree_dir`` (evolve removes and
    adds the worktree itself). The units leave out what is under the repository or the state directory."""
    from evolve.metrics import textfile_dir

    out = []
    if cfg.metrics.textfile_dir:
        out.append(str(textfile_dir(paths, cfg.metrics.textfile_dir)))
    out.append(str(paths.nextwork.parent))
    if cfg.git.worktree_dir:
        tree = Path(os.path.abspath(paths.repo / Path(cfg.git.worktree_dir).expanduser()))
        out.append(str(tree if tree.parent == Path("/") else tree.parent))
    return tuple(dict.fromkeys(out))


def _git_url(repo: Path) -> str:
    from evolve.git.run import run_git

    out = run_git(repo, "remote", "get-url", "origin")
    return out.stdout.strip() if out.returncode == 0 else ""


def _config_for_configmap(path: Path) -> str:
    """The repository's config.toml for the CronJob's ConfigMap (a clone lacks it: .agents/ is git-ignored).

    A ConfigMap is not a Secret: anything that looks like one is redacted, and said so on stderr.
    """
    from evolve import redact

    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return "# no .agents/evolve/config.toml when this was rendered: evolve's defaults apply\n"
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read it for the ConfigMap: {exc}") from exc
    safe = redact.current().text(text)
    if safe != text:
        print(f"warning: {path} holds what looks like a secret; it is redacted in the ConfigMap: "
              "put it in the Secret evolve-agent instead", file=sys.stderr)
    return safe


def _config_home() -> Path:
    return Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")


def _where(args: argparse.Namespace) -> Path:
    if args.dest is not None:
        return args.dest
    if args.kind == "systemd":
        return _config_home() / "systemd" / "user" if args.user else Path("/etc/systemd/system")
    if args.kind == "cron":
        return _config_home() / "evolve" / "cron" if args.user else Path("/etc/cron.d")
    return _config_home() / "evolve" / "kubernetes"


def _enable_hint(args: argparse.Namespace, where: Path, files: list[str], name: str) -> str:
    """The command to paste into a shell: every path in it shell-quoted (``--dest`` may hold anything)."""
    import shlex

    paths = [shlex.quote(str(where / f)) for f in files]
    if args.kind == "systemd":
        ctl = "systemctl --user" if args.user else "systemctl"
        unit = next(f for f in files if f.endswith((".timer", "daemon@" + name + ".service")))
        if args.dest is not None:
            # Outside the unit search path: link the files in, then enable.
            cmd = f"{ctl} link {' '.join(paths)} && {ctl} enable --now {unit}"
        else:
            cmd = f"{ctl} daemon-reload && {ctl} enable --now {unit}"
        extra = "\n(a user unit runs while you are logged out only after `loginctl enable-linger`)" if args.user else ""
        return f"enable: {cmd}{extra}"
    if args.kind == "cron":
        if not args.user:
            if args.dest is None:
                return f"enabled: cron reads {paths[0]} on its own"
            return f"enable: install -m 0644 {paths[0]} /etc/cron.d/"
        f = paths[0]
        return (f"enable: (crontab -l 2>/dev/null | grep -vxF -f {f} | grep -v ' # evolve:{name}$'; cat {f}) "
                "| crontab -")
    return f"enable: kubectl apply -f {paths[0]}"


def _check_timezone(zone: str, source: Path) -> None:
    """schedule.timezone goes into the crontab's comments, OnCalendar= and the CronJob: a line-breaking
    character is a usage error like any rendered value; an unknown zone is bad configuration, as in the daemon."""
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    from evolve.deploy import check_text

    check_text(f"{source}: schedule.timezone", zone)
    try:
        if zone:
            ZoneInfo(zone)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise ConfigError(f"{source}: schedule.timezone {zone!r}: unknown time zone") from exc


def run(args: argparse.Namespace) -> int:
    import getpass

    from evolve import configtrust, cronexpr, deploy, exitcodes
    from evolve.paths import Paths
    from evolve.store.atomic import atomic_write_bytes

    if args.daemon and args.kind != "systemd":
        raise UsageError("--daemon is for `evolve install systemd`")
    repo = repo_of(args).resolve()
    paths = Paths.for_repo(repo)
    loaded = configtrust.load(paths, os.environ)
    cfg = loaded.cfg
    if args.kind == "kubernetes" and args.image and loaded.refusal:
        # The ConfigMap's copy is written untracked in the pod: it would become the operator's unreviewed.
        raise ConfigError(loaded.refusal)
    expr = args.schedule if args.schedule is not None else cfg.schedule.cron
    # Before parsing: cron's whitespace splitting would read a newline as one more field separator.
    deploy.check_text("--schedule" if args.schedule is not None else f"{paths.config}: schedule.cron", expr)
    try:
        cronexpr.parse(expr)
    except ValueError as exc:
        if args.schedule is not None:
            raise UsageError(f"--schedule {expr!r}: {exc}") from exc
        raise ConfigError(f"{paths.config}: schedule.cron {expr!r}: {exc}") from exc
    _check_timezone(cfg.schedule.timezone, paths.config)
    name = args.name or re.sub(r"[^A-Za-z0-9_.:-]", "_", repo.name) or "repo"
    if not re.fullmatch(r"[A-Za-z0-9_.:-]+", name):
        raise UsageError(f"--name {name!r}: use letters, digits and _ . : - only")
    evolve = deploy.evolve_command()
    env = dict(os.environ)
    k8s = args.kind == "kubernetes"
    fire_path, dropped = _fire_path(args, repo, evolve, env)
    extra_env = {} if k8s else _carried_env(paths, env)
    if args.daemon and args.schedule is not None:
        # The daemon reads its schedule from config; --schedule goes in as the env layer, above the file.
        extra_env["EVOLVE_SCHEDULE_CRON"] = expr
    target = deploy.Target(
        name=name,
        repo=str(repo),
        state_dir=str(paths.evolve_dir),
        evolve=evolve,
        path=fire_path,
        home=str(Path.home()),
        cron=expr,
        timezone=cfg.schedule.timezone,
        jitter_s=cfg.schedule.jitter_s,
        grace_s=cfg.daemon.grace_s,
        runtime_cap_s=deploy.runtime_cap_s(cfg),
        user=None if args.user else getpass.getuser(),
        user_mode=args.user,
        image=args.image,
        git_url=_git_url(repo) if args.kind == "kubernetes" else "",
        # Read only for a manifest that will render (no --image: deploy.kubernetes says how to build one).
        config_toml=_config_for_configmap(paths.config) if args.kind == "kubernetes" and args.image else "",
        extra_env=extra_env,
        rw_paths=() if k8s else _written_dirs(paths, cfg),
    )
    try:
        if args.kind == "systemd":
            files = deploy.systemd_units(target, daemon=args.daemon)
        elif args.kind == "cron":
            files = deploy.crontab(target, system=not args.user)
        else:
            files = deploy.kubernetes(target)
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    where = _where(args)
    hint = _enable_hint(args, where, list(files), name)
    for note in [*dropped, *_path_notes(fire_path, evolve, cfg, k8s)]:
        print(note, file=sys.stderr)
    if args.print_only:
        out = []
        for fname, text in files.items():
            out.append(f"# {fname}\n{text}")
        sys.stdout.write("\n".join(out))
        print(f"(write to {where}) {hint}", file=sys.stderr)
        return exitcodes.OK
    for fname, text in files.items():
        # The operator's directory, resolved once (their own links are honoured: the writer
        # follows none); 0o666 less the umask when new, a rewrite keeps mode, owner and group.
        target_path = where.resolve() / fname
        try:
            atomic_write_bytes(target_path, text.encode("utf-8"))
        except PermissionError as exc:
            raise UsageError(f"cannot write {target_path}: permission denied (use --user, --dest or --print)") from exc
        print(f"wrote {target_path}")
    print(hint)
    return exitcodes.OK
