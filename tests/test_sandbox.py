"""The sandbox the agent, gate commands, setup and goal checks run in (docs/DESIGN.md §8.6).

Real bubblewrap, real fires: a hostile agent and a hostile gate command try to write everything
evolve trusts, each write fails, and the cycle's legitimate edit still lands through the gate. A
host without bwrap (``EVOLVE_BWRAP`` naming nothing) runs unsandboxed with a warning under the
default ``auto`` and refuses before any claim (exit 78) under ``required``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from support import Env, entry, git, live

from evolve import sandbox
from evolve.sandbox import Probe, decide

HAS_BWRAP = sandbox.probe(os.environ).ok
needs_bwrap = pytest.mark.skipif(not HAS_BWRAP, reason="bubblewrap cannot start here (apt-get install bubblewrap)")
NO_BWRAP = {"EVOLVE_BWRAP": "/nonexistent/bwrap"}


@pytest.mark.parametrize(
    ("mode", "network", "found", "use", "warns", "refuses", "label"),
    [
        ("auto", "all", Probe("/usr/bin/bwrap"), True, False, False, "bubblewrap, network: all"),
        ("auto", "none", Probe("/usr/bin/bwrap"), True, False, False, "bubblewrap, network: none"),
        ("required", "all", Probe("/usr/bin/bwrap"), True, False, False, "bubblewrap, network: all"),
        ("auto", "all", Probe(None), False, True, False, "none: bwrap not found on PATH"),
        ("auto", "all", Probe("/usr/bin/bwrap", "bwrap: No permissions to create new namespace"), False, True, False,
         "none: bwrap: No permissions to create new namespace"),
        ("required", "all", Probe(None), False, False, True, "none: bwrap not found on PATH"),
        ("required", "all", Probe("/b", "bwrap: setting up uid map: Permission denied"), False, False, True,
         "none: bwrap: setting up uid map: Permission denied"),
        # a network policy is a sandbox the operator asked for: never dropped silently
        ("auto", "none", Probe(None), False, False, True, "none: bwrap not found on PATH"),
        ("off", "all", Probe(None), False, False, False, 'off ([sandbox] mode = "off")'),
        ("off", "all", Probe("/usr/bin/bwrap"), False, False, False, 'off ([sandbox] mode = "off")'),
    ],
)
def test_decide(mode: str, network: str, found: Probe, use: bool, warns: bool, refuses: bool, label: str) -> None:
    d = decide(mode, network, found)
    assert (d.use, d.warning is not None, d.refuse is not None, d.label) == (use, warns, refuses, label)
    for line in (d.warning, d.refuse):
        if line:
            assert "\n" not in line and sandbox.INSTALL in line and (found.error or "bwrap not found") in line


def test_binds_put_the_most_specific_path_last(tmp_path: Path) -> None:
    """A worktree inside the protected state dir is writable; a checkout inside scratch is not."""
    repo, home = tmp_path / "repo", tmp_path / "home"
    state, tree = repo / ".agents/evolve", repo / ".agents/evolve/wt"
    for d in (tree, home / ".claude", tmp_path / "gone"):
        d.mkdir(parents=True)
    (tmp_path / "gone").rmdir()
    scope = sandbox.Scope(writable=(tree, home / ".claude", tmp_path / "gone"), protected=(repo, state, home),
                          scratch=(tmp_path,))
    got = [(b.path, b.rw) for b in sandbox.binds(scope)]
    assert got == [(str(tmp_path), True), (str(repo), False), (str(home), False), (str(home / ".claude"), True),
                   (str(state), False), (str(tree), True)]  # and the path that is not there is not bound


def test_network_model_and_relative_writable_paths_are_one_line_config_errors(env: Env, cli) -> None:
    env.write_config(sandbox={"network": "model"})
    r = cli("fire", "--cycles", "1")
    assert r.code == 78 and 'sandbox.network = "model"' in r.stderr and "not implemented" in r.stderr
    env.write_config(sandbox={"network": "all", "writable": ["build/out"]})
    r = cli("fire", "--cycles", "1")
    assert r.code == 78 and "sandbox.writable: 'build/out' must be an absolute path" in r.stderr
    assert not env.ledger() and git(env.repo, "status", "--porcelain") == ""


# What a hostile child tries: every write must fail with EROFS (or EACCES), the file unchanged.
ATTACK = r"""
import json, os, sys
repo, tree, home, trust, out = sys.argv[1:6]
ev = os.path.join(repo, ".agents", "evolve")
targets = {
    "checkout": os.path.join(repo, "README.md"),
    "config_abs": os.path.join(ev, "config.toml"),
    "config_dotdot": os.path.join(tree, "..", "config.toml"),
    "kill": os.path.join(ev, "KILL"),
    "stop": os.path.join(ev, "STOP"),
    "ledger": os.path.join(ev, "cycle-history.jsonl"),
    "state": os.path.join(ev, "session-state.json"),
    "home": os.path.join(home, "evolve-sandbox-test-planted"),
    "git_config": os.path.join(repo, ".git", "config"),
    "git_hook": os.path.join(repo, ".git", "hooks", "pre-commit"),
    "git_branch": os.path.join(repo, ".git", "refs", "heads", "main"),
    "trust": os.path.join(trust, "git-trust.json"),
}
got = {}
for name, path in targets.items():
    try:
        with open(path, "a") as fh:
            fh.write("planted\n")
        got[name] = "written"
    except OSError as exc:
        got[name] = exc.strerror
try:
    os.unlink(os.path.join(repo, "README.md"))
    got["unlink_checkout"] = "removed"
except OSError as exc:
    got["unlink_checkout"] = exc.strerror
with open(out, "a") as fh:
    fh.write(json.dumps(got) + "\n")
"""


def _home(env: Env) -> Path:
    """A $HOME of the test's own (protected like the operator's), so a sandbox that failed writes nothing real."""
    home = env.root / "home"
    home.mkdir(exist_ok=True)
    return home


def _snapshot(env: Env, home: Path) -> dict[str, bytes | None]:
    ev = env.paths.evolve_dir
    paths = [env.repo / "README.md", ev / "config.toml", ev / "KILL", ev / "STOP", env.repo / ".git" / "config",
             env.repo / ".git" / "hooks" / "pre-commit", env.repo / ".git" / "refs" / "heads" / "main",
             home / "evolve-sandbox-test-planted", env.paths.git_trust]
    return {str(p): p.read_bytes() if p.exists() else None for p in paths}


def _attack_argv(env: Env, home: Path, out: Path) -> list[str]:
    assert env.paths.trust_dir is not None
    return [sys.executable, "-c", ATTACK, str(env.repo), str(env.tree), str(home), str(env.paths.trust_dir), str(out)]


def _assert_all_refused(out: Path, runs: int) -> None:
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(lines) == runs, lines
    for got in lines:
        assert set(got.values()) <= {"Read-only file system", "Permission denied"}, got


def _assert_git_clean(env: Env, start_count: int) -> None:
    assert not (env.repo / ".git" / "index.lock").exists()
    assert not (env.tree / ".git").is_file() or not list((env.repo / ".git" / "worktrees").glob("*/index.lock"))
    assert git(env.repo, "status", "--porcelain") == ""  # nothing of the operator's touched
    assert int(git(env.repo, "rev-list", "--count", "HEAD")) == start_count + 1  # the cycle landed, nothing lost


@needs_bwrap
def test_a_hostile_agent_cannot_write_what_evolve_trusts_and_its_edit_lands(env: Env, cli, tmp_path: Path) -> None:
    home = _home(env)
    env.queue(entry("harmless"))
    env.cfg()  # the config exists; the trust dir is made by the fire
    out = tmp_path / "attack.jsonl"
    before = _snapshot(env, home)
    start = int(git(env.repo, "rev-list", "--count", "HEAD"))
    env.steps([{"write": [{"path": "src/feature.py", "content": "x = 1\n"}], "commit": True,
                "run": [_attack_argv(env, home, out),
                        ["git", "update-ref", "refs/heads/main", "HEAD"],  # move the operator's branch
                        ["git", "config", "core.hooksPath", "/tmp/evil"]],
                "report": {"result": "improved"}}])
    r = cli("fire", "--cycles", "1", extra_env={"HOME": str(home)})
    assert r.code == 0, r.stderr
    e = env.ledger()[-1]
    assert e["result"] == "improved" and e["landed"] is True, e
    _assert_all_refused(out, 1)
    after = _snapshot(env, home)
    assert {k: v for k, v in after.items() if not k.endswith("main")} == {
        k: v for k, v in before.items() if not k.endswith("main")}
    assert "hookspath" not in git(env.repo, "config", "--list").lower()
    assert git(env.repo, "show", "HEAD:src/feature.py") == "x = 1\n"  # the agent's own commit landed by evolve
    assert e["sha"] == git(env.repo, "rev-parse", "HEAD").strip()
    _assert_git_clean(env, start)
    s = cli("status", "--json", extra_env={"HOME": str(home)})
    assert json.loads(s.stdout)["sandbox"]["label"] == "bubblewrap, network: all", s.stdout


@needs_bwrap
def test_a_hostile_gate_command_cannot_write_what_evolve_trusts(env: Env, cli, tmp_path: Path) -> None:
    home = _home(env)
    env.queue(entry("gated"))
    out = tmp_path / "gate-attack.jsonl"
    env.write_config(gate={"commands": [_attack_argv(env, home, out)]})
    before = _snapshot(env, home)
    start = int(git(env.repo, "rev-list", "--count", "HEAD"))
    env.steps([{"write": [{"path": "src/ok.py", "content": "ok = True\n"}], "report": {"result": "improved"}}])
    r = cli("fire", "--cycles", "1", extra_env={"HOME": str(home)})
    assert r.code == 0, r.stderr
    e = env.ledger()[-1]
    assert e["result"] == "improved" and e["gate"] == "PASS" and e["landed"] is True, e
    _assert_all_refused(out, 1)
    assert _snapshot(env, home) == {**before, str(env.repo / ".git" / "refs" / "heads" / "main"):
                                    (env.repo / ".git" / "refs" / "heads" / "main").read_bytes()}
    assert git(env.repo, "show", "HEAD:src/ok.py") == "ok = True\n"
    _assert_git_clean(env, start)


@needs_bwrap
def test_network_none_cuts_the_agent_off(env: Env, cli, tmp_path: Path) -> None:
    env.queue(entry("offline"))
    env.write_config(sandbox={"network": "none"})
    out = tmp_path / "net.txt"
    code = ("import socket,sys\ntry:\n socket.create_connection(('127.0.0.1', 9), 2); r = 'connected'\n"
            "except OSError as e:\n r = type(e).__name__ + ':' + str(e.errno)\nopen(sys.argv[1], 'w').write("
            "r + ' ' + str(sorted(n for _, n in socket.if_nameindex())))")
    env.steps([{"write": [{"path": "n.txt", "content": "1\n"}], "run": [[sys.executable, "-c", code, str(out)]],
                "report": {"result": "improved"}}])
    r = cli("fire", "--cycles", "1")
    assert r.code == 0 and env.ledger()[-1]["result"] == "improved", r.stderr
    text = out.read_text()
    assert text.split()[-1] == "['lo']" and "connected" not in text  # only a loopback of its own


def test_without_bwrap_auto_runs_unsandboxed_and_says_so(env: Env, cli) -> None:
    env.queue(entry("plain"))
    start = int(git(env.repo, "rev-list", "--count", "HEAD"))
    r = cli("fire", "--cycles", "1", extra_env=NO_BWRAP)
    assert r.code == 0, r.stderr
    assert "sandbox.none" in r.stderr and "apt-get install bubblewrap" in r.stderr
    assert env.ledger()[-1]["result"] == "improved"
    _assert_git_clean(env, start)
    dry = json.loads(cli("fire", "--dry-run", extra_env=NO_BWRAP).stdout)
    assert dry["sandbox"]["in_force"] == "none: bwrap not found on PATH" and dry["sandbox"]["warning"], dry
    s = cli("status", extra_env=NO_BWRAP)
    assert "sandbox    none: bwrap not found on PATH" in s.stdout and "apt-get install bubblewrap" in s.stdout, s.stdout
    js = json.loads(cli("status", "--json", extra_env=NO_BWRAP).stdout)
    assert js["sandbox"]["in_force"] is False and "apt-get install bubblewrap" in js["sandbox"]["warning"]
    assert any("unsandboxed" in w for w in js["warnings"]), js["warnings"]
    d = cli("doctor", extra_env=NO_BWRAP)
    line = next(x for x in d.stdout.splitlines() if "sandbox" in x)
    assert line.lstrip().startswith("WARN") and "apt-get install bubblewrap" in line, d.stdout


def test_without_bwrap_required_refuses_before_any_claim(env: Env, cli) -> None:
    env.queue(entry("must be sandboxed"))
    env.write_config(sandbox={"mode": "required"})
    queue_before = env.paths.nextwork.read_bytes()
    head_before = git(env.repo, "rev-parse", "HEAD")
    r = cli("fire", "--cycles", "1", extra_env=NO_BWRAP)
    assert r.code == 78, r.stderr
    reason = [x for x in r.stderr.splitlines() if "preflight.failed" in x]
    assert reason and '[sandbox] mode = \\"required\\" but bubblewrap cannot start: bwrap not found' in reason[0]
    assert env.paths.nextwork.read_bytes() == queue_before  # nothing claimed
    assert [i.get("claim_status", "available") for e in live(env.paths.nextwork) for i in e["items"]] == ["available"]
    assert not env.ledger() and git(env.repo, "rev-parse", "HEAD") == head_before
    assert git(env.repo, "status", "--porcelain") == "" and not (env.repo / ".git" / "index.lock").exists()
    d = cli("doctor", extra_env=NO_BWRAP)
    line = next(x for x in d.stdout.splitlines() if "sandbox" in x)
    assert line.lstrip().startswith("FAIL") and "bwrap not found" in line, d.stdout


@needs_bwrap
def test_the_process_group_kill_reaches_everything_inside_the_sandbox(env: Env, cli, tmp_path: Path) -> None:
    """KILL while a sandboxed agent runs, with a child of its own in the background: nothing survives."""
    env.queue(entry("long"))
    env.steps([{"spawn_sleeper": 600, "write": [{"path": "w.txt", "content": "1\n"}], "wait_for": "never-there",
                "report": {"result": "improved"}}])
    import subprocess
    import time

    proc = subprocess.Popen([sys.executable, "-m", "evolve", "--repo", str(env.repo), "fire", "--cycles", "1"],
                            env=env.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not env.calls():
        time.sleep(0.1)
    assert env.calls(), "the agent never started"
    pgid = env.calls()[0]["pgid"]
    inside = [p for p in _group(pgid)]
    assert any(b"bwrap" in _cmdline(p) for p in inside), "the agent did not run under bwrap"
    (env.paths.evolve_dir / "KILL").write_text("stop\n")
    _out, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err
    assert not _group(pgid), "something of the sandboxed agent survived"
    assert env.ledger()[-1]["result"] == "interrupted"
    assert not (env.repo / ".git" / "index.lock").exists() and git(env.repo, "status", "--porcelain") == ""


def _group(pgid: int) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text()
            except OSError:
                continue
            fields = stat[stat.rfind(")") + 2:].split()
            if int(fields[2]) == pgid and fields[0] not in "ZX":
                out.append(int(d.name))
    return out


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


@needs_bwrap
def test_workspace_setup_and_goal_checks_cannot_write_what_evolve_trusts(env: Env, cli, tmp_path: Path) -> None:
    home = _home(env)
    setup_out, goal_out = tmp_path / "setup-attack.jsonl", tmp_path / "goal-attack.jsonl"
    attack = tmp_path / "attack.py"
    attack.write_text(ATTACK)
    assert env.paths.trust_dir is not None
    args = f"{env.repo} {env.tree} {home} {env.paths.trust_dir}"
    (env.repo / "GOALS.yaml").write_text(
        "version: 3\nmission: m\ngoals:\n  - id: tries\n    description: d\n"
        f"    check: \"{sys.executable} {attack} {args} {goal_out}; test -f done.txt\"\n    weight: 5\n")
    git(env.repo, "add", "GOALS.yaml")
    git(env.repo, "commit", "-q", "-m", "goals")
    env.write_config(workspace={"setup": [[sys.executable, str(attack), *args.split(), str(setup_out)]],
                                "probe": False})
    before = _snapshot(env, home)
    start = int(git(env.repo, "rev-list", "--count", "HEAD"))
    env.steps([{"write": [{"path": "done.txt", "content": "1\n"}], "report": {"result": "improved"}}])
    r = cli("fire", "--cycles", "1", extra_env={"HOME": str(home)})
    assert r.code == 0, r.stderr
    e = env.ledger()[-1]
    assert (e["work_ref"], e["result"], e["landed"]) == ("goal:tries", "improved", True), e
    _assert_all_refused(setup_out, 1)
    goal_runs = len(goal_out.read_text().splitlines())
    assert goal_runs >= 2  # measured before and after the cycle, each time refused
    _assert_all_refused(goal_out, goal_runs)
    main = str(env.repo / ".git" / "refs" / "heads" / "main")
    assert {k: v for k, v in _snapshot(env, home).items() if k != main} == {
        k: v for k, v in before.items() if k != main}
    _assert_git_clean(env, start)


@needs_bwrap
def test_a_sandbox_nested_inside_the_agents_starts(env: Env, cli, tmp_path: Path) -> None:
    """An agent CLI with a bubblewrap sandbox of its own (Codex) can start it inside evolve's."""
    env.queue(entry("nested"))
    out = tmp_path / "nested.txt"
    bwrap = sandbox.find_bwrap(os.environ)
    assert bwrap is not None
    inner = [bwrap, "--ro-bind", "/", "/", "--dev", "/dev", "--unshare-user", "--unshare-pid", "--proc", "/proc",
             "--bind", str(tmp_path), str(tmp_path), "--", "sh", "-c", f"echo inner-ran > {out}"]
    env.steps([{"write": [{"path": "n.txt", "content": "1\n"}], "run": [inner], "report": {"result": "improved"}}])
    r = cli("fire", "--cycles", "1")
    assert r.code == 0 and env.ledger()[-1]["result"] == "improved", r.stderr
    assert out.read_text() == "inner-ran\n"


@needs_bwrap
def test_a_rewritten_worktree_git_file_opens_no_more_of_git(env: Env, cli, tmp_path: Path) -> None:
    """The agent points its worktree's ``.git`` at the shared git dir: evolve puts the file back and refuses the
    cycle before the gate runs (workspace.Isolated._repair_git_file); and had a child started meanwhile, the
    sandbox reads the git dirs from the operator's checkout (the next test), never from that file."""
    home = _home(env)
    env.queue(entry("redirect"))
    saved, out = tmp_path / "dotgit", tmp_path / "gate-attack.jsonl"
    redirect = (f"import shutil; shutil.copy('.git', {str(saved)!r}); "
                f"open('.git', 'w').write('gitdir: {env.repo / '.git'}\\n')")
    restore = f"import shutil; shutil.copy({str(saved)!r}, '.git')"
    env.write_config(gate={"commands": [_attack_argv(env, home, out), [sys.executable, "-c", restore]]})
    before = _snapshot(env, home)
    start = int(git(env.repo, "rev-list", "--count", "HEAD"))
    env.steps([{"write": [{"path": "r.txt", "content": "1\n"}], "run": [[sys.executable, "-c", redirect]],
                "report": {"result": "improved"}}])
    r = cli("fire", "--cycles", "1", extra_env={"HOME": str(home)})
    assert r.code == 0, r.stderr
    assert saved.read_text().startswith("gitdir: ") and str(env.repo / ".git" / "worktrees") in saved.read_text()
    assert "rewrote its worktree's .git file" in env.ledger()[-1]["error"]
    assert (env.tree / ".git").read_text() == saved.read_text(), "put back"
    assert not out.exists(), "the gate never ran on the refused cycle"
    main = str(env.repo / ".git" / "refs" / "heads" / "main")
    assert {k: v for k, v in _snapshot(env, home).items() if k != main} == {
        k: v for k, v in before.items() if k != main}
    assert not (env.repo / ".git" / "index.lock").exists() and git(env.repo, "status", "--porcelain") == ""
    assert int(git(env.repo, "rev-list", "--count", "HEAD")) >= start  # nothing of the operator's lost


def test_the_git_dirs_come_from_the_checkout_not_the_worktrees_git_file(env: Env, tmp_path: Path) -> None:
    """Pure but for the real repository: a worktree whose .git file was rewritten still gets only its own admin
    dir and the objects writable, never the shared git dir."""
    tree = tmp_path / "wt"
    git(env.repo, "worktree", "add", "-q", "--detach", str(tree))
    common = env.repo / ".git"
    admin = next(p for p in (common / "worktrees").iterdir())
    scope = sandbox.Scope(writable=(tree,), protected=(env.repo,), scratch=(), git_dirs=(tree,), git_repo=env.repo)
    rw = {b.path for b in sandbox.binds(scope) if b.rw}
    assert rw == {str(tree), str(admin), str(common / "objects")}
    (tree / ".git").write_text(f"gitdir: {common}\n")  # the agent's rewrite
    assert {b.path for b in sandbox.binds(scope) if b.rw} == rw and str(common) not in rw
