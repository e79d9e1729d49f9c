"""The gate's verdict is about the tree that lands (issue 22, item 1; docs/DESIGN.md §8.4).

Real venvs with the fixture project installed editable in the operator's checkout (tests/pyfixture.py),
src and flat layouts, ``python -m pytest`` and the ``pytest`` entry point, the venv's bin first on PATH
as an activated venv has it; a scripted agent that breaks ``verify_signature`` (must never land) and one
that adds a function with its test (must land). Every test asserts the git state: what is on the
branch, the operator's files byte for byte, no stray ``index.lock``.
"""

from __future__ import annotations

import os
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
