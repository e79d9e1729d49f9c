"""Red team of issue 22: the workspace boundary attacked the way a hostile agent, an unlucky operator or a
real repository would. Each test is a break of one of the issue's "What must hold" items, reproduced with
real git and real fires; its docstring says what must hold instead.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyfixture
from support import Env, entry, git, improved_step


def head(repo: Path, ref: str = "HEAD") -> str:
    return git(repo, "rev-parse", ref).strip()


def commit_file(repo: Path, path: str, content: str, msg: str) -> str:
    (repo / path).parent.mkdir(parents=True, exist_ok=True)
    (repo / path).write_text(content)
    git(repo, "add", "--", path)
    git(repo, "commit", "-q", "-m", msg)
    return head(repo)


def wait_until(pred, what: str, timeout: float = 120.0) -> None:
    """A hang guard only: the condition is an event, never a speed."""
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def start_fire(env: Env, *args: str, extra_env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "evolve", "--repo", str(env.repo), "fire", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env.env(**(extra_env or {})))


def test_a_landing_finished_after_a_death_never_writes_into_the_branch_the_operator_switched_to(
        env: Env, cli) -> None:
    """Items 2, 4, 7: the fire dies right after git's fast-forward moved ``main`` (crash point
    ``land.moved``); before the next fire the operator switches their checkout to ``feature``, as anyone
    may between two cron fires. The next fire's recovery "finishes" the fast-forward path by path in the
    checkout named by the intent, without asking which branch that checkout is on now: it writes
    ``main``'s landed file into the operator's ``feature`` working tree and stages it in ``feature``'s
    index, so the operator's next commit on ``feature`` carries evolve's change. What must hold: a landing
    is finished only in a checkout that still has its branch checked out; ``feature`` (its tip, index and
    files) is untouched, and ``main`` carries the landed commit."""
    git(env.repo, "branch", "feature")
    env.queue(entry("once"))
    env.steps([improved_step(path="once.txt", content="once\n")])
    r = cli("fire", "--cycles", "1", extra_env={"EVOLVE_CRASHPOINT": "land.moved"})
    assert r.code == -signal.SIGKILL, r.stderr
    landed = head(env.repo, "main")
    assert git(env.repo, "show", f"{landed}:once.txt") == "once\n"  # git's fast-forward went through
    feature = head(env.repo, "feature")
    git(env.repo, "checkout", "-q", "feature")  # the operator, between two fires
    assert git(env.repo, "status", "--porcelain").strip() == "" and not (env.repo / "once.txt").exists()
    env.steps([{"report": {"result": "unchanged", "summary": "nothing"}}])
    r = cli("fire", "--cycles", "1")
    assert r.code == 0, r.stderr
    assert head(env.repo, "main") == landed
    assert head(env.repo, "feature") == feature
    assert git(env.repo, "symbolic-ref", "HEAD").strip() == "refs/heads/feature"
    # feature's checkout as the operator left it: nothing of main's landing in its files or its index
    assert git(env.repo, "status", "--porcelain").strip() == "", git(env.repo, "status", "--porcelain")
    assert not (env.repo / "once.txt").exists()


def tracked_agents_repo(env: Env) -> None:
    """An agentops-style repository (as tests/test_landing.py has it): the queue and learnings committed."""
    (env.repo / ".agents" / ".gitignore").unlink()
    (env.repo / ".gitignore").write_text(".agents/evolve/\n")
    (env.repo / ".agents" / "learnings").mkdir(parents=True)
    (env.repo / ".agents" / "learnings" / "l1.md").write_text("first learning\n")
    env.queue(entry("work"))
    git(env.repo, "add", ".gitignore", ".agents")
    git(env.repo, "commit", "-q", "-m", "agentops: queue and learnings are tracked")


def test_an_agent_that_commits_its_learning_with_its_code_in_a_tracked_agents_repo_lands(env: Env, cli) -> None:
    """Items 10 and 8: in an agentops repository (``.agents/`` tracked) an agent that does what such repos
    ask of it — ``git add -A && git commit`` of its code *and* its learning — is green, but the door first
    copies the learning into the operator's ``.agents/`` as an untracked file, and then the landing finds
    that very file "in the way" and holds the chain: the cycle is ``pending`` with the reason "your checkout
    has changes, untracked or ignored files in paths this landing writes: .agents/learnings/new.md" (evolve's
    own write, not the operator's), and every later fire holds it again for the same reason: the good change
    never lands by itself. What must hold: a file the door itself put there, byte for byte what the landing
    writes, is not the operator's and does not hold the landing; the change lands."""
    tracked_agents_repo(env)
    start = head(env.repo)
    env.steps([{"write": [{"path": "code.txt", "content": "code\n"},
                          {"path": ".agents/learnings/new.md", "content": "what the agent learned\n"}],
                "run": [["git", "add", "-A"], ["git", "commit", "-q", "-m", "agent: code and its learning"]],
                "report": {"result": "improved"}}])
    r = cli("fire", "--cycles", "1")
    assert r.code == 0, r.stderr
    assert (env.repo / ".agents" / "learnings" / "new.md").read_text() == "what the agent learned\n"
    env.steps([{"report": {"result": "unchanged", "summary": "nothing"}}])
    r = cli("fire", "--cycles", "1")  # a later fire: nothing of the operator's has changed meanwhile
    assert r.code == 0, r.stderr
    first = env.ledger()[0]
    assert first["result"] == "improved" or any(
        e.get("pending_cycle") == first["cycle"] and e["result"] == "improved" for e in env.ledger()), \
        (first["result"], first.get("pending_reason"))
    assert head(env.repo, "main") != start
    assert (env.repo / "code.txt").read_text() == "code\n"


def test_applying_a_dead_cycle_s_stranded_work_never_brings_back_a_commit_the_operator_dropped(
        env: Env, cli) -> None:
    """Items 2 and 11: the operator committed a secret by mistake; a cycle starts on it; the fire dies
    (SIGKILL, OOM) while its agent works; the operator drops the secret commit; the next fire sets the
    dead cycle's work aside as ``stranded/<cycle>``, and the operator takes it back with ``evolve setaside
    apply``. The ``crashed`` entry reconcile writes has no ``cycle_start_sha``, so the change is measured
    from the ref's fork point with the operator's branch, which lies *below* the dropped commit: the apply
    writes ``secret.txt`` back into the checkout. What must hold: a set-aside change is only the cycle's
    own (measured from the cycle's start, which evolve knew when it started the cycle); nothing the
    operator removed comes back with it."""
    base = head(env.repo)
    commit_file(env.repo, "secret.txt", "AKIA-not-for-git\n", "oops: committed a secret")
    env.queue(entry("work"))
    go = env.root / "go"
    env.steps([{"write": [{"path": "agent.txt", "content": "agent\n"}], "wait_for": str(go),
                "report": {"result": "improved"}}])
    fire = start_fire(env, "--cycles", "1")
    wait_until(lambda: (env.tree / "agent.txt").exists(), "the agent's edit")
    fire.send_signal(signal.SIGKILL)  # the fire dies (OOM, power cut) while its agent works
    fire.communicate(timeout=60)
    go.write_text("")  # the orphaned agent ends (or the next fire's reconcile kills it)
    git(env.repo, "reset", "-q", "--hard", base)  # the operator drops the commit with the secret
    env.steps([{"report": {"result": "unchanged", "summary": "nothing"}}])
    r = cli("fire", "--cycles", "1")
    assert r.code == 0, r.stderr
    crashed = env.ledger()[0]
    assert crashed["result"] == "crashed", crashed
    stranded = git(env.repo, "for-each-ref", "--format=%(refname)", "refs/evolve/stranded/").split()
    assert len(stranded) == 1, stranded
    assert git(env.repo, "show", f"{stranded[0]}:agent.txt") == "agent\n"  # the dead cycle's work is kept
    r = cli("setaside", "apply", stranded[0].removeprefix("refs/evolve/"))
    assert r.code == 0, (r.stdout, r.stderr)
    assert (env.repo / "agent.txt").read_text() == "agent\n"
    assert not (env.repo / "secret.txt").exists(), "the dropped secret came back with the set-aside work"
    assert head(env.repo) == base


MANY_FILES = """
import os
d = "gen/" + "d" * 60
os.makedirs(d, exist_ok=True)
for i in range(20000):
    with open(f"{d}/file_{i:06d}_" + "x" * 60 + ".txt", "w") as fh:
        fh.write(f"{i}\\n")
"""


def test_a_change_of_twenty_thousand_paths_neither_crashes_the_fire_nor_wedges_every_later_one(
        env: Env, cli) -> None:
    """Item 7 (and the issue's "a huge number of paths"): an agent that generates 20,000 files (a code
    generator, a vendored dependency) makes evolve name every path on one git argv (``git add -- <paths>``),
    past the kernel's ARG_MAX: the fire dies with "unexpected error: OSError: Argument list too long" and
    no entry; every later fire then fails to make its workspace the same way (setting the dead cycle's
    work aside names every path again), status DEGRADED "the next fire tries again", forever, and the
    dead cycle's work is never kept under a ref. What must hold: a change of any number of paths is
    committed (or refused with a reason) and recorded; a dead cycle's work is set aside and the next
    fire works its next item."""
    env.queue(entry("gen", "small"))  # a next item whichever way the first fire ends
    env.steps([{"run": [[sys.executable, "-c", MANY_FILES]], "report": {"result": "improved"}},
               improved_step(path="small.txt", content="small\n")])
    start = head(env.repo)
    cli("fire", "--cycles", "1", timeout=600)
    r = cli("fire", "--cycles", "1", timeout=600)
    assert r.code == 0, [e for e in r.events() if "error" in e["event"]]
    assert git(env.repo, "show", "main:small.txt") == "small\n"  # the next cycle worked and landed
    gen = "gen/" + "d" * 60 + "/file_000000_" + "x" * 60 + ".txt"
    kept = git(env.repo, "for-each-ref", "--format=%(refname)", "refs/evolve/").split()
    assert any(subprocess.run(["git", "cat-file", "-e", f"{ref}:{gen}"], cwd=env.repo).returncode == 0
               for ref in [*kept, "main"]), "the generated files are neither on main nor kept under a ref"
    assert head(env.repo, "main") != start


GOALS_API = """\
version: 3
mission: every caller names a function the api has
goals:
  - id: callers-resolve
    description: every name in callers/ is defined in api.txt
    check: "for n in $(cat callers/* 2>/dev/null); do grep -qx \\"$n\\" api.txt || exit 1; done"
    weight: 5
"""


def test_a_replay_onto_the_operator_s_new_commit_is_gated_by_the_goals_too(env: Env) -> None:
    """Items 1 and 2: the GOALS checks are the repository's gate (no ``gate.commands``). The agent renames
    the api's function; meanwhile the operator commits a caller of the old name. Each tree alone is green,
    together the goal fails. The branch moved, so evolve replays the change onto the operator's tip and
    "re-gates" it, but only with ``gate.commands`` (none here): the replayed tree, whose goal now fails,
    lands as ``improved`` with ``gate: PASS``. What must hold: the tree that lands is the tree the gate
    judged: after a replay the goals that passed before are measured again, and a regression there keeps
    the change unlanded."""
    (env.repo / "GOALS.yaml").write_text(GOALS_API)
    git(env.repo, "add", "GOALS.yaml")
    commit_file(env.repo, "api.txt", "old_name\n", "api and its goal")
    env.queue(entry("rename the api's function"))
    go = env.root / "go"
    env.steps([{"write": [{"path": "api.txt", "content": "new_name\n"}], "wait_for": str(go),
                "report": {"result": "improved"}}])
    fire = start_fire(env, "--cycles", "1")
    wait_until(lambda: (env.tree / "api.txt").exists() and (env.tree / "api.txt").read_text() == "new_name\n",
               "the agent's edit")
    commit_file(env.repo, "callers/op.txt", "old_name\n", "operator: a caller of the api")  # during the cycle
    go.write_text("")
    _, err = fire.communicate(timeout=300)
    assert fire.returncode == 0, err
    check = subprocess.run(["sh", "-c", "for n in $(cat callers/* 2>/dev/null); do grep -qx \"$n\" api.txt || "
                            "exit 1; done"], cwd=env.repo)
    e = [x for x in env.ledger() if x.get("work_ref", "").endswith("rename the api's function")][-1]
    assert not (e["result"] == "improved" and check.returncode != 0), \
        f"landed {e['result']} (gate {e.get('gate')}) with the goal red on the branch: {e}"
    assert git(env.repo, "status", "--porcelain").strip() == ""


CRYPT = r'''
import sys
MAGIC = b"CRYPT1:"
data = sys.stdin.buffer.read()
if sys.argv[1] == "clean":
    out = data if data.startswith(MAGIC) else MAGIC + bytes(b ^ 0x5A for b in data).hex().encode() + b"\n"
else:
    out = bytes(b ^ 0x5A for b in bytes.fromhex(data[len(MAGIC):].decode())) if data.startswith(MAGIC) else data
sys.stdout.buffer.write(out)
'''


def test_a_replay_onto_a_commit_that_declares_a_filter_never_lands_plaintext_in_the_filtered_file(
        env: Env, cli) -> None:
    """Item 6: the operator's git-crypt-style filter is approved (``doctor --trust-git-config``). While a
    cycle runs, in which the agent adds ``config/prod.env``, the operator commits a ``.gitattributes``
    that sends ``config/*.env`` through that filter (exactly what one does on noticing env files are about
    to be committed). The branch moved, so evolve replays the agent's commit onto it; the replay moves
    the committed blob as it is (plaintext: at the cycle's start nothing declared it filtered), no filter
    check runs on the replayed tree, and the plaintext lands in a path ``main`` now declares encrypted
    (and is pushed with ``[git] push``). What must hold: plaintext never lands in a filtered file: a
    replayed change is checked against the attributes of the tree it lands in (refused, kept unlanded)
    or renormalized through the filter."""
    prog = env.root / "crypt.py"
    prog.write_text(CRYPT)
    git(env.repo, "config", "filter.crypt.clean", f"{sys.executable} {prog} clean")
    git(env.repo, "config", "filter.crypt.smudge", f"{sys.executable} {prog} smudge")
    r = cli("doctor", "--trust-git-config")
    assert "approved filter.crypt.clean" in r.stdout, r.stdout
    env.queue(entry("configure production"))
    go = env.root / "go"
    env.steps([{"write": [{"path": "config/prod.env", "content": "DB_PASSWORD=hunter2\n"}],
                "wait_for": str(go), "report": {"result": "improved"}}])
    fire = start_fire(env, "--cycles", "1")
    wait_until(lambda: (env.tree / "config" / "prod.env").exists(), "the agent's edit")
    commit_file(env.repo, ".gitattributes", "config/*.env filter=crypt\n", "operator: env files are encrypted")
    go.write_text("")
    _, err = fire.communicate(timeout=300)
    assert fire.returncode == 0, err
    on_main = subprocess.run(["git", "cat-file", "blob", "main:config/prod.env"], cwd=env.repo,
                             capture_output=True).stdout
    assert b"hunter2" not in on_main, f"plaintext landed in a filtered file: {on_main!r}"
    assert git(env.repo, "status", "--porcelain").strip() == ""


def test_what_the_gate_judged_is_what_lands_even_when_a_new_file_matches_gitignore(env: Env, cli) -> None:
    """Item 1: GitHub's Python ``.gitignore`` ignores every directory named ``lib/`` (and ``build/``,
    ``env/``, ...), at any depth. The agent adds a helper module under ``lib/`` and imports it; the gate
    runs in the worktree, where the file exists, and is green; evolve then commits only the paths
    ``git status`` shows, so the helper (ignored) is not committed: ``main`` gets code that imports a
    module it does not have, recorded ``improved`` with ``gate: PASS``. What must hold: the gate's verdict
    is about the tree that lands: a file the gate's tree had and the commit leaves out either makes the
    cycle red (or refused with the reason), or the gate judges the committed tree."""
    (env.repo / ".gitignore").write_text("# from github/gitignore Python.gitignore\nbuild/\nlib/\nenv/\n")
    (env.repo / "app.py").write_text("def main():\n    return 1\n")
    git(env.repo, "add", ".gitignore", "app.py")
    git(env.repo, "commit", "-q", "-m", "app")
    gate = [sys.executable, "-c", "import app; assert app.main() == 2"]
    env.write_config(gate={"commands": [gate]})
    env.queue(entry("return two via a helper"))
    env.steps([{"write": [{"path": "lib/__init__.py", "content": ""},
                          {"path": "lib/helpers.py", "content": "def two():\n    return 2\n"},
                          {"path": "app.py", "content": "from lib.helpers import two\n\n\ndef main():\n"
                                                        "    return two()\n"}],
                "report": {"result": "improved"}}])
    r = cli("fire", "--cycles", "1")
    assert r.code == 0, r.stderr
    e = env.ledger()[-1]
    landed = env.root / "landed"
    git(env.repo, "worktree", "add", "-q", "--detach", str(landed), "main")
    on_main = subprocess.run(gate, cwd=landed, capture_output=True, text=True,
                             env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert not (e["result"] == "improved" and on_main.returncode != 0), \
        f"{e['result']} (gate {e.get('gate')}), but the gate is red on what landed: {on_main.stderr[-300:]}"


SLOW_SMUDGE = r'''
import os, sys, time
data = sys.stdin.buffer.read()
if sys.argv[1] == "smudge" and os.getcwd() == {repo!r} and sys.argv[2] == "b.dat" and not os.path.exists({marker!r}):
    open({marker!r}, "w").write(str(os.getppid()))  # git, mid-checkout in the operator's checkout (once)
    time.sleep(120)
sys.stdout.buffer.write(data)
'''


def test_systemctl_stop_during_the_fast_forward_never_leaves_the_checkout_half_updated(env: Env, cli) -> None:
    """Item 7: the units run with ``KillMode=control-group``, so ``systemctl stop`` (or a shutdown) sends
    SIGTERM to every process of the fire at once, git included. Arriving while git's ``merge --ff-only``
    writes the landing into the operator's checkout (here: an approved filter, slow on the second of
    three files), git dies between files; the fire, which only sets its stop flag, sees "git refused the
    fast-forward" and holds the chain as pending. The operator's checkout keeps ``a.dat`` new while its
    index and branch are old: evolve's half-landed file looks like the operator's own edit, and from then
    on it is "in the way" of the very landing it belongs to. What must hold: a landing killed half-way
    never leaves the operator's checkout half-updated: after the stop (and at the latest after the next
    fire) the checkout is clean and its files are exactly its HEAD's."""
    marker = env.root / "smudging"
    prog = env.root / "slow.py"
    prog.write_text(SLOW_SMUDGE.format(repo=str(env.repo), marker=str(marker)))
    git(env.repo, "config", "filter.slow.clean", "cat")
    git(env.repo, "config", "filter.slow.smudge", f"{sys.executable} {prog} smudge %f")
    commit_file(env.repo, ".gitattributes", "*.dat filter=slow\n", "dat files go through the filter")
    r = cli("doctor", "--trust-git-config")
    assert "approved filter.slow.smudge" in r.stdout, r.stdout
    start = head(env.repo)
    env.queue(entry("data"))
    env.steps([{"write": [{"path": f"{n}.dat", "content": f"{n} new\n"} for n in "abc"],
                "report": {"result": "improved"}}])
    fire = start_fire(env, "--cycles", "1")
    wait_until(marker.exists, "git's fast-forward, mid-checkout", timeout=300)
    git_pid = int(marker.read_text())
    os.killpg(os.getpgid(git_pid), signal.SIGTERM)  # systemd: SIGTERM to the whole control group at once
    fire.send_signal(signal.SIGTERM)
    fire.communicate(timeout=300)
    r = cli("fire", "--cycles", "1")  # and the next fire, too, may put it right
    status = git(env.repo, "status", "--porcelain", "--untracked-files=all")
    assert status.strip() == "", f"the operator's checkout after the stop: {status!r} (main moved: " \
                                 f"{head(env.repo) != start})"
    assert not (env.repo / ".git" / "index.lock").exists()
    for n in "abc":
        tracked = subprocess.run(["git", "cat-file", "-e", f"HEAD:{n}.dat"], cwd=env.repo).returncode == 0
        assert (env.repo / f"{n}.dat").exists() == tracked


def test_a_worktree_dir_shared_by_two_repositories_never_destroys_the_other_s_work(env: Env, cli) -> None:
    """Items 7 and 12: ``EVOLVE_GIT_WORKTREE_DIR`` (or ``[git] worktree_dir``) set once for every instance
    of the ``evolve@.service`` template names the same absolute path for two repositories. Repository A's
    fire dies while its agent works (its edits are in that worktree, to be set aside as ``stranded/``).
    Repository B's fire finds a worktree there that evolve made (for A: its ``.git`` file points into A's
    ``worktrees/``), which B's git cannot remove, so evolve deletes the directory (``shutil.rmtree``) and
    makes its own: A's dead cycle's work is gone, and A's next fire has nothing to set aside. What must
    hold: a ``worktree_dir`` that is another repository's worktree is refused (as one evolve did not make
    for this repository), and a dead cycle's work is kept under a ref of its own repository."""
    shared = env.root / "shared-worktree"
    wt = {"EVOLVE_GIT_WORKTREE_DIR": str(shared)}
    other = env.root / "other"
    other.mkdir()
    git(other, "init", "-q", "-b", "main")
    commit_file(other, "README.md", "# the other repository\n", "initial")
    (other / ".agents" / "evolve").mkdir(parents=True)
    (other / ".agents" / ".gitignore").write_text("*\n")
    (other / ".agents" / "evolve" / "config.toml").write_bytes(env.paths.config.read_bytes())
    env.queue(entry("work"))
    go = env.root / "go"
    env.steps([{"write": [{"path": "wip.txt", "content": "an hour of the agent's work\n"}], "wait_for": str(go),
                "report": {"result": "improved"}}])
    fire = start_fire(env, "--cycles", "1", extra_env=wt)
    wait_until(lambda: (shared / "wip.txt").exists(), "the agent's edit")
    fire.send_signal(signal.SIGKILL)  # repository A's fire dies (OOM, power cut) while its agent works
    fire.communicate(timeout=60)
    go.write_text("")
    env.steps([{"report": {"result": "unchanged", "summary": "nothing"}}])
    cli("fire", "--cycles", "1", extra_env=wt, repo=other)  # repository B's fire, same worktree_dir
    cli("fire", "--cycles", "1", extra_env=wt)  # repository A's next fire
    kept = git(env.repo, "for-each-ref", "--format=%(refname)", "refs/evolve/").split()
    assert any(subprocess.run(["git", "cat-file", "-e", f"{ref}:wip.txt"], cwd=env.repo).returncode == 0
               for ref in kept), f"repository A's dead cycle's work is gone (refs: {kept})"


def test_the_door_never_brings_back_a_learning_the_operator_deleted(env: Env, cli) -> None:
    """Item 10 (and "never resurrect the operator's things"): in an agentops repository the operator deletes
    an obsolete learning from their ``.agents/`` (not committed yet, as one does). The agent's worktree has
    the branch's copy, and the agent refines it; the door treats the missing file as "not changed by the
    operator" and writes the agent's version back into their ``.agents/``. What must hold: a file the
    operator changed since the branch tip — deleting it is a change — is never written over or recreated:
    the agent's version goes beside it (``<name>.evolve-<cycle>``), as for an edit."""
    tracked_agents_repo(env)
    learned = env.repo / ".agents" / "learnings" / "l1.md"
    learned.unlink()  # the operator removes it (the deletion not committed yet)
    env.steps([{"write": [{"path": "code.txt", "content": "code\n"},
                          {"path": ".agents/learnings/l1.md", "content": "first learning, refined\n"}],
                "report": {"result": "improved"}}])
    r = cli("fire", "--cycles", "1")
    assert r.code == 0, r.stderr
    assert env.ledger()[-1]["result"] == "improved"
    assert not learned.exists(), "the learning the operator deleted is back: " + learned.read_text()


def test_a_path_that_is_not_utf8_in_a_landing_reason_is_recorded_not_a_crash(env: Env, cli) -> None:
    """Item 4 (and untrusted input: the repository itself): a real repository may hold a file whose name is
    not UTF-8 (``caf\\xe9.txt``, from a Latin-1 system). The operator has it modified in their checkout, the
    agent changes it too: the landing must wait, and its reason names the path. That reason goes into
    the ledger (``pending_reason``), whose JSON encoder refuses the surrogate-escaped name: the fire dies
    with "unexpected error: TypeError: str is not valid UTF-8", no entry for the cycle, and the next fire
    records it ``crashed``, retries the item and dies the same way (the same with a refusal under
    ``max_file_mb``). What must hold: the cycle is recorded (pending, with a reason that shows the name
    escaped) and the fire ends normally; the operator's file is untouched."""
    name = os.fsencode("caf") + b"\xe9.txt"
    (env.repo / os.fsdecode(name)).write_bytes(b"v1\n")
    git(env.repo, "add", "-A")
    git(env.repo, "commit", "-q", "-m", "a file named in Latin-1")
    (env.repo / os.fsdecode(name)).write_bytes(b"the operator's edit\n")
    env.queue(entry("x"))
    mk = f"open({name!r}, 'wb').write(b'the agent\\'s edit\\n')"
    env.steps([{"run": [[sys.executable, "-c", mk]], "report": {"result": "improved"}}])
    r = cli("fire", "--cycles", "1")
    assert r.code == 0 and not r.error_lines(), r.error_lines()
    e = env.ledger()[-1]
    assert e["result"] == "pending" and "caf" in e["pending_reason"], e
    assert (env.repo / os.fsdecode(name)).read_bytes() == b"the operator's edit\n"


def test_a_make_gate_that_runs_the_pytest_entry_point_is_not_judged_as_python_dash_m(env: Env, cli) -> None:
    """Item 1: the usual set-up (a venv in the checkout, the project installed editable, the venv first on
    PATH), a flat layout, and the gate the project documents: ``make test``, whose recipe runs ``pytest``.
    For a task runner the probe asks the PATH's ``python3`` as ``python -m`` would run (``sys.path[0]`` the
    worktree), finds ``mypkg`` in the worktree and lets the fire go on; but the recipe starts the
    ``pytest`` entry point, whose ``sys.path[0]`` is the venv's ``bin``, so ``import mypkg`` is the
    checkout's copy (through the editable install). The agent's broken ``verify_signature`` is tested
    against the operator's good code, is green, and lands on ``main``. The probe claims to err "in the
    safe direction: a gate it cannot place refuses"; here it placed it wrong. What must hold: a broken
    change never lands green: the fire refuses (exit 78) a gate whose imports it cannot know, or the gate
    exercises the worktree's code."""
    bin_dir = pyfixture.operator_venv(env.repo, "flat")
    (env.repo / "Makefile").write_text("test:\n\tpytest -q -p no:cacheprovider\n")
    git(env.repo, "add", "-A")
    git(env.repo, "commit", "-q", "-m", "the project")
    tip = head(env.repo)
    env.write_config(gate={"commands": [["make", "test"]]})
    env.queue(entry("simplify verify_signature"))
    env.steps([{"write": [{"path": "mypkg/__init__.py", "content": pyfixture.BROKEN}],
                "report": {"result": "improved", "summary": "verify_signature simplified"}}])
    path = f"{bin_dir}{os.pathsep}{os.environ.get('PATH', os.defpath)}"
    r = cli("fire", "--cycles", "1", extra_env={"PATH": path})
    landed = git(env.repo, "show", "main:mypkg/__init__.py")
    assert landed != pyfixture.BROKEN, (f"the broken change landed ({[e['result'] for e in env.ledger()]}, "
                                        f"exit {r.code})")
    assert head(env.repo) == tip or r.code == 78


def test_a_landing_settled_after_a_death_is_pushed(env: Env, cli) -> None:
    """Item 3: with ``[git] push = true`` the fire dies right after the landing moved ``main`` (crash point
    ``land.moved``: before the push). The next fire settles the landing from the intent (``improved``,
    ``recovered: landing``) but never pushes it: ``push.json`` has no record of it, so nothing is retried,
    no push failure shows in ``status`` or the metrics, and the landed commit stays unpublished until some
    later landing on ``main`` happens to carry it. What must hold: what landed is pushed where it landed,
    also when the landing is settled by recovery; until it is, status says so and a fire retries."""
    remote = env.root / "remote.git"
    git(env.root, "init", "-q", "--bare", str(remote))
    git(env.repo, "remote", "add", "origin", str(remote))
    git(env.repo, "push", "-q", "origin", "main")
    env.write_config(git={"push": True})
    env.queue(entry("once"))
    env.steps([improved_step(path="once.txt", content="once\n")])
    r = cli("fire", "--cycles", "1", extra_env={"EVOLVE_CRASHPOINT": "land.moved"})
    assert r.code == -signal.SIGKILL, r.stderr
    landed = head(env.repo, "main")
    env.steps([{"report": {"result": "unchanged", "summary": "nothing"}}])
    for _ in range(2):
        r = cli("fire", "--cycles", "1")
        assert r.code == 0, r.stderr
    first = env.ledger()[0]
    assert (first["result"], first.get("recovered"), first["sha"]) == ("improved", "landing", landed), first
    status = cli("status")
    assert head(remote, "refs/heads/main") == landed or "push" in status.stdout, \
        f"landed {landed[:12]} is not on the remote and status says nothing: {status.stdout[:300]}"


def test_a_pending_item_s_claim_is_not_a_plain_in_progress_that_another_reader_takes_over(env: Env, cli) -> None:
    """Item 8: "an item whose change is pending keeps a claim of its own that no one takes over (not a plain
    ``in_progress`` that expires)". The queue is shared (other v1.4 tools read it; so does a second evolve
    given the same ``EVOLVE_NEXTWORK``), but what it holds for a pending item is a plain ``in_progress``
    claim with the cycle's ``claimed_at``: only this evolve's own ``pending.json`` protects it. Two hours
    later any reader with the stale-claim rule (here: evolve's own v1.4 reader, as another instance would
    run it) finds the claim stale, selects the item and takes it over, and the item is done twice (its
    first change still waits to land). What must hold: the pending item's claim, as the queue says it, is
    one no reader takes over while the work waits."""
    import time

    from evolve.work.harvested import HarvestedQueue

    (env.repo / "x.txt").write_text("the operator's scratch file\n")
    env.queue(entry("x"))
    env.steps([improved_step(path="x.txt", content="x\n")])
    r = cli("fire", "--cycles", "1")
    assert r.code == 0, r.stderr
    assert env.ledger()[-1]["result"] == "pending"
    later = HarvestedQueue(env.paths.nextwork, claim_visibility_s=3600, clock=lambda: time.time() + 7200)
    taken = [w for w in later.candidates() if w.title == "x"]
    assert not taken, f"the pending item is selectable again for another reader: {taken[0].data}"


def test_max_file_mb_holds_for_every_commit_that_lands_not_only_the_last(env: Env, cli) -> None:
    """Item 12: ``[git] max_file_mb`` is checked on the chain's last tree only. An agent that commits a
    1.5 MB dump (over a 1 MB limit) and then ``git rm``s it in a second commit of the same cycle lands both
    commits: the large blob is in ``main``'s history for good (and pushed with ``[git] push``: a
    100 MB file there makes every later push fail until the operator rewrites history). What must hold:
    no commit that lands adds or grows a file past the limit (refused, kept unlanded, with the reason)."""
    start = head(env.repo)
    env.write_config(git={"max_file_mb": 1})
    env.queue(entry("analyse"))
    env.steps([{"write": [{"path": "dump.bin", "content": "x" * 1_500_000}],
                "run": [["git", "add", "dump.bin"], ["git", "commit", "-q", "-m", "agent: the dump"],
                        ["git", "rm", "-q", "dump.bin"], ["git", "commit", "-q", "-m", "agent: dump removed"],
                        [sys.executable, "-c", "open('findings.txt', 'w').write('what the dump showed')"]],
                "report": {"result": "improved"}}])
    r = cli("fire", "--cycles", "1")
    assert r.code == 0, r.stderr
    big = [c for c in git(env.repo, "rev-list", f"{start}..main").split()
           if subprocess.run(["git", "cat-file", "-e", f"{c}:dump.bin"], cwd=env.repo).returncode == 0]
    assert not big, f"a 1.5 MB file is in main's history ({env.ledger()[-1]['result']}): {big}"
