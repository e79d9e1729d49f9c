"""The gate probe's pure rules as tables (docs/DESIGN.md §8.4): what a command starts, the project's
names, what pytest puts on sys.path, where a name resolved, and the problem and fix for each case."""

from __future__ import annotations

from dataclasses import replace

import pytest

from evolve.cycle import probe
from evolve.cycle.probe import Launch, NodeFacts, TreeFacts

PATH = {
    "python": "/venv/bin/python", "python3": "/usr/bin/python3", "pytest": "/venv/bin/pytest",
    "py.test": "/venv/bin/py.test", "uv": "/usr/bin/uv", "npm": "/usr/bin/npm", "tox": "/usr/bin/tox",
    "make": "/usr/bin/make", "long": "/venv/bin/long", "nodescript": "/opt/bin/nodescript",
    "envscript": "/opt/bin/envscript", "./run.sh": "/t/run.sh", "node": "/usr/bin/node",
    "ruff": "/venv/bin/ruff", "black": "/venv/bin/black", "bash": "/bin/bash", "env": "/usr/bin/env",
    "timeout": "/usr/bin/timeout", "invoke": "/venv/bin/invoke",
}
HEADS = {
    "/venv/bin/pytest": "#!/venv/bin/python\n# -*- coding: utf-8 -*-\nimport re\nimport sys\n"
                        "from pytest import console_main\n",
    "/venv/bin/py.test": "#!/venv/bin/python -sE\nfrom pytest import console_main\n",
    "/venv/bin/long": "#!/bin/sh\n'''exec' \"/very long/venv/bin/python\" \"$0\" \"$@\"\n' '''\n"
                      "from mytool.cli import main\n",
    "/opt/bin/nodescript": "#!/usr/bin/env node\nconsole.log(1)\n",
    "/opt/bin/envscript": "#!/usr/bin/env -S python3 -I\nfrom tool import main\n",
    "/t/run.sh": "#!/bin/bash\nset -e\npytest\n",
    "/venv/bin/black": "#!/venv/bin/python\nimport sys\nfrom black import patched_main\n",
    "/venv/bin/invoke": "#!/venv/bin/python\nimport sys\nfrom invoke.main import program\n",
}


def classify(argv: list[str]) -> Launch:
    return probe.classify(argv, PATH.get, lambda p: HEADS.get(p, ""))


@pytest.mark.parametrize(("argv", "want"), [
    (["python", "-m", "pytest", "-q"],
     dict(kind="python", interpreter="/venv/bin/python", module="pytest", path0="", pytest=True)),
    (["python3", "-X", "dev", "-m", "unittest"], dict(kind="python", module="unittest", flags=("-X", "dev"))),
    (["python", "-I", "-m", "pytest"], dict(kind="python", path0=None, pytest=True)),
    (["python", "-Bc", "print(1)"], dict(kind="python", path0="", module=None, flags=("-B",))),
    (["python", "-Im", "pytest"], dict(kind="python", path0=None, module="pytest", flags=("-I",))),
    (["python", "-Wdefault", "-m", "x"], dict(kind="python", module="x", flags=("-W", "default"))),
    (["python", "-u", "-W", "error", "t.py"], dict(kind="python", path0=".", flags=("-u", "-W", "error"))),
    (["python", "tests/run.py"], dict(kind="python", path0="tests", module=None)),
    (["python"], dict(kind="python", path0="")),
    (["python", "-mpytest"], dict(kind="python", module="pytest")),
    (["python", "-m", "pkg.sub"], dict(kind="python", module="pkg")),
    (["python", "-m", "tox"], dict(kind="isolating")),
    (["pytest", "-q"], dict(kind="script", interpreter="/venv/bin/python", module="pytest", path0="@script",
                            pytest=True)),
    (["py.test"], dict(kind="script", flags=("-sE",), pytest=True)),
    (["long"], dict(kind="script", interpreter="/very long/venv/bin/python", module="mytool")),
    (["envscript"], dict(kind="script", interpreter="/usr/bin/python3", flags=("-I",), path0=None, module="tool")),
    (["nodescript"], dict(kind="node")),
    (["npm", "test"], dict(kind="node", program="/usr/bin/npm")),
    (["node", "t.js"], dict(kind="node")),
    (["tox", "-e", "py"], dict(kind="isolating")),
    (["make", "test"], dict(kind="shell", opaque=True)),
    (["./run.sh"], dict(kind="shell", program="/t/run.sh", opaque=True)),
    # What these start is not seen: a shell by name, a wrapper, a Python task runner (its tasks go through a
    # shell, so its own #! line says nothing about them), python -m of one.
    (["bash", "-c", "pytest -q"], dict(kind="shell", program="/bin/bash", opaque=True, interpreter=None)),
    (["env", "PYTHONPATH=src", "pytest"], dict(kind="shell", opaque=True)),
    (["timeout", "600", "pytest"], dict(kind="shell", opaque=True)),
    (["invoke", "test"], dict(kind="shell", program="/venv/bin/invoke", opaque=True)),
    (["python", "-m", "invoke", "test"], dict(kind="shell", interpreter="/venv/bin/python", opaque=True)),
    (["python", "-m", "pytest"], dict(opaque=False)),
    (["pytest"], dict(opaque=False)),
    (["ruff", "check", "."], dict(kind="other", program="/venv/bin/ruff")),
    (["black", "--check", "."], dict(kind="script", module="black")),
    (["nope"], dict(kind="missing")),
    (["uv", "run", "pytest", "-q"], dict(kind="uv", inner=("pytest", "-q"), path0="@bin", pytest=True)),
    (["uv", "run", "--frozen", "--extra", "test", "python", "-m", "pytest"],
     dict(kind="uv", uv_args=("--frozen", "--extra", "test"), inner=("python", "-m", "pytest"), path0="",
          pytest=True)),
    (["uv", "--offline", "run", "--with=pytest", "--", "pytest"],
     dict(kind="uv", uv_args=("--with=pytest",), inner=("pytest",))),
    (["uv", "sync"], dict(kind="other")),
    (["uv", "run", "pytest"], dict(kind="uv", opaque=False)),
    (["uv", "run", "make", "test"], dict(kind="uv", opaque=True, path0=None, pytest=False, inner=("make", "test"))),
    (["uv", "run", "./scripts/test.sh"], dict(kind="uv", opaque=True)),
    (["uv", "run", "bash", "-c", "pytest"], dict(kind="uv", opaque=True, pytest=False)),
    (["uv", "run", "python", "-m", "invoke", "test"], dict(kind="uv", opaque=True)),
])
def test_classify_table(argv, want) -> None:
    got = classify(argv)
    assert {k: getattr(got, k) for k in want} == want


@pytest.mark.parametrize(("head", "interp", "flags"), [
    ("#!/usr/bin/python3\n", "/usr/bin/python3", ()),
    ("#!/usr/bin/env python3\n", "/usr/bin/python3", ()),
    ("#!/usr/bin/env -S python3 -u\n", "/usr/bin/python3", ("-u",)),
    ("#!/usr/bin/env -u FOO python\n", "/venv/bin/python", ()),
    ("#!\n", None, ()),
    ("no shebang\n", None, ()),
])
def test_shebang_table(head, interp, flags) -> None:
    got, fl, _ = probe.shebang(head, PATH.get)
    assert (got, fl) == (interp, flags)


@pytest.mark.parametrize(("facts", "names"), [
    (TreeFacts(src=("mypkg",), packages=("tests",), python_project=True), ["mypkg"]),
    (TreeFacts(packages=("mypkg", "tests", "docs"), modules=("setup", "conftest", "noxfile"), python_project=True),
     ["mypkg"]),
    (TreeFacts(modules=("tool", "test_tool", "setup")), ["tool"]),
    (TreeFacts(packages=("b_pkg", "a_pkg", "_private"), project_name="B-Pkg"), ["b_pkg", "a_pkg"]),
    (TreeFacts(src=("one", "two"), packages=("flat",)), ["one", "two"]),  # src wins: the layout it is
    (TreeFacts(packages=("not-an-identifier", "ok")), ["ok"]),
    (TreeFacts(), []),
])
def test_import_names_table(facts, names) -> None:
    assert probe.import_names(facts) == names


@pytest.mark.parametrize(("facts", "argv", "front"), [
    (TreeFacts(), [], []),
    (TreeFacts(conftest=True), [], [""]),
    (TreeFacts(tests_init=True), [], [""]),
    (TreeFacts(conftest=True, import_mode="importlib"), [], []),
    (TreeFacts(conftest=True), ["pytest", "--import-mode=append"], []),
    (TreeFacts(pythonpath=("src", "lib/")), [], ["src", "lib"]),
    (TreeFacts(pythonpath=("src",), conftest=True), [], ["src", ""]),
])
def test_pytest_front_table(facts, argv, front) -> None:
    assert probe.pytest_front(facts, argv) == front


T, R = "/r/.agents/evolve/worktree", "/r"


@pytest.mark.parametrize(("spec", "where"), [
    ({"origin": f"{T}/src/m/__init__.py"}, "worktree"),
    ({"origin": f"{R}/src/m/__init__.py"}, "checkout"),
    ({"origin": f"{R}/.venv/lib/python3.11/site-packages/m/__init__.py"}, "elsewhere"),
    ({"origin": f"{T}/.venv/lib/python3.11/site-packages/m/__init__.py"}, "elsewhere"),
    ({"origin": "/usr/lib/python3/dist-packages/m.py"}, "elsewhere"),
    ({"origin": None, "locations": [f"{R}/src/ns", f"{T}/src/ns"]}, "worktree"),  # a namespace package
    ({"origin": None, "locations": [f"{R}/src/ns"]}, "checkout"),
    ({"origin": f"{R}x/m.py"}, "elsewhere"),  # a sibling directory whose name starts like the checkout's
    (None, "missing"),
    ({"error": "ValueError: boom"}, "missing"),
])
def test_place_table(spec, where) -> None:
    assert probe.place(spec, tree=T, repo=R)[0] == where


PY = Launch("python -m pytest -q", "python", "/r/.venv/bin/python", interpreter="/r/.venv/bin/python",
            module="pytest", path0="", pytest=True)


def test_a_tool_that_reads_files_gets_a_note_not_a_refusal() -> None:
    black = Launch("black --check .", "script", "/r/.venv/bin/black", interpreter="/r/.venv/bin/python",
                   module="black", path0="@script")
    answer = {"spec": {"mypkg": {"origin": f"{R}/src/mypkg/__init__.py"}, "black": {"origin": "/x/black.py"}}}
    (p,) = probe.python_problems(black, answer, ["mypkg"], TreeFacts(src=("mypkg",)), tree=T, repo=R, config="C")[0]
    assert not p.refuse and "reads the worktree's files" in p.message


@pytest.mark.parametrize(("kind", "facts", "py", "node"), [
    ("python", TreeFacts(), True, False),
    ("shell", TreeFacts(python_project=True), True, False),
    ("shell", TreeFacts(package_json=True), False, True),
    ("shell", TreeFacts(python_project=True, package_json=True), True, True),  # make may run either: both
    ("other", TreeFacts(python_project=True), False, False),  # a compiled program imports no Python
    ("node", TreeFacts(python_project=True), False, True),
    ("isolating", TreeFacts(python_project=True), False, False),
])
def test_which_rules_apply_table(kind, facts, py, node) -> None:
    la = Launch("x", kind, "/x")
    assert (probe.needs_python(la, facts), probe.needs_node(la, facts)) == (py, node)


@pytest.mark.parametrize(("answer", "messages"), [
    ({"spec": {"mypkg": {"origin": f"{T}/src/mypkg/__init__.py"}, "pytest": {"origin": "/x/pytest/__init__.py"}}},
     []),
    ({"spec": {"mypkg": {"origin": f"{R}/src/mypkg/__init__.py"}, "pytest": {"origin": "/x/pytest/__init__.py"}}},
     ["the gate's interpreter /r/.venv/bin/python imports mypkg from your checkout (/r/src/mypkg/__init__.py), "
      "not the worktree"]),
    ({"spec": {"mypkg": None, "pytest": None}},
     ["the gate's interpreter /r/.venv/bin/python has no module 'pytest'",
      "the gate's interpreter /r/.venv/bin/python cannot import mypkg at all"]),
    ({"error": "timed out after 60s"},
     ["cannot ask the gate's interpreter /r/.venv/bin/python what it imports: timed out after 60s"]),
])
def test_python_problems_table(answer, messages) -> None:
    problems, _ = probe.python_problems(PY, answer, ["mypkg"], TreeFacts(src=("mypkg",)), tree=T, repo=R,
                                        config="CONF")
    assert [p.message.split(": ", 1)[1] for p in problems] == messages
    assert all(p.refuse and p.fix.startswith("in CONF: [workspace] setup = ") for p in problems)


@pytest.mark.parametrize(("facts", "launch", "setup"), [
    (TreeFacts(), PY, '[["python3", "-m", "venv", ".venv"], [".venv/bin/pip", "install", "-e", ".", "pytest"]]'),
    (TreeFacts(extras=("docs", "test")), PY,
     '[["python3", "-m", "venv", ".venv"], [".venv/bin/pip", "install", "-e", ".[test]"]]'),
    (TreeFacts(requirements=("requirements.txt", "requirements-dev.txt")), PY,
     '[["python3", "-m", "venv", ".venv"], [".venv/bin/pip", "install", "-e", ".", "-r", "requirements-dev.txt"]]'),
    (TreeFacts(uv_lock=True), PY, '[["uv", "sync", "--frozen"]]'),
    # make test in a Python project: its tests most likely run pytest, which the worktree's venv then needs
    (TreeFacts(), Launch("make test", "shell", "/usr/bin/make", opaque=True),
     '[["python3", "-m", "venv", ".venv"], [".venv/bin/pip", "install", "-e", ".", "pytest"]]'),
    (TreeFacts(), Launch("make test", "shell", "/usr/bin/make"),
     '[["python3", "-m", "venv", ".venv"], [".venv/bin/pip", "install", "-e", "."]]'),
])
def test_python_fix_table(facts, launch, setup) -> None:
    fix = probe.python_fix(facts, launch, config="C", in_place=False)
    assert fix.startswith(f"in C: [workspace] setup = {setup} and path = [\".venv/bin\"]")


MAKE = Launch("make test", "shell", "/usr/bin/make", interpreter="/r/.venv/bin/python3", opaque=True)


@pytest.mark.parametrize(("launch", "want"), [
    (MAKE, (("cwd", ""), ("entry", "@drop"))),  # opaque: as python -m would, and as an entry point would
    (Launch("uv run make test", "uv", "/usr/bin/uv", opaque=True), (("cwd", ""), ("entry", "@drop"))),
    (PY, (("", ""),)),  # python -m pytest: only as it runs, the cwd first
    (Launch("pytest", "script", "/r/.venv/bin/pytest", interpreter="/r/.venv/bin/python", path0="@script"),
     (("", "@script"),)),
    (Launch("python -I -m pytest", "python", "/p", interpreter="/p", path0=None), (("", None),)),
    (Launch("uv run pytest", "uv", "/usr/bin/uv", path0="@bin"), (("", "@bin"),)),
])
def test_ways_table(launch, want) -> None:
    assert probe.ways(launch) == want


ENTRY = Launch("pytest", "script", "/r/.venv/bin/pytest", interpreter="/r/.venv/bin/python", module="pytest",
               path0="@script", pytest=True)


@pytest.mark.parametrize(("launch", "found", "via"), [
    # make asked with the worktree's venv python, but the PATH's pytest is the checkout venv's: ask it too
    (Launch("make test", "shell", "/usr/bin/make", interpreter=f"{T}/.venv/bin/python3",
            opaque=True), ENTRY, "pytest"),
    (MAKE, ENTRY, None),  # the same venv: the entry way already asks it as an entry point
    (Launch("make test", "shell", "/usr/bin/make", opaque=True), ENTRY, "pytest"),  # no python on PATH at all
    (replace(MAKE, interpreter="/usr/bin/python3"), replace(ENTRY, kind="other", interpreter=None), None),
    (PY, ENTRY, None),  # not opaque: what it starts is seen
    (Launch("uv run make", "uv", "/usr/bin/uv", opaque=True), ENTRY, None),  # uv puts its own venv first
])
def test_companion_table(launch, found, via) -> None:
    got = probe.companion(launch, found)
    assert (got.via if got else None) == via
    if got is not None:
        assert (got.label, got.role, got.kind, got.interpreter, got.pytest) == (launch.label, launch.role, "script",
                                                                                  ENTRY.interpreter, True)


IN_T = {"origin": f"{T}/mypkg/__init__.py"}
IN_R = {"origin": f"{R}/mypkg/__init__.py"}
UNSEEN = "evolve cannot see what 'make test' runs, so it must import the worktree's code both ways"
AS_M = "as `python -m ...` or a script in the worktree runs (the worktree first on sys.path)"
AS_ENTRY = "as an entry-point script such as `pytest` runs (sys.path[0] its bin directory, not the worktree)"
CHECKOUT = "imports mypkg from your checkout (/r/mypkg/__init__.py), not the worktree"
VIA = replace(ENTRY, label="make test", via="pytest")


@pytest.mark.parametrize(("launch", "answers", "messages", "place", "alt"), [
    # the red team's case: flat layout, make runs the pytest entry point: python -m would be right, pytest is not
    (MAKE, [("cwd", {"spec": {"mypkg": IN_T}}), ("entry", {"spec": {"mypkg": IN_R}})],
     [f"the gate's interpreter /r/.venv/bin/python3 {CHECKOUT}, when run {AS_ENTRY}; {UNSEEN}"], "checkout", True),
    (MAKE, [("cwd", {"spec": {"mypkg": IN_R}}), ("entry", {"spec": {"mypkg": IN_T}})],
     [f"the gate's interpreter /r/.venv/bin/python3 {CHECKOUT}, when run {AS_M}; {UNSEEN}"], "checkout", False),
    (MAKE, [("cwd", {"spec": {"mypkg": IN_R}}), ("entry", {"spec": {"mypkg": IN_R}})],
     [f"the gate's interpreter /r/.venv/bin/python3 {CHECKOUT}, either way: run {AS_M} or {AS_ENTRY}"], "checkout",
     False),
    (MAKE, [("cwd", {"spec": {"mypkg": IN_T}}), ("entry", {"spec": {"mypkg": None}})],
     [f"the gate's interpreter /r/.venv/bin/python3 cannot import mypkg at all, when run {AS_ENTRY}; {UNSEEN}"],
     "missing", True),
    (MAKE, [("cwd", {"error": "exit 1"}), ("entry", {"error": "exit 1"})],
     ["cannot ask the gate's interpreter /r/.venv/bin/python3 what it imports: exit 1, either way: run "
      f"{AS_M} or {AS_ENTRY}"], None, False),
    (MAKE, [("cwd", {"spec": {"mypkg": IN_T}}), ("entry", {"spec": {"mypkg": IN_T}})], [], "worktree", False),
    (PY, [("", {"spec": {"mypkg": IN_R, "pytest": {"origin": "/x/pytest.py"}}})],
     [f"the gate's interpreter /r/.venv/bin/python {CHECKOUT}"], "checkout", False),
    # the PATH's pytest a make gate may start, from another venv than the python asked both ways
    (VIA, [("", {"spec": {"mypkg": IN_R, "pytest": None}})],
     [f"the pytest on the gate's PATH (/r/.venv/bin/pytest, run by /r/.venv/bin/python) {CHECKOUT}; evolve cannot "
      "see whether 'make test' starts it, so it must import the worktree's code too"], "checkout", False),
    (VIA, [("", {"spec": {"mypkg": None}})], [], "missing", False),  # it would fail red, not land green
    (VIA, [("", {"error": "exit 1"})], [], None, False),
])
def test_python_verdict_table(launch, answers, messages, place, alt) -> None:
    problems, seen, by_way = probe.python_verdict(launch, answers, ["mypkg"], TreeFacts(packages=("mypkg",)),
                                                  tree=T, repo=R, config="C")
    assert [p.message.split(": ", 1)[1] for p in problems] == messages
    assert all(p.refuse and p.fix.startswith("in C: [workspace] setup = ") for p in problems)
    assert all(p.fix.endswith(probe.PROBE_OFF[2:]) for p in problems)
    assert all(('["python", "-m", "pytest"]' in p.fix) is alt for p in problems)
    assert (seen["mypkg"]["place"] if seen else None) == place
    assert sorted(by_way) == sorted(w for w, _ in answers if len(answers) > 1)


def test_python_fix_in_place_names_the_path_only() -> None:
    assert "path = [\".venv/bin\"]" in probe.python_fix(TreeFacts(), PY, config="C", in_place=True)


NPM = Launch("npm test", "node", "/usr/bin/npm")


LINK = ', or link = ["node_modules"]'


@pytest.mark.parametrize(("facts", "refuse", "fix"), [
    (NodeFacts(package_json=False, repo_modules=True), None, None),
    (NodeFacts(package_json=True, tree_modules="dir"), None, None),
    (NodeFacts(package_json=True, repo_modules=False), None, None),
    (NodeFacts(package_json=True, repo_modules=True, nested=True), False, '[["npm", "install"]]' + LINK),
    (NodeFacts(package_json=True, repo_modules=True, nested=False, lock="package-lock.json"), True,
     '[["npm", "ci"]]' + LINK),
    (NodeFacts(package_json=True, repo_modules=True, repo_foreign=True, lock="yarn.lock"), True,
     '[["yarn", "install", "--frozen-lockfile"]]'),
    (NodeFacts(package_json=True, repo_modules=True, nested=False, repo_foreign=True), True, '[["npm", "install"]]'),
    (NodeFacts(package_json=True, tree_modules="link", foreign=(("mylib", "lib/"),), lock="pnpm-lock.yaml"), True,
     '[["pnpm", "install", "--frozen-lockfile"]] (instead of link)'),
])
def test_node_problems_table(facts, refuse, fix) -> None:
    got = probe.node_problems(NPM, facts, config="C")
    if refuse is None:
        assert got == []
        return
    (p,) = got
    assert p.refuse is refuse and p.fix == f"in C: [workspace] setup = {fix}"


@pytest.mark.parametrize(("ignored", "present", "configured", "missing"), [
    (["local.conf", ".env", ".venv/", "node_modules/", "x.egg-info/", "build/"], set(), [], [".env", "local.conf"]),
    (["local.conf"], {"local.conf"}, [], []),
    (["local.conf", "secrets/"], set(), ["local.conf"], ["secrets"]),
    (["deep/path"], set(), [], []),
])
def test_missing_ignored_table(ignored, present, configured, missing) -> None:
    assert probe.missing_ignored(ignored, present=present.__contains__, configured=configured) == missing


def test_config_key_changes_with_the_gate_and_the_workspace() -> None:
    from evolve.config import WorkspaceConfig

    base = probe.config_key([["pytest"]], WorkspaceConfig())
    assert base == probe.config_key([["pytest"]], WorkspaceConfig())
    assert base != probe.config_key([["pytest", "-q"]], WorkspaceConfig())
    assert base != probe.config_key([["pytest"]], WorkspaceConfig(path=[".venv/bin"]))
