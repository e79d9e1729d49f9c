"""What the gate will see (docs/DESIGN.md §8.4): the shell around :mod:`evolve.cycle.probe`'s rules.

It gathers the snapshot the rules need — each gate command's program on the gate's PATH and its
``#!`` line, the worktree's top level, the node_modules a node there would load — asks each distinct
Python interpreter (through :func:`evolve.procgroup.run_group`, in the worktree, with the gate's
environment) where the project's names resolve (``importlib.util.find_spec``: nothing is imported or
written), and records the answer in ``<state dir>/workspace-probe.json``. The record is keyed by a
fingerprint of everything the answer depends on (config, PATH, the programs and interpreters, the
venvs' site-packages, the tree's layout and manifests), so an unchanged set-up costs a few ``stat``
calls per fire and no process.
"""

from __future__ import annotations

import configparser
import hashlib
import json
import os
import shlex
import shutil
import stat
import tempfile
import tomllib
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from evolve import redact
from evolve.childenv import BASE, FIRE, child_env, with_path
from evolve.config import Config, bad_rel_path
from evolve.cycle import probe
from evolve.git import run as gitrun
from evolve.procgroup import Limits, contained, run_group
from evolve.store.atomic import read_json, write_json
from evolve.timeutil import utc_iso

PROBE_TIMEOUT_S = 60.0  # one interpreter answering find_spec; uv run may first sync its environment
UV_PROBE_TIMEOUT_S = 600.0
HEAD_BYTES = 4096
MAX_READ = 1 << 20  # a manifest larger than this is not read (its size and mtime key the record)
MAX_NODE_ENTRIES = 5000
LOCKS = ("package-lock.json", "npm-shrinkwrap.json", "yarn.lock", "pnpm-lock.yaml")
MANIFESTS = ("pyproject.toml", "setup.cfg", "setup.py", "pytest.ini", "tox.ini", "uv.lock", "package.json", *LOCKS)

# Runs in the gate's interpreter: sys.path as the gate command will have it, then find_spec for each name
# (a top-level find_spec executes nothing of the project). Answers one JSON line, realpaths only.
PROBE_SCRIPT = r"""
import importlib.util, json, os, sys
req = json.loads(sys.argv[1])
p0 = req["path0"]
if p0 == "@bin":
    p0 = os.path.dirname(sys.executable)
if p0 == "@drop":  # as an entry point: no cwd on sys.path (any version; -P is 3.11+ and PYTHONSAFEPATH may be set)
    if sys.path and sys.path[0] in ("", os.getcwd()):
        del sys.path[0]
elif p0 is not None and sys.path:
    sys.path[0] = p0
for p in reversed(req["front"]):
    sys.path.insert(0, p)
out = {"executable": sys.executable, "version": sys.version.split()[0], "prefix": sys.prefix, "spec": {}}
for n in req["names"]:
    try:
        s = importlib.util.find_spec(n)
    except BaseException as e:
        out["spec"][n] = {"error": (type(e).__name__ + ": " + str(e))[:200]}
        continue
    if s is None:
        out["spec"][n] = None
        continue
    o = s.origin if s.origin and os.path.isabs(s.origin) else None
    locs = [os.path.realpath(p) for p in (s.submodule_search_locations or [])]
    out["spec"][n] = {"origin": os.path.realpath(o) if o else None, "locations": locs}
sys.stdout.write("\n@evolve-probe " + json.dumps(out) + "\n")
"""


# -- the gate's environment -----------------------------------------------------------------------


def path_dirs(tree: Path, rel: list[str]) -> list[str]:
    """``[workspace] path`` as absolute directories of ``tree`` (entries the config check refused dropped)."""
    return [str(tree / p) for p in rel if bad_rel_path(p) is None]


def gate_env(cfg: Config, env: Mapping[str, str], tree: Path) -> dict[str, str]:
    """What a gate command gets (``Gate.command_env``): the allow-list, ``[gate] pass_env``, the
    ``[workspace] path`` directories first on PATH."""
    return with_path(child_env(env, (*BASE, *FIRE), cfg.gate.pass_env), path_dirs(tree, cfg.workspace.path))


def _which(name: str, path: str, cwd: Path) -> str | None:
    if "/" in name:
        full = name if os.path.isabs(name) else str(cwd / name)
        return full if os.path.isfile(full) and os.access(full, os.X_OK) else None
    return shutil.which(name, path=path)


def _head(path: str) -> str:
    try:
        with open(path, "rb") as fh:
            data = fh.read(HEAD_BYTES)
    except OSError:
        return ""
    if b"\0" in data:
        return ""  # a binary
    return data.decode("utf-8", "replace")


# -- the tree -----------------------------------------------------------------------------------


def _regular(path: Path) -> bool:
    """A regular file, not a link: the repository's committed links are never followed."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def _real_dir(path: Path) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def _read(path: Path) -> bytes | None:
    if not _regular(path):
        return None
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return None
    try:
        if os.fstat(fd).st_size > MAX_READ:
            return None
        with os.fdopen(fd, "rb", closefd=False) as fh:
            return fh.read(MAX_READ)
    finally:
        os.close(fd)


def _toml(path: Path) -> dict[str, Any]:
    data = _read(path)
    if data is None:
        return {}
    try:
        return tomllib.loads(data.decode("utf-8", "replace"))
    except tomllib.TOMLDecodeError:
        return {}


def _ini(path: Path, section: str) -> dict[str, str]:
    data = _read(path)
    if data is None:
        return {}
    parser = configparser.ConfigParser(interpolation=None)
    try:
        parser.read_string(data.decode("utf-8", "replace"))
    except configparser.Error:
        return {}
    return dict(parser[section]) if parser.has_section(section) else {}


def _listdir(path: Path) -> list[os.DirEntry[str]]:
    if not _real_dir(path):
        return []
    try:
        with os.scandir(path) as it:
            return sorted(it, key=lambda e: e.name)[:MAX_NODE_ENTRIES]
    except OSError:
        return []


def _words(value: Any) -> list[str]:
    if isinstance(value, list):
        return [str(v) for v in value]
    if isinstance(value, str):
        return value.split()
    return []


def tree_facts(tree: Path) -> probe.TreeFacts:
    """What the worktree's top level says about the project; nothing is followed, run or imported."""
    src, packages, modules = [], [], []
    for e in _listdir(tree / "src"):
        if e.is_dir(follow_symlinks=False):
            if (_regular(Path(e.path) / "__init__.py")
                    or any(c.name.endswith(".py") for c in _listdir(Path(e.path)))):
                src.append(e.name)
        elif e.name.endswith(".py") and e.is_file(follow_symlinks=False):
            src.append(e.name[:-3])
    for e in _listdir(tree):
        if e.is_dir(follow_symlinks=False) and not e.name.startswith(".") and _regular(Path(e.path) / "__init__.py"):
            packages.append(e.name)
        elif e.name.endswith(".py") and e.is_file(follow_symlinks=False):
            modules.append(e.name[:-3])
    pyproject = _toml(tree / "pyproject.toml")
    project = pyproject.get("project") if isinstance(pyproject.get("project"), dict) else {}
    name = project.get("name") if isinstance(project.get("name"), str) else None
    if name is None:
        name = _ini(tree / "setup.cfg", "metadata").get("name") or None
    extras = project.get("optional-dependencies")
    tool = pyproject.get("tool") if isinstance(pyproject.get("tool"), dict) else {}
    pt = tool.get("pytest") if isinstance(tool.get("pytest"), dict) else {}
    ini: dict[str, Any] = pt.get("ini_options") if isinstance(pt.get("ini_options"), dict) else pt
    for fname, section in (("pytest.ini", "pytest"), ("tox.ini", "pytest"), ("setup.cfg", "tool:pytest")):
        if not ini:
            ini = _ini(tree / fname, section)
    addopts = _words(ini.get("addopts"))
    mode = "prepend"
    for i, a in enumerate(addopts):
        if a.startswith("--import-mode="):
            mode = a.split("=", 1)[1]
        elif a == "--import-mode" and i + 1 < len(addopts):
            mode = addopts[i + 1]
    requirements = [e.name for e in _listdir(tree) if e.name.endswith(".txt") and "requirements" in e.name
                    and e.is_file(follow_symlinks=False)]
    return probe.TreeFacts(
        src=tuple(src), packages=tuple(packages), modules=tuple(modules), project_name=name,
        python_project=any(_regular(tree / f) for f in ("pyproject.toml", "setup.py", "setup.cfg")),
        extras=tuple(sorted(extras)) if isinstance(extras, dict) else (),
        requirements=tuple(requirements), uv_lock=_regular(tree / "uv.lock"),
        conftest=_regular(tree / "conftest.py"),
        tests_init=any(_regular(tree / d / "__init__.py") for d in ("tests", "test")),
        pythonpath=tuple(_words(ini.get("pythonpath"))), import_mode=mode,
        package_json=_regular(tree / "package.json"),
    )


def _node_links(modules: Path, repo: str, own: list[str]) -> list[tuple[str, str]]:
    """Packages in ``modules`` (a node_modules directory; a link to one is followed, as node does) that
    are links into ``repo``'s own code: not under any of ``own`` (the worktree, the checkout's node_modules)."""
    try:
        base = Path(os.path.realpath(modules))
        entries = sorted(os.scandir(base), key=lambda e: e.name)[:MAX_NODE_ENTRIES]
    except OSError:
        return []
    out = []
    for e in entries:
        scoped = e.name.startswith("@") and e.is_dir(follow_symlinks=False)
        for sub in (sorted(os.scandir(e.path), key=lambda s: s.name)[:MAX_NODE_ENTRIES] if scoped else [e]):
            if not sub.is_symlink():
                continue
            target = os.path.realpath(sub.path)
            if probe.within(target, repo) and not any(probe.within(target, o) for o in own):
                name = f"{e.name}/{sub.name}" if scoped else sub.name
                out.append((name, os.path.relpath(target, repo) + "/"))
    return out


def node_facts(tree: Path, repo: Path) -> probe.NodeFacts:
    rtree, rrepo = os.path.realpath(tree), os.path.realpath(repo)
    nm = tree / "node_modules"
    try:
        mode = os.lstat(nm).st_mode
        kind = "link" if stat.S_ISLNK(mode) else "dir" if stat.S_ISDIR(mode) else "other"
    except OSError:
        kind = "absent"
    repo_nm = repo / "node_modules"
    own = [rtree, os.path.realpath(repo_nm)]
    in_place = rtree == rrepo
    return probe.NodeFacts(
        package_json=_regular(tree / "package.json"),
        tree_modules=kind,
        repo_modules=(not in_place) and repo_nm.is_dir(),
        lock=next((f for f in LOCKS if _regular(tree / f)), None),
        nested=probe.within(rtree, rrepo),
        foreign=tuple(_node_links(nm, rrepo, own)) if kind in ("dir", "link") and not in_place else (),
        repo_foreign=bool(_node_links(repo_nm, rrepo, [rtree])) if not in_place and repo_nm.is_dir() else False,
    )


def goal_checks(cfg: Config, tree: Path) -> list[tuple[str, list[str]]]:
    """The GOALS checks that are one plain command (``pytest -q tests/x``; a check with shell syntax in it
    is not guessed at): they run in the worktree with the gate's environment, so the same rules apply."""
    if cfg.work.beads_only:
        return []
    from evolve.config import shell_syntax
    from evolve.work.goals import GoalsError, load_goals

    try:
        gf = load_goals(tree)
    except (GoalsError, OSError):
        return []
    out = []
    for g in (gf.goals if gf is not None else [])[:20]:
        try:
            argv = shlex.split(g.check)
        except ValueError:
            continue
        if argv and shell_syntax(argv, command_line=True) is None:
            out.append((g.id, argv))
    return out


# -- asking the interpreter ---------------------------------------------------------------------------


def probe_argv(launch: probe.Launch, req: dict[str, Any]) -> list[str]:
    payload = json.dumps(req)
    if launch.kind == "uv":
        assert launch.program is not None
        return [launch.program, "run", *launch.uv_args, "python", "-c", PROBE_SCRIPT, payload]
    interp = launch.interpreter or launch.program or "python3"
    return [interp, *launch.flags, "-c", PROBE_SCRIPT, payload]


def ask(argv: list[str], *, tree: Path, env: Mapping[str, str], timeout_s: float) -> dict[str, Any]:
    """Run the probe; its answer, or ``{"error": why}``."""
    with tempfile.TemporaryDirectory(prefix="evolve-sees-") as tmp:
        out = Path(tmp).resolve() / "out"
        try:
            res = run_group(argv, cwd=tree, env={**env, "PYTHONDONTWRITEBYTECODE": "1"},
                            limits=Limits(timeout_s=timeout_s, grace_s=1.0, tail_bytes=0, log_max_bytes=0),
                            log_path=out, sandbox=contained())
        except OSError as exc:
            return {"error": f"cannot run {argv[0]}: {exc.strerror or exc}"}
        text = out.read_text(errors="replace") if out.exists() else ""
    for line in reversed(text.splitlines()):
        if line.startswith("@evolve-probe "):
            try:
                answer = json.loads(line[len("@evolve-probe "):])
            except ValueError:
                break
            if isinstance(answer, dict):
                return answer
    if res.timed_out:
        return {"error": f"timed out after {timeout_s:g}s"}
    last = " ".join(text.strip().splitlines()[-1:])[:200]
    return {"error": f"exit {res.returncode}" + (f": {redact.current().text(last)}" if last else "")}


# -- the verdict ------------------------------------------------------------------------------------


def _stat_key(path: str | None) -> list[Any] | None:
    if not path:
        return None
    try:
        st = os.stat(path)
    except OSError:
        return [path, None]
    return [os.path.realpath(path), st.st_mtime_ns, st.st_size]


def _site_dirs(interp: str | None) -> list[Any]:
    """The site-packages an interpreter's venv (or installation) has: what a pip install changes."""
    if not interp:
        return []
    out = []
    venv = Path(interp).parent.parent
    # A venv's own site-packages only (its base's are not on its path); an installation's otherwise.
    roots = [venv] if (venv / "pyvenv.cfg").is_file() else sorted({venv, Path(os.path.realpath(interp)).parent.parent})
    for root in roots:
        for d in sorted([*root.glob("lib/python3*/site-packages"), *root.glob("lib64/python3*/site-packages"),
                         root / "pyvenv.cfg"]):
            out.append(_stat_key(str(d)))
    return out


def _digest(tree: Path, names: tuple[str, ...]) -> str:
    h = hashlib.sha256()
    for n in names:
        data = _read(tree / n)
        h.update(n.encode() + b"\0" + (hashlib.sha256(data).digest() if data is not None else b"-"))
    return h.hexdigest()[:16]


class Sees:
    """The probe for one config, environment and tree: :meth:`key` (no process), :meth:`verdict` (asks)."""

    def __init__(self, cfg: Config, env: Mapping[str, str], tree: Path, repo: Path, *, config_label: str) -> None:
        self.cfg, self.tree, self.repo = cfg, tree, repo
        self.env = gate_env(cfg, env, tree)
        self.config_label = config_label
        path = self.env.get("PATH", os.defpath)
        which = lambda n: _which(n, path, tree)  # noqa: E731
        self.launches = [probe.classify(argv, which, _head) for argv in cfg.gate.commands]
        # Goal checks that are shell scripts or make are not probed: most only read files (grep, test -f).
        self.launches += [la for la in (probe.classify(argv, which, _head, role=f"goal check {gid}")
                                        for gid, argv in goal_checks(cfg, tree))
                          if la.kind in ("python", "script", "uv", "node")]
        # A shell script or make: what it runs is not known; the PATH's python is what `python` in it is, asked
        # both ways (probe.ways), and the PATH's pytest as itself when another environment runs it.
        py = which("python3") or which("python")
        self.launches = [replace(la, interpreter=py) if la.kind == "shell" and la.interpreter is None else la
                         for la in self.launches]
        self.facts = tree_facts(tree)
        self.node = node_facts(tree, repo)
        self.names = probe.import_names(self.facts) if self.facts.python_project or self.facts.src else []
        found = probe.classify(["pytest"], which, _head) if self.names else None  # the PATH's pytest
        with_companions: list[probe.Launch] = []
        for la in self.launches:
            with_companions.append(la)
            extra = probe.companion(la, found) if found and probe.needs_python(la, self.facts) else None
            if extra is not None:
                with_companions.append(extra)
        self.launches = with_companions
        self.rtree, self.rrepo = os.path.realpath(tree), os.path.realpath(repo)

    def key(self) -> str:
        """Everything the answer depends on, without starting a process."""
        parts = {
            "v": 2,  # the rules' version: an answer recorded under other rules is not reused
            "config": probe.config_key(self.cfg.gate.commands, self.cfg.workspace),
            "path": self.env.get("PATH"),
            "tree": self.rtree, "repo": self.rrepo,
            "launches": [la.as_json() for la in self.launches],
            "programs": [[_stat_key(la.program), _stat_key(la.interpreter), _site_dirs(la.interpreter)]
                         for la in self.launches],
            "facts": self.facts.as_json(), "node": self.node.as_json(), "names": self.names,
            "manifests": _digest(self.tree, MANIFESTS),
            "venvs": [_stat_key(str(self.tree / p)) for p in self.cfg.workspace.path],
        }
        return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:24]

    def _request(self, launch: probe.Launch, path0: str | None) -> dict[str, Any]:
        if path0 == "@script" and launch.program:
            path0 = os.path.dirname(os.path.realpath(launch.program))
        elif path0 not in (None, "", "@bin", "@drop"):
            path0 = os.path.dirname(os.path.realpath(self.tree / path0 / "x"))  # python path/to/script.py
        front = [str(self.tree / p) if p else str(self.tree) for p in probe.pytest_front(
            self.facts, shlex.split(launch.label))] if launch.pytest else []
        names = list(self.names)
        if launch.module and launch.module not in names:
            names.append(launch.module)
        return {"path0": path0, "front": front, "names": names}

    def verdict(self) -> probe.Verdict:
        v = probe.Verdict()
        asked: dict[str, dict[str, Any]] = {}
        for launch in self.launches:
            row: dict[str, Any] = {"command": launch.label, "starts": launch.as_json()}
            if launch.kind == "missing":
                v.problems.append(probe.missing_problem(launch, self.env.get("PATH", "")))
            if probe.needs_python(launch, self.facts) and launch.kind != "missing":
                if launch.interpreter is None and launch.kind != "uv":
                    v.problems.append(probe.Problem(launch.label, f"{launch.role} {launch.label!r}: no Python "
                                                    "interpreter found for it on the gate's PATH",
                                                    probe.python_fix(self.facts, launch, config=self.config_label,
                                                                     in_place=self.rtree == self.rrepo)))
                elif self.names or launch.module:
                    answers = []
                    for way, path0 in probe.ways(launch):
                        req = self._request(launch, path0)
                        argv = probe_argv(launch, req)
                        cache_key = json.dumps([argv[0], launch.flags, req, launch.uv_args])
                        if cache_key not in asked:
                            timeout = UV_PROBE_TIMEOUT_S if launch.kind == "uv" else PROBE_TIMEOUT_S
                            asked[cache_key] = ask(argv, tree=self.tree, env=self.env, timeout_s=timeout)
                        answers.append((way, asked[cache_key]))
                    problems, seen, by_way = probe.python_verdict(launch, answers, self.names, self.facts,
                                                                  tree=self.rtree, repo=self.rrepo,
                                                                  config=self.config_label)
                    v.problems += problems
                    answer = answers[0][1]
                    if launch.via:
                        row["command"] = f"{launch.label} (the {launch.via} on PATH it may start)"
                    row.update(interpreter=answer.get("executable") or launch.interpreter,
                               python=answer.get("version"), imports=seen)
                    if by_way:
                        row["ways"] = by_way
                    errors = [a["error"] for _, a in answers if a.get("error")]
                    if errors and not launch.via:  # a companion that cannot answer refuses nothing: reusable
                        row["probe_error"] = errors[0]
            if probe.needs_node(launch, self.facts) and launch.kind != "missing":
                v.problems += probe.node_problems(launch, self.node, config=self.config_label)
                row["node_modules"] = self.node.tree_modules
            v.commands.append(row)
        if self.rtree != self.rrepo and self.launches:
            note = probe.ignored_note(self._missing_ignored(), config=self.config_label)
            if note is not None:
                v.problems.append(note)
        return v

    def _missing_ignored(self) -> list[str]:
        try:
            out = gitrun.git(self.repo, "ls-files", "-z", "--others", "--ignored", "--exclude-standard", "--directory")
        except (gitrun.GitError, OSError):
            return []
        ws = self.cfg.workspace
        return probe.missing_ignored(out.split("\0"), present=lambda n: os.path.lexists(self.tree / n),
                                     configured=[*ws.link, *ws.copy])

    def describe(self, v: probe.Verdict | None) -> dict[str, Any]:
        """What ``fire --dry-run`` and ``doctor --json`` show as ``gate_sees``."""
        out: dict[str, Any] = {
            "tree": str(self.tree), "PATH": self.env.get("PATH"), "project_names": self.names,
            "path": path_dirs(self.tree, self.cfg.workspace.path), "probe": self.cfg.workspace.probe,
        }
        if v is not None:
            out["commands"] = v.commands
            out["problems"] = [p.as_json() for p in v.refusing]
            out["notes"] = [p.as_json() for p in v.notes]
        return out


def record(path: Path, cfg: Config, key: str | None, v: probe.Verdict, shown: dict[str, Any]) -> None:
    """The answer, for the next fire (``key``: None when it must not be reused) and ``evolve status``."""
    write_json(path, redact.current().json({  # messages quote commands and paths: masked like every sink
        "key": key, "config": probe.config_key(cfg.gate.commands, cfg.workspace), "at": utc_iso(),
        "problems": [p.as_json() for p in v.refusing], "notes": [p.as_json() for p in v.notes],
        "sees": {k: val for k, val in shown.items() if k not in ("problems", "notes")},
    }))


def cached(path: Path, key: str) -> dict[str, Any] | None:
    rec = read_json(path)
    return rec if isinstance(rec, dict) and rec.get("key") == key else None


def from_record(rec: dict[str, Any]) -> probe.Verdict:
    v = probe.Verdict(commands=list((rec.get("sees") or {}).get("commands") or []))
    for p in [*(rec.get("problems") or []), *(rec.get("notes") or [])]:
        if isinstance(p, dict):
            v.problems.append(probe.Problem(str(p.get("command", "")), str(p.get("message", "")),
                                            str(p.get("fix", "")), bool(p.get("refuse", True))))
    return v
