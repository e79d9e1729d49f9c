"""Filters the operator configured are the operator's (issue 22, item 6; docs/DESIGN.md §8.1).

A git-crypt-style filter set up in the repository's own ``.git/config`` (a real filter program, a
reversible byte transform, named by a committed ``.gitattributes``), and the real git-crypt: the
agent's worktree is checked out through it once the operator approved it, evolve's commits go
through its clean side, plaintext never reaches the branch through a filter evolve does not run,
and a fire that cannot make its workspace says why in ``evolve status``.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from pathlib import Path

import orjson
import pytest
from support import Env, entry, git

from evolve.git import filters, pins, trust
from evolve.status.snapshot import workspace_error, workspace_lines

MAGIC = b"CRYPT1:"
# A reversible transform: clean hex-encodes the bytes XORed with 0x5A behind a magic prefix, smudge
# undoes it (content without the prefix passes through, as git-crypt does with plaintext).
FILTER = r'''
import os, sys
MAGIC = b"CRYPT1:"
mode = sys.argv[1]
data = sys.stdin.buffer.read()
if len(sys.argv) > 2:
    open(sys.argv[2], "a").write(mode + " " + repr(sorted(k for k in os.environ)) + "\n")
if mode == "clean":
    out = data if data.startswith(MAGIC) else MAGIC + bytes(b ^ 0x5A for b in data).hex().encode() + b"\n"
else:
    out = bytes(b ^ 0x5A for b in bytes.fromhex(data[len(MAGIC):].decode())) if data.startswith(MAGIC) else data
sys.stdout.buffer.write(out)
'''
SECRET = b"password = hunter2\n"


def encrypted(data: bytes) -> bytes:
    return MAGIC + bytes(b ^ 0x5A for b in data).hex().encode() + b"\n"


def blob(repo: Path, rev: str, path: str) -> bytes:
    import subprocess

    return subprocess.run(["git", "cat-file", "blob", f"{rev}:{path}"], cwd=repo, check=True,
                          capture_output=True).stdout


def head(repo: Path, ref: str = "HEAD") -> str:
    return git(repo, "rev-parse", ref).strip()


def crypt_repo(env: Env, *, required: bool = True, log: Path | None = None) -> Path:
    """The operator's set-up: a filter program outside the repository, named in .git/config, and a
    committed .gitattributes that sends secret.txt through it; secret.txt committed encrypted."""
    prog = env.root / "crypt.py"
    prog.write_text(FILTER)
    extra = f" {log}" if log else ""
    git(env.repo, "config", "filter.crypt.clean", f"{sys.executable} {prog} clean{extra}")
    git(env.repo, "config", "filter.crypt.smudge", f"{sys.executable} {prog} smudge{extra}")
    if required:
        git(env.repo, "config", "filter.crypt.required", "true")
    (env.repo / ".gitattributes").write_text("secret.txt filter=crypt\n")
    (env.repo / "secret.txt").write_bytes(SECRET)
    for name in (".gitattributes", "secret.txt"):  # older than the index: git trusts its stat data, no re-read
        os.utime(env.repo / name, (time.time() - 3600, time.time() - 3600))
    git(env.repo, "add", ".gitattributes", "secret.txt")
    git(env.repo, "commit", "-q", "-m", "secrets, encrypted")
    assert blob(env.repo, "HEAD", "secret.txt") == encrypted(SECRET)  # the operator's git ran the filter
    return prog


def agent_edits_secret(env: Env) -> None:
    env.steps([{"write": [{"path": "secret.txt", "content": "token = s3cr3t\n", "append": True},
                          {"path": "src/out.txt", "content": "work\n"}],
                "report": {"result": "improved", "summary": "rotated the token"}}])
    env.queue(entry("rotate the token"))


def status_json(cli) -> dict:
    r = cli("status", "--json")
    return {"code": r.code, **orjson.loads(r.stdout)}


def assert_operator_untouched(env: Env, tip: str) -> None:
    """The operator's branch, checkout and index as they were; no lock left anywhere."""
    assert head(env.repo) == tip
    assert git(env.repo, "status", "--porcelain").strip() == ""
    assert (env.repo / "secret.txt").read_bytes() == SECRET
    assert not list((env.repo / ".git").rglob("index.lock"))


def test_a_required_filter_evolve_does_not_run_makes_every_fire_fail_and_status_says_why(env: Env, cli) -> None:
    crypt_repo(env, required=True)
    tip = head(env.repo)
    agent_edits_secret(env)
    r = cli("fire", "--cycles", "1")
    assert r.code == 1, r.stderr
    assert any(e.get("reason") == "workspace_error" for e in r.events() if e["event"] == "fire.end")
    assert env.calls() == []  # no agent ran
    s = status_json(cli)
    assert (s["code"], s["health"]) == (1, "degraded"), s["reasons"]
    why = " ".join(s["reasons"])
    assert "smudge filter crypt failed" in why and "evolve doctor --trust-git-config" in why
    assert_operator_untouched(env, tip)


def test_without_required_plaintext_never_reaches_the_branch_through_an_unapproved_filter(env: Env, cli) -> None:
    crypt_repo(env, required=False)
    tip = head(env.repo)
    agent_edits_secret(env)
    r = cli("fire", "--cycles", "1")
    assert r.code == 1, r.stderr
    e = env.ledger()[-1]
    assert (e["result"], e["error_class"]) == ("failed", "commit_failed")
    assert "secret.txt" in e["error"] and "crypt" in e["error"] and "--trust-git-config" in e["error"]
    assert head(env.repo) == tip  # nothing landed
    for ref in git(env.repo, "for-each-ref", "--format=%(refname)", "refs/heads").split():
        assert b"s3cr3t" not in blob(env.repo, ref, "secret.txt")
    s = status_json(cli)
    assert s["health"] == "degraded" and any("crypt" in x for x in s["reasons"])
    assert_operator_untouched(env, tip)


def approve(cli) -> str:
    r = cli("doctor", "--trust-git-config")
    assert "approved filter.crypt.clean" in r.stdout and "approved filter.crypt.smudge" in r.stdout, r.stdout
    return r.stdout


@pytest.mark.parametrize("required", [True, False])
def test_an_approved_filter_checks_out_plaintext_and_commits_encrypted(env: Env, cli, required: bool) -> None:
    log = env.root / "filter-runs.log"
    crypt_repo(env, required=required, log=log)
    agent_edits_secret(env)
    approve(cli)
    r = cli("fire", "--cycles", "1")
    assert r.code == 0, r.stderr
    e = env.ledger()[-1]
    assert e["result"] == "improved", e
    new = head(env.repo)
    assert new == e["sha"]
    # The worktree was checked out through smudge (the agent appended to the plaintext), and evolve's
    # commit went through clean: the branch holds ciphertext of exactly the plaintext.
    assert blob(env.repo, new, "secret.txt") == encrypted(SECRET + b"token = s3cr3t\n")
    assert blob(env.repo, new, "src/out.txt") == b"work\n"
    assert (env.tree / "secret.txt").read_bytes() == SECRET + b"token = s3cr3t\n"
    # The operator's checkout was fast-forwarded through the filter too: plaintext, nothing left dirty.
    assert (env.repo / "secret.txt").read_bytes() == SECRET + b"token = s3cr3t\n"
    assert git(env.repo, "status", "--porcelain").strip() == ""
    assert not list((env.repo / ".git").rglob("index.lock"))
    runs = log.read_text().splitlines()
    assert any(x.startswith("smudge ") for x in runs) and any(x.startswith("clean ") for x in runs)
    s = status_json(cli)
    assert s["health"] == "healthy", s["reasons"]
    assert not any("git config" in w for w in s["warnings"]), s["warnings"]


def test_a_failed_fire_clears_once_the_filter_is_approved(env: Env, cli) -> None:
    crypt_repo(env, required=True)
    agent_edits_secret(env)
    assert cli("fire", "--cycles", "1").code == 1
    assert status_json(cli)["health"] == "degraded"
    d = cli("doctor")
    assert "FAIL  workspace" in d.stdout and "smudge filter crypt failed" in d.stdout
    assert "WARN  git config" in d.stdout and "filter.crypt.smudge" in d.stdout and "--trust-git-config" in d.stdout
    approve(cli)
    r = cli("fire", "--cycles", "1")
    assert r.code == 0, r.stderr
    assert env.ledger()[-1]["result"] == "improved"
    s = status_json(cli)
    assert s["health"] == "healthy" and s["workspace"] is None, s["reasons"]
    assert blob(env.repo, "HEAD", "secret.txt") == encrypted(SECRET + b"token = s3cr3t\n")


def test_init_records_the_filters_it_finds_and_a_key_changed_later_stays_pinned(env: Env, cli) -> None:
    log = env.root / "filter-runs.log"
    crypt_repo(env, required=False, log=log)
    r = cli("init")
    assert r.code == 0 and "filter.crypt.clean" in r.stdout and "git-trust.json" in r.stdout, r.stdout
    rec = orjson.loads(env.paths.git_trust.read_bytes())
    assert sorted(rec["keys"]) == ["filter.crypt.clean", "filter.crypt.smudge"] and rec["approved_by"] == "evolve init"
    # After that, something (the agent, say) points the clean side at its own program.
    planted = env.root / "planted-ran"
    evil = env.root / "evil.sh"
    evil.write_text(f'#!/bin/sh\ntouch "{planted}"\ncat\n')
    evil.chmod(0o755)
    git(env.repo, "config", "filter.crypt.clean", str(evil))
    log.unlink(missing_ok=True)
    tip = head(env.repo)
    agent_edits_secret(env)
    r = cli("fire", "--cycles", "1")
    assert r.code == 1, r.stderr
    e = env.ledger()[-1]
    assert (e["result"], e["error_class"]) == ("failed", "commit_failed") and "secret.txt" in e["error"]
    assert not planted.exists()  # the changed key never ran
    assert head(env.repo) == tip
    s = status_json(cli)
    assert any("filter.crypt.clean" in w and "--trust-git-config" in w for w in s["warnings"]), s["warnings"]
    # A filter runs whole or not at all: its unchanged smudge is pinned with it (checked out as stored).
    assert not log.exists()
    assert (env.tree / "secret.txt").read_bytes() == encrypted(SECRET)
    assert cli("init").stdout.count("kept") == 2  # a second init records nothing new
    assert orjson.loads(env.paths.git_trust.read_bytes())["keys"] == rec["keys"]
    assert_operator_untouched(env, tip)


def test_a_program_inside_the_repository_is_never_approved(env: Env, cli) -> None:
    inside = env.repo / "tools" / "clean.sh"
    inside.parent.mkdir()
    inside.write_text("#!/bin/sh\ncat\n")
    inside.chmod(0o755)
    git(env.repo, "config", "filter.x.clean", str(inside))
    git(env.repo, "config", "filter.y.clean", "./tools/clean.sh")
    r = cli("doctor", "--trust-git-config")
    assert "not approved filter.x.clean" in r.stdout and "inside" in r.stdout, r.stdout
    assert "not approved filter.y.clean" in r.stdout and "relative" in r.stdout, r.stdout
    assert orjson.loads(env.paths.git_trust.read_bytes())["keys"] == {}


def test_local_attributes_that_turn_a_declared_filter_off_are_refused(env: Env, cli) -> None:
    crypt_repo(env, required=False)
    approve(cli)
    (env.repo / ".git" / "info").mkdir(exist_ok=True)
    (env.repo / ".git" / "info" / "attributes").write_text("secret.txt -filter\n")  # planted: no filter at all
    tip = head(env.repo)
    agent_edits_secret(env)
    r = cli("fire", "--cycles", "1")
    assert r.code == 1, r.stderr
    e = env.ledger()[-1]
    assert e["error_class"] == "commit_failed" and "override" in e["error"], e
    assert head(env.repo) == tip


def git_crypt_repo(env: Env) -> None:
    """git-crypt as its README sets it up; in CI its absence fails (.ci/run installs it), locally it skips."""
    if shutil.which("git-crypt") is None:
        if os.environ.get("CI"):
            pytest.fail("git-crypt is missing: .ci/run installs it (apt-get install git-crypt)")
        pytest.skip("git-crypt is not installed (README's apt-get line)")
    import subprocess

    subprocess.run(["git-crypt", "init"], cwd=env.repo, check=True, capture_output=True)
    (env.repo / ".gitattributes").write_text("secret.txt filter=git-crypt diff=git-crypt\n")
    (env.repo / "secret.txt").write_bytes(SECRET)
    for name in (".gitattributes", "secret.txt"):
        os.utime(env.repo / name, (time.time() - 3600, time.time() - 3600))
    git(env.repo, "add", ".gitattributes", "secret.txt")
    git(env.repo, "commit", "-q", "-m", "git-crypt")
    assert blob(env.repo, "HEAD", "secret.txt").startswith(b"\0GITCRYPT\0")


def test_git_crypt_set_up_after_the_worktree_exists(env: Env, cli) -> None:
    """The worktree was made before git-crypt: its git directory gets the keys' link at the next fire."""
    env.queue(entry("before"))
    assert cli("fire", "--cycles", "1").code == 0 and (env.tree / ".git").is_file()
    git_crypt_repo(env)
    out = cli("doctor", "--trust-git-config").stdout
    assert "approved filter.git-crypt.clean" in out, out
    agent_edits_secret(env)
    r = cli("fire", "--cycles", "1")
    assert r.code == 0, r.stderr
    assert env.ledger()[-1]["result"] == "improved"
    assert (env.tree / "secret.txt").read_bytes() == SECRET + b"token = s3cr3t\n"
    assert blob(env.repo, "HEAD", "secret.txt").startswith(b"\0GITCRYPT\0")
    assert (env.repo / "secret.txt").read_bytes() == SECRET + b"token = s3cr3t\n"
    assert git(env.repo, "status", "--porcelain").strip() == ""


def test_real_git_crypt(env: Env, cli) -> None:
    git_crypt_repo(env)
    tip = head(env.repo)
    agent_edits_secret(env)
    # Not approved: every fire fails at the worktree, and status says why and what to run.
    assert cli("fire", "--cycles", "1").code == 1
    s = status_json(cli)
    assert s["health"] == "degraded" and "smudge filter git-crypt failed" in " ".join(s["reasons"]), s["reasons"]
    assert "--trust-git-config" in " ".join(s["reasons"])
    assert_operator_untouched(env, tip)
    out = cli("doctor", "--trust-git-config").stdout
    assert "approved filter.git-crypt.smudge" in out and "approved diff.git-crypt.textconv" in out, out
    r = cli("fire", "--cycles", "1")
    assert r.code == 0, r.stderr
    assert env.ledger()[-1]["result"] == "improved"
    new = head(env.repo)
    assert blob(env.repo, new, "secret.txt").startswith(b"\0GITCRYPT\0")  # encrypted on the branch
    assert b"s3cr3t" not in blob(env.repo, new, "secret.txt")
    assert (env.repo / "secret.txt").read_bytes() == SECRET + b"token = s3cr3t\n"  # plaintext for the operator
    assert git(env.repo, "status", "--porcelain").strip() == ""
    assert status_json(cli)["health"] == "healthy"


# -- the pure decisions, as tables --------------------------------------------------------------

def listing(*entries: tuple[str, str, str]) -> str:
    return "".join(f"{scope}\0{key}\n{value}\0" for scope, key, value in entries)


CRYPT = (("local", "filter.crypt.clean", "crypt clean"), ("local", "filter.crypt.smudge", "crypt smudge"))


@pytest.mark.parametrize(("entries", "trusted", "pinned"), [
    # nothing approved: every program key of the repository's own config pinned (to nothing, or git's default)
    (CRYPT, None, {"filter.crypt.clean": "", "filter.crypt.smudge": ""}),
    # approved with these values: runs
    (CRYPT, {"filter.crypt.clean": ["crypt clean"], "filter.crypt.smudge": ["crypt smudge"]}, {}),
    # one side changed since: the whole filter is pinned (smudge without clean makes every file "modified")
    (CRYPT, {"filter.crypt.clean": ["other"], "filter.crypt.smudge": ["crypt smudge"]},
     {"filter.crypt.clean": "", "filter.crypt.smudge": ""}),
    # a second value appended (git uses the last): not the approved list
    ((*CRYPT, ("local", "filter.crypt.clean", "evil")),
     {"filter.crypt.clean": ["crypt clean"], "filter.crypt.smudge": ["crypt smudge"]},
     {"filter.crypt.clean": "", "filter.crypt.smudge": ""}),
    # a worktree-scope value for an approved key counts as the repository's too
    ((*CRYPT, ("worktree", "filter.crypt.smudge", "evil")),
     {"filter.crypt.clean": ["crypt clean"], "filter.crypt.smudge": ["crypt smudge"]},
     {"filter.crypt.clean": "", "filter.crypt.smudge": ""}),
    # another filter's approval says nothing about this one; pinned falls back to the operator's global value
    ((("global", "filter.lfs.process", "git-lfs filter-process"), ("local", "filter.lfs.process", "evil"),
      *CRYPT), {"filter.crypt.clean": ["crypt clean"], "filter.crypt.smudge": ["crypt smudge"]},
     {"filter.lfs.process": "git-lfs filter-process"}),
    # never approvable (editor, hooks): pinned whatever the record says
    ((("local", "core.editor", "vim"), ("local", "core.sshcommand", "ssh -i k")),
     {"core.editor": ["vim"], "core.sshcommand": ["ssh -i k"]}, {"core.editor": "true"}),
])
def test_pins_table(entries, trusted, pinned) -> None:
    text = listing(*entries)
    assert pins.pinned(text, trusted) == pinned
    args = pins.pins_from_config(text, trusted)
    assert dict(a.split("=", 1) for a in args[1::2]) == pinned
    eff = pins.effective(text, trusted)
    assert all(eff[k] == v for k, v in pinned.items())


def test_review_table() -> None:
    local = {"filter.crypt.clean": ["a"], "filter.crypt.smudge": ["b"], "core.editor": ["vim"],
             "merge.x.driver": ["m"], "diff.y.textconv": ["./t"]}
    r = trust.review(local, {"filter.crypt.clean": ["a"], "filter.crypt.smudge": ["b"]},
                     {"diff.y.textconv": "relative"})
    assert r.trusted == {"filter.crypt.clean": ("a",), "filter.crypt.smudge": ("b",)}
    assert r.unapproved == {"merge.x.driver": ("m",)}  # core.editor is never approvable: not listed
    assert r.refused == {"diff.y.textconv": "relative"}


def test_why_refused(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    (repo / "bin").mkdir(parents=True)
    inside = repo / "bin" / "f"
    inside.write_text("#!/bin/sh\n")
    inside.chmod(0o755)
    outside = tmp_path / "f"
    outside.write_text("#!/bin/sh\n")
    outside.chmod(0o755)
    link = tmp_path / "link"
    link.symlink_to(inside)
    roots = [repo]
    assert trust.why_refused([f"{outside} clean"], roots, "/usr/bin") is None
    assert trust.why_refused([f'"{outside}" smudge --key-name=x'], roots, "/usr/bin") is None
    assert "inside" in trust.why_refused([f"{inside} clean"], roots, "/usr/bin")
    assert "inside" in trust.why_refused([f"{link} clean"], roots, "/usr/bin")  # followed to where it is
    assert "inside" in trust.why_refused(["f clean"], roots, str(repo / "bin"))  # found on PATH in the repo
    assert "relative" in trust.why_refused(["./bin/f clean"], roots, "/usr/bin")
    assert "relative" in trust.why_refused([f"{outside} tools/clean.py"], roots, "/usr/bin")
    assert "inside" in trust.why_refused([f"{outside} {inside}"], roots, "/usr/bin")  # a script of the repo's
    assert trust.why_refused([f"{outside} --url=https://example.com/x -- %f"], roots, "/usr/bin") is None
    assert "not found" in trust.why_refused(["no-such-program-xyz clean"], roots, "/usr/bin")
    assert "cannot tell" in trust.why_refused(['"unterminated'], roots, "/usr/bin")


def test_attribute_and_refusal_table() -> None:
    assert filters.parse_check_attr("a.txt\0filter\0crypt\0b.txt\0filter\0unspecified\0c\0filter\0unset\0") == {
        "a.txt": "crypt"}
    eff = {"filter.crypt.clean": "", "filter.lfs.process": "git-lfs filter-process", "filter.nb.clean": "nbstrip"}
    declared = {"s.txt": "crypt", "big.bin": "lfs", "n.ipynb": "nb", "o.txt": "nb"}
    actual = {"s.txt": "crypt", "big.bin": "lfs", "n.ipynb": "nb"}  # o.txt: local attributes turned it off
    assert filters.blocked(declared, actual, eff) == {"o.txt": "nb", "s.txt": "crypt"}
    assert filters.blocked({}, actual, eff) == {}
    pinned = filters.refusal_text({"s.txt": "crypt"}, actual, ["filter.crypt.clean"])
    assert pinned.startswith("refused to commit s.txt") and filters.APPROVE in pinned and len(pinned) < 300
    missing = filters.refusal_text({"s.txt": "crypt"}, actual, [])
    assert "no clean program" in missing and len(missing) < 300
    override = filters.refusal_text({"o.txt": "nb"}, actual, [])
    assert "override" in override and len(override) < 300
    many = filters.refusal_text({f"{i}.txt": "crypt" for i in range(5)}, {f"{i}.txt": "crypt" for i in range(5)}, [])
    assert "(+2 more)" in many


@pytest.mark.parametrize(("error", "unapproved", "cause", "fix"), [
    ("git worktree failed: Preparing worktree (detached HEAD 1a2b)\nfatal: secret.txt: smudge filter crypt failed",
     ["filter.crypt.smudge"], "the worktree cannot be checked out: smudge filter crypt failed on secret.txt",
     "approve the repository's filter with `evolve doctor --trust-git-config`"),
    ("git reset failed: error: external filter 'x' failed 1\nfatal: a b.txt: smudge filter git-crypt failed", [],
     "smudge filter git-crypt failed on a b.txt", "the filter fails in a linked worktree"),
    ("branch refs/heads/main is gone", ["filter.crypt.smudge"], "the workspace cannot be made: branch",
     "evolve doctor"),
])
def test_workspace_advice_table(error, unapproved, cause, fix) -> None:
    got_cause, got_fix = filters.workspace_advice(error, unapproved)
    assert cause in got_cause and fix in got_fix


def test_workspace_status_lines_table() -> None:
    health = {"error": {"cause": "the worktree cannot be checked out: smudge filter crypt failed", "filter": "crypt",
                        "fix": "approve the repository's filter with `evolve doctor --trust-git-config`"},
              "unapproved": {"filter.crypt.smudge": ["c s"], "filter.crypt.clean": ["c c"]}, "refused": {}}
    degraded, warnings = workspace_lines(health, None)
    assert degraded == ["the worktree cannot be checked out: smudge filter crypt failed; approve the repository's"
                        " filter with `evolve doctor --trust-git-config`"]
    assert len(warnings) == 1 and "filter.crypt.clean, filter.crypt.smudge" in warnings[0]
    approved = {"keys": {"filter.crypt.smudge": ["c s"], "filter.crypt.clean": ["c c"]}}
    degraded, warnings = workspace_lines(health, approved)  # approved since the fire: said, still degraded
    assert degraded == ["the worktree cannot be checked out: smudge filter crypt failed; its filter is approved now:"
                        " the next fire retries"] and warnings == []
    assert workspace_error({"unapproved": {}}, None) is None
    assert workspace_lines(None, None) == ([], []) and workspace_lines("junk", {"keys": 3}) == ([], [])
    _, warnings = workspace_lines({"refused": {"filter.x.clean": "/r/x is inside /r"}}, None)
    assert "filter.x.clean" in warnings[0] and "inside" in warnings[0]


def test_the_agent_s_own_commit_of_a_filtered_path_is_not_landed(env: Env, cli) -> None:
    """.gitattributes says `vault` filters the file, and nothing here configures `vault`: the agent's own
    commit stores its plaintext, and evolve does not land it on the branch."""
    (env.repo / ".gitattributes").write_text("vault.txt filter=vault\n")
    git(env.repo, "add", ".gitattributes")
    git(env.repo, "commit", "-q", "-m", "vault")
    tip = head(env.repo)
    env.steps([{"write": [{"path": "vault.txt", "content": "api_key = plain\n"}], "commit": True,
                "report": {"result": "improved", "summary": "stored the key"}}])
    env.queue(entry("store the key"))
    r = cli("fire", "--cycles", "1")
    assert r.code == 1, r.stderr
    e = env.ledger()[-1]
    assert (e["result"], e["error_class"]) == ("failed", "commit_failed")
    assert "vault.txt" in e["error"] and "no clean program" in e["error"]
    assert head(env.repo) == tip and not (env.repo / "vault.txt").exists()
    assert git(env.repo, "status", "--porcelain").strip() == ""


@pytest.mark.skipif(shutil.which("git-lfs") is None, reason="git-lfs is not installed (Debian's package also"
                    " installs it system-wide, so CI leaves it out)")
def test_real_git_lfs_installed_locally(env: Env, cli) -> None:
    import subprocess

    nosys = {"GIT_CONFIG_NOSYSTEM": "1"}  # as on a machine where LFS is not installed system-wide

    def g(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=env.repo, check=True, capture_output=True, text=True,
                              env={**env.env(), **nosys}).stdout

    g("lfs", "install", "--local")
    assert "filter.lfs.process" in g("config", "--local", "--list")
    (env.repo / ".gitattributes").write_text("*.bin filter=lfs diff=lfs merge=lfs -text\n")
    (env.repo / "big.bin").write_bytes(b"\x00binary v1\n" * 100)
    for name in (".gitattributes", "big.bin"):
        os.utime(env.repo / name, (time.time() - 3600, time.time() - 3600))
    g("add", ".gitattributes", "big.bin")
    g("commit", "-q", "-m", "lfs")
    assert g("cat-file", "blob", "HEAD:big.bin").startswith("version https://git-lfs.github.com/spec/v1")
    tip = head(env.repo)
    env.steps([{"write": [{"path": "big.bin", "content": "binary v2\n", "append": True}],
                "report": {"result": "improved", "summary": "grew the blob"}}])
    env.queue(entry("grow the blob"))
    assert cli("fire", "--cycles", "1", extra_env=nosys).code == 1
    s = orjson.loads(cli("status", "--json", extra_env=nosys).stdout)
    assert s["health"] == "degraded" and "filter lfs failed" in " ".join(s["reasons"]), s["reasons"]
    assert head(env.repo) == tip
    out = cli("doctor", "--trust-git-config", extra_env=nosys).stdout
    assert "approved filter.lfs.process" in out, out
    r = cli("fire", "--cycles", "1", extra_env=nosys)
    assert r.code == 0, r.stderr
    assert env.ledger()[-1]["result"] == "improved"
    assert g("cat-file", "blob", "HEAD:big.bin").startswith("version https://git-lfs.github.com/spec/v1")
    assert (env.repo / "big.bin").read_bytes() == b"\x00binary v1\n" * 100 + b"binary v2\n"
    assert g("status", "--porcelain").strip() == ""


def test_a_change_that_drops_the_filter_from_gitattributes_is_refused(env: Env, cli) -> None:
    """The agent edits .gitattributes so that secret.txt is no longer encrypted, and writes the secret:
    what the committed .gitattributes declared still holds for evolve's commit."""
    crypt_repo(env, required=False)
    approve(cli)
    tip = head(env.repo)
    env.steps([{"write": [{"path": ".gitattributes", "content": "# nothing is encrypted any more\n"},
                          {"path": "secret.txt", "content": "token = s3cr3t\n", "append": True}],
                "report": {"result": "improved", "summary": "simplified"}}])
    env.queue(entry("simplify"))
    r = cli("fire", "--cycles", "1")
    assert r.code == 1, r.stderr
    e = env.ledger()[-1]
    assert e["error_class"] == "commit_failed" and "edits .gitattributes" in e["error"], e
    assert head(env.repo) == tip
    assert_operator_untouched(env, tip)
