"""The worktree's own environment (docs/DESIGN.md §8.4): ``[workspace]`` setup, link, copy and path.

Before each claim (:meth:`Preparer.ready`) the worktree gets the checkout paths ``link`` and ``copy``
name (once per fire), runs ``setup`` when it was made or the content of an ``inputs`` file differs
from the last successful setup (a stamp in ``<state dir>/workspace-setup.json``), and the gate probe
(:mod:`evolve.cycle.sees`) says whether the gate will test the worktree's code. A change whose own
inputs differ (the agent edited ``pyproject.toml``) gets its setup just before the gate
(:meth:`Preparer.before_gate`); a setup that fails there is the change's red.

Setup commands run code the agent controls (the manifests, the build backend): like a gate command
each runs through :func:`evolve.procgroup.run_group` in its own process group, bounded by
``setup_timeout_s`` and the fire's stop event, with the gate's allow-listed environment plus
``[workspace] pass_env``, the proxy and CA variables, and package caches under ``<state dir>/cache/``;
no other secret. What setup leaves in the worktree is settled so no cycle commits it and no reset
deletes it: a new untracked directory (``.venv/``, ``src/x.egg-info/``) is listed in the repository's
``info/exclude`` (anchored, like the links of §8.3), a new untracked file is removed, a tracked file it
rewrote is restored.
"""

from __future__ import annotations

import contextlib
import errno
import fnmatch
import hashlib
import json
import os
import secrets
import shlex
import shutil
import stat
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evolve import redact
from evolve.childenv import BASE, FIRE, NETWORK, child_env, with_path
from evolve.config import Config
from evolve.cycle import probe, sees
from evolve.cycle.gate import Red, excerpt, output_tail
from evolve.git import pathargs, worktree
from evolve.git import run as gitrun
from evolve.paths import PROBE_FILE, SETUP_FILE, Paths
from evolve.procgroup import Limits, contained, run_group
from evolve.store.atomic import open_artifact, read_json, write_json
from evolve.store.dirfd import ensure_dir
from evolve.timeutil import utc_iso

# Package managers' caches, under the state directory: setup may download, never into the operator's $HOME.
CACHES = (("PIP_CACHE_DIR", "pip"), ("UV_CACHE_DIR", "uv"), ("npm_config_cache", "npm"),
          ("YARN_CACHE_FOLDER", "yarn"), ("XDG_CACHE_HOME", "xdg"))
SETUP_LOG = "workspace-setup.log"  # in runs/: every setup command's output, redacted
TREE_ID = "evolve-workspace-id"  # in the worktree's private git dir: gone when the worktree is made again
MAX_INPUT_BYTES = 64 << 20
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


# -- pure --------------------------------------------------------------------------------------------


def setup_key(cfg: Config) -> str:
    """What a stamp depends on in the config: the commands and the inputs that key them."""
    blob = json.dumps({"setup": cfg.workspace.setup, "inputs": cfg.workspace.inputs}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def setup_due(stamp: Mapping[str, Any] | None, *, commands: bool, tree: str, tree_id: str, config: str,
              digest: str) -> str | None:
    """Why setup must run now, or None (pure): the worktree was made (or moved), the last setup failed,
    the setup config changed, or an input's content differs from the last successful setup."""
    if not commands:
        return None
    if not stamp or stamp.get("tree") != tree or stamp.get("tree_id") != tree_id:
        return "the worktree was made"
    if stamp.get("ok") is not True:
        return "the last setup failed"
    if stamp.get("config") != config:
        return "[workspace] setup changed"
    if stamp.get("digest") != digest:
        return "an input changed"
    return None


def exclude_pattern(path: str) -> str | None:
    """An ``info/exclude`` line matching exactly ``path`` at the worktree's top (None: not expressible)."""
    if not path or "\n" in path or "\r" in path:
        return None
    escaped = "".join("\\" + c if c in "\\*?[]!# " else c for c in path)
    return "/" + escaped


@dataclass(frozen=True)
class Settled:
    """What to do with what setup left (pure): directories to keep (excluded), files to remove, tracked paths
    to restore."""

    keep: tuple[str, ...]
    remove: tuple[str, ...]
    restore: tuple[str, ...]


def settle(before: Mapping[str, str], after: Mapping[str, str]) -> Settled:
    """``git status`` (``--untracked-files=normal``: a new directory is one ``dir/`` entry) before and after
    setup: only what changed across setup is setup's; anything the cycle had changed before is left alone."""
    new = {p: c for p, c in after.items() if before.get(p) != c}
    keep = tuple(sorted(p for p, c in new.items() if c == "??" and p.endswith("/")))
    remove = tuple(sorted(p for p, c in new.items() if c == "??" and not p.endswith("/")))
    restore = tuple(sorted(p for p, c in new.items() if c != "??" and p not in before))
    return Settled(keep, remove, restore)


@dataclass(frozen=True)
class Refusal:
    """Why no work may be claimed: ``check`` is ``setup``, ``workspace`` (link/copy) or ``gate`` (the probe);
    ``interrupted`` when the fire was stopped during setup."""

    check: str
    error: str
    fix: str = ""
    output: str = ""


# -- the shell ---------------------------------------------------------------------------------------


def setup_env(cfg: Config, env: Mapping[str, str], tree: Path, cache: Path) -> dict[str, str]:
    """The gate's environment, plus ``[workspace] pass_env``, proxies and CA files, and the caches."""
    caches = {name: str(cache / sub) for name, sub in CACHES}
    out = child_env(env, (*BASE, *FIRE, *NETWORK), (*cfg.gate.pass_env, *cfg.workspace.pass_env), set_=caches)
    return with_path(out, sees.path_dirs(tree, cfg.workspace.path))


def inputs_digest(tree: Path, globs: list[str]) -> tuple[str, list[str]]:
    """The content of every regular file the ``inputs`` globs match at the worktree (links never followed)."""
    found: set[str] = set()
    for pattern in globs:
        parts = [p for p in pattern.split("/") if p not in ("", ".")]
        dirs = [("", tree)]
        for i, part in enumerate(parts):
            nxt = []
            for rel, d in dirs:
                try:
                    with os.scandir(d) as it:
                        entries = list(it)
                except OSError:
                    continue
                for e in entries:
                    if not fnmatch.fnmatchcase(e.name, part):
                        continue
                    if i == len(parts) - 1:
                        if e.is_file(follow_symlinks=False):
                            found.add(f"{rel}{e.name}")
                    elif e.is_dir(follow_symlinks=False) and e.name != ".git":
                        nxt.append((f"{rel}{e.name}/", Path(e.path)))
            dirs = nxt
    h = hashlib.sha256()
    names = sorted(found)
    for name in names:
        h.update(name.encode("utf-8", "surrogateescape") + b"\0")
        try:
            fd = os.open(tree / name, os.O_RDONLY | _NOFOLLOW)
        except OSError:
            h.update(b"-\0")
            continue
        with os.fdopen(fd, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            if size > MAX_INPUT_BYTES:
                h.update(f"{size}:{os.fstat(fh.fileno()).st_mtime_ns}".encode())
            else:
                h.update(hashlib.sha256(fh.read()).digest())
        h.update(b"\0")
    return h.hexdigest()[:24], names


def tree_id(tree: Path, *, create: bool = True) -> str:
    """An id kept in the worktree's private git dir: a worktree made again (its git dir too) has none."""
    try:
        text = (tree / ".git").read_text(encoding="utf-8", errors="replace").strip() if not (
            tree / ".git").is_symlink() else ""
    except OSError:
        text = ""
    if not text.startswith("gitdir:"):
        return ""
    gitdir = Path(os.path.normpath(tree / text[len("gitdir:"):].strip()))
    marker = gitdir / TREE_ID
    try:
        fd = os.open(marker, os.O_RDONLY | _NOFOLLOW)
        with os.fdopen(fd, "r", encoding="ascii", errors="replace") as fh:
            got = fh.read(64).strip()
        if got:
            return got
    except OSError:
        pass
    if not create:
        return ""
    new = secrets.token_hex(8)
    try:
        fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | _NOFOLLOW, 0o644)
        with os.fdopen(fd, "w", encoding="ascii") as fh:
            fh.write(new + "\n")
    except OSError:
        return ""
    return new


def status_entries(tree: Path) -> dict[str, str]:
    """``git status`` of the worktree, one entry per path (a wholly untracked directory as ``dir/``)."""
    out = gitrun.git(tree, "status", "--porcelain=v1", "-z", "--untracked-files=normal")
    entries: dict[str, str] = {}
    parts = out.split("\0")
    i = 0
    while i < len(parts):
        rec = parts[i]
        i += 1
        if len(rec) < 4:
            continue
        entries[rec[3:]] = rec[:2]
        if "R" in rec[:2] or "C" in rec[:2]:
            i += 1
    return entries


def add_excludes(repo: Path, paths: list[str], why: str) -> list[str]:
    """Anchored ``info/exclude`` lines for ``paths`` (the ones not there yet); the lines written."""
    exclude = worktree.common_dir(repo) / "info" / "exclude"
    try:
        lines = exclude.read_text(encoding="utf-8", errors="replace").splitlines()
    except FileNotFoundError:
        lines = []
    want = [p for p in (exclude_pattern(x.rstrip("/")) for x in paths) if p and p not in lines]
    if not want:
        return []
    exclude.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(exclude, os.O_WRONLY | os.O_APPEND | os.O_CREAT | _NOFOLLOW, 0o644)
    with os.fdopen(fd, "a", encoding="utf-8") as fh:
        fh.write(("\n" if lines and lines[-1] else "") + f"# evolve: {why} in its agent worktree\n")
        fh.write("".join(f"{w}\n" for w in want))
    return want


def _open_parent(tree: Path, rel: str, *, create: bool) -> tuple[int, str]:
    """A descriptor of ``rel``'s parent inside ``tree`` and its last name; no link on the way is followed
    (a link the repository committed is refused, never written through)."""
    parts = [p for p in rel.split("/") if p not in ("", ".")]
    fd = os.open(os.path.realpath(tree), os.O_RDONLY | os.O_DIRECTORY)
    try:
        for part in parts[:-1]:
            try:
                nfd = os.open(part, os.O_RDONLY | os.O_DIRECTORY | _NOFOLLOW, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                os.mkdir(part, 0o755, dir_fd=fd)
                nfd = os.open(part, os.O_RDONLY | os.O_DIRECTORY | _NOFOLLOW, dir_fd=fd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise OSError(errno.ELOOP, f"{part} (in {rel}) is a link or a file; not followed") from None
                raise
            os.close(fd)
            fd = nfd
    except BaseException:
        os.close(fd)
        raise
    return fd, parts[-1]


def _tracked(tree: Path, paths: list[str]) -> set[str]:
    if not paths:
        return set()
    found = pathargs.ls_files(tree, paths)  # literal: evolve's git has GIT_LITERAL_PATHSPECS
    dirs = {f.rsplit("/", i)[0] for f in found for i in range(1, f.count("/") + 1)}  # every directory above one
    return {p for p in paths if p in found or p.rstrip("/") in dirs}


def _in_checkout(repo: Path, rel: str) -> os.stat_result | None:
    """``repo/rel``'s lstat, reached without following a link on the way (None: not there)."""
    fd, name = _open_parent(repo, rel, create=False)
    try:
        return os.stat(name, dir_fd=fd, follow_symlinks=False)
    except FileNotFoundError:
        return None
    finally:
        os.close(fd)


def place_link(repo: Path, tree: Path, rel: str) -> str | None:
    """``tree/rel`` a link to the checkout's ``repo/rel``; why not, or None."""
    source = repo / rel
    try:
        found = _in_checkout(repo, rel)
    except FileNotFoundError:
        found = None
    if found is None:
        return f"[workspace] link {rel!r}: your checkout has no {rel}"
    fd, name = _open_parent(tree, rel, create=True)
    try:
        try:
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            st = None
        if st is not None and stat.S_ISLNK(st.st_mode):
            if os.readlink(name, dir_fd=fd) == str(source):
                return None
            os.unlink(name, dir_fd=fd)  # ours to manage (not tracked): pointed elsewhere since
        elif st is not None:
            return (f"[workspace] link {rel!r}: the worktree has its own {rel} (made by setup?); "
                    "link it or make it, not both")
        os.symlink(str(source), name, dir_fd=fd)
        return None
    finally:
        os.close(fd)


def _copy_into(src: str, dst_fd: int, name: str) -> int:
    """Copy ``src`` (a regular file or a directory of them; links and special files skipped, never
    followed) to ``name`` in ``dst_fd``; how many entries were skipped."""
    st = os.lstat(src)
    if stat.S_ISREG(st.st_mode):
        sfd = os.open(src, os.O_RDONLY | _NOFOLLOW)
        try:
            dfd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, stat.S_IMODE(st.st_mode) | 0o200,
                          dir_fd=dst_fd)
            try:
                while chunk := os.read(sfd, 1 << 20):
                    os.write(dfd, chunk)
            finally:
                os.close(dfd)
        finally:
            os.close(sfd)
        return 0
    if not stat.S_ISDIR(st.st_mode):
        return 1
    os.mkdir(name, 0o755, dir_fd=dst_fd)
    sub = os.open(name, os.O_RDONLY | os.O_DIRECTORY | _NOFOLLOW, dir_fd=dst_fd)
    skipped = 0
    try:
        with os.scandir(src) as it:
            for e in it:
                skipped += _copy_into(e.path, sub, e.name)
    finally:
        os.close(sub)
    return skipped


def place_copy(repo: Path, tree: Path, rel: str) -> tuple[str | None, int]:
    """``repo/rel`` copied to ``tree/rel`` afresh (regular files and directories only); (why not, skipped)."""
    source = repo / rel
    try:
        st = _in_checkout(repo, rel)
    except FileNotFoundError:
        st = None
    if st is None:
        return f"[workspace] copy {rel!r}: your checkout has no {rel}", 0
    if stat.S_ISLNK(st.st_mode):
        return f"[workspace] copy {rel!r}: it is a link in your checkout; not followed (use link)", 0
    fd, name = _open_parent(tree, rel, create=True)
    try:
        with contextlib.suppress(FileNotFoundError):
            old = os.stat(name, dir_fd=fd, follow_symlinks=False)
            if stat.S_ISDIR(old.st_mode):
                shutil.rmtree(name, dir_fd=fd)  # fd-based: links inside are removed, never followed
            else:
                os.unlink(name, dir_fd=fd)
        return None, _copy_into(str(source), fd, name)
    finally:
        os.close(fd)


def _link_state(tree: Path, repo: Path, rel: str) -> str:
    try:
        target = os.readlink(tree / rel)
    except FileNotFoundError:
        return "not yet"
    except OSError:
        return "the worktree has its own (not a link)"
    return "linked" if target == str(repo / rel) else f"points elsewhere ({target[:200]})"


@dataclass(frozen=True)
class SetupRun:
    ok: bool
    command: str = ""
    detail: str = ""
    output: str = ""
    interrupted: bool = False


class Preparer:
    """The worktree made ready before each claim, and again before the gate when the change needs it."""

    def __init__(self, paths: Paths, cfg: Config, env: Mapping[str, str], log: Any,
                 stop: threading.Event | None = None) -> None:
        self.paths, self.cfg, self.env, self.log, self.stop = paths, cfg, env, log, stop
        self.ws: Any = None
        self.placed = False  # links and copies: once per fire
        self.stamp_path = paths.evolve_dir / SETUP_FILE
        self.probe_path = paths.evolve_dir / PROBE_FILE
        self.gate_policy = gitrun.GitPolicy(run_hooks=cfg.git.run_hooks, sign=cfg.git.sign,
                                            timeout_s=cfg.git.timeout_s)

    @property
    def config_label(self) -> str:
        try:
            return str(self.paths.config.relative_to(self.paths.repo))
        except ValueError:
            return str(self.paths.config)

    # -- before a claim --------------------------------------------------------------------------

    def ready(self, ws: Any, cycle: int) -> Refusal | None:
        """None when work may be claimed; otherwise why not (the fire exits 78)."""
        self.ws = ws
        tree = ws.tree
        if ws.isolated:
            ws.begin(cycle)  # at the base, clean: what setup and the probe see is what the cycle starts from
            if not self.placed:
                refused = self._place(tree)
                if refused is not None:
                    return refused
                self.placed = True
            run = self.run_if_due(tree, phase="before_claim")
            if run is not None and run.interrupted:
                return Refusal("interrupted", "stopped during workspace setup")
            if run is not None and not run.ok:
                return Refusal("setup", f"workspace setup {run.command!r} {run.detail}",
                               "fix the command or what it installs (its output is in runs/workspace-setup.log);"
                               " the next fire runs it again", run.output)
        elif self.cfg.workspace.setup and not self.placed:
            self.log.warning("workspace.setup_skipped", reason="the agent works in your checkout (in place)")
            self.placed = True
        if not self.cfg.workspace.probe:
            return None
        v = self.probe(tree)
        for note in v.notes:
            self.log.warning("workspace.note", command=note.command, note=note.message, fix=note.fix)
        if v.refusing:
            first = v.refusing[0]
            return Refusal("gate", first.message, first.fix)
        return None

    def probe(self, tree: Path) -> probe.Verdict:
        """The gate probe, from the record when nothing it depends on changed."""
        s = sees.Sees(self.cfg, self.env, tree, self.paths.repo, config_label=self.config_label)
        key = s.key()
        rec = sees.cached(self.probe_path, key)
        if rec is not None:
            return sees.from_record(rec)
        v = s.verdict()
        shown = s.describe(v)
        failed = any(row.get("probe_error") for row in v.commands)
        sees.record(self.probe_path, self.cfg, None if failed else key, v, shown)
        self.log.info("workspace.probed", problems=len(v.refusing), notes=len(v.notes),
                      commands=[{k: row.get(k) for k in ("command", "interpreter", "imports")} for row in v.commands])
        return v

    def _place(self, tree: Path) -> Refusal | None:
        ws = self.cfg.workspace
        if not (ws.link or ws.copy):
            return None
        repo = self.paths.repo
        tracked = _tracked(tree, [*ws.link, *ws.copy])
        for rel in [*ws.link, *ws.copy]:
            if rel in tracked:
                return Refusal("workspace", f"[workspace] {'link' if rel in ws.link else 'copy'} {rel!r}: it is "
                               "tracked in the repository (the worktree has its own)",
                               f"remove {rel!r} from [workspace] link/copy in {self.config_label}")
        skipped = 0
        add_excludes(repo, [*ws.link, *ws.copy], "links and copies")  # first: a half-done placing is never dirt
        try:
            for rel in ws.link:
                why = place_link(repo, tree, rel)
                if why:
                    return Refusal("workspace", why, f"fix [workspace] link in {self.config_label}")
            for rel in ws.copy:
                why, n = place_copy(repo, tree, rel)
                skipped += n
                if why:
                    return Refusal("workspace", why, f"fix [workspace] copy in {self.config_label}")
        except OSError as exc:
            return Refusal("workspace", f"[workspace] link/copy: {exc.strerror or exc}",
                           "remove what is in the way in the worktree (evolve follows no link there)")
        self.log.info("workspace.placed", links=len(ws.link), copies=len(ws.copy), skipped=skipped)
        return None

    # -- setup -----------------------------------------------------------------------------------

    def run_if_due(self, tree: Path, *, phase: str) -> SetupRun | None:
        """Setup when :func:`setup_due` says so; None when it was not due."""
        if not self.cfg.workspace.setup:
            return None
        digest, inputs = inputs_digest(tree, self.cfg.workspace.inputs)
        tid = tree_id(tree)
        stamp = read_json(self.stamp_path)
        due = setup_due(stamp if isinstance(stamp, dict) else None, commands=True, tree=str(tree), tree_id=tid,
                        config=setup_key(self.cfg), digest=digest)
        if due is None:
            return None
        self.log.info("workspace.setup", reason=due, phase=phase, commands=len(self.cfg.workspace.setup))
        try:
            before: dict[str, str] | None = status_entries(tree)
        except gitrun.GitError as exc:  # then nothing is settled: the cycle's own changes are never touched
            self.log.warning("workspace.setup_output_unsettled", error=str(exc)[:300])
            before = None
        run = self._run(tree, due)
        kept = self._settle(tree, before) if before is not None else []
        rec: dict[str, Any] = {
            "tree": str(tree), "tree_id": tid, "config": setup_key(self.cfg), "digest": digest if run.ok else None,
            "inputs": inputs[:50], "ok": run.ok, "at": utc_iso(), "reason": due, "phase": phase, "kept": kept,
        }
        if not run.ok:
            rec["failed"] = {"command": run.command, "detail": run.detail, "output": excerpt(run.output)}
            rec["interrupted"] = run.interrupted  # the fire was stopped: runs again, nothing to fix
            self.log.error("workspace.setup_failed", command=run.command, detail=run.detail, phase=phase,
                           interrupted=run.interrupted)
        else:
            self.log.info("workspace.setup_done", reason=due, kept=kept)
        write_json(self.stamp_path, redact.current().json(rec))  # a command line may carry a token
        return run

    def _run(self, tree: Path, due: str) -> SetupRun:
        cache = ensure_dir(self.paths.evolve_dir / "cache", mode=0o700)
        env = setup_env(self.cfg, self.env, tree, cache)
        log_path = self.paths.runs_dir / SETUP_LOG
        ensure_dir(self.paths.runs_dir)
        budget = self.cfg.workspace.setup_timeout_s
        for argv in self.cfg.workspace.setup:
            label = shlex.join(argv)
            fd = open_artifact(log_path)
            try:
                os.write(fd, f"\n--- evolve workspace setup ({due}) {utc_iso()}: {label} ---\n".encode())
            finally:
                os.close(fd)
            try:
                res = run_group(argv, cwd=tree, env=env, log_path=log_path, stop=self.stop, sandbox=contained(),
                                limits=Limits(timeout_s=max(budget, 0.1), grace_s=2.0, tail_bytes=16 * 1024))
            except OSError as exc:
                return SetupRun(False, label, f"cannot start: {exc.strerror or exc}")
            budget -= res.duration_s
            tail = redact.current().text(output_tail(res.output_tail))
            if res.interrupted:
                return SetupRun(False, label, "interrupted", tail, interrupted=True)
            if res.timed_out:
                return SetupRun(False, label, f"timed out ([workspace] setup_timeout_s = "
                                f"{self.cfg.workspace.setup_timeout_s:g}); process group killed", tail)
            if res.returncode != 0:
                return SetupRun(False, label, f"exit {res.returncode}", tail)
        return SetupRun(True)

    def _settle(self, tree: Path, before: dict[str, str]) -> list[str]:
        """What setup left: new directories kept (excluded), new files removed, tracked files restored."""
        try:
            s = settle(before, status_entries(tree))
            kept = add_excludes(self.paths.repo, list(s.keep), "setup outputs") if s.keep else []
            for rel in s.remove:
                with contextlib.suppress(OSError):
                    fd, name = _open_parent(tree, rel, create=False)
                    try:
                        os.unlink(name, dir_fd=fd)
                    finally:
                        os.close(fd)
            if s.restore:
                pathargs.checkout_index(tree, s.restore, policy=self.gate_policy)
            if s.remove or s.restore:
                self.log.warning("workspace.setup_output", removed=list(s.remove)[:20], restored=list(s.restore)[:20],
                                 why="setup wrote files the repository tracks or does not ignore")
            return kept or [p for p in (exclude_pattern(x.rstrip("/")) for x in s.keep) if p]
        except (gitrun.GitError, OSError) as exc:
            self.log.warning("workspace.setup_output_unsettled", error=str(exc)[:300])
            return []

    # -- what doctor and the dry run show ---------------------------------------------------------

    def describe(self, ws: Any) -> tuple[dict[str, Any], probe.Verdict | None]:
        """What the gate will see, read-only: setup's state, links and copies, and the probe's answer
        (the recorded one while nothing it depends on changed, else asked now; nothing is written).
        The verdict is None when there is no worktree to ask yet."""
        tree, repo = ws.tree, self.paths.repo
        ws_cfg = self.cfg.workspace
        out: dict[str, Any] = {"isolation": "worktree" if ws.isolated else "none", "tree": str(tree)}
        made = (tree / ".git").exists() if ws.isolated else True
        out["setup"] = self._setup_state(tree, made) if ws.isolated else (
            {"state": "skipped: the agent works in your checkout"} if ws_cfg.setup else {"state": "none configured"})
        out["links"] = [{"path": rel, "target": str(repo / rel), "state": _link_state(tree, repo, rel)}
                        for rel in ws_cfg.link]
        out["copies"] = [{"path": rel, "state": "copied" if os.path.lexists(tree / rel) else "not yet"}
                         for rel in ws_cfg.copy]
        if not made:
            out["gate_sees"] = {"state": "no worktree yet: the first fire makes it, runs setup and probes before "
                                         "claiming any work"}
            return out, None
        s = sees.Sees(self.cfg, self.env, tree, repo, config_label=self.config_label)
        rec = sees.cached(self.probe_path, s.key())
        v = sees.from_record(rec) if rec is not None else s.verdict()
        out["gate_sees"] = {**s.describe(v), "from_record": rec is not None}
        return out, v

    def _setup_state(self, tree: Path, made: bool) -> dict[str, Any]:
        if not self.cfg.workspace.setup:
            return {"state": "none configured"}
        stamp = read_json(self.stamp_path)
        stamp = stamp if isinstance(stamp, dict) else None
        if not made:
            return {"state": "will run: the first fire makes the worktree"}
        digest, inputs = inputs_digest(tree, self.cfg.workspace.inputs)
        due = setup_due(stamp, commands=True, tree=str(tree), tree_id=tree_id(tree, create=False),
                        config=setup_key(self.cfg), digest=digest)
        out: dict[str, Any] = {"state": f"will run: {due}" if due else "up to date", "inputs": inputs[:20],
                               "stamp": str(self.stamp_path)}
        if stamp is not None:
            out["last"] = {k: stamp.get(k) for k in ("at", "ok", "reason", "phase", "failed", "kept") if k in stamp}
        return out

    # -- before the gate ---------------------------------------------------------------------------

    def before_gate(self, tree: Path) -> Red | None:
        """The change touched an input (or the setup config): setup again in the tree the gate runs in;
        a failure is the gate's red."""
        if self.ws is None or not self.ws.isolated or not self.cfg.workspace.setup:
            return None
        run = self.run_if_due(tree, phase="gate")
        if run is None or run.ok:
            return None
        return Red(f"workspace setup {run.command}: {run.detail}", run.output)
