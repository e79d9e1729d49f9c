"""The sandbox every child that runs repository or agent code starts in (docs/DESIGN.md §8.6).

The agent, gate commands, workspace setup, the gate probe's interpreter and goal checks run the
repository's code, or the model's, as the operator's user. Under bubblewrap (Debian's
``bubblewrap``) they see the whole file system read-only except their worktree, the paths their
agent CLI keeps its own state in, what ``[workspace]`` declares, ``[sandbox] writable`` and the
scratch directories (``/tmp``, ``/var/tmp``, ``/dev/shm``); what evolve trusts (its state
directory: config, markers, session state, the ledger; the operator's trust records; the shared
``.git`` but for this worktree's own admin directory and the object store; the operator's checkout
and ``$HOME``) is bound read-only on top of anything writable that contains it.

Three parts, as everywhere in evolve:

- :func:`decide` (pure): ``[sandbox] mode`` and what the host offered (:class:`Probe`) -> a
  :class:`Decision`: wrap in bubblewrap, run unsandboxed with a warning, or refuse with one line;
- :func:`probe` (the shell's one look, cached per fire by the caller): actually starts
  ``bwrap --ro-bind / / --dev /dev --proc /proc true``;
- :class:`Sandbox`: the argv wrapper :func:`evolve.procgroup.spawn` applies, its binds computed
  from a :class:`Scope` at each start (a worktree made after the fire began is there).

Not ``--new-session`` (it calls ``setsid``: evolve's process-group kill, §12.3, would miss the
child) and not ``--unshare-pid`` (reconcile finds a dead fire's children by their pid and
``EVOLVE_FIRE_ID``, §12.4), and not ``--die-with-parent``: bwrap dies at the group's SIGTERM, and with
it the child would get SIGKILL at once, never the grace in which an agent ends cleanly (saves its
session); without it the child stays in the group, and ``kill_group`` gives it the grace, then KILL.

Base layer: standard library only. ``evolve status`` does not import it: it reads what the last fire
recorded (``Paths.sandbox_state``).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

MODES = ("auto", "required", "off")
NETWORKS = ("all", "none")  # "model" (only the model API) is refused by the config check: not built yet
INSTALL = "apt-get install bubblewrap"
PROBE_TIMEOUT_S = 10.0
SCRATCH = ("/tmp", "/var/tmp", "/dev/shm")
# What each agent CLI writes besides its worktree, relative to $HOME (found by running each CLI
# under the sandbox against the test servers): its config and session store, and its caches.
CLI_HOME: dict[str, tuple[str, ...]] = {
    "claude": (".claude", ".claude.json", ".claude.json.backup", ".cache/claude", ".cache/claude-cli-nodejs"),
    "codex": (".codex",),
    "gemini": (".gemini",),
}
CLI_ENV_HOME = {"codex": "CODEX_HOME", "claude": "CLAUDE_CONFIG_DIR", "gemini": "GEMINI_CLI_HOME"}
CLI_DIRS = {"claude": ".claude", "codex": ".codex", "gemini": ".gemini"}  # made before a run: $HOME is read-only


def prepare_cli_home(runner: str, env: Mapping[str, str]) -> None:
    """Make the agent CLI's own directory (its config and session store) before the first sandboxed run:
    the CLI would make it itself, but ``$HOME`` is read-only in the sandbox and a path that is not there is
    not bound (:func:`binds`)."""
    name = CLI_DIRS.get(runner)
    if name is None:
        return
    home = Path(env.get("HOME") or Path.home())
    own = env.get(CLI_ENV_HOME.get(runner, ""), "")
    for d in (Path(own) if own else None, home / name):
        if d is not None:
            try:
                d.mkdir(mode=0o700, parents=False, exist_ok=True)
            except OSError:
                pass  # the CLI will say what it misses; a fire does not fail for it


@dataclass(frozen=True)
class Probe:
    """What the host offered: the bwrap found (None: none) and why it could not start (None: it did)."""

    bwrap: str | None
    error: str | None = None
    flags: tuple[str, ...] = ()  # what it needed besides the base argv (root without CAP_SYS_ADMIN: a user namespace)

    @property
    def ok(self) -> bool:
        return self.bwrap is not None and self.error is None


@dataclass(frozen=True)
class Decision:
    use: bool  # wrap the children in bubblewrap
    label: str  # which sandbox is in force, for doctor and status ("bubblewrap, network: all")
    warning: str | None = None  # runs unsandboxed although the operator did not ask for that
    refuse: str | None = None  # the fire must not start (exit 78): one line, with the fix


def decide(mode: str, network: str, found: Probe) -> Decision:
    """Which sandbox a fire runs its children in (pure; a table test in tests/test_sandbox.py).

    ``auto`` (the default) uses bubblewrap where it starts and otherwise runs unsandboxed with a
    warning; ``required`` refuses instead. A network policy other than ``all`` is a sandbox the operator
    asked for: without bubblewrap it is refused in either mode, never silently dropped.
    """
    if mode == "off":
        return Decision(False, 'off ([sandbox] mode = "off")')
    if found.ok:
        return Decision(True, f"bubblewrap, network: {network}")
    why = found.error if found.bwrap is not None else "bwrap not found on PATH"
    if mode == "required" or network != "all":
        asked = 'mode = "required"' if mode == "required" else f'network = "{network}"'
        return Decision(False, f"none: {why}", refuse=(
            f"[sandbox] {asked} but bubblewrap cannot start: {why}; {INSTALL}, or allow it in the service's "
            "sandbox (docs/DESIGN.md §8.6)"))
    return Decision(False, f"none: {why}", warning=(
        f"the agent and the gate run unsandboxed: {why}; {INSTALL} (or set [sandbox] mode = \"off\")"))


def find_bwrap(env: Mapping[str, str]) -> str | None:
    """``$EVOLVE_BWRAP`` (the operator's choice; a path that is not there means none), else bwrap on PATH."""
    chosen = env.get("EVOLVE_BWRAP")
    if chosen is not None:
        return chosen if chosen and os.access(chosen, os.X_OK) and os.path.isfile(chosen) else None
    return shutil.which("bwrap", path=env.get("PATH") or os.defpath)


def probe(env: Mapping[str, str], network: str = "all") -> Probe:
    """Start the smallest sandbox this policy needs and see it run: a bwrap that is installed may still be
    refused its namespaces (a container's seccomp profile, a unit's ``SystemCallFilter=``)."""
    bwrap = find_bwrap(env)
    if bwrap is None:
        return Probe(None)
    found = _try(bwrap, (), network, env)
    if found.error is not None and os.geteuid() == 0:
        # root in a container has no CAP_SYS_ADMIN: bwrap then needs a user namespace of its own (uid 0 kept)
        again = _try(bwrap, ROOT_USERNS, network, env)
        if again.error is None:
            return again
    return found


ROOT_USERNS = ("--unshare-user", "--uid", "0", "--gid", "0")


def _try(bwrap: str, flags: tuple[str, ...], network: str, env: Mapping[str, str]) -> Probe:
    argv = [*base_argv(bwrap), *flags, *(["--unshare-net"] if network == "none" else []), "--", "true"]
    try:
        res = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                             timeout=PROBE_TIMEOUT_S, env={"PATH": env.get("PATH") or os.defpath}, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return Probe(bwrap, f"{bwrap}: {exc}"[:300])
    if res.returncode != 0:
        lines = res.stderr.decode(errors="replace").strip().splitlines() or [_died(res.returncode)]
        return Probe(bwrap, lines[-1][:300])
    return Probe(bwrap, flags=flags)


def _died(code: int) -> str:
    """Why bwrap ended without a word: a signal (its own, or its child's as 128+N) or a plain exit code."""
    sig = -code if code < 0 else code - 128 if code > 128 else 0
    if sig == signal.SIGSYS:
        return ("killed by SIGSYS: a seccomp filter refuses its namespaces (a unit's SystemCallFilter= without "
                "@mount, a container's seccomp profile)")
    return f"killed by signal {sig}" if sig else f"exit {code}"


def base_argv(bwrap: str, euid: int | None = None) -> list[str]:
    """The read-only root, a fresh ``/dev`` and ``/proc``: what every sandboxed child starts from.

    As root, ``/proc`` is the host's, bound: a fresh one (``--proc``) gets bwrap's read-only covers on
    ``/proc/sys``, ``/proc/bus``..., and with them no sandbox nested inside (the Codex CLI's own) may
    mount a ``/proc`` of its own ("Operation not permitted"). Root is not contained anyway (SECURITY.md).
    """
    euid = os.geteuid() if euid is None else euid
    proc = ["--bind", "/proc", "/proc"] if euid == 0 else ["--proc", "/proc"]
    return [bwrap, "--ro-bind", "/", "/", "--dev", "/dev", *proc]


@dataclass(frozen=True)
class Scope:
    """Where a fire's sandboxed children may write, and what is bound read-only over that (absolute paths).

    ``writable`` is bound read-write, ``protected`` read-only; the more specific path wins, so a
    worktree inside the (protected) state directory is writable, and a checkout under (scratch)
    ``/tmp`` is not. At the same path a writable entry wins over a protected one.
    """

    writable: tuple[Path, ...]
    protected: tuple[Path, ...]
    scratch: tuple[Path, ...] = tuple(Path(p) for p in SCRATCH)
    git_dirs: tuple[Path, ...] = ()  # work trees whose git admin dir and object store are added at each start
    git_repo: Path | None = None  # the operator's checkout: where the git common dir is read from


def scope_for(
    *,
    repo: Path,
    tree: Path,
    state_dir: Path,
    trust_dir: Path | None,
    env: Mapping[str, str],
    runner: str,
    workspace_links: Iterable[str] = (),
    extra: Iterable[str] = (),
    also_protected: Iterable[Path] = (),
    exchange: Path | None = None,
) -> Scope:
    """The scope of a fire whose agent works in ``tree`` (the worktree, or the checkout itself with
    ``[git] isolation = "none"``)."""
    home = Path(env.get("HOME") or Path.home())
    writable: list[Path] = [tree, state_dir / "cache", *([exchange] if exchange else [])]
    homes = CLI_HOME.get(runner, ())
    own = env.get(CLI_ENV_HOME.get(runner, ""), "")
    writable += [Path(own)] if own else []
    writable += [home / p for p in homes]
    writable += [repo / p for p in workspace_links]  # a [workspace] link: the checkout's copy, shared on purpose
    writable += [Path(os.path.expanduser(p.replace("~", str(home), 1) if p.startswith("~") else p)) for p in extra]
    if env.get("TMPDIR"):
        writable.append(Path(env["TMPDIR"]))
    protected = [repo, state_dir, home, *([trust_dir] if trust_dir else []), *also_protected]
    # Inside the CLI's writable home, the operator's own user settings stay theirs: a hook written there would
    # run in their interactive sessions, outside any sandbox. (The CLI writes its state, not these, in a run.)
    protected += [home / ".claude" / "settings.json", home / ".gitconfig"]
    git = Path(env.get("XDG_CONFIG_HOME") or home / ".config")
    protected += [git / "evolve", home / ".config" / "evolve"]  # the global KILL
    # No link into the checkout is ever writable: the worktree's .agents is the agent's own copy (the door,
    # cycle/door.py), and a link the agent plants there must not open the operator's .agents to the next child.
    return Scope(tuple(writable), tuple(protected), git_dirs=(tree,), git_repo=repo)


def git_admin(tree: Path) -> tuple[Path | None, Path | None]:
    """A work tree's git admin dir and common dir, read from its ``.git`` (a linked worktree's file, or the
    checkout's directory); None where there is none."""
    dot = tree / ".git"
    try:
        if dot.is_dir() and not dot.is_symlink():
            return dot, dot
        text = dot.read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        return None, None
    if not text.startswith("gitdir:"):
        return None, None
    admin = Path(os.path.normpath(tree / text[len("gitdir:"):].strip()))
    try:
        common = Path(os.path.normpath(admin / (admin / "commondir").read_text(encoding="utf-8").strip()))
    except OSError:
        common = admin
    return admin, common


def worktree_admin(common: Path, tree: Path) -> Path | None:
    """The admin dir (``<common>/worktrees/<name>``) whose ``gitdir`` names ``tree/.git``, compared as paths
    (no link followed): each of those files is in an admin dir the agent cannot write but its own."""
    want = {os.path.join(os.path.abspath(tree), ".git"), os.path.join(os.path.realpath(tree), ".git")}
    try:
        entries = sorted(os.scandir(common / "worktrees"), key=lambda e: e.name)
    except OSError:
        return None
    for entry in entries:
        try:
            named = Path(entry.path, "gitdir").read_text(encoding="utf-8", errors="replace").strip()
        except OSError:
            continue
        if entry.is_dir(follow_symlinks=False) and os.path.normpath(named) in want:
            return Path(entry.path)
    return None


@dataclass(frozen=True)
class Bind:
    path: str
    rw: bool


def binds(scope: Scope) -> list[Bind]:
    """The mounts over the read-only root, in the order bwrap must make them (pure but for realpath and
    existence: a path that is not there is neither bound nor protected).

    Sorted by depth, so the most specific path is mounted last and wins; at one path the order is
    scratch < protected < writable.
    """
    ranked: dict[str, tuple[int, bool]] = {}

    def add(paths: Iterable[Path], rank: int, rw: bool) -> None:
        for p in paths:
            real = os.path.realpath(p)
            if not os.path.exists(real):
                continue
            if real not in ranked or ranked[real][0] <= rank:
                ranked[real] = (rank, rw)

    add(scope.scratch, 0, True)
    protected, writable = list(scope.protected), list(scope.writable)
    # The git dirs come from the operator's checkout (read-only to every child), never from the worktree's
    # own ``.git`` file: the agent can rewrite that one to name the common dir, or any other, as "its" admin dir.
    _, common = git_admin(scope.git_repo) if scope.git_repo is not None else (None, None)
    kept = [common / "objects" / "pack", common / "objects" / "info"] if common is not None else []
    for tree in scope.git_dirs if common is not None else ():
        assert common is not None
        protected.append(common)  # hooks, config, refs, packed-refs: the operator's git
        if scope.git_repo is not None and os.path.abspath(tree) == os.path.abspath(scope.git_repo):
            # the checkout itself ([git] isolation = "none"): the agent commits on the branch
            writable.append(common)
            protected += [common / "config", common / "hooks", *kept]
            continue
        admin = worktree_admin(common, tree)
        if admin is not None:
            writable += [admin, common / "objects"]  # its HEAD, index and logs; the objects its commits add
            protected += kept  # what is packed (most of history) is not deletable, nor are alternates added
    add(protected, 1, False)
    add(writable, 2, True)
    order = sorted(ranked.items(), key=lambda kv: (kv[0].count("/"), kv[1][0]))
    return [Bind(path, rw) for path, (_rank, rw) in order]


@dataclass(frozen=True)
class Sandbox:
    """Wraps an argv in bubblewrap (:func:`evolve.procgroup.spawn` applies it)."""

    bwrap: str
    network: str
    scope: Scope
    label: str = field(default="bubblewrap")
    flags: tuple[str, ...] = ()  # Probe.flags

    def wrap(self, argv: Sequence[str]) -> list[str]:
        out = [*base_argv(self.bwrap), *self.flags]
        for b in binds(self.scope):
            if b.path == "/dev/shm":
                out += ["--tmpfs", "/dev/shm"]  # --dev made a fresh /dev; a private shm, like a private /dev
                continue
            out += ["--bind" if b.rw else "--ro-bind", b.path, b.path]
        if self.network == "none":
            out.append("--unshare-net")
        return [*out, "--", *argv]


def state_json(decision: Decision, network: str, mode: str) -> dict[str, object]:
    """What ``sandbox.json`` says of a fire's sandbox (for ``evolve status``, which never probes)."""
    return {"mode": mode, "network": network, "in_force": decision.use, "label": decision.label,
            "warning": decision.warning, "refused": decision.refuse}
