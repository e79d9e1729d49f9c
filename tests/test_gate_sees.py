"""The gate's verdict is about the tree that lands (issue 22, item 1; docs/DESIGN.md §8.4).

Real venvs with the fixture project installed editable in the operator's checkout (tests/pyfixture.py),
src and flat layouts, ``python -m pytest`` and the ``pytest`` entry point, the venv's bin first on PATH
as an activated venv has it; a scripted agent that breaks ``verify_signature`` (must never land) and one
that adds a function with its test (must land). Every test asserts the git state: what is on the
branch, the operator's files byte for byte, no stray ``index.lock``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import orjson
import pyfixture
import pytest
from support import Env, entry, git, live

HERE = Path(__file__).resolve().parent
PYTEST_GATE = ["python", "-m", "pytest", "-q", "-p", "no:cacheprovider"]
ENTRY_GATE = ["pytest", "-q", "-p", "no:cacheprovider"]
SETUPS = [("src", PYTEST_GATE), ("flat", ENTRY_GATE), ("flat", PYTEST_GATE), ("src", ENTRY_GATE)]
IDS = ["src-python_m_pytest", "flat-pytest", "flat-python_m_pytest", "src-pytest"]


def head(repo: Path, ref: str = "HEAD") -> str:
    return git(repo, "rev-parse", ref).strip()


def python_repo(env: Env, layout: str) -> Path:
    """The fixture project committed on main, a venv in the checkout with it installed editable; the
    venv's bin (first on PATH for the fire, as for an operator with the venv activated)."""
    bin_dir = pyfixture.operator_venv(env.repo, layout)
    git(env.repo, "add", "-A")
    git(env.repo, "commit", "-q", "-m", "the project")
    return bin_dir


def path_with(bin_dir: Path) -> str:
    return f"{bin_dir}{os.pathsep}{os.environ.get('PATH', os.defpath)}"


def breaks(layout: str) -> dict:
    pkg = "src/mypkg/__init__.py" if layout == "src" else "mypkg/__init__.py"
    return {"write": [{"path": pkg, "content": pyfixture.BROKEN}],
            "report": {"result": "improved", "summary": "verify_signature simplified"}}


def adds(layout: str) -> dict:
    pkg = "src/mypkg/__init__.py" if layout == "src" else "mypkg/__init__.py"
    return {"write": [{"path": pkg, "content": pyfixture.ADDED},
                      {"path": "tests/test_sign.py", "content": pyfixture.ADDED_TEST}],
            "report": {"result": "improved", "summary": "sign() added, with its test"}}


def snapshot(repo: Path) -> dict[str, bytes]:
    """The operator's checkout, byte for byte (the venv and the state dir aside)."""
    out = {}
    for p in sorted(repo.rglob("*")):
        rel = p.relative_to(repo)
        if rel.parts[0] in (".git", ".venv", ".agents") or "__pycache__" in rel.parts or not p.is_file():
            continue
        out[str(rel)] = p.read_bytes()
    return out


def assert_git_clean(env: Env) -> None:
    assert not (env.repo / ".git" / "index.lock").exists()
    assert not list((env.repo / ".git" / "worktrees").glob("*/index.lock"))
    assert git(env.repo, "status", "--porcelain").strip() == ""


def setup_cfg(gate: list[str]) -> dict:
    """The fix evolve names, offline: a venv in the worktree with the project installed editable."""
    return {
        "setup": [[sys.executable, str(HERE / "pyfixture.py"), "venv", ".venv", "--pytest"],
                  [".venv/bin/python", "-m", "pip", "install", "-q", "--no-build-isolation", "--no-deps",
                   "--no-index", "--disable-pip-version-check", "-e", "."]],
        "path": [".venv/bin"],
    }


# -- without [workspace]: evolve refuses before claiming anything ----------------------------------

@pytest.mark.parametrize(("layout", "gate"), [SETUPS[0], SETUPS[1], SETUPS[3]], ids=[IDS[0], IDS[1], IDS[3]])
def test_an_editable_venv_in_the_checkout_is_refused_before_any_claim(env: Env, cli, layout, gate) -> None:
    bin_dir = python_repo(env, layout)
    env.write_config(gate={"commands": [gate]})
    env.queue(entry("simplify verify_signature"))
    env.steps([breaks(layout)])
    tip, before = head(env.repo), snapshot(env.repo)
    r = cli("fire", "--cycles", "1", extra_env={"PATH": path_with(bin_dir)})
    assert r.code == 78, r.stderr
    failed = [e for e in r.events() if e["event"] == "preflight.failed"]
    assert failed and failed[0]["check"] == "gate"
    line = failed[0]["error"]
    assert "mypkg" in line and "your checkout" in line and "not the worktree" in line and gate[0] in line
    assert "[workspace]" in failed[0]["fix"] and ".venv/bin" in failed[0]["fix"]
    assert env.calls() == []  # no agent ran
    assert env.ledger() == []  # no cycle, no claim
    assert live(env.paths.nextwork)[0]["claim_status"] == "available"
    assert head(env.repo) == tip and snapshot(env.repo) == before
    assert_git_clean(env)
    # status says why, until the set-up is fixed
    st = cli("status", "--json", extra_env={"PATH": path_with(bin_dir)})
    snap = orjson.loads(st.stdout)
    assert snap["health"] == "degraded"
    assert any("mypkg" in r and "your checkout" in r for r in snap["reasons"])


def test_probe_false_turns_the_refusal_off(env: Env, cli) -> None:
    bin_dir = python_repo(env, "src")
    env.write_config(gate={"commands": [PYTEST_GATE]}, workspace={"probe": False})
    env.queue(entry("add sign"))
    env.steps([{"report": {"result": "unchanged", "summary": "nothing to do"}}])
    r = cli("fire", "--cycles", "1", extra_env={"PATH": path_with(bin_dir)})
    assert r.code == 0, r.stderr
    assert [e["result"] for e in env.ledger()] == ["unchanged"]
    assert "workspace.probed" not in r.names()  # not even asked
    # doctor still says what the gate sees, as a warning
    d = cli("doctor", "--json", extra_env={"PATH": path_with(bin_dir)})
    (warn,) = [f for f in orjson.loads(d.stdout) if f["check"] == "gate sees" and f["level"] != "OK"]
    assert warn["level"] == "WARN" and "imports mypkg from your checkout" in warn["message"]
    assert "probe = false: fires go on" in warn["fix"]
    assert_git_clean(env)


# -- with the fix: the gate exercises the worktree's code ----------------------------------------



@pytest.mark.parametrize(("layout", "gate"), SETUPS, ids=IDS)
def test_with_setup_a_broken_change_never_lands(env: Env, cli, layout, gate) -> None:
    bin_dir = python_repo(env, layout)
    env.write_config(gate={"commands": [gate]}, workspace=setup_cfg(gate))
    env.queue(entry("simplify verify_signature"))
    env.steps([breaks(layout)])
    tip, before = head(env.repo), snapshot(env.repo)
    r = cli("fire", "--cycles", "1", extra_env={"PATH": path_with(bin_dir)})
    assert r.code == 0, r.stderr
    (e,) = env.ledger()
    assert e["result"] == "regressed" and "test_bad" in e["gate_output"], e
    assert head(env.repo) == tip and snapshot(env.repo) == before  # nothing landed
    assert [x["event"] for x in r.events() if x["event"] == "workspace.setup"] == ["workspace.setup"]
    stamp = orjson.loads((env.paths.evolve_dir / "workspace-setup.json").read_bytes())
    assert stamp["ok"] is True and stamp["tree"] == str(env.tree) and stamp["reason"] == "the worktree was made"
    assert (env.tree / ".venv" / "bin" / "python").exists()  # the worktree's own venv ...
    assert git(env.tree, "status", "--porcelain").strip() == ""  # ... git-ignored, nothing else left
    assert_git_clean(env)


@pytest.mark.parametrize(("layout", "gate"), SETUPS, ids=IDS)
def test_with_setup_a_good_change_lands(env: Env, cli, layout, gate) -> None:
    bin_dir = python_repo(env, layout)
    env.write_config(gate={"commands": [gate]}, workspace=setup_cfg(gate))
    env.queue(entry("add sign"))
    env.steps([adds(layout)])
    tip = head(env.repo)
    extra = {"PATH": path_with(bin_dir)}
    r = cli("fire", "--cycles", "1", extra_env=extra)
    assert r.code == 0, r.stderr
    assert [x["reason"] for x in r.events() if x["event"] == "workspace.setup"] == ["the worktree was made"]
    (e,) = env.ledger()
    assert e["result"] == "improved" and e["gate"] == "PASS", e
    assert head(env.repo) == e["sha"] != tip  # the good change landed
    pkg = pyfixture.package_dir(env.repo, layout) / "__init__.py"
    assert pkg.read_text() == pyfixture.ADDED
    assert (env.repo / "tests" / "test_sign.py").read_text() == pyfixture.ADDED_TEST
    landed = set(git(env.repo, "show", "--name-only", "--format=", "HEAD").split())
    assert landed == {str(pkg.relative_to(env.repo)), "tests/test_sign.py"}  # no venv, no setup output
    assert_git_clean(env)
    # the next fire: nothing changed, so no setup and no probe process
    env.queue(entry("nothing", epic="e2"))
    env.steps([{"report": {"result": "unchanged", "summary": "nothing to do"}}])
    r = cli("fire", "--cycles", "1", extra_env=extra)
    assert r.code == 0, r.stderr
    assert [x["event"] for x in r.events() if x["event"] in ("workspace.setup", "workspace.probed")] == []


# -- opaque gates: a shell, make (what they start is not seen) -----------------------------------------

MAKEFILE = "test:\n\tpytest -q -p no:cacheprovider\n"  # the recipe runs the pytest entry point


def no_pytest_setup() -> dict:
    """A worktree venv with the project installed from it but no ``pytest`` console script in its bin."""
    cfg = setup_cfg(["make", "test"])
    return {**cfg, "setup": [cfg["setup"][0][:-1], cfg["setup"][1]]}


def test_a_shell_gate_is_asked_both_ways_and_refused_when_the_entry_point_imports_the_checkout(env: Env, cli) -> None:
    """``["bash", "-c", "pytest ..."]`` (the argv form of shell syntax evolve's own messages suggest), flat
    layout, the checkout's editable venv first on PATH. What the shell starts is not seen, so the PATH's
    python is asked as ``python -m`` would run (the worktree first: its mypkg) and as an entry point would
    (no cwd: the checkout's mypkg, through the editable install): the second refuses before any claim."""
    bin_dir = python_repo(env, "flat")
    env.write_config(gate={"commands": [["bash", "-c", "pytest -q -p no:cacheprovider"]]})
    env.queue(entry("simplify verify_signature"))
    env.steps([breaks("flat")])
    tip, before = head(env.repo), snapshot(env.repo)
    r = cli("fire", "--cycles", "1", extra_env={"PATH": path_with(bin_dir)})
    assert r.code == 78, (r.stderr[-2000:], [e["result"] for e in env.ledger()])
    (failed,) = [e for e in r.events() if e["event"] == "preflight.failed"]
    line = failed["error"]
    assert failed["check"] == "gate" and line.startswith("""gate command "bash -c 'pytest -q -p no:cacheprovider'": """)
    assert f"imports mypkg from your checkout ({env.repo / 'mypkg' / '__init__.py'}), not the worktree" in line
    assert "when run as an entry-point script such as `pytest` runs" in line and "cannot see what" in line
    assert '"install", "-e", ".", "pytest"]]' in failed["fix"] and 'path = [".venv/bin"]' in failed["fix"]
    assert '["python", "-m", "pytest"]' in failed["fix"]  # as python -m runs it, the worktree is first
    assert env.calls() == [] and env.ledger() == []
    assert live(env.paths.nextwork)[0]["claim_status"] == "available"
    assert head(env.repo) == tip and snapshot(env.repo) == before
    rec = orjson.loads((env.paths.evolve_dir / "workspace-probe.json").read_bytes())
    (row,) = rec["sees"]["commands"]
    assert {w: row["ways"][w]["mypkg"]["place"] for w in row["ways"]} == {"cwd": "worktree", "entry": "checkout"}
    assert row["imports"]["mypkg"]["place"] == "checkout"  # the worst way is what doctor shows
    assert_git_clean(env)


def test_a_make_gate_is_judged_by_the_path_s_pytest_too_and_the_named_fix_works(env: Env, cli) -> None:
    """``make test`` whose recipe runs ``pytest``; the worktree has its own venv (first on PATH) with the
    project installed, but without a ``pytest`` script: the recipe's ``pytest`` is the checkout venv's, next
    on PATH, which tests the checkout's code. Asking only the PATH's python (the worktree's, right both ways)
    would let the broken change land green; the PATH's pytest is asked as itself and refuses. With the fix
    evolve names (pytest in the worktree's venv) the broken change is red and a good one lands."""
    bin_dir = python_repo(env, "flat")
    (env.repo / "Makefile").write_text(MAKEFILE)
    git(env.repo, "add", "Makefile")
    git(env.repo, "commit", "-q", "-m", "make test")
    env.write_config(gate={"commands": [["make", "test"]]}, workspace=no_pytest_setup())
    env.queue(entry("simplify verify_signature"), entry("add sign", epic="e2"))
    env.steps([breaks("flat"), adds("flat")])
    tip, before = head(env.repo), snapshot(env.repo)
    extra = {"PATH": path_with(bin_dir)}
    r = cli("fire", "--cycles", "2", extra_env=extra)
    assert r.code == 78, (r.stderr[-2000:], [e["result"] for e in env.ledger()])
    (failed,) = [e for e in r.events() if e["event"] == "preflight.failed"]
    assert failed["error"].startswith(f"gate command 'make test': the pytest on the gate's PATH ({bin_dir / 'pytest'}, "
                                      f"run by {bin_dir / 'python'}) imports mypkg from your checkout")
    assert "cannot see whether 'make test' starts it" in failed["error"]
    assert '"install", "-e", ".", "pytest"]]' in failed["fix"]
    assert env.calls() == [] and env.ledger() == []
    assert head(env.repo) == tip and snapshot(env.repo) == before
    assert_git_clean(env)
    # the fix it names: the worktree's venv has its own pytest
    env.write_config(workspace=setup_cfg(["make", "test"]))
    r = cli("fire", "--cycles", "2", extra_env=extra)
    assert r.code == 0, r.stderr[-2000:]
    red, green = env.ledger()
    assert red["result"] == "regressed" and "test_bad" in red["gate_output"], red
    assert green["result"] == "improved" and head(env.repo) == green["sha"] != tip, green
    assert (env.repo / "mypkg" / "__init__.py").read_text() == pyfixture.ADDED
    assert set(git(env.repo, "show", "--name-only", "--format=", "HEAD").split()) == {"mypkg/__init__.py",
                                                                                     "tests/test_sign.py"}
    rec = orjson.loads((env.paths.evolve_dir / "workspace-probe.json").read_bytes())
    assert rec["problems"] == []
    (row,) = rec["sees"]["commands"]  # the worktree's venv has a pytest of its own: nothing else to ask
    assert row["interpreter"].startswith(str(env.tree)) and set(row["ways"]) == {"cwd", "entry"}
    assert all(w["mypkg"]["place"] == "worktree" for w in row["ways"].values())
    assert_git_clean(env)


# -- npm: node_modules only in the checkout ------------------------------------------------------------

NPM_GATE = ["npm", "test", "--silent"]
LIB_GOOD = 'exports.verify = (d, s) => s === "ok:" + d;\n'
LIB_BROKEN = "exports.verify = () => true;\n"
LIB_ADDED = LIB_GOOD + 'exports.sign = (d) => "ok:" + d;\n'
NODE_TEST = ('const assert = require("assert");\nconst { verify } = require("mylib");\n'
             'assert.ok(verify("x", "ok:x"));\nassert.ok(!verify("x", "forged"));\n'
             'for (const f of require("fs").readdirSync(".").filter((n) => n.startsWith("test_")))'
             ' require("./" + f);\n')
NODE_ADDED_TEST = 'const assert = require("assert");\nconst { sign, verify } = require("mylib");\n' \
                  'assert.ok(verify("y", sign("y")));\n'


def npm_repo(env: Env) -> None:
    """An npm workspace: the app's tests load ``mylib`` (its own code, lib/) through node_modules, which
    ``npm install`` made in the checkout only (git-ignored): node_modules/mylib -> ../lib."""
    (env.repo / "lib").mkdir()
    (env.repo / "package.json").write_text(
        '{"name": "app", "version": "1.0.0", "private": true, "workspaces": ["lib"],'
        ' "scripts": {"test": "node test.js"}}\n')
    (env.repo / "lib" / "package.json").write_text('{"name": "mylib", "version": "1.0.0", "main": "index.js"}\n')
    (env.repo / "lib" / "index.js").write_text(LIB_GOOD)
    (env.repo / "test.js").write_text(NODE_TEST)
    (env.repo / ".gitignore").write_text("node_modules/\n")
    subprocess.run(["npm", "install", "--offline", "--no-audit", "--no-fund"], cwd=env.repo, check=True,
                   capture_output=True, env={**os.environ, "npm_config_cache": str(env.root / "npm-cache")})
    assert os.readlink(env.repo / "node_modules" / "mylib") == "../lib"
    git(env.repo, "add", "-A")
    git(env.repo, "commit", "-q", "-m", "the app")


def test_npm_with_node_modules_only_in_the_checkout_is_refused(env: Env, cli) -> None:
    npm_repo(env)
    env.write_config(gate={"commands": [NPM_GATE]})
    env.queue(entry("simplify verify"))
    env.steps([{"write": [{"path": "lib/index.js", "content": LIB_BROKEN}], "report": {"result": "improved"}}])
    tip, before = head(env.repo), snapshot(env.repo)
    r = cli("fire", "--cycles", "1")
    assert r.code == 78, r.stderr
    (failed,) = [e for e in r.events() if e["event"] == "preflight.failed"]
    assert "npm test" in failed["error"] and "node_modules" in failed["error"] and "checkout" in failed["error"]
    assert '["npm", "ci"]' in failed["fix"]
    assert env.calls() == [] and env.ledger() == []
    assert head(env.repo) == tip and snapshot(env.repo) == before
    assert_git_clean(env)


def test_npm_linking_the_checkout_s_node_modules_is_refused_when_it_links_the_checkout_s_code(env: Env, cli) -> None:
    npm_repo(env)
    env.write_config(gate={"commands": [NPM_GATE]}, workspace={"link": ["node_modules"]})
    env.queue(entry("simplify verify"))
    tip = head(env.repo)
    r = cli("fire", "--cycles", "1")
    assert r.code == 78, r.stderr
    (failed,) = [e for e in r.events() if e["event"] == "preflight.failed"]
    assert "node_modules/mylib" in failed["error"] and "lib/" in failed["error"]
    assert "instead of link" in failed["fix"]
    assert os.readlink(env.tree / "node_modules") == str(env.repo / "node_modules")  # the link was made
    assert env.calls() == [] and head(env.repo) == tip
    assert_git_clean(env)


@pytest.mark.parametrize("good", [False, True], ids=["broken", "good"])
def test_npm_with_setup_tests_the_worktree(env: Env, cli, good: bool) -> None:
    npm_repo(env)
    env.write_config(gate={"commands": [NPM_GATE]},
                     workspace={"setup": [["npm", "ci", "--offline", "--no-audit", "--no-fund"]]})
    env.queue(entry("change mylib"))
    if good:
        env.steps([{"write": [{"path": "lib/index.js", "content": LIB_ADDED},
                              {"path": "test_sign.js", "content": NODE_ADDED_TEST}], "report": {"result": "improved"}}])
    else:
        env.steps([{"write": [{"path": "lib/index.js", "content": LIB_BROKEN}], "report": {"result": "improved"}}])
    tip, before = head(env.repo), snapshot(env.repo)
    r = cli("fire", "--cycles", "1")
    assert r.code == 0, r.stderr
    (e,) = env.ledger()
    assert os.readlink(env.tree / "node_modules" / "mylib") == "../lib"  # the worktree's own, from npm ci
    assert list((env.paths.evolve_dir / "cache" / "npm").iterdir())  # npm's cache under the state dir
    if good:
        assert e["result"] == "improved" and head(env.repo) == e["sha"] != tip, e
        assert (env.repo / "lib" / "index.js").read_text() == LIB_ADDED
        landed = set(git(env.repo, "show", "--name-only", "--format=", "HEAD").split())
        assert landed == {"lib/index.js", "test_sign.js"}
    else:
        assert e["result"] == "regressed", e
        assert head(env.repo) == tip and snapshot(env.repo) == before
    assert_git_clean(env)


def test_npm_with_a_plain_dependency_found_by_walking_up_is_a_note_not_a_refusal(env: Env, cli) -> None:
    """node_modules holds a real package (no link into the checkout's code): node in the nested worktree
    finds it by walking up, and the worktree's own code is what the tests load."""
    (env.repo / "node_modules" / "minitest").mkdir(parents=True)
    (env.repo / "node_modules" / "minitest" / "index.js").write_text("exports.ok = (v) => { if (!v) throw 1; };\n")
    (env.repo / "package.json").write_text('{"name": "app", "version": "1.0.0", "scripts": {"test": "node t.js"}}\n')
    (env.repo / "app.js").write_text("exports.two = () => 2;\n")
    (env.repo / "t.js").write_text('require("minitest").ok(require("./app").two() === 2);\n')
    (env.repo / ".gitignore").write_text("node_modules/\n")
    git(env.repo, "add", "-A")
    git(env.repo, "commit", "-q", "-m", "the app")
    env.write_config(gate={"commands": [NPM_GATE]})
    env.queue(entry("break two"))
    env.steps([{"write": [{"path": "app.js", "content": "exports.two = () => 3;\n"}],
                "report": {"result": "improved"}}])
    tip = head(env.repo)
    r = cli("fire", "--cycles", "1")
    assert r.code == 0, r.stderr
    notes = [e for e in r.events() if e["event"] == "workspace.note"]
    assert notes and "walking up" in notes[0]["note"]
    assert [e["result"] for e in env.ledger()] == ["regressed"]  # the worktree's app.js was tested
    assert head(env.repo) == tip
    assert_git_clean(env)


# -- a git-ignored file the tests read -----------------------------------------------------------------

def test_a_gitignored_file_the_tests_read_is_copied_in(env: Env, cli) -> None:
    (env.repo / "check.py").write_text(
        "import sys\nconf = open('local.conf').read()\nsys.exit(0 if 'db=ok' in conf else 3)\n")
    (env.repo / ".gitignore").write_text("local.conf\n")
    (env.repo / "local.conf").write_text("db=ok\npassword=hunter2\n")
    git(env.repo, "add", "-A")
    git(env.repo, "commit", "-q", "-m", "check")
    env.write_config(gate={"commands": [[sys.executable, "check.py"]]}, workspace={"copy": ["local.conf"]})
    env.queue(entry("add docs"))
    env.steps([{"write": [{"path": "docs.md", "content": "docs\n"}], "report": {"result": "improved"}}])
    r = cli("fire", "--cycles", "1")
    assert r.code == 0, r.stderr
    (e,) = env.ledger()
    assert e["result"] == "improved" and head(env.repo) == e["sha"], e
    copied = env.tree / "local.conf"
    assert copied.read_text() == "db=ok\npassword=hunter2\n" and not copied.is_symlink()
    assert (env.repo / "local.conf").read_text() == "db=ok\npassword=hunter2\n"  # the operator's, untouched
    assert set(git(env.repo, "show", "--name-only", "--format=", "HEAD").split()) == {"docs.md"}
    assert_git_clean(env)


def test_without_the_copy_the_probe_names_the_gitignored_file_the_worktree_lacks(env: Env, cli) -> None:
    """The same repository without ``copy``: the gate cannot read local.conf in the worktree (a good change
    is thrown away), and the probe says which git-ignored files of the checkout the worktree lacks."""
    (env.repo / "check.py").write_text(
        "import sys\nconf = open('local.conf').read()\nsys.exit(0 if 'db=ok' in conf else 3)\n")
    (env.repo / ".gitignore").write_text("local.conf\n")
    (env.repo / "local.conf").write_text("db=ok\n")
    git(env.repo, "add", "-A")
    git(env.repo, "commit", "-q", "-m", "check")
    env.write_config(gate={"commands": [[sys.executable, "check.py"]]})
    env.queue(entry("add docs"))
    env.steps([{"write": [{"path": "docs.md", "content": "docs\n"}], "report": {"result": "improved"}}])
    r = cli("fire", "--cycles", "1")
    assert r.code == 0, r.stderr
    notes = [e for e in r.events() if e["event"] == "workspace.note"]
    assert notes and "local.conf" in notes[0]["note"] and 'copy = ["local.conf"]' in notes[0]["fix"]
    assert [e["result"] for e in env.ledger()] == ["regressed"]
    assert "local.conf" in env.ledger()[0]["gate_output"]
    assert (env.repo / "local.conf").read_text() == "db=ok\n"
    assert_git_clean(env)


# -- the probe's own rules, with real venvs ----------------------------------------------------------

def test_a_root_conftest_makes_pytest_import_the_worktree_and_the_probe_lets_it_run(env: Env, cli) -> None:
    """Flat layout, the ``pytest`` entry point, a conftest.py at the top: pytest itself puts the top first
    on sys.path (prepend mode), so the worktree's mypkg is tested; no refusal, and the broken change is red."""
    bin_dir = pyfixture.operator_venv(env.repo, "flat")
    (env.repo / "conftest.py").write_text("")
    git(env.repo, "add", "-A")
    git(env.repo, "commit", "-q", "-m", "the project")
    env.write_config(gate={"commands": [ENTRY_GATE]})
    env.queue(entry("simplify verify_signature"))
    env.steps([breaks("flat")])
    tip = head(env.repo)
    r = cli("fire", "--cycles", "1", extra_env={"PATH": path_with(bin_dir)})
    assert r.code == 0, r.stderr
    assert [e["result"] for e in env.ledger()] == ["regressed"]
    assert head(env.repo) == tip
    rec = orjson.loads((env.paths.evolve_dir / "workspace-probe.json").read_bytes())
    assert rec["problems"] == [] and rec["sees"]["commands"][0]["imports"]["mypkg"]["place"] == "worktree"
    assert_git_clean(env)


def test_pytest_pythonpath_src_makes_the_src_layout_import_the_worktree(env: Env, cli) -> None:
    bin_dir = pyfixture.operator_venv(env.repo, "src")
    with open(env.repo / "pyproject.toml", "a") as fh:
        fh.write('\n[tool.pytest.ini_options]\npythonpath = ["src"]\n')
    git(env.repo, "add", "-A")
    git(env.repo, "commit", "-q", "-m", "the project")
    env.write_config(gate={"commands": [ENTRY_GATE]})
    env.queue(entry("simplify verify_signature"))
    env.steps([breaks("src")])
    r = cli("fire", "--cycles", "1", extra_env={"PATH": path_with(bin_dir)})
    assert r.code == 0, r.stderr
    assert [e["result"] for e in env.ledger()] == ["regressed"]
    rec = orjson.loads((env.paths.evolve_dir / "workspace-probe.json").read_bytes())
    assert rec["problems"] == [] and rec["sees"]["commands"][0]["imports"]["mypkg"]["place"] == "worktree"
    assert_git_clean(env)


def test_a_non_editable_install_is_an_installed_copy_and_refused(env: Env, cli) -> None:
    pyfixture.make_project(env.repo, "src")
    python = pyfixture.make_venv(env.repo / ".venv")
    pyfixture.install_copy(python, env.repo)
    git(env.repo, "add", "-A")
    git(env.repo, "commit", "-q", "-m", "the project")
    env.write_config(gate={"commands": [PYTEST_GATE]})
    env.queue(entry("anything"))
    r = cli("fire", "--cycles", "1", extra_env={"PATH": path_with(env.repo / ".venv" / "bin")})
    assert r.code == 78, r.stderr
    (failed,) = [e for e in r.events() if e["event"] == "preflight.failed"]
    assert "site-packages" in failed["error"] and "an installed copy" in failed["error"]
    assert env.calls() == []
    assert_git_clean(env)


def test_a_gate_python_without_the_project_is_refused(env: Env, cli, tmp_path: Path) -> None:
    """The cron/systemd case: another venv (evolve's own) first on PATH, without the project or pytest."""
    pyfixture.make_project(env.repo, "src")
    git(env.repo, "add", "-A")
    git(env.repo, "commit", "-q", "-m", "the project")
    other = tmp_path / "evolve-venv"
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", "--without-pip", str(other)], check=True)
    env.write_config(gate={"commands": [PYTEST_GATE]})
    env.queue(entry("anything"))
    r = cli("fire", "--cycles", "1", extra_env={"PATH": path_with(other / "bin")})
    assert r.code == 78, r.stderr
    (failed,) = [e for e in r.events() if e["event"] == "preflight.failed"]
    assert "has no module 'pytest'" in failed["error"] or "cannot import mypkg at all" in failed["error"]
    assert str(other) in failed["error"]
    assert env.calls() == []
    rec = orjson.loads((env.paths.evolve_dir / "workspace-probe.json").read_bytes())
    assert rec["problems"][0]["message"] == failed["error"]
    assert_git_clean(env)


def test_a_gate_program_missing_from_path_is_refused(env: Env, cli) -> None:
    env.write_config(gate={"commands": [["no-such-test-runner", "-q"]]})
    env.queue(entry("anything"))
    r = cli("fire", "--cycles", "1")
    assert r.code == 78, r.stderr
    (failed,) = [e for e in r.events() if e["event"] == "preflight.failed"]
    assert "'no-such-test-runner' is not on the gate's PATH" in failed["error"]
    assert env.calls() == [] and env.ledger() == []
    assert_git_clean(env)


# -- doctor and --dry-run show what the gate will see -----------------------------------------------

def doctor_findings(cli, extra: dict[str, str]) -> tuple[int, list[dict[str, str]]]:
    r = cli("doctor", "--json", extra_env=extra)
    return r.code, [f for f in orjson.loads(r.stdout) if f["check"] in ("gate sees", "setup", "link")]


def test_doctor_and_dry_run_show_what_the_gate_will_see(env: Env, cli) -> None:
    bin_dir = python_repo(env, "src")
    env.write_config(gate={"commands": [PYTEST_GATE]})
    extra = {"PATH": path_with(bin_dir)}
    code, found = doctor_findings(cli, extra)
    assert [f["level"] for f in found] == ["WARN"] and "no worktree yet" in found[0]["message"]
    env.queue(entry("anything"))
    assert cli("fire", "--cycles", "1", extra_env=extra).code == 78  # makes the worktree, refuses
    code, found = doctor_findings(cli, extra)
    assert code == 1
    fail = [f for f in found if f["level"] == "FAIL"]
    assert fail and "imports mypkg from your checkout" in fail[0]["message"] and ".venv/bin" in fail[0]["fix"]
    assert any(f["level"] == "OK" and "mypkg from the checkout" in f["message"] for f in found)
    # the dry run: the same, as data, and nothing written
    before = {p: p.read_bytes() for p in env.repo.rglob("*") if p.is_file() and ".git/" not in str(p)
              and ".venv" not in p.parts}
    r = cli("fire", "--dry-run", extra_env=extra)
    assert r.code == 0, r.stderr
    plan = orjson.loads(r.stdout[r.stdout.index("{\n"):])
    sees = plan["gate_sees"]["gate_sees"]
    assert sees["PATH"].split(os.pathsep)[0] == str(bin_dir) and sees["project_names"] == ["mypkg"]
    (row,) = sees["commands"]
    assert row["interpreter"] == str(bin_dir / "python") and row["imports"]["mypkg"]["place"] == "checkout"
    assert sees["problems"][0]["message"] == fail[0]["message"] and sees["from_record"] is True
    assert plan["gate_sees"]["setup"] == {"state": "none configured"}
    after = {p: p.read_bytes() for p in env.repo.rglob("*") if p.is_file() and ".git/" not in str(p)
             and ".venv" not in p.parts}
    assert before == after


def test_doctor_is_green_once_the_worktree_has_its_own_venv(env: Env, cli) -> None:
    bin_dir = python_repo(env, "flat")
    env.write_config(gate={"commands": [ENTRY_GATE]}, workspace={**setup_cfg(ENTRY_GATE), "link": ["data"]})
    (env.repo / "data").mkdir()
    env.queue(entry("nothing"))
    env.steps([{"report": {"result": "unchanged"}}])
    extra = {"PATH": path_with(bin_dir)}
    assert cli("fire", "--cycles", "1", extra_env=extra).code == 0
    code, found = doctor_findings(cli, extra)
    assert code == 0, found
    assert [f["level"] for f in found] == ["OK"] * len(found)
    msgs = " | ".join(f["message"] for f in found)
    assert "up to date" in msgs and "mypkg from the worktree" in msgs and "linked" in msgs
    assert "the gate tests the worktree's code" in msgs
    r = cli("fire", "--dry-run", extra_env=extra)
    plan = orjson.loads(r.stdout[r.stdout.index("{\n"):])["gate_sees"]
    assert plan["setup"]["state"] == "up to date" and plan["setup"]["last"]["ok"] is True
    assert plan["links"] == [{"path": "data", "target": str(env.repo / "data"), "state": "linked"}]
    assert plan["gate_sees"]["path"] == [str(env.tree / ".venv" / "bin")]
    assert plan["gate_sees"]["commands"][0]["imports"]["mypkg"]["place"] == "worktree"


# -- uv run --------------------------------------------------------------------------------------------

def _uv() -> str | None:
    import shutil

    found = shutil.which("uv")
    if found:
        return found
    try:
        import uv  # type: ignore[import-not-found]  # the PyPI package ships the binary
    except ImportError:
        return None
    return uv.find_uv_bin()


UNITTEST = ("import unittest\nfrom mypkg import verify_signature\n\n\nclass T(unittest.TestCase):\n"
            "    def test_good(self):\n        self.assertTrue(verify_signature(b'x', 'ok:x'))\n\n"
            "    def test_bad(self):\n        self.assertFalse(verify_signature(b'x', 'forged'))\n")


@pytest.mark.skipif(_uv() is None, reason="uv is not installed")
def test_uv_run_tests_the_worktree_and_the_probe_asks_uv(env: Env, cli) -> None:
    """``uv run`` syncs the project's own .venv where it runs: in the worktree, from the worktree (offline:
    the fixture's backend needs nothing). The checkout's uv venv has the project installed editable."""
    uv = _uv()
    assert uv is not None
    pyfixture.make_project(env.repo, "src")
    (env.repo / "tests" / "test_sig.py").write_text(UNITTEST)
    uv_env = {**os.environ, "UV_CACHE_DIR": str(env.root / "uv-cache")}
    subprocess.run([uv, "sync", "--offline"], cwd=env.repo, check=True, capture_output=True, env=uv_env)
    git(env.repo, "add", "-A")
    git(env.repo, "commit", "-q", "-m", "the project")
    gate = [uv, "run", "--offline", "python", "-m", "unittest", "discover", "-s", "tests", "-q"]
    env.write_config(gate={"commands": [gate], "pass_env": ["UV_CACHE_DIR"]})
    env.queue(entry("simplify verify_signature"))
    env.steps([breaks("src")])
    tip = head(env.repo)
    r = cli("fire", "--cycles", "1", extra_env={"UV_CACHE_DIR": str(env.root / "uv-cache"),
                                                "PATH": path_with(env.repo / ".venv" / "bin")})
    assert r.code == 0, r.stderr
    rec = orjson.loads((env.paths.evolve_dir / "workspace-probe.json").read_bytes())
    assert rec["problems"] == [], rec
    (row,) = rec["sees"]["commands"]
    assert row["starts"]["kind"] == "uv" and row["imports"]["mypkg"]["place"] == "worktree"
    assert row["interpreter"].startswith(str(env.tree))  # the worktree's own .venv, made by uv run
    assert [e["result"] for e in env.ledger()] == ["regressed"]
    assert head(env.repo) == tip
    assert_git_clean(env)


def test_in_place_the_checkout_is_the_tree_and_its_editable_venv_is_right(env: Env, cli) -> None:
    """``[git] isolation = "none"``: the gate runs in the checkout, so the checkout's editable venv tests
    exactly the code that is committed; no refusal, and the broken change is red."""
    bin_dir = python_repo(env, "src")
    env.write_config(gate={"commands": [PYTEST_GATE]}, git={"isolation": "none"},
                     workspace={"setup": [["false"]]})
    env.queue(entry("simplify verify_signature"))
    env.steps([breaks("src")])
    tip = head(env.repo)
    r = cli("fire", "--cycles", "1", extra_env={"PATH": path_with(bin_dir)})
    assert r.code == 0, r.stderr
    assert "workspace.setup_skipped" in r.names()  # never run in the operator's checkout
    assert [e["result"] for e in env.ledger()] == ["regressed"]
    assert head(env.repo) == tip
    assert git(env.repo, "status", "--porcelain").strip() == ""


def test_status_drops_the_probe_s_reason_once_the_config_changes(env: Env, cli) -> None:
    bin_dir = python_repo(env, "src")
    env.write_config(gate={"commands": [PYTEST_GATE]})
    env.queue(entry("anything"))
    extra = {"PATH": path_with(bin_dir)}
    assert cli("fire", "--cycles", "1", extra_env=extra).code == 78
    assert orjson.loads(cli("status", "--json", extra_env=extra).stdout)["health"] == "degraded"
    env.write_config(workspace={"probe": False})
    snap = orjson.loads(cli("status", "--json", extra_env=extra).stdout)
    assert not any("worktree's code" in r for r in snap["reasons"]), snap["reasons"]


def test_a_goal_check_that_imports_the_checkout_is_refused_too(env: Env, cli) -> None:
    bin_dir = pyfixture.operator_venv(env.repo, "src")
    (env.repo / "GOALS.yaml").write_text("version: 3\nmission: m\ngoals:\n  - id: sig\n    description: d\n"
                                         "    check: python -m pytest -q -p no:cacheprovider\n    weight: 1\n")
    git(env.repo, "add", "-A")
    git(env.repo, "commit", "-q", "-m", "the project")
    env.queue(entry("anything"))
    r = cli("fire", "--cycles", "1", extra_env={"PATH": path_with(bin_dir)})
    assert r.code == 78, r.stderr
    (failed,) = [e for e in r.events() if e["event"] == "preflight.failed"]
    assert failed["error"].startswith("goal check sig 'python -m pytest -q -p no:cacheprovider': its interpreter")
    assert "imports mypkg from your checkout" in failed["error"]
    assert env.calls() == [] and env.ledger() == []
    assert_git_clean(env)
