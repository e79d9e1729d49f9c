"""What the gate will see (docs/DESIGN.md §8.4): the pure rules, each a function of a snapshot.

The gate runs in evolve's worktree, but what a command *imports* is decided by its interpreter, its
``sys.path`` and whatever is installed there: with the usual venv in the operator's checkout and the
project installed editable, ``import mypkg`` finds the checkout's ``src/``, so the gate judges the
operator's code, not the agent's. These rules say, for each gate command, what it starts (the
interpreter, ``sys.path[0]``, the module; for a command that hides it, such as ``make test``, the ways
it might start Python, each asked: :func:`ways`), which names the project's own code goes by, where each
resolved (``worktree``, ``checkout``, ``elsewhere``, ``missing``) and, when that is not the worktree,
the one-line problem and the exact ``[workspace]`` fix. The shell (:mod:`evolve.cycle.sees`) gathers
the snapshot (a PATH lookup, a ``#!`` line, a directory listing, one interpreter run) and applies the
answer. Standard library and the config only: ``evolve status`` reads the recorded answer through
:func:`config_key`.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

MAX_NAMES = 12  # top-level import names probed per project

_PYTHON = re.compile(r"(python|pypy)(\d+(\.\d+)*)?")
_SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ksh"})
# Programs that run other commands the probe cannot see: a shell, a task runner (make, or a Python one such
# as invoke or poe: their tasks go through a shell too), a wrapper that starts its argument.
_TASK_RUNNERS = frozenset({"make", "gmake", "just", "task", "invoke", "inv", "poe", "doit"})
_RUNNER_MODULES = frozenset({"invoke", "poethepoet", "doit"})  # ``python -m`` of a task runner
_WRAPPERS = frozenset({"env", "timeout", "nice", "nohup", "ionice", "stdbuf", "setsid", "xvfb-run", "time", "chrt",
                       "taskset", "flock"})
_OPAQUE = _SHELLS | _TASK_RUNNERS | _WRAPPERS
# Modules that read files rather than import the project: a gate of theirs sees the tree it runs in,
# so what the interpreter would import is only a note.
_FILE_TOOLS = frozenset({
    "black", "ruff", "flake8", "isort", "pyflakes", "pycodestyle", "pydocstyle", "bandit", "codespell",
    "pre_commit", "yamllint", "autopep8", "docformatter", "pyupgrade",
})
_NODE = frozenset({"npm", "npx", "node", "nodejs", "yarn", "pnpm", "bun"})
# Tools that build their own environment from the tree they run in: what they import is theirs to get right.
_ISOLATING = frozenset({"tox", "nox", "hatch", "uvx"})
# uv run's options that take a value (the rest are flags); the command follows them.
_UV_VALUE_OPTS = frozenset({
    "--with", "--with-editable", "--with-requirements", "--extra", "--group", "--no-group", "--only-group",
    "--package", "--python", "-p", "--directory", "--project", "--env-file", "--index", "--default-index",
    "--index-url", "-i", "--extra-index-url", "--find-links", "-f", "--config-file", "--cache-dir",
    "--index-strategy", "--resolution", "--prerelease", "--exclude-newer", "--link-mode", "--keyring-provider",
    "--python-platform", "--refresh-package", "--reinstall-package", "--upgrade-package", "-P",
    "--no-binary-package", "--no-build-package", "--config-setting", "-C", "--color", "--allow-insecure-host",
})
_EXCLUDED_DIRS = frozenset({
    "tests", "test", "testing", "docs", "doc", "examples", "example", "scripts", "benchmarks", "bench",
    "build", "dist", "tools", "site", "htmlcov", "node_modules", "venv", "env", "typings", "stubs",
})
_EXCLUDED_MODULES = frozenset({"setup", "conftest", "noxfile", "fabfile", "tasks", "manage", "dodo", "toxfile"})
_FROM_IMPORT = re.compile(r"^from ([A-Za-z_][\w.]*) import ", re.M)
_PIP_SH_EXEC = re.compile(r"""^'''exec' "?([^"\n]+?)"? "\$0" "\$@"$""", re.M)  # pip's launcher for long paths


# -- what a gate command starts -------------------------------------------------------------------


@dataclass(frozen=True)
class Launch:
    """What one gate command starts, as far as the gate's PATH and the program's ``#!`` line say.

    ``kind``: ``python`` (an interpreter), ``script`` (a Python entry point such as ``pytest``), ``uv``
    (``uv run …``), ``node`` (npm, npx, node, yarn, pnpm), ``isolating`` (tox, nox, hatch: they make their
    own environment from the tree), ``shell`` (a shell script, make and other task runners: what they run
    is not known, so the PATH's python is asked), ``other`` (a compiled program) or ``missing`` (not on
    the gate's PATH).
    """

    label: str
    kind: str
    program: str | None = None  # argv[0] as the gate's PATH resolves it
    interpreter: str | None = None  # the Python that runs (from PATH, or the #! line)
    flags: tuple[str, ...] = ()  # interpreter options (the #! line's, or before -m)
    module: str | None = None  # ``python -m X``'s X, or the module an entry point imports
    path0: str | None = None  # sys.path[0]: "" = the cwd, "@bin" = the interpreter's own dir, None = none
    pytest: bool = False  # pytest's own sys.path rules apply
    uv_args: tuple[str, ...] = ()  # uv run's options, before its command
    inner: tuple[str, ...] = ()  # uv run's command
    opaque: bool = False  # what it runs is not seen: asked both ways (:func:`ways`)
    via: str | None = None  # the PATH program an opaque command may start (:func:`companion`)
    role: str = "gate command"  # or "goal check <id>" (GOALS checks run in the worktree too)

    def as_json(self) -> dict[str, Any]:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(self).items()
                if v not in ((), None) and k != "role"}


def label(argv: Sequence[str]) -> str:
    text = shlex.join(argv)
    return text if len(text) <= 160 else text[:159] + "…"


def is_python(name: str) -> bool:
    return _PYTHON.fullmatch(os.path.basename(name)) is not None


def parse_python_args(args: Sequence[str]) -> tuple[tuple[str, ...], str | None, str | None, bool]:
    """An interpreter's arguments: (its options, ``-m`` module, script path, ``-c`` given). Short options
    combine as Python reads them: ``-Bc code``, ``-Im pytest``, ``-Wdefault``."""
    flags: list[str] = []
    i = 0
    while i < len(args):
        a = args[i]
        if a == "-" or not a.startswith("-"):
            return tuple(flags), None, (None if a == "-" else a), a == "-"
        if a.startswith("--"):
            flags.append(a)
            i += 1
            continue
        for j, ch in enumerate(a[1:], start=1):
            rest = a[j + 1 :]
            if ch == "m":
                return tuple(flags), rest or (args[i + 1] if i + 1 < len(args) else ""), None, False
            if ch == "c":
                return tuple(flags), None, None, True
            if ch in "WXQ":
                flags += [f"-{ch}", rest] if rest else [f"-{ch}", *args[i + 1 : i + 2]]
                if not rest:
                    i += 1
                break
            flags.append(f"-{ch}")
        i += 1
    return tuple(flags), None, None, True  # no script: like -c, sys.path[0] is the cwd


def _isolated(flags: Sequence[str]) -> bool:
    """-I (isolated) or -P (safe path): no cwd or script dir on sys.path."""
    return any(f.startswith("-") and not f.startswith("--") and ("I" in f[1:] or "P" in f[1:]) for f in flags)


def shebang(head: str, which: Callable[[str], str | None]) -> tuple[str | None, tuple[str, ...], str]:
    """A script's ``#!`` line: (interpreter, its options, the interpreter's name as written)."""
    first = head.split("\n", 1)[0]
    if not first.startswith("#!"):
        return None, (), ""
    words = first[2:].split()
    if not words:
        return None, (), ""
    prog, rest = words[0], words[1:]
    base = os.path.basename(prog)
    if base == "env":
        while rest and rest[0].startswith("-"):
            rest = rest[2:] if rest[0] in ("-u", "--unset", "-C", "--chdir") else rest[1:]
        if not rest:
            return None, (), "env"
        return which(rest[0]), tuple(rest[1:]), rest[0]
    if base in ("sh", "bash", "dash"):
        m = _PIP_SH_EXEC.search(head)
        if m:
            return m.group(1), (), os.path.basename(m.group(1))
    return prog, tuple(rest), base


def entry_module(head: str) -> str | None:
    """The module a pip-made console script imports (``from pytest import console_main``)."""
    m = _FROM_IMPORT.search(head)
    return m.group(1) if m else None


def parse_uv_run(args: Sequence[str]) -> tuple[tuple[str, ...], tuple[str, ...]] | None:
    """``uv [opts] run [opts] CMD…``: (run's options, CMD…); None when it is not ``uv run``."""
    i = 0
    while i < len(args) and args[i].startswith("-"):
        i += 1
    if i >= len(args) or args[i] != "run":
        return None
    opts: list[str] = []
    i += 1
    while i < len(args):
        a = args[i]
        if a == "--":
            return tuple(opts), tuple(args[i + 1 :])
        if not a.startswith("-"):
            return tuple(opts), tuple(args[i:])
        if a in _UV_VALUE_OPTS:
            opts.extend(args[i : i + 2])
            i += 2
            continue
        opts.append(a)
        i += 1
    return tuple(opts), ()


def classify(argv: Sequence[str], which: Callable[[str], str | None], head: Callable[[str], str],
             role: str = "gate command") -> Launch:
    """What ``argv`` starts: ``which`` is the gate's PATH lookup (a path with a ``/`` is taken relative to
    the worktree), ``head`` the first bytes of a file as text ("" when unreadable)."""
    return replace(_classify(argv, which, head), role=role)


def _classify(argv: Sequence[str], which: Callable[[str], str | None], head: Callable[[str], str]) -> Launch:
    text = label(argv)
    if not argv:
        return Launch(text, "missing")
    name = os.path.basename(argv[0])
    program = which(argv[0])
    if program is None:
        return Launch(text, "missing")
    if name in _ISOLATING:
        return Launch(text, "isolating", program)
    if name in _NODE:
        return Launch(text, "node", program)
    if name == "uv":
        run = parse_uv_run(argv[1:])
        if run is None:
            return Launch(text, "other", program)
        opts, inner = run
        is_pytest = bool(inner) and (os.path.basename(inner[0]) in ("pytest", "py.test")
                                     or (is_python(inner[0]) and parse_python_args(inner[1:])[1] == "pytest"))
        # uv run of a shell, a task runner or a script file: what that runs is not seen (uv puts its venv's
        # bin first on PATH, so its python is the one asked, both ways).
        opaque = not inner or os.path.basename(inner[0]) in _OPAQUE or inner[0].endswith(".sh") or (
            is_python(inner[0]) and (parse_python_args(inner[1:])[1] or "").split(".")[0] in _RUNNER_MODULES)
        path0 = None if opaque else "" if is_python(inner[0]) else "@bin"
        return Launch(text, "uv", program, path0=path0, pytest=is_pytest and not opaque, uv_args=opts, inner=inner,
                      opaque=opaque)
    if name in _OPAQUE:  # before the #! line: invoke and poe are Python scripts whose tasks run through a shell
        return Launch(text, "shell", program, opaque=True)
    if is_python(argv[0]):
        flags, module, script, _code = parse_python_args(argv[1:])
        if module in _ISOLATING:
            return Launch(text, "isolating", program, interpreter=program, flags=flags, module=module)
        if (module or "").split(".")[0] in _RUNNER_MODULES:
            return Launch(text, "shell", program, interpreter=program, opaque=True)
        path0: str | None = ""
        if script is not None:
            path0 = os.path.dirname(script) or "."
        if _isolated(flags):
            path0 = None
        top = (module or "").split(".")[0] or None
        return Launch(text, "python", program, interpreter=program, flags=flags, module=top, path0=path0,
                      pytest=top == "pytest")
    start = head(program)
    interp, flags, written = shebang(start, which)
    if interp is not None and is_python(written or interp):
        module = entry_module(start)
        top = module.split(".")[0] if module else None
        is_pytest = name in ("pytest", "py.test") or top == "pytest"
        return Launch(text, "script", program, interpreter=interp, flags=flags, module=top,
                      path0=None if _isolated(flags) else "@script", pytest=is_pytest)
    if interp is not None and os.path.basename(written or interp) in _NODE:
        return Launch(text, "node", program)
    if interp is not None and os.path.basename(written or interp) in _SHELLS:
        return Launch(text, "shell", program, opaque=True)
    return Launch(text, "other", program)  # a compiled program (ruff, go, cargo): it imports nothing of Python


# -- the project's own names and the tree ---------------------------------------------------------


@dataclass(frozen=True)
class TreeFacts:
    """What the worktree's top level says about the project (gathered by the shell, no code run)."""

    src: tuple[str, ...] = ()  # importable names under src/ (packages with or without __init__, modules)
    packages: tuple[str, ...] = ()  # top-level directories with an __init__.py
    modules: tuple[str, ...] = ()  # top-level *.py modules (without .py)
    project_name: str | None = None  # [project] name, or setup.cfg's [metadata] name
    python_project: bool = False  # pyproject.toml, setup.py or setup.cfg present
    extras: tuple[str, ...] = ()  # [project.optional-dependencies] keys
    requirements: tuple[str, ...] = ()  # top-level requirements*.txt files
    uv_lock: bool = False
    conftest: bool = False  # conftest.py at the top
    tests_init: bool = False  # tests/__init__.py or test/__init__.py: pytest puts the top on sys.path
    pythonpath: tuple[str, ...] = ()  # pytest's ``pythonpath`` ini option (relative to the top)
    import_mode: str = "prepend"  # pytest's --import-mode (from addopts)
    package_json: bool = False

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def import_names(facts: TreeFacts) -> list[str]:
    """The project's own top-level import names: src/ first (the src layout), else the flat layout's
    packages and modules, with the project's name (pyproject) first when it is one of them."""
    if facts.src:
        names = sorted(set(facts.src))
    else:
        names = sorted({p for p in facts.packages if p not in _EXCLUDED_DIRS}
                       | {m for m in facts.modules if m not in _EXCLUDED_MODULES and not m.startswith("test_")})
    names = [n for n in names if n.isidentifier() and not n.startswith("_")]
    hint = normalize(facts.project_name) if facts.project_name else None
    if hint in names:
        names.remove(hint)
        names.insert(0, hint)
    return names[:MAX_NAMES]


def pytest_front(facts: TreeFacts, argv: Sequence[str] = ()) -> list[str]:
    """What pytest itself puts first on sys.path, relative to the top ("" = the top): its ``pythonpath``
    ini option, and in prepend mode the top itself when a conftest.py there or a ``tests`` package
    makes it the rootdir of an imported file."""
    mode = facts.import_mode
    for a in argv:
        if a.startswith("--import-mode="):
            mode = a.split("=", 1)[1]
    front = [p.strip("/") or "" for p in facts.pythonpath]
    if mode == "prepend" and (facts.conftest or facts.tests_init):
        front.append("")
    return front


# -- where each name resolved, and what that means ---------------------------------------------------


def within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def place(spec: Mapping[str, Any] | None, *, tree: str, repo: str) -> tuple[str, str]:
    """Where a name resolved (realpaths): ``worktree``, ``checkout`` (the operator's, outside the
    worktree), ``elsewhere`` (an installed copy: any ``site-packages``, or outside both) or ``missing``;
    and the path that says so."""
    if not spec:
        return "missing", ""
    if spec.get("error"):
        return "missing", str(spec["error"])
    where = [str(spec["origin"])] if spec.get("origin") else [str(p) for p in spec.get("locations") or []]
    if not where:
        return "missing", ""
    installed = [p for p in where if {"site-packages", "dist-packages"} & set(p.split("/"))]
    if installed:  # a copy pip installed, even in a venv inside the checkout or the worktree
        return "elsewhere", installed[0]
    if any(within(p, tree) for p in where):
        return "worktree", next(p for p in where if within(p, tree))
    if any(within(p, repo) for p in where):
        return "checkout", next(p for p in where if within(p, repo))
    return "elsewhere", where[0]


@dataclass(frozen=True)
class Problem:
    """One thing the gate would get wrong; ``refuse``: fires exit 78 before claiming (else a note)."""

    command: str
    message: str
    fix: str
    refuse: bool = True

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


PROBE_OFF = "; or [workspace] probe = false if the gate is right as it is"


def python_fix(facts: TreeFacts, launch: Launch | None, *, config: str, in_place: bool) -> str:
    """The exact ``[workspace]`` lines that give the worktree its own environment."""
    if in_place:
        return (f'put the project\'s venv first on the PATH evolve runs with, or in {config}: [workspace] '
                f'path = [".venv/bin"] (a venv in the checkout)')
    if facts.uv_lock:
        setup: list[list[str]] = [["uv", "sync", "--frozen"]]
    else:
        extra = next((e for e in ("test", "tests", "testing", "dev") if e in facts.extras), None)
        pip = [".venv/bin/pip", "install", "-e", f".[{extra}]" if extra else "."]
        req = next((r for r in facts.requirements if any(w in r for w in ("dev", "test"))), None)
        if extra is None and req:
            pip += ["-r", req]
        elif extra is None and launch is not None and (launch.pytest or launch.opaque):
            pip.append("pytest")  # an opaque gate in a Python project (make test) most likely runs pytest
        setup = [["python3", "-m", "venv", ".venv"], pip]
    return (f"in {config}: [workspace] setup = {json.dumps(setup)} and path = [\".venv/bin\"] "
            f"(a venv in the worktree with the project installed from it){PROBE_OFF}")


def python_problems(launch: Launch, answer: Mapping[str, Any] | None, names: Sequence[str], facts: TreeFacts,
                    *, tree: str, repo: str, config: str) -> tuple[list[Problem], dict[str, dict[str, str]]]:
    """The problems of one Python gate command from the interpreter's answer (``answer``: the probe's
    JSON: ``executable``, ``spec`` {name: spec}; ``error`` when it could not run), and the places seen."""
    in_place = tree == repo
    fix = python_fix(facts, launch, config=config, in_place=in_place)
    interp = launch.interpreter or launch.program or "?"
    who = f"the gate's interpreter {interp}" if launch.role == "gate command" else f"its interpreter {interp}"
    if launch.kind == "uv":
        who = "uv run's interpreter"
    if launch.via:
        who = f"the {launch.via} on the gate's PATH ({launch.program}, run by {interp})"
    if answer is None or answer.get("error"):
        if launch.via:  # a program the command may not even start: one that cannot answer fails the gate red
            return [], {}
        why = (answer or {}).get("error") or "no answer"
        return [Problem(launch.label, f"{launch.role} {launch.label!r}: cannot ask {who} what it imports: {why}",
                        fix)], {}
    specs = answer.get("spec") or {}
    seen = {n: dict(zip(("place", "path"), place(specs.get(n), tree=tree, repo=repo), strict=True)) for n in names}
    out: list[Problem] = []
    if launch.module and not launch.via and launch.module not in names and place(
            specs.get(launch.module), tree=tree, repo=repo)[0] == "missing":
        out.append(Problem(launch.label, f"{launch.role} {launch.label!r}: {who} has no module {launch.module!r}",
                           fix))
    # A program an opaque command may start is only wrong when it would test other code: one that cannot
    # import the project makes the gate red, not green.
    bad = [(n, s) for n, s in seen.items() if s["place"] != "worktree" and not (launch.via and s["place"] == "missing")]
    if bad:
        n, s = bad[0]
        more = f" (and {len(bad) - 1} more of the project's names)" if len(bad) > 1 else ""
        if s["place"] == "checkout":
            what = f"imports {n} from your checkout ({s['path']}), not the worktree"
        elif s["place"] == "elsewhere":
            what = f"imports {n} from {s['path']} (an installed copy), not the worktree"
        else:
            what = f"cannot import {n} at all"
        if launch.module in _FILE_TOOLS:
            out.append(Problem(launch.label, f"{launch.role} {launch.label!r}: {who} {what}{more} ({launch.module} "
                               "reads the worktree's files, so it judges them all the same)", fix, refuse=False))
        else:
            why = (f"; evolve cannot see whether {launch.label!r} starts it, so it must import the worktree's code too"
                   if launch.via else "")
            out.append(Problem(launch.label, f"{launch.role} {launch.label!r}: {who} {what}{more}{why}", fix))
    return out, seen


# How each way of asking sets sys.path[0] (the probe script's ``path0``), and what it stands for.
WAYS: dict[str, tuple[str, str]] = {
    "cwd": ("", "as `python -m ...` or a script in the worktree runs (the worktree first on sys.path)"),
    "entry": ("@drop", "as an entry-point script such as `pytest` runs (sys.path[0] its bin directory, not the "
                       "worktree)"),
}


def ways(launch: Launch) -> tuple[tuple[str, str | None], ...]:
    """How to ask a command's interpreter: ``(way, path0)`` pairs. A command whose final interpreter
    invocation is not seen (``opaque``: make, a shell script, ``uv run make``) may start ``python -m X``
    (the cwd first on sys.path) or an entry point (no cwd): both are asked, and either going wrong refuses.
    Everything else once, as it runs (way ``""``)."""
    if launch.opaque:
        return tuple((w, WAYS[w][0]) for w in ("cwd", "entry"))
    return (("", launch.path0),)


def companion(opaque: Launch, found: Launch) -> Launch | None:
    """A program an opaque command may start, to ask as it runs: ``found`` is the gate PATH's ``pytest``
    as :func:`classify` sees it. Asked only when it is a Python entry point of another environment than
    the interpreter the opaque command is asked with (the same one is covered by the ``entry`` way)."""
    if not opaque.opaque or opaque.kind != "shell" or found.kind != "script" or not found.interpreter:
        return None
    if opaque.interpreter and os.path.dirname(found.interpreter) == os.path.dirname(opaque.interpreter):
        return None
    return replace(found, label=opaque.label, role=opaque.role, via=os.path.basename(found.label.split()[0]))


Seen = dict[str, dict[str, str]]  # name -> {"place", "path"}


def python_verdict(launch: Launch, answers: Sequence[tuple[str, Mapping[str, Any] | None]], names: Sequence[str],
                   facts: TreeFacts, *, tree: str, repo: str,
                   config: str) -> tuple[list[Problem], Seen, dict[str, Seen]]:
    """:func:`python_problems` over each way a command was asked (``answers``: ``(way, answer)`` in
    :func:`ways` order): the problems, each saying which way and why; where each name resolved (the
    worst way's place); and, for more than one way, the places per way."""
    per = [(way, *python_problems(launch, answer, names, facts, tree=tree, repo=repo, config=config))
           for way, answer in answers]
    if len(per) == 1:
        return per[0][1], per[0][2], {}
    seen: Seen = {}
    for n in names:
        found = [s[n] for _, _, s in per if n in s]
        if found:
            seen[n] = next((f for f in found if f["place"] != "worktree"), found[0])
    by_way = {way: s for way, _, s in per}
    bad = [(way, ps) for way, ps, _ in per if ps]
    if not bad:
        return [], seen, by_way
    unseen = f"evolve cannot see what {launch.label!r} runs, so it must import the worktree's code both ways"
    if len(bad) == len(per) and all([p.message for p in ps] == [p.message for p in bad[0][1]] for _, ps in bad):
        both = " or ".join(WAYS[w][1] for w, _ in bad)
        return [replace(p, message=f"{p.message}, either way: run {both}") for p in bad[0][1]], seen, by_way
    out = []
    for way, ps in bad:
        fix_more = ""
        if way == "entry" and all(w == "entry" for w, _ in bad):
            # Only the entry point goes wrong: the same tests run as `python -m` run in the worktree.
            fix_more = (f"; or make the gate command what {launch.label!r} runs, started as `python -m` starts it "
                        '(e.g. ["python", "-m", "pytest"]): the worktree is first on its sys.path')
        out += [replace(p, message=f"{p.message}, when run {WAYS[way][1]}; {unseen}",
                        fix=p.fix.replace(PROBE_OFF, fix_more + PROBE_OFF)) for p in ps]
    return out, seen, by_way


@dataclass(frozen=True)
class NodeFacts:
    package_json: bool = False
    tree_modules: str = "absent"  # node_modules in the worktree: absent | dir | link | other
    repo_modules: bool = False  # the checkout has a node_modules directory
    lock: str | None = None  # package-lock.json, npm-shrinkwrap.json, yarn.lock, pnpm-lock.yaml
    nested: bool = True  # the worktree is inside the checkout: node walks up to the checkout's node_modules
    foreign: tuple[tuple[str, str], ...] = ()  # packages the worktree's node would load from checkout code
    repo_foreign: bool = False  # the checkout's node_modules links packages to its own code (workspaces)

    def as_json(self) -> dict[str, Any]:
        return {**asdict(self), "foreign": [list(f) for f in self.foreign]}


def node_setup(lock: str | None) -> list[str]:
    if lock == "yarn.lock":
        return ["yarn", "install", "--frozen-lockfile"]
    if lock == "pnpm-lock.yaml":
        return ["pnpm", "install", "--frozen-lockfile"]
    return ["npm", "ci"] if lock in ("package-lock.json", "npm-shrinkwrap.json") else ["npm", "install"]


def node_problems(launch: Launch, facts: NodeFacts, *, config: str) -> list[Problem]:
    """Does the worktree's node load the worktree's code and dependencies?"""
    if not facts.package_json:
        return []
    setup = f"in {config}: [workspace] setup = {json.dumps([node_setup(facts.lock)])}"
    if facts.foreign:
        name, target = facts.foreign[0]
        return [Problem(launch.label, f"{launch.role} {launch.label!r}: node_modules/{name} in the worktree "
                        f"loads your checkout's {target}, not the worktree's", setup + " (instead of link)")]
    if facts.tree_modules != "absent" or not facts.repo_modules:
        return []
    # Linking the checkout's node_modules is no fix when its links load the checkout's own packages.
    link = "" if facts.repo_foreign else ', or link = ["node_modules"]'
    if not facts.nested:
        return [Problem(launch.label, f"{launch.role} {launch.label!r}: the worktree has no node_modules (yours is "
                        "in the checkout): its dependencies are not found there", setup + link)]
    if facts.repo_foreign:
        return [Problem(launch.label, f"{launch.role} {launch.label!r}: the worktree has no node_modules, so node "
                        "finds your checkout's, whose links load the checkout's own packages, not the worktree's",
                        setup)]
    return [Problem(launch.label, f"{launch.role} {launch.label!r}: the worktree has no node_modules; node finds "
                    "your checkout's by walking up, so a dependency a change adds is not installed",
                    setup + link, refuse=False)]


def missing_problem(launch: Launch, path: str) -> Problem:
    shown = path if len(path) <= 200 else path[:199] + "…"
    return Problem(launch.label, f"{launch.role} {launch.label!r}: {shlex.split(launch.label)[0]!r} is not on "
                   f"the gate's PATH ({shown})",
                   "put it on the PATH evolve runs with (the unit's Environment=PATH, the cron line), "
                   "or name the worktree's dir in [workspace] path")


# What a checkout's git-ignored top level holds that no test reads as configuration: caches, builds, editors.
_IGNORED_NOISE = frozenset({
    ".venv", "venv", "node_modules", "__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache", ".tox",
    ".nox", "build", "dist", ".coverage", "htmlcov", "coverage", ".agents", ".claude", "CLAUDE.local.md",
    ".idea", ".vscode", ".DS_Store", ".hypothesis", ".eggs", ".cache", ".next", ".turbo", "target", ".gradle",
    ".parcel-cache", ".direnv", ".python-version", ".benchmarks", "site",
})


def missing_ignored(ignored: Iterable[str], *, present: Callable[[str], bool], configured: Iterable[str]) -> list[str]:
    """The checkout's git-ignored top-level files the worktree lacks that a test might read (``local.conf``,
    ``.env``): not a cache or build output, not already linked or copied in."""
    conf = {c.strip("/").split("/")[0] for c in configured}
    out = []
    for name in ignored:
        n = name.rstrip("/")
        if ("/" in n or n in _IGNORED_NOISE or n in conf or n.endswith((".egg-info", ".pyc", ".log", ".swp", "~"))
                or present(n)):
            continue
        out.append(n)
    return sorted(out)[:10]


def ignored_note(missing: Sequence[str], *, config: str) -> Problem | None:
    if not missing:
        return None
    shown = ", ".join(missing)
    return Problem("", f"your checkout has git-ignored {shown} that the worktree lacks (the gate runs there)",
                   f"if the tests read them, in {config}: [workspace] copy = {json.dumps(list(missing))} "
                   "(or link)", refuse=False)


# -- the whole verdict ------------------------------------------------------------------------------


@dataclass
class Verdict:
    """Everything the probe saw: per command what it starts and imports, the problems, the notes."""

    commands: list[dict[str, Any]] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)

    @property
    def refusing(self) -> list[Problem]:
        return [p for p in self.problems if p.refuse]

    @property
    def notes(self) -> list[Problem]:
        return [p for p in self.problems if not p.refuse]


def needs_python(launch: Launch, facts: TreeFacts) -> bool:
    """Whether the Python rules apply: a Python launch, or an opaque command in a Python project (one that
    also has a package.json included: what make runs may be either, so both rules apply)."""
    if launch.kind in ("python", "script", "uv"):
        return True
    return launch.kind == "shell" and facts.python_project


def needs_node(launch: Launch, facts: TreeFacts) -> bool:
    return launch.kind == "node" or (launch.kind == "shell" and facts.package_json)


def config_key(gate_commands: Iterable[Sequence[str]], workspace: Any) -> str:
    """What a recorded answer depends on in the config (status shows a record only while it holds)."""
    ws = asdict(workspace) if hasattr(workspace, "__dataclass_fields__") else dict(workspace)
    blob = json.dumps({"gate": [list(c) for c in gate_commands], "workspace": ws}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]
