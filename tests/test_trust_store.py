"""The operator's trust records live outside the repository and evolve's state directory (DESIGN.md §8.4)."""

from __future__ import annotations

import orjson
from support import Env, git

from evolve import trusted
from evolve.paths import Paths


def test_the_records_are_outside_the_repository_and_the_state_directory(env: Env) -> None:
    p = env.paths
    assert p.trust_dir is not None
    for record in (p.git_trust, p.config_trust, p.pins, p.guard):
        assert not record.is_relative_to(p.repo) and not record.is_relative_to(p.evolve_dir), record
        assert record.parent == p.trust_dir
    assert p.trust_dir.is_relative_to(env.xdg.parent / "xdg-state")


def test_every_work_tree_of_a_repository_shares_one_record_and_two_clones_do_not(env: Env) -> None:
    wt = env.root / "wt"
    git(env.repo, "worktree", "add", "-q", "--detach", str(wt))
    clone = env.root / "clone"
    git(env.root, "clone", "-q", str(env.repo), str(clone))
    e = env.env()
    assert trusted.repo_dir(wt, e) == env.paths.trust_dir
    assert trusted.repo_dir(clone, e) != env.paths.trust_dir
    assert Paths.for_repo(env.repo, env=e | {"EVOLVE_TRUST_DIR": str(env.root / "t")}).trust_dir == env.root / "t"


def test_a_git_trust_record_an_older_evolve_kept_in_the_state_directory_is_moved_once(env: Env, cli) -> None:
    legacy = env.paths.git_trust_legacy
    legacy.parent.mkdir(parents=True, exist_ok=True)
    legacy.write_bytes(orjson.dumps({"version": 1, "approved_by": "evolve init", "keys": {}}))
    r = cli("doctor")
    assert r.code in (0, 1), r.stdout + r.stderr
    assert not legacy.exists()
    assert orjson.loads(env.paths.git_trust.read_bytes())["approved_by"] == "evolve init"
