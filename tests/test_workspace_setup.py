"""``[workspace]`` setup, link, copy and path (issue 22 item 1, docs/DESIGN.md §8.4).

Real fires with real setup commands (small Python programs, so nothing is downloaded): when setup runs
(the worktree made, an input changed, the change itself edited an input), what a failing one does
(before a claim: exit 78 and status says why; at the gate: the change is red), what it leaves behind
(kept, never committed), its environment (caches under the state dir, no secret), that it stops with
the fire, and that links and copies never follow a link the repository committed. The pure parts are
tables. Every fire test asserts the git state.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest
from support import Env, entry, git, live

from evolve.childenv import with_path
from evolve.config import ConfigError, bad_rel_path, load
from evolve.cycle.gate import Gate
from evolve.cycle.setup import Settled, exclude_pattern, settle, setup_due
from evolve.procgroup import group_alive

# A setup step that records, in a directory it makes (build/, not git-ignored), the pyproject it saw;
# it fails when the pyproject says so.
RECORD = """
import hashlib, os, pathlib, sys
text = pathlib.Path("pyproject.toml").read_text()
if "fail-setup" in text:
    print("setup: cannot install this"); sys.exit(4)
pathlib.Path("build").mkdir(exist_ok=True)
pathlib.Path("build/seen.txt").write_text(hashlib.sha256(text.encode()).hexdigest())
with open(os.environ["RUNS"], "a") as fh:
    fh.write(hashlib.sha256(text.encode()).hexdigest()[:8] + "\\n")
"""
# The gate: green only when setup saw the pyproject as it is now.
CHECK = """
import hashlib, pathlib, sys
want = hashlib.sha256(pathlib.Path("pyproject.toml").read_text().encode()).hexdigest()
seen = pathlib.Path("build/seen.txt")
sys.exit(0 if seen.exists() and seen.read_text() == want else 5)
"""


def head(repo: Path, ref: str = "HEAD") -> str:
    return git(repo, "rev-parse", ref).strip()


def assert_git_clean(env: Env) -> None:
    assert not (env.repo / ".git" / "index.lock").exists()
    assert not list((env.repo / ".git" / "worktrees").glob("*/index.lock"))
    assert git(env.repo, "status", "--porcelain").strip() == ""


def recording_repo(env: Env, *, pyproject: str = '[project]\nname = "app"\nversion = "1"\n') -> Path:
    (env.repo / "pyproject.toml").write_text(pyproject)
    (env.repo / "record.py").write_text(RECORD)
    (env.repo / "check.py").write_text(CHECK)
    git(env.repo, "add", "-A")
    git(env.repo, "commit", "-q", "-m", "app")
    runs = env.root / "setup-runs.txt"
    env.write_config(gate={"commands": [[sys.executable, "check.py"]]},
                     workspace={"setup": [[sys.executable, "record.py"]], "pass_env": ["RUNS"]})
    return runs


def runs_of(path: Path) -> list[str]:
    return path.read_text().split() if path.exists() else []


def test_setup_runs_again_before_the_gate_when_the_change_edits_an_input(env: Env, cli) -> None:
    runs = recording_repo(env)
    env.queue(entry("add a dependency"))
    edited = '[project]\nname = "app"\nversion = "1"\ndependencies = ["attrs"]\n'
    env.steps([{"write": [{"path": "pyproject.toml", "content": edited}], "report": {"result": "improved"}}])
    tip = head(env.repo)
    r = cli("fire", "--cycles", "1", extra_env={"RUNS": str(runs)})
    assert r.code == 0, r.stderr
    (e,) = env.ledger()
    assert e["result"] == "improved" and head(env.repo) == e["sha"] != tip, e
    setups = [x for x in r.events() if x["event"] == "workspace.setup"]
    assert [(x["reason"], x["phase"]) for x in setups] == [("the worktree was made", "before_claim"),
                                                           ("an input changed", "gate")]
    assert len(runs_of(runs)) == 2
    assert set(git(env.repo, "show", "--name-only", "--format=", "HEAD").split()) == {"pyproject.toml"}
    assert not (env.repo / "build").exists()  # setup's output stays in the worktree
    assert (env.tree / "build" / "seen.txt").exists()
    # The landed pyproject is what the stamp was made from: the next fire runs no setup.
    env.queue(entry("nothing", epic="e2"))
    env.steps([{"report": {"result": "unchanged"}}])
    r = cli("fire", "--cycles", "1", extra_env={"RUNS": str(runs)})
    assert r.code == 0, r.stderr
    assert [x for x in r.events() if x["event"] == "workspace.setup"] == []
    assert len(runs_of(runs)) == 2
    assert_git_clean(env)


def test_a_change_that_breaks_setup_is_red_and_the_next_cycle_sets_up_again(env: Env, cli) -> None:
    runs = recording_repo(env)
    env.queue(entry("break the install"), entry("add docs", epic="e2"))
    broken = '[project]\nname = "app"\nversion = "1"\n# fail-setup\n'
    env.steps([{"write": [{"path": "pyproject.toml", "content": broken}], "report": {"result": "improved"}},
               {"write": [{"path": "docs.md", "content": "docs\n"}], "report": {"result": "improved"}}])
    tip = head(env.repo)
    r = cli("fire", "--cycles", "2", extra_env={"RUNS": str(runs)})
    assert r.code == 0, r.stderr
    first, second = env.ledger()
    assert first["result"] == "regressed" and first["gate_detail"].startswith("workspace setup "), first
    assert "cannot install this" in first["gate_output"]
    # the red cycle's tree is gone; the next cycle's setup saw the base's pyproject again, and it is green
    assert second["result"] == "improved", second
    reasons = [(x["reason"], x["phase"]) for x in r.events() if x["event"] == "workspace.setup"]
    assert reasons == [("the worktree was made", "before_claim"), ("an input changed", "gate"),
                       ("the last setup failed", "before_claim")]
    assert git(env.repo, "show", f"{tip}:pyproject.toml") == (env.repo / "pyproject.toml").read_text()
    assert set(git(env.repo, "show", "--name-only", "--format=", "HEAD").split()) == {"docs.md"}
    assert_git_clean(env)


def test_a_failing_setup_refuses_before_any_claim_and_status_says_why(env: Env, cli) -> None:
    recording_repo(env, pyproject='[project]\nname = "app"\n# fail-setup\n')
    env.queue(entry("anything"))
    tip = head(env.repo)
    r = cli("fire", "--cycles", "1", extra_env={"RUNS": str(env.root / "runs.txt")})
    assert r.code == 78, r.stderr
    (failed,) = [x for x in r.events() if x["event"] == "preflight.failed"]
    assert failed["check"] == "setup" and "record.py" in failed["error"] and "exit 4" in failed["error"]
    assert "cannot install this" in failed["output"]
    assert env.calls() == [] and env.ledger() == []
    assert live(env.paths.nextwork)[0]["claim_status"] == "available"
    log = (env.paths.runs_dir / "workspace-setup.log").read_text()
    assert "cannot install this" in log
    st = cli("status", "--json")
    snap = orjson.loads(st.stdout)
    assert snap["health"] == "degraded"
    assert any("workspace setup failed" in x and "exit 4" in x for x in snap["reasons"])
    assert head(env.repo) == tip
    assert_git_clean(env)
    # fixed in the repository: the next fire sets up and works; status is healthy again
    (env.repo / "pyproject.toml").write_text('[project]\nname = "app"\n')
    git(env.repo, "commit", "-qam", "fix the manifest")
    env.steps([{"report": {"result": "unchanged"}}])
    r = cli("fire", "--cycles", "1", extra_env={"RUNS": str(env.root / "runs.txt")})
    assert r.code == 0, r.stderr
    assert [x["result"] for x in env.ledger()] == ["unchanged"]
    assert not any("workspace" in x for x in orjson.loads(cli("status", "--json").stdout)["reasons"])


def test_a_secret_setup_prints_is_masked_everywhere_it_is_kept(env: Env, cli) -> None:
    secret = "s3cr3t-registry-value-42"
    (env.repo / "pyproject.toml").write_text('[project]\nname = "app"\n')
    git(env.repo, "add", "-A")
    git(env.repo, "commit", "-q", "-m", "app")
    env.write_config(workspace={"pass_env": ["REGISTRY_TOKEN"], "setup": [
        [sys.executable, "-c", "import os; print('auth', os.environ['REGISTRY_TOKEN']); raise SystemExit(3)"]]})
    env.queue(entry("anything"))
    r = cli("fire", "--cycles", "1", extra_env={"REGISTRY_TOKEN": secret})
    assert r.code == 78
    kept = [(env.paths.evolve_dir / "workspace-setup.json").read_text(),
            (env.paths.runs_dir / "workspace-setup.log").read_text(), r.stderr,
            cli("status", "--json", extra_env={"REGISTRY_TOKEN": secret}).stdout]
    assert "auth" in kept[1] and "exit 3" in kept[0]
    assert all(secret not in k for k in kept)
    assert_git_clean(env)


def test_what_setup_leaves_is_kept_and_never_committed(env: Env, cli) -> None:
    """build/ (new, not ignored) is kept across the per-cycle reset; a stray file is removed; a tracked
    file setup rewrote is restored; the commits hold only the agent's paths."""
    script = ("import pathlib\npathlib.Path('build').mkdir(exist_ok=True)\n"
              "pathlib.Path('build/lib.so').write_text('built')\npathlib.Path('setup.log').write_text('noise')\n"
              "with open('README.md', 'a') as fh: fh.write('rewritten by setup\\n')\n")
    (env.repo / "mk.py").write_text(script)
    (env.repo / "pyproject.toml").write_text('[project]\nname = "app"\n')
    git(env.repo, "add", "-A")
    git(env.repo, "commit", "-q", "-m", "app")
    readme = (env.repo / "README.md").read_text()
    env.write_config(gate={"commands": [[sys.executable, "-c", "import pathlib; assert pathlib.Path('build/lib.so')"
                                         ".read_text() == 'built'"]]},
                     workspace={"setup": [[sys.executable, "mk.py"]]})
    env.queue(entry("one"), entry("two", epic="e2"))
    env.steps([{"write": [{"path": "a.md", "content": "a\n"}], "report": {"result": "improved"}},
               {"write": [{"path": "b.md", "content": "b\n"}], "report": {"result": "improved"}}])
    r = cli("fire", "--cycles", "2")
    assert r.code == 0, r.stderr
    assert [x["result"] for x in env.ledger()] == ["improved", "improved"]
    out = [x for x in r.events() if x["event"] == "workspace.setup_output"]
    assert out and out[0]["removed"] == ["setup.log"] and out[0]["restored"] == ["README.md"]
    assert (env.tree / "build" / "lib.so").read_text() == "built"  # kept through the second cycle's reset
    assert not (env.tree / "setup.log").exists()
    assert (env.repo / "README.md").read_text() == readme
    for sha in git(env.repo, "log", "--format=%H", "-2").split():
        assert set(git(env.repo, "show", "--name-only", "--format=", sha).split()) <= {"a.md", "b.md"}
    assert "/build" in (env.repo / ".git" / "info" / "exclude").read_text().splitlines()
    setups = [x for x in r.events() if x["event"] == "workspace.setup"]
    assert [x["reason"] for x in setups] == ["the worktree was made"]
    assert_git_clean(env)


def test_setup_gets_caches_under_the_state_dir_its_pass_env_and_no_secret(env: Env, cli) -> None:
    dump = env.root / "setup-env.json"
    (env.repo / "pyproject.toml").write_text('[project]\nname = "app"\n')
    git(env.repo, "add", "-A")
    git(env.repo, "commit", "-q", "-m", "app")
    env.write_config(workspace={
        "setup": [[sys.executable, "-c", f"import json, os; json.dump(dict(os.environ), open({str(dump)!r}, 'w'))"]],
        "pass_env": ["REGISTRY_TOKEN"], "path": [".venv/bin"]})
    env.queue(entry("anything"))
    env.steps([{"report": {"result": "unchanged"}}])
    secrets = {"ANTHROPIC_API_KEY": "sk-ant-secret", "GITHUB_TOKEN": "ghp_secret", "AWS_SECRET_ACCESS_KEY": "x"}
    r = cli("fire", "--cycles", "1", extra_env={**secrets, "REGISTRY_TOKEN": "reg", "HTTPS_PROXY": "http://p:1"})
    assert r.code == 0, r.stderr
    got = json.loads(dump.read_text())
    assert not set(secrets) & set(got)
    assert got["REGISTRY_TOKEN"] == "reg" and got["HTTPS_PROXY"] == "http://p:1"
    cache = env.paths.evolve_dir / "cache"
    for name, sub in (("PIP_CACHE_DIR", "pip"), ("UV_CACHE_DIR", "uv"), ("npm_config_cache", "npm"),
                      ("XDG_CACHE_HOME", "xdg")):
        assert got[name] == str(cache / sub)
    assert got["PATH"].split(os.pathsep)[0] == str(env.tree / ".venv" / "bin")
    assert got["EVOLVE_FIRE_ID"]  # found again (and reaped) by the next fire if this one dies
    assert oct(cache.stat().st_mode & 0o777) == "0o700"
    assert_git_clean(env)


def test_setup_stops_with_the_fire_and_nothing_is_claimed(env: Env) -> None:
    started = env.root / "setup-started"
    (env.repo / "pyproject.toml").write_text('[project]\nname = "app"\n')
    git(env.repo, "add", "-A")
    git(env.repo, "commit", "-q", "-m", "app")
    sleeper = (f"import os, pathlib, time; pathlib.Path({str(started)!r}).write_text(str(os.getpgid(0))); "
               "time.sleep(600)")
    env.write_config(workspace={"setup": [[sys.executable, "-c", sleeper]]})
    env.queue(entry("anything"))
    proc = subprocess.Popen([sys.executable, "-m", "evolve", "--repo", str(env.repo), "fire", "--cycles", "1"],
                            env=env.env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not started.exists() or not started.read_text():
        assert time.monotonic() < deadline and proc.poll() is None, "setup never started"
        time.sleep(0.05)
    pgid = int(started.read_text())
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err
    assert not group_alive(pgid)  # the setup's whole group was stopped
    assert env.calls() == [] and env.ledger() == []
    assert live(env.paths.nextwork)[0]["claim_status"] == "available"
    stamp = orjson.loads((env.paths.evolve_dir / "workspace-setup.json").read_bytes())
    assert stamp["ok"] is False and stamp["interrupted"] is True  # the next fire runs it again
    snap = orjson.loads(subprocess.run([sys.executable, "-m", "evolve", "--repo", str(env.repo), "status", "--json"],
                                       env=env.env(), capture_output=True, text=True).stdout)
    assert not any("workspace setup failed" in x for x in snap["reasons"])  # stopped is not failed
    assert_git_clean(env)


def test_a_worktree_made_again_runs_setup_again(env: Env, cli) -> None:
    runs = recording_repo(env)
    env.queue(entry("one"), entry("two", epic="e2"))
    env.steps([{"report": {"result": "unchanged"}}])
    assert cli("fire", "--cycles", "1", extra_env={"RUNS": str(runs)}).code == 0
    git(env.repo, "worktree", "remove", "--force", str(env.tree))
    r = cli("fire", "--cycles", "1", extra_env={"RUNS": str(runs)})
    assert r.code == 0, r.stderr
    assert [x["reason"] for x in r.events() if x["event"] == "workspace.setup"] == ["the worktree was made"]
    assert len(runs_of(runs)) == 2
    assert_git_clean(env)


# -- link and copy ----------------------------------------------------------------------------------

def test_link_and_copy_never_follow_a_link_the_repository_committed(env: Env, cli, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    os.symlink(str(outside), env.repo / "vendor")  # committed: a link to a directory outside the repository
    git(env.repo, "add", "vendor")
    git(env.repo, "commit", "-q", "-m", "vendor link")
    (outside / "data").mkdir()
    (outside / "data" / "fixture.json").write_text("{}")
    env.write_config(workspace={"copy": ["vendor/data"], "link": ["vendor/node_modules"]})
    env.queue(entry("anything"))
    r = cli("fire", "--cycles", "1")
    assert r.code == 78, r.stderr
    (failed,) = [x for x in r.events() if x["event"] == "preflight.failed"]
    assert failed["check"] == "workspace" and "not followed" in failed["error"]
    assert [p.name for p in outside.iterdir()] == ["data"]  # nothing written through the link
    assert env.calls() == []
    assert_git_clean(env)


def test_a_link_planted_where_a_copy_goes_is_replaced_not_written_through(env: Env, cli, tmp_path: Path) -> None:
    (env.repo / ".gitignore").write_text("local.conf\n")
    (env.repo / "local.conf").write_text("mine\n")
    git(env.repo, "add", ".gitignore")
    git(env.repo, "commit", "-q", "-m", "ignore")
    env.write_config(workspace={"copy": ["local.conf"]})
    env.queue(entry("one"), entry("two", epic="e2"))
    env.steps([{"report": {"result": "unchanged"}}])
    assert cli("fire", "--cycles", "1").code == 0
    victim = tmp_path / "victim"
    victim.write_text("do not touch\n")
    (env.tree / "local.conf").unlink()
    os.symlink(str(victim), env.tree / "local.conf")  # what an agent could leave behind
    r = cli("fire", "--cycles", "1")
    assert r.code == 0, r.stderr
    assert victim.read_text() == "do not touch\n"
    assert not (env.tree / "local.conf").is_symlink() and (env.tree / "local.conf").read_text() == "mine\n"
    assert (env.repo / "local.conf").read_text() == "mine\n"
    assert_git_clean(env)


def test_a_tracked_path_is_never_linked_over(env: Env, cli) -> None:
    (env.repo / "node_modules").mkdir()
    (env.repo / "node_modules" / "vendored.js").write_text("x")
    git(env.repo, "add", "-A")
    git(env.repo, "commit", "-q", "-m", "vendored")
    env.write_config(workspace={"link": ["node_modules"]})
    env.queue(entry("anything"))
    r = cli("fire", "--cycles", "1")
    assert r.code == 78, r.stderr
    (failed,) = [x for x in r.events() if x["event"] == "preflight.failed"]
    assert "tracked in the repository" in failed["error"]
    assert not (env.tree / "node_modules").is_symlink()
    assert_git_clean(env)


@pytest.mark.parametrize(("key", "value", "why"), [
    ("link", "/etc", "not relative"),
    ("copy", "../secrets", "leaves the worktree"),
    ("path", ".git/hooks", "under .git"),
    ("link", "", "empty"),
    ("inputs", "a/../../b", "leaves the worktree"),
    ("path", "~/bin", "not relative"),
])
def test_workspace_paths_outside_the_worktree_are_refused_at_load(env: Env, cli, key, value, why) -> None:
    env.write_config(workspace={key: [value]})
    with pytest.raises(ConfigError, match=why):
        load(env.paths.config, env.env())
    r = cli("fire", "--cycles", "1")
    assert r.code == 78 and f"workspace.{key}" in r.stderr


def test_setup_in_shell_syntax_is_refused_at_load(env: Env) -> None:
    env.write_config(workspace={"setup": [["cd", "x"]]})
    with pytest.raises(ConfigError, match="shell syntax"):
        load(env.paths.config, env.env())


# -- the gate and goal checks get [workspace] path --------------------------------------------------

def test_gate_commands_get_the_workspace_path_first(env: Env, tmp_path: Path) -> None:
    env.write_config(workspace={"path": [".venv/bin", "node_modules/.bin"]})
    cfg = env.cfg()
    gate = Gate(env.paths, cfg, None, {"PATH": "/usr/bin:/bin", "SECRET_TOKEN": "x"})
    got = gate.command_env(tmp_path)
    assert got["PATH"] == f"{tmp_path}/.venv/bin:{tmp_path}/node_modules/.bin:/usr/bin:/bin"
    assert "SECRET_TOKEN" not in got
    assert with_path({"PATH": "/a:/b"}, ["/b"]) == {"PATH": "/b:/a"}
    assert with_path({"PATH": "/a"}, []) == {"PATH": "/a"}


def test_goal_checks_get_the_workspace_path_first(env: Env, cli) -> None:
    tool = env.repo / "tools" / "bin" / "goalcheck"
    tool.parent.mkdir(parents=True)
    tool.write_text("#!/bin/sh\nexit 0\n")
    tool.chmod(0o755)
    (env.repo / "GOALS.yaml").write_text("version: 3\nmission: m\ngoals:\n  - id: tool\n    description: d\n"
                                         "    check: goalcheck\n    weight: 1\n")
    git(env.repo, "add", "-A")
    git(env.repo, "commit", "-q", "-m", "goals")
    env.write_config(workspace={"path": ["tools/bin"]}, work={"beads_command": []})
    r = cli("fire", "--cycles", "1")
    assert r.code == 0, r.stderr
    snap = orjson.loads((env.paths.evolve_dir / "fitness-latest.json").read_bytes())
    assert {g["goal_id"]: g["result"] for g in snap["goals"]} == {"tool": "pass"}  # found on the tree's PATH
    assert_git_clean(env)


# -- the pure parts ---------------------------------------------------------------------------------

STAMP = {"tree": "/t", "tree_id": "i", "ok": True, "config": "c", "digest": "d"}


@pytest.mark.parametrize(("stamp", "kw", "due"), [
    (STAMP, {}, None),
    (None, {}, "the worktree was made"),
    (STAMP, {"tree_id": "other"}, "the worktree was made"),
    (STAMP, {"tree": "/elsewhere"}, "the worktree was made"),
    ({**STAMP, "ok": False}, {}, "the last setup failed"),
    (STAMP, {"config": "c2"}, "[workspace] setup changed"),
    (STAMP, {"digest": "d2"}, "an input changed"),
    (None, {"commands": False}, None),
])
def test_setup_due_table(stamp, kw, due) -> None:
    args = {"commands": True, "tree": "/t", "tree_id": "i", "config": "c", "digest": "d", **kw}
    assert setup_due(stamp, **args) == due


@pytest.mark.parametrize(("before", "after", "settled"), [
    ({}, {".venv/": "??"}, Settled((".venv/",), (), ())),
    ({}, {"setup.log": "??", " x": " M"}, Settled((), ("setup.log",), (" x",))),
    ({"a.py": " M", "new/": "??"}, {"a.py": " M", "new/": "??", "README.md": " M"}, Settled((), (), ("README.md",))),
    ({"own.txt": "??"}, {"own.txt": "??", "src/x.egg-info/": "??"}, Settled(("src/x.egg-info/",), (), ())),
    ({"a.py": " M"}, {"a.py": "MM"}, Settled((), (), ())),  # the cycle's path: never setup's to restore
])
def test_settle_table(before, after, settled) -> None:
    assert settle(before, after) == settled


@pytest.mark.parametrize(("path", "pattern"), [
    (".venv", "/.venv"),
    ("src/x.egg-info", "/src/x.egg-info"),
    ("we*ird [1]", "/we\\*ird\\ \\[1\\]"),
    ("!bang", "/\\!bang"),
    ("#hash", "/\\#hash"),
    ("new\nline", None),
])
def test_exclude_pattern_table(path, pattern) -> None:
    assert exclude_pattern(path) == pattern


def test_an_escaped_pattern_matches_exactly_that_path(tmp_path: Path) -> None:
    repo = tmp_path / "r"
    repo.mkdir()
    git(repo, "init", "-q")
    for name in ("we*ird [1]", "weXird 1"):
        (repo / name).write_text("x")
    (repo / ".git" / "info" / "exclude").write_text(exclude_pattern("we*ird [1]") + "\n")
    assert git(repo, "status", "--porcelain", "-z").split("\0")[:1] == ["?? weXird 1"]


@pytest.mark.parametrize(("path", "bad"), [
    ("node_modules", None), (".venv/bin", None), ("a/./b", None), ("/abs", "is not relative to the worktree"),
    ("..", "leaves the worktree (..)"), ("a/../../b", "leaves the worktree (..)"), (".git", "is under .git"),
    ("./.git/x", "is under .git"), (".", "names the worktree itself"), (" x", "is empty or padded with spaces"),
    ("a\nb", "holds a control character"), ("~", "is not relative to the worktree"),
])
def test_bad_rel_path_table(path, bad) -> None:
    assert bad_rel_path(path) == bad


def test_the_agent_gets_the_workspace_path_but_its_own_program_from_the_fire_s_path(env: Env, cli,
                                                                                     tmp_path: Path) -> None:
    """The agent runs the tests itself: its PATH starts with the worktree's venv, as the gate's does; but a
    ``myagent`` that setup (code the agent controls) put in that venv never stands in for the real one."""
    seen = tmp_path / "agent-path.txt"
    real = tmp_path / "bin" / "myagent"
    real.parent.mkdir()
    real.write_text(f"#!{sys.executable}\nimport json, os\n"
                    f"open({str(seen)!r}, 'w').write('real ' + os.environ['PATH'])\n"
                    "open(os.environ['EVOLVE_REPORT_FILE'], 'w').write(json.dumps({'result': 'unchanged'}))\n")
    real.chmod(0o755)
    plant = ("import os, pathlib; p = pathlib.Path('.venv/bin'); p.mkdir(parents=True, exist_ok=True); "
             f"(p / 'myagent').write_text('#!/bin/sh\\necho planted > {seen}\\n'); os.chmod(p / 'myagent', 0o755)")
    (env.repo / ".gitignore").write_text(".venv/\n")
    git(env.repo, "add", "-A")
    git(env.repo, "commit", "-q", "-m", "ignore")
    env.write_config(agent={"argv": ["myagent"], "pass_env": []},
                     workspace={"setup": [[sys.executable, "-c", plant]], "path": [".venv/bin"]})
    env.queue(entry("anything"))
    r = cli("fire", "--cycles", "1", extra_env={"PATH": f"{real.parent}{os.pathsep}{os.environ['PATH']}"})
    assert r.code == 0, r.stderr
    kind, path = seen.read_text().split(" ", 1)
    assert kind == "real"
    assert path.split(os.pathsep)[0] == str(env.tree / ".venv" / "bin")
    assert [x["result"] for x in env.ledger()] == ["unchanged"]
    assert_git_clean(env)
