"""Issue 23, item 4: what lands is checked for secrets.

The agent's commits (messages, authors, file names, added lines: every commit of the chain, not only the
last tree) are read before landing. The literal value of a secret evolve holds or passes is a *hit*: the
chain is kept unlanded with the reason (the variable named, the value never), the cycle is
``failed``/``land_refused``, status is DEGRADED with that reason. A secret's *shape* alone (a fixture's fake
``ghp_`` token or PEM block) is a warning recorded with the landing, never a refusal.

The scan itself (``evolve/git/leaks.py``) is a table; the shell that feeds it is run on real repositories
(binary attributes, header-looking lines, an agent's merge); the rest are real fires with a real scripted
agent that reads the secret from its environment, as a hostile or careless agent would, and a real bare
remote the refused chain never reaches.
"""

from __future__ import annotations

import secrets as pysecrets
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest
from support import Env, entry, git

from evolve.git import land, landing, leaks
from evolve.git.land import Snapshot, Step
from evolve.git.leaks import LINE, MESSAGE, NAME, PERSON, Secrets

PEM = ("-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEAvQ2ZkFAKEFAKEFAKEFAKE0123456789abcdef\n"
       "-----END RSA PRIVATE KEY-----\n")
FAKE_GHP = "ghp_" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8"
C = "c" * 40


def head(repo: Path, ref: str = "HEAD") -> str:
    return git(repo, "rev-parse", ref).strip()


# -- which values are secrets, as a table ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("env", "pass_env", "creds", "labels"),
    [
        ({"GITHUB_TOKEN": "abcdefgh12345"}, (), (), {"abcdefgh12345": "the value of GITHUB_TOKEN"}),
        ({"GITHUB_TOKEN": "short"}, (), (), {}),  # under redact's MIN_LITERAL: never a literal
        ({"GIT_AUTHOR_NAME": "Someone Long"}, (), (), {}),  # AUTHOR is not AUTH
        ({"DATABASE_URL": "postgres://u:hunter2hunter2@db/x"}, (), (),
         {"hunter2hunter2": "the password in DATABASE_URL"}),
        # pass_env: a token-like value counts, configuration does not
        ({"DEPLOY_ID": "a1B2c3D4e5F6g7H8i9J0k"}, ("DEPLOY_*",), (),
         {"a1B2c3D4e5F6g7H8i9J0k": "the value of DEPLOY_ID"}),
        ({"AWS_REGION": "us-east-1", "JAVA_HOME": "/usr/lib/jvm/java-17-openjdk"}, ("AWS_*", "JAVA_HOME"), (), {}),
        ({"DEPLOY_ID": "a1B2c3D4e5F6g7H8i9J0k"}, (), (), {}),  # not passed, not secret-named
        ({"MY_LLM": "plainwordsonly"}, (), ("MY_LLM",), {"plainwordsonly": "the value of MY_LLM"}),  # api_key_env
    ],
)
def test_which_values_are_secrets(env, pass_env, creds, labels) -> None:
    assert leaks.held(env, pass_env, creds).labels == labels


def test_a_multi_line_secret_is_found_by_each_of_its_lines() -> None:
    """A PEM key in a variable lands line by line (each added line is read alone): its body lines count."""
    got = leaks.held({"DEPLOY_KEY": PEM}).labels
    body = PEM.splitlines()[1]
    assert got[body] == "the value of DEPLOY_KEY" and got[PEM] == "the value of DEPLOY_KEY"
    assert not any(k.startswith("-----") for k in got if k != PEM)  # the armour is not the key


# -- the scan, as a table ------------------------------------------------------------------------------------

TOKEN = "Zk29vQ7mLx41pRt8"  # no known shape: only its value says it is a secret
SECRETS = Secrets({TOKEN: "the value of GITHUB_TOKEN"})


@pytest.mark.parametrize(
    ("kw", "hits", "shapes"),
    [
        ({"messages": [(C, MESSAGE, f"fix: use {TOKEN}")]},
         [f"commit {C[:12]}'s message holds the value of GITHUB_TOKEN"], []),
        ({"messages": [(C, PERSON, f"{TOKEN} <a@b>")]}, [f"commit {C[:12]}'s author or committer holds the value of "
                                                         "GITHUB_TOKEN"], []),
        ({"names": [(C, f"notes/{TOKEN}.txt")]},
         [f"commit {C[:12]} adds a file notes/***.txt whose name holds the value of GITHUB_TOKEN"], []),
        ({"lines": [(C, "src/a.py", f"T = '{TOKEN}'")]},
         [f"commit {C[:12]} adds a line holding the value of GITHUB_TOKEN to src/a.py"], []),
        ({"lines": [(C, "src/a.py", f"T = '{TOKEN}'")] * 3},  # the same line thrice: one finding
         [f"commit {C[:12]} adds a line holding the value of GITHUB_TOKEN to src/a.py"], []),
        ({"lines": [(C, "tests/fx.py", f"FAKE = '{FAKE_GHP}'")]}, [],
         [f"commit {C[:12]} adds what looks like a GitHub token to tests/fx.py"]),
        ({"lines": [(C, "tests/k.pem", PEM.splitlines()[0]), (C, "tests/k.pem", "AKIA" + "Q" * 16)]}, [],
         [f"commit {C[:12]} adds what looks like a private key block to tests/k.pem",
          f"commit {C[:12]} adds what looks like an AWS access key id to tests/k.pem"]),
        ({"lines": [(C, "src/a.py", "token = get_token()  # password = input()")]}, [], []),  # code, not a secret
        ({"lines": [(C, "src/a.py", TOKEN[:-1])]}, [], []),  # a different value
        ({"lines": [(C, "src/a.py", f"{FAKE_GHP} and {TOKEN}")]},  # both: a hit and a warning
         [f"commit {C[:12]} adds a line holding the value of GITHUB_TOKEN to src/a.py"],
         [f"commit {C[:12]} adds what looks like a GitHub token to src/a.py"]),
    ],
)
def test_the_scan(kw: dict[str, Any], hits: list[str], shapes: list[str]) -> None:
    got = leaks.scan(SECRETS, **kw)
    assert list(got.reasons()) == hits and list(got.warnings()) == shapes
    for text in (*got.reasons(), *got.warnings()):
        assert TOKEN not in text


def test_the_scan_keeps_a_bounded_record_and_counts_the_rest() -> None:
    lines = ((C, f"tests/f{i}.py", f"X = '{FAKE_GHP}' and '{TOKEN}'") for i in range(10_000))
    got = leaks.scan(SECRETS, lines=lines)
    assert len(got.hits) == leaks.KEPT and got.more_hits == 10_000 - leaks.KEPT
    assert got.warnings()[-1] == f"and {10_000 - leaks.KEPT} more"
    why = leaks.refusal(got.reasons(), got.more_hits)
    assert why.endswith(f"; and {10_000 - leaks.SHOWN} more") and TOKEN not in why


# -- the plan: a hit refuses before anything else but a stop ---------------------------------------------


def snap(**kw: Any) -> Snapshot:
    base: dict[str, Any] = {"branch": "refs/heads/main", "tip": "b" * 40, "base": "b" * 40, "new": "n" * 40}
    return Snapshot(**{**base, **kw})


HIT = ("commit cccccccccccc's message holds the value of GITHUB_TOKEN",)


@pytest.mark.parametrize(
    ("kw", "step", "says"),
    [
        ({"secrets": HIT}, Step.REFUSE, "message holds the value of GITHUB_TOKEN"),
        ({"secrets": HIT, "holder": "/op"}, Step.REFUSE, "so nothing lands"),  # never fast-forwarded
        ({"secrets": HIT, "tip": "t" * 40}, Step.REFUSE, "GITHUB_TOKEN"),  # never replayed (nor gated again)
        ({"secrets": HIT, "tip": None}, Step.REFUSE, "GITHUB_TOKEN"),
        ({"secrets": HIT, "too_large": (("big.bin", 60_000_000),), "limit_mb": 50}, Step.REFUSE, "GITHUB_TOKEN"),
        ({"secrets": HIT, "stopping": True}, Step.STOP, "stop"),  # a stop still outranks it: nothing lands either way
        ({"secret_shapes": ("commit c adds what looks like a GitHub token to t.py",)}, Step.CAS, ""),  # a warning
        ({"secret_shapes": ("x",), "holder": "/op"}, Step.FAST_FORWARD, ""),
    ],
)
def test_the_plan_refuses_a_hit(kw: dict[str, Any], step: Step, says: str) -> None:
    got = land.plan(snap(**kw))
    assert got.step is step and says in got.reason


# -- the shell reads everything a chain adds, on a real repository -----------------------------------------


def commit(repo: Path, files: dict[str, bytes | str], msg: str) -> str:
    for path, content in files.items():
        (repo / path).parent.mkdir(parents=True, exist_ok=True)
        data = content.encode() if isinstance(content, str) else content
        (repo / path).write_bytes(data)
        git(repo, "add", "-f", "--", path)
    git(repo, "commit", "-q", "--allow-empty", "-m", msg)
    return head(repo)


def test_the_shell_reads_every_commit_however_the_repository_dresses_it(env: Env) -> None:
    """What a hostile repository would hide behind: a ``binary``/``-diff`` attribute, a line that looks like a
    diff header, a secret committed and removed again, a merge that brings it in, an empty file's name."""
    repo, base = env.repo, head(env.repo)
    commit(repo, {".gitattributes": "*.dat binary\n*.txt -diff\n"}, "attributes")
    a = commit(repo, {"blob.dat": b"\x00\x01" + TOKEN.encode() + b"\xff", "notes.txt": f"x\n{TOKEN}\n"}, "hidden")
    b = commit(repo, {"hdr.py": f"x = 1\n++ b/{TOKEN}\n"}, "header-looking line")  # added line "+++ b/<token>"
    (repo / "blob.dat").unlink()
    git(repo, "commit", "-q", "-am", "removed again")
    git(repo, "checkout", "-q", "-b", "side", base)
    m = commit(repo, {"side.md": f"from the side: {TOKEN}\n"}, "side")
    git(repo, "checkout", "-q", "main")
    git(repo, "merge", "-q", "--no-ff", "-m", "merge", "side")
    merge = head(repo)
    commit(repo, {f"empty-{TOKEN}": b""}, "an empty file")
    found = landing.leaks(repo, base, head(repo), SECRETS)
    where = {(f.commit, f.where, f.path) for f in found.hits}
    assert (a, LINE, "blob.dat") in where and (a, LINE, "notes.txt") in where, where
    assert (b, LINE, "hdr.py") in where, where
    assert (m, LINE, "side.md") in where and (merge, LINE, "side.md") in where, where  # the merge brings it in
    assert any(f.where == NAME and f.path == "empty-***" for f in found.hits), where
    assert all(TOKEN not in r for r in found.reasons())
    # names and messages are still read when a file is too large to read (refused for that already)
    names_only = landing.leaks(repo, base, head(repo), SECRETS, content=False)
    assert {f.where for f in names_only.hits} == {NAME}


# -- real fires -----------------------------------------------------------------------------------------------


def bare_remote(env: Env) -> Path:
    remote = env.root / "remote.git"
    git(env.root, "init", "-q", "--bare", str(remote))
    git(env.repo, "remote", "add", "origin", str(remote))
    git(env.repo, "push", "-q", "origin", "main")
    return remote


def leaked(env: Env, value: str) -> list[str]:
    """Every file under the state directory (ledger, logs, run output, records) that holds ``value``."""
    out = []
    for p in env.paths.evolve_dir.rglob("*"):
        if p.is_file() and not p.is_symlink():
            try:
                data = p.read_bytes()
            except OSError:
                continue
            if value.encode() in data:
                out.append(str(p.relative_to(env.paths.evolve_dir)))
    return out


def py(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def fire_with_secret(env: Env, cli, run: list[list[str]], *, name: str = "GITHUB_TOKEN", push: bool = True):
    """One cycle by an agent that gets ``name`` (pass_env) and does ``run`` with it; the gate is green."""
    value = "lit" + pysecrets.token_hex(12)  # no known shape: only its value makes it a secret
    remote = bare_remote(env) if push else None
    env.write_config(agent={"pass_env": ["PYTHONPATH", name]}, git={"push": push})
    start = head(env.repo)
    env.queue(entry("work"))
    env.steps([{"run": run, "report": {"result": "improved", "summary": "did it"}}])
    r = cli("fire", "--cycles", "1", extra_env={name: value})
    assert r.code == 0, r.stderr
    return value, start, remote, r


def assert_refused(env: Env, cli, value: str, start: str, remote: Path | None, r, says: str, name: str) -> dict:
    e = env.ledger()[-1]
    assert (e["result"], e["error_class"]) == ("failed", "land_refused"), e
    assert says in e["error"] and name in e["error"], e["error"]
    assert head(env.repo, "main") == start and git(env.repo, "status", "--porcelain").strip() == ""
    if remote is not None:
        assert head(remote, "refs/heads/main") == start  # nothing pushed
    assert git(env.repo, "for-each-ref", "--format=%(refname)", "refs/evolve/unlanded/").strip() == e["unlanded_ref"]
    assert not (env.repo / ".git" / "index.lock").exists()
    s = cli("status", "--json", extra_env={name: value})
    info = orjson.loads(s.stdout)
    assert s.code == 1 and any(says in reason and name in reason for reason in info["reasons"]), info["reasons"]
    for text in (r.stdout, r.stderr, s.stdout, s.stderr):
        assert value not in text
    assert leaked(env, value) == [], "the secret is in evolve's state"
    return e


def test_a_secret_in_a_file_the_agent_writes_never_lands(env: Env, cli) -> None:
    value, start, remote, r = fire_with_secret(env, cli, [py(
        "import os; os.makedirs('src', exist_ok=True); "
        "open('src/settings.py', 'w').write('TOKEN = %r\\n' % os.environ['GITHUB_TOKEN'])")])
    e = assert_refused(env, cli, value, start, remote, r, "adds a line holding the value of GITHUB_TOKEN to "
                       "src/settings.py", "GITHUB_TOKEN")
    assert value in git(env.repo, "show", f"{e['unlanded_ref']}:src/settings.py")  # kept whole for the operator
    assert "land.refused" in r.names()


def test_a_secret_committed_and_removed_again_never_lands(env: Env, cli) -> None:
    """Every commit of the chain, not only the last tree: the removed file would still be in main's history."""
    value, start, remote, r = fire_with_secret(env, cli, [
        py("import os; open('key.txt', 'w').write(os.environ['ANTHROPIC_API_KEY'])"),
        ["git", "add", "key.txt"], ["git", "commit", "-q", "-m", "agent: key"],
        ["git", "rm", "-q", "key.txt"], ["git", "commit", "-q", "-m", "agent: key removed"],
        py("open('done.txt', 'w').write('done')")], name="ANTHROPIC_API_KEY")
    assert_refused(env, cli, value, start, remote, r, "to key.txt", "ANTHROPIC_API_KEY")


def test_a_secret_in_a_file_name_never_lands(env: Env, cli) -> None:
    value, start, remote, r = fire_with_secret(env, cli, [py(
        "import os; open('notes-' + os.environ['GITHUB_TOKEN'] + '.md', 'w').write('nothing secret inside')")])
    assert_refused(env, cli, value, start, remote, r, "adds a file notes-***.md whose name holds the value of "
                   "GITHUB_TOKEN", "GITHUB_TOKEN")


def test_a_secret_in_the_agents_own_commit_message_never_lands(env: Env, cli) -> None:
    value, start, remote, r = fire_with_secret(env, cli, [py(
        "import os, subprocess; open('a.txt', 'w').write('a\\n'); subprocess.run(['git', 'add', 'a.txt']); "
        "subprocess.run(['git', 'commit', '-q', '-m', 'fix: auth with ' + os.environ['GITHUB_TOKEN']])")])
    assert_refused(env, cli, value, start, remote, r, "'s message holds the value of GITHUB_TOKEN", "GITHUB_TOKEN")


def test_a_secrets_shape_only_lands_with_a_warning(env: Env, cli) -> None:
    """Test fixtures are full of tokens: a fake ``ghp_`` token and a PEM block land, and the record says so."""
    remote = bare_remote(env)
    env.write_config(git={"push": True})
    env.queue(entry("fixtures"))
    env.steps([{"write": [{"path": "tests/fixtures/keys.py", "content": f"FAKE = {FAKE_GHP!r}\nPEM = '''{PEM}'''\n"}],
                "report": {"result": "improved", "summary": "fixtures"}}])
    r = cli("fire", "--cycles", "1")
    assert r.code == 0, r.stderr
    e = env.ledger()[-1]
    assert e["result"] == "improved" and e["landed"] is True, e
    assert head(env.repo, "main") == e["sha"] == head(remote, "refs/heads/main")
    assert FAKE_GHP in (env.repo / "tests/fixtures/keys.py").read_text()  # landed byte for byte
    shapes = " | ".join(e["secret_shapes"])
    assert "a GitHub token to tests/fixtures/keys.py" in shapes and "a private key block" in shapes, shapes
    assert "land.secret_shapes" in r.names()
    assert not git(env.repo, "for-each-ref", "refs/evolve/unlanded/").strip()

