"""A change of more paths than an argv holds (issue 22 item 7, docs/DESIGN.md §8.1 "Path lists").

20,000 files of long names (a code generator, a vendored dependency) are past the kernel's ARG_MAX:
named on one git argv, the ``exec`` fails with ``E2BIG`` before git runs. Each function that hands git a
list of paths is run here on such a list with real git, together with the names that test the stdin
forms (a file called ``*``, a newline, a trailing CR, quotes, a backslash, bytes that are not UTF-8);
then two real fires: a failed commit of such a change is a failed cycle with the change kept, and a
fire killed with such a change in the worktree leaves it set aside for the next fire, which works on.
Every test asserts the git state: what is in the tree, the index, the refs, and that no lock is left.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from support import GIT_ENV, Env, entry, git, improved_step, live

from evolve.git import change as gitchange
from evolve.git import filters, landing, patch, pathargs, worktree
from evolve.git.run import GitError, run_git

N = 20_000
DIR = "gen/" + "d" * 60
# Names git's stdin forms must carry verbatim: a glob, a newline, a trailing CR (git's line reader drops
# it), a leading quote (C-quoted lines start with one), a backslash, a leading dash, bytes not UTF-8.
ODD = ["*", "new\nline.txt", "cr\r", '"quoted".txt', "back\\slash.txt", "-dash.txt", " lead space.txt",
       os.fsdecode(b"latin1-\xe9.txt")]


def many(n: int = N) -> list[str]:
    return [f"{DIR}/file_{i:06d}_" + "x" * 60 + ".txt" for i in range(n)]


def past_arg_max(paths: list[str]) -> None:
    """The test's premise: these paths alone do not fit one argv."""
    assert sum(len(os.fsencode(p)) + 1 for p in paths) > os.sysconf("SC_ARG_MAX")


def write(root: Path, paths: list[str], content: str = "{i}\n") -> None:
    for d in {os.path.dirname(p) for p in paths}:
        (root / d).mkdir(parents=True, exist_ok=True)
    for i, p in enumerate(paths):
        (root / p).write_text(content.format(i=i))


def raw(repo: Path, *args: str, data: bytes | None = None) -> bytes:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, input=data,
                          env={**os.environ, **GIT_ENV}).stdout


def names(out: bytes) -> set[str]:
    return {os.fsdecode(p) for p in out.split(b"\0") if p}


def tree_of(repo: Path, rev: str) -> set[str]:
    return names(raw(repo, "ls-tree", "-r", "-z", "--name-only", rev))


def index_of(repo: Path) -> set[str]:
    return names(raw(repo, "ls-files", "-z"))


def status(repo: Path) -> set[str]:
    """``status --porcelain`` records (``XY path``), verbatim."""
    return {os.fsdecode(r) for r in raw(repo, "status", "--porcelain=v1", "-z", "--untracked-files=all").split(b"\0")
            if r}


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    r = tmp_path / "repo"
    r.mkdir()
    git(r, "init", "-q", "-b", "main")
    (r / "README.md").write_text("# r\n")
    git(r, "add", "README.md")
    git(r, "commit", "-q", "-m", "initial")
    return r


def commit_all(repo: Path, msg: str) -> str:
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", msg)
    return git(repo, "rev-parse", "HEAD").strip()


def no_lock(repo: Path) -> None:
    assert not list((repo / ".git").rglob("index.lock"))


def test_an_argv_past_arg_max_is_a_git_error_not_an_os_error(repo: Path) -> None:
    paths = many()
    past_arg_max(paths)
    with pytest.raises(GitError, match="argument list is too long"):
        run_git(repo, "ls-files", "--", *paths)


@pytest.mark.parametrize(("path", "want", "hit"), [
    ("a/b/c.txt", {"a/b/c.txt"}, True),
    ("a/b/c.txt", {"a"}, True),
    ("a/b/c.txt", {"a/b/"}, True),  # status names an untracked repository inside the tree "a/b/"
    ("a/b/c.txt", {"a/b/c"}, False),
    ("a/bc.txt", {"a/b"}, False),
    ("*", {"*"}, True),
    ("x.txt", {"*"}, False),  # literal: never a glob
])
def test_named_table(path: str, want: set[str], hit: bool) -> None:
    assert pathargs.named(path, want) is hit


A, B, C = "a" * 40, "b" * 40, "c" * 40
Z = "0" * 40


@pytest.mark.parametrize(("tree", "index", "want", "records"), [
    # an entry the commit has is given back; one it lacks is dropped, first
    ([f"100644 blob {A}\ta.txt"], [f"100644 {B} 0\ta.txt", f"100644 {C} 0\tnew.txt"], {"a.txt", "new.txt"},
     [f"0 {Z}\tnew.txt", f"100644 blob {A}\ta.txt"]),
    # one already as the commit has it is left alone; what ``want`` does not name too
    ([f"100644 blob {A}\ta.txt", f"100644 blob {B}\tb.txt"], [f"100644 {A} 0\ta.txt", f"100644 {C} 0\tb.txt",
                                                              f"100644 {C} 0\tmine.txt"], {"a.txt", "b.txt"},
     [f"100644 blob {B}\tb.txt"]),
    # a mode change is a change; an unmerged path is given its entry whatever its stages hold
    ([f"100755 blob {A}\tx", f"100644 blob {A}\tu"], [f"100644 {A} 0\tx", f"100644 {A} 1\tu", f"100644 {B} 2\tu"],
     {"x", "u"}, [f"100755 blob {A}\tx", f"100644 blob {A}\tu"]),
    # a directory names what is in it; "sub/" (a repository inside the tree) names its gitlink
    ([f"100644 blob {B}\td/x", f"160000 commit {C}\tsub"], [f"100644 {A} 0\td/y"], {"d", "sub/"},
     [f"0 {Z}\td/y", f"100644 blob {B}\td/x", f"160000 commit {C}\tsub"]),
    # literal: "*" is the file called that
    ([], [f"100644 {A} 0\t*", f"100644 {A} 0\tx"], {"*"}, [f"0 {Z}\t*"]),
])
def test_index_info_table(tree: list[str], index: list[str], want: set[str], records: list[str]) -> None:
    out, have = pathargs.index_info(tree, index, want, Z)
    assert out == pathargs.nul(records)
    assert have == {r.split("\t", 1)[1] for r in tree if pathargs.named(r.split("\t", 1)[1], want)}


def _index(repo: Path) -> bytes:
    return raw(repo, "ls-files", "-s", "-z")


def test_stage_stages_what_git_add_would(tmp_path: Path) -> None:
    """The same change staged by ``stage`` and by ``git add -A -- <paths>`` in two copies of one repository:
    the same index, for a new, a changed, a deleted and an executable file, a link, a file that became a
    directory, a repository inside the tree (``status`` says ``sub/``) and the odd names."""
    a = tmp_path / "a"
    a.mkdir()
    git(a, "init", "-q", "-b", "main")
    write(a, ["changed.txt", "deleted.txt", "was_file", "keep.txt"])
    git(a, "add", "-A")
    git(a, "commit", "-q", "-m", "base")
    b = tmp_path / "b"
    git(tmp_path, "clone", "-q", str(a), str(b))
    for r in (a, b):
        (r / "changed.txt").write_text("changed\n")
        (r / "deleted.txt").unlink()
        (r / "was_file").unlink()
        (r / "was_file").mkdir()
        (r / "was_file" / "inside.txt").write_text("inside\n")
        (r / "run.sh").write_text("#!/bin/sh\n")
        (r / "run.sh").chmod(0o755)
        (r / "link").symlink_to("changed.txt")
        write(r, ODD)
        (r / "sub").mkdir()
        git(r / "sub", "init", "-q")
        # One date for both inner commits: made a second apart (a loaded machine), their ids would differ.
        subprocess.run(["git", "commit", "-q", "--allow-empty", "-m", "inner"], cwd=r / "sub", check=True,
                       capture_output=True, env={**os.environ, **GIT_ENV, "GIT_AUTHOR_DATE": "2026-01-01T00:00:00Z",
                                                 "GIT_COMMITTER_DATE": "2026-01-01T00:00:00Z"})
    paths = sorted(gitchange.dirty_paths(a))
    assert "sub/" in paths and "was_file" in paths and "was_file/inside.txt" in paths
    pathargs.stage(a, paths)
    env = {"GIT_LITERAL_PATHSPECS": "1"}
    subprocess.run(["git", "add", "-A", "--pathspec-from-file=-", "--pathspec-file-nul"], cwd=b, check=True,
                   input=pathargs.nul(paths), capture_output=True, env={**os.environ, **GIT_ENV, **env})
    assert _index(a) == _index(b)
    assert "keep.txt" in index_of(a) and "deleted.txt" not in index_of(a)


def test_stage_takes_a_directory_replaced_by_a_link(repo: Path) -> None:
    """``d/x`` tracked, then ``d`` a link: ``git add -- d/x d`` refuses ("beyond a symbolic link") and
    with it the whole change; ``stage`` drops ``d/x`` and stages the link."""
    write(repo, ["d/x"])
    commit_all(repo, "d")
    (repo / "d" / "x").unlink()
    (repo / "d").rmdir()
    (repo / "d").symlink_to("README.md")
    paths = sorted(gitchange.dirty_paths(repo))
    assert paths == ["d", "d/x"]
    pathargs.stage(repo, paths)
    assert raw(repo, "ls-files", "-s", "-z", "--", "d").startswith(b"120000 ")
    assert index_of(repo) == {"README.md", "d"}


def test_reset_index_is_git_reset_of_those_paths(tmp_path: Path) -> None:
    """``reset_index`` and ``git reset -q <commit> -- <paths>`` on two copies: the same index, the work
    tree untouched, what the paths do not name left staged."""
    a = tmp_path / "a"
    a.mkdir()
    git(a, "init", "-q", "-b", "main")
    write(a, ["x.txt", "gone.txt", "d/f", *ODD])
    git(a, "add", "-A")
    git(a, "commit", "-q", "-m", "base")
    b = tmp_path / "b"
    git(tmp_path, "clone", "-q", str(a), str(b))
    for r in (a, b):
        write(r, ["x.txt", "new.txt", "mine.txt", *ODD], "staged {i}\n")
        (r / "gone.txt").unlink()
        git(r, "add", "-A")
    paths = ["x.txt", "new.txt", "gone.txt", "d", *ODD]
    have = pathargs.reset_index(a, "HEAD", paths)
    subprocess.run(["git", "reset", "-q", "HEAD", "--pathspec-from-file=-", "--pathspec-file-nul"], cwd=b,
                   input=pathargs.nul(paths), capture_output=True, env={**os.environ, **GIT_ENV,
                                                                          "GIT_LITERAL_PATHSPECS": "1"})
    assert _index(a).replace(b"\0", b"\n").split() == _index(b).replace(b"\0", b"\n").split()
    assert have == {"x.txt", "gone.txt", "d/f", *ODD}
    assert status(a) == status(b) and "A  mine.txt" in status(a)
    assert (a / "x.txt").read_text() == "staged 0\n"  # the work tree untouched


def test_hash_object_runs_no_filter_the_repository_s_own_config_plants(repo: Path) -> None:
    """``versions`` hashes the operator's files with the clean filters ``.gitattributes`` names: one the
    agent plants in ``.git/config`` (shared with its worktree) is pinned like every other content command."""
    (repo / ".gitattributes").write_text("*.t filter=planted\n")
    old = commit_all(repo, "attributes")
    (repo / "a.t").write_text("a\n")
    new = commit_all(repo, "a")
    ran = repo.parent / "planted-ran"
    git(repo, "config", "filter.planted.clean", f"touch {ran}; cat")
    assert landing.versions(repo, old, new, ["a.t"]) == {"a.t": landing.Version.NEW}
    assert not ran.exists()


def test_commit_paths_commits_every_path_and_nothing_else(repo: Path) -> None:
    paths = [*many(), *ODD]
    past_arg_max(paths)
    (repo / "staged.txt").write_text("the operator's, staged\n")
    git(repo, "add", "staged.txt")
    (repo / "other.txt").write_text("the operator's, untracked\n")  # would match "*" as a glob
    write(repo, paths)
    sha = gitchange.commit_paths(repo, paths, "evolve: cycle 1 -- gen improved")
    assert sha == git(repo, "rev-parse", "HEAD").strip()
    assert tree_of(repo, "HEAD") == {"README.md", *paths}
    assert raw(repo, "show", f"HEAD:{DIR}/file_019999_{'x' * 60}.txt") == b"19999\n"
    assert raw(repo, "show", "HEAD:" + ODD[1]) == f"{N + 1}\n".encode()
    assert status(repo) == {"A  staged.txt", "?? other.txt"}  # still staged, never committed
    no_lock(repo)


def test_commit_paths_of_paths_with_nothing_to_commit_commits_nothing(repo: Path) -> None:
    paths = many()
    write(repo, paths)
    start = commit_all(repo, "the files, already committed")
    assert gitchange.commit_paths(repo, paths, "evolve: nothing") is None
    assert git(repo, "rev-parse", "HEAD").strip() == start and status(repo) == set()


def test_restore_cycle_puts_every_path_back_and_leaves_the_operator_s(repo: Path) -> None:
    paths = many()
    write(repo, paths)
    (repo / "mine.txt").write_text("committed\n")
    start = commit_all(repo, "the generated files")
    (repo / "mine.txt").write_text("the operator's edit, before the cycle\n")
    write(repo, paths, "the agent rewrote {i}\n")
    write(repo, ODD, "the agent added {i}\n")
    touched = gitchange.restore_cycle(repo, start, {"mine.txt"})
    assert set(touched) == {*paths, *ODD}
    assert status(repo) == {" M mine.txt"}
    assert (repo / "mine.txt").read_text() == "the operator's edit, before the cycle\n"
    assert (repo / paths[-1]).read_text() == f"{N - 1}\n"
    assert not any(os.path.lexists(repo / p) for p in ODD)
    no_lock(repo)


def test_save_uncommitted_keeps_every_path_and_restore_paths_puts_them_back(repo: Path) -> None:
    (repo / "kept.txt").write_text("committed\n")
    start = commit_all(repo, "kept")
    paths = [*many(), *ODD, "kept.txt"]
    past_arg_max(paths)
    write(repo, paths)
    (repo / "mine.txt").write_text("the operator's, not the cycle's\n")
    ref = gitchange.save_uncommitted(repo, paths, 7, "evolve: cycle 7 -- gen failed")
    assert ref == "refs/evolve/uncommitted/7"
    assert tree_of(repo, ref) == {"README.md", *paths}
    assert raw(repo, "show", f"{ref}:kept.txt") == str(len(paths) - 1).encode() + b"\n"
    assert raw(repo, "show", f"{ref}:{ODD[-1]}") == str(len(paths) - 2).encode() + b"\n"
    assert git(repo, "rev-parse", f"{ref}^").strip() == start
    gitchange.restore_paths(repo, paths)
    assert status(repo) == {"?? mine.txt"}  # the cycle's paths as in HEAD, the operator's file untouched
    assert (repo / "kept.txt").read_text() == "committed\n" and index_of(repo) == {"README.md", "kept.txt"}
    no_lock(repo)


def test_restore_paths_unstages_every_path_it_puts_back(repo: Path) -> None:
    paths = many()
    write(repo, paths)
    git(repo, "add", "-A")  # a commit that failed after staging them
    gitchange.restore_paths(repo, paths)
    assert status(repo) == set() and index_of(repo) == {"README.md"}


def test_save_tree_keeps_every_path_of_a_dead_cycle(repo: Path) -> None:
    start = git(repo, "rev-parse", "HEAD").strip()
    paths = [*many(), *ODD]
    write(repo, paths)
    ref = worktree.save_tree(repo, paths, "refs/evolve/stranded/3", "evolve: cycle 3 -- work stranded")
    assert tree_of(repo, ref) == {"README.md", *paths}
    assert git(repo, "rev-parse", f"{ref}^").strip() == start
    assert raw(repo, "show", f"{ref}:{ODD[2]}") == f"{N + 2}\n".encode()
    assert index_of(repo) == {"README.md"}  # a scratch index: the tree's own is untouched
    no_lock(repo)


def _half_landed(repo: Path) -> tuple[str, str, list[str]]:
    """``old`` and ``new`` (every path rewritten, the odd names added), the checkout at ``old`` with the
    first half of the paths already holding ``new``'s version: a fast-forward a death cut short."""
    paths = many()
    write(repo, paths, "old {i}\n")
    old = commit_all(repo, "old")
    write(repo, paths, "new {i}\n")
    write(repo, ODD, "odd {i}\n")
    new = commit_all(repo, "evolve: cycle 1 -- gen improved")
    git(repo, "reset", "-q", "--hard", old)
    half = [*paths[: N // 2], *ODD[:4]]
    for i, p in enumerate(paths[: N // 2]):
        (repo / p).write_text(f"new {i}\n")
    for i, p in enumerate(ODD[:4]):
        (repo / p).write_text(f"odd {i}\n")
    return old, new, half


def test_versions_tells_each_path_s_version_of_a_landing_past_arg_max(repo: Path) -> None:
    old, new, half = _half_landed(repo)
    paths = sorted(gitchange.changed(repo, old, new))
    past_arg_max(paths)
    found = landing.versions(repo, old, new, paths)
    assert {p for p, v in found.items() if v == landing.Version.NEW} == set(half)
    assert {p for p, v in found.items() if v == landing.Version.OLD} == set(paths) - set(half)


def test_finish_completes_a_fast_forward_of_every_path(repo: Path) -> None:
    old, new, _ = _half_landed(repo)
    (repo / ".git" / "index.lock").write_bytes((repo / ".git" / "index").read_bytes())  # git died holding it
    assert landing.finish(repo, "refs/heads/main", old, new) == ""
    assert git(repo, "rev-parse", "main").strip() == new
    assert status(repo) == set()
    assert (repo / many()[-1]).read_text() == f"new {N - 1}\n"
    assert (repo / ODD[-1]).read_text() == f"odd {len(ODD) - 1}\n"
    no_lock(repo)


@pytest.mark.parametrize("born", [True, False], ids=["on-a-commit", "unborn-branch"])
def test_a_model_s_diff_of_every_path_applies_and_leaves_the_index_as_it_was(tmp_path: Path, born: bool) -> None:
    src = tmp_path / "src"
    src.mkdir()
    git(src, "init", "-q", "-b", "main")
    paths = [*many(), *ODD]
    write(src, paths)
    git(src, "add", "-A")
    diff = raw(src, "diff", "--cached", "--binary")
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    if born:
        git(repo, "commit", "-q", "--allow-empty", "-m", "initial")
    pfile = tmp_path / "model.patch"
    pfile.write_bytes(diff)
    assert patch.apply(repo, pfile, diff.decode("utf-8", "surrogateescape")) == ""
    assert index_of(repo) == set()  # --3way staged them; evolve unstaged every one
    assert (repo / paths[-1]).read_text() == f"{len(paths) - 1}\n"
    assert len(status(repo)) == len(paths)
    no_lock(repo)


def test_refusal_reads_the_filter_of_every_path(repo: Path) -> None:
    """``check-attr`` over 20,000 paths on its stdin: the one a committed ``.gitattributes`` filters (with
    no clean program here) is found, whatever its name."""
    (repo / ".gitattributes").write_text("*.secret filter=crypt\n")
    commit_all(repo, "attributes")
    secret = "new\nline.secret"
    paths = [*many(), *ODD, secret]
    write(repo, paths)
    why = filters.refusal(repo, paths)
    assert why is not None and "crypt" in why and "new" in why
    assert filters.refusal(repo, paths[:-1]) is None
    assert index_of(repo) == {"README.md", ".gitattributes"}


def test_setup_finds_which_of_many_paths_are_tracked(repo: Path) -> None:
    from evolve.cycle.setup import _tracked

    paths = many()
    write(repo, paths[: N // 2])
    commit_all(repo, "half")
    assert _tracked(repo, [*paths, "gen/"]) == {*paths[: N // 2], "gen/"}  # a directory: what is in it


def test_setaside_apply_of_a_ref_of_every_path(env: Env, cli) -> None:
    """``evolve setaside apply`` of a kept change of 20,000 files: every one is back in the checkout."""
    paths = [*many(), *ODD]
    base = git(env.repo, "rev-parse", "HEAD").strip()
    idx = env.root / "scratch-index"
    genv = {**os.environ, **GIT_ENV, "GIT_INDEX_FILE": str(idx), "GIT_LITERAL_PATHSPECS": "1"}
    write(env.repo, paths)
    subprocess.run(["git", "read-tree", base], cwd=env.repo, env=genv, check=True)
    subprocess.run(["git", "add", "-A", "--", "gen", *ODD], cwd=env.repo, env=genv, check=True)
    tree = subprocess.run(["git", "write-tree"], cwd=env.repo, env=genv, check=True, capture_output=True,
                          text=True).stdout.strip()
    sha = git(env.repo, "commit-tree", tree, "-p", base, "-m", "evolve: cycle 1 -- work stranded by a dead cycle")
    git(env.repo, "update-ref", "refs/evolve/stranded/1", sha.strip())
    git(env.repo, "clean", "-q", "-f", "-d")
    assert status(env.repo) == set()
    r = cli("setaside", "apply", "stranded/1")
    assert r.code == 0, r.stderr
    assert (env.repo / paths[-1]).read_text() == f"{len(paths) - 1}\n"
    assert {s[3:] for s in status(env.repo)} == set(paths)  # untracked, as the change had them
    assert git(env.repo, "rev-parse", "HEAD").strip() == base
    no_lock(env.repo)


MANY_FILES = f"""
import os
d = {DIR!r}
os.makedirs(d, exist_ok=True)
for i in range({N}):
    with open(f"{{d}}/file_{{i:06d}}_" + "x" * 60 + ".txt", "w") as fh:
        fh.write(f"{{i}}\\n")
"""
# Leaves the index lock of the tree it runs in (evolve's worktree) behind: the commit then fails.
LOCK_GATE = [sys.executable, "-c", "import subprocess as s; open(s.run(['git', 'rev-parse', '--git-path', "
             "'index.lock'], capture_output=True, text=True, check=True).stdout.strip(), 'w').close()"]


def test_a_failed_commit_of_a_change_past_arg_max_is_a_failed_cycle_with_the_change_kept(env: Env, cli) -> None:
    start = git(env.repo, "rev-parse", "HEAD").strip()
    env.write_config(gate={"commands": [LOCK_GATE], "timeout_s": 60})
    env.queue(entry("gen"))
    env.steps([{"run": [[sys.executable, "-c", MANY_FILES]], "report": {"result": "improved"}}])
    r = cli("fire", "--cycles", "1", timeout=600)
    e = env.ledger()[-1]  # an entry, not "unexpected error: OSError: Argument list too long"
    assert (r.code, e["result"], e["error_class"]) == (1, "failed", "commit_failed"), (r.stdout, r.stderr)
    ref = e["uncommitted_ref"]
    assert len(e["uncommitted_paths"]) == N
    assert git(env.repo, "show", f"{ref}:{many()[-1]}") == f"{N - 1}\n"
    assert len(tree_of(env.repo, ref) - tree_of(env.repo, start)) == N
    assert git(env.repo, "rev-parse", "main").strip() == start  # nothing landed
    assert status(env.tree) == set()  # the worktree back at the cycle's start (empty directories aside)
    assert not [p for p in (env.tree / "gen").rglob("*") if not p.is_dir()]
    assert live(env.paths.nextwork)[0]["items"][0]["claim_status"] == "available"
    assert status(env.repo) == set() and not (env.repo / ".git" / "index.lock").exists()


def test_a_fire_killed_with_a_change_past_arg_max_leaves_it_set_aside_and_the_next_fire_works(
        env: Env, cli) -> None:
    start = git(env.repo, "rev-parse", "HEAD").strip()
    env.queue(entry("gen", "small"))
    env.steps([{"run": [[sys.executable, "-c", MANY_FILES]], "report": {"result": "improved"}},
               improved_step(path="small.txt", content="small\n")])
    r = cli("fire", "--cycles", "1", timeout=600, extra_env={"EVOLVE_CRASHPOINT": "gate"})
    assert r.code == -signal.SIGKILL, r.stderr
    r2 = cli("fire", "--cycles", "1", timeout=600)
    assert r2.code == 0, [e for e in r2.events() if "error" in e["event"]]
    stranded = [x for x in r2.events() if x["event"] == "workspace.stranded"]
    assert stranded and stranded[0]["paths"] == N, r2.stderr
    ref = stranded[0]["ref"]
    assert git(env.repo, "show", f"{ref}:{many()[0]}") == "0\n"
    assert len(tree_of(env.repo, ref) - tree_of(env.repo, start)) == N
    assert git(env.repo, "show", "main:small.txt") == "small\n"  # the next fire worked and landed
    assert not (set(tree_of(env.repo, "main")) & set(many(10)))  # the dead cycle's change did not land
    assert status(env.repo) == set() and not (env.repo / ".git" / "index.lock").exists()
