"""A config tracked in git is the repository's (issue 23 item 3; docs/DESIGN.md §8.5 *Trust*).

Real repositories, real ``python -m evolve`` subprocesses: a committed config whose gate, governor and notify
commands write marker files runs nothing until ``evolve trust``; a commit changing it needs trust again; an
untracked config (what ``evolve init`` writes) is the operator's, as before; the operator's own layers
(``$XDG_CONFIG_HOME/evolve/config.toml``, ``--config``) apply over the repository's.
"""

from __future__ import annotations

import sys
from pathlib import Path

import orjson
import pytest
from support import Env, entry, git, live

from evolve import configtrust
from evolve.configtrust import CONFIG, Owned, merge, verdict

REFUSAL = "the repository's .agents/evolve/config.toml (tracked in git) is not trusted"


# -- the pure pieces (tables) ------------------------------------------------------------------

@pytest.mark.parametrize("record, sha, trusted, why", [
    ({}, "a" * 64, False, "is not trusted: review it, then `evolve trust`"),
    ({"c.toml": {"sha256": "a" * 64, "kind": CONFIG}}, "a" * 64, True, ""),
    ({"c.toml": {"sha256": "b" * 64, "kind": CONFIG}}, "a" * 64, False, "changed since you trusted it (sha256 bbbb"),
    ({"c.toml": {"sha256": "a" * 64, "kind": "agent-settings"}}, "a" * 64, False, "is not trusted"),  # other kind
    ({"c.toml": {"sha256": "a" * 64, "kind": CONFIG}}, None, False, "now gone"),
])
def test_verdict(record: dict, sha: str | None, trusted: bool, why: str) -> None:
    v = verdict("c.toml", CONFIG, sha, record)
    assert v.trusted is trusted
    assert why in v.why()


@pytest.mark.parametrize("tables, want", [
    ([{"gate": {"commands": [["a"]]}}, {"gate": {"timeout_s": 5}}], {"gate": {"commands": [["a"]], "timeout_s": 5}}),
    ([{"gate": {"commands": [["a"]]}}, {"gate": {"commands": [["b"]]}}], {"gate": {"commands": [["b"]]}}),
    ([{"fire": {"max_cycles": 1}}, {"notify": {"command": ["n"]}}],
     {"fire": {"max_cycles": 1}, "notify": {"command": ["n"]}}),
    ([], {}),
])
def test_merge_key_by_key(tables: list, want: dict) -> None:
    assert merge(tables) == want


# -- the shell: real fires ---------------------------------------------------------------------

def hostile(env: Env, marks: Path) -> None:
    """A config committed in the repository whose gate, governor and notify commands leave marker files."""
    def touch(name: str) -> list[str]:
        return [sys.executable, "-c", f"open({str(marks / name)!r}, 'a').write('ran\\n')"]

    env.write_config(gate={"commands": [touch("gate")]}, halt={"governor_cmd": touch("governor")},
                     notify={"command": touch("notify")})


def commit_config(env: Env, message: str = "config") -> None:
    git(env.repo, "add", "-f", ".agents/evolve/config.toml")
    git(env.repo, "commit", "-q", "-m", message)


def status_json(cli) -> dict:
    r = cli("status", "--json")
    return orjson.loads(r.stdout)


def assert_untouched(env: Env, head: str) -> None:
    """Nothing claimed, nothing committed, no lock left behind."""
    assert git(env.repo, "rev-parse", "HEAD").strip() == head
    assert not list(env.repo.joinpath(".git").rglob("index.lock"))
    assert env.ledger() == []
    item = live(env.paths.nextwork)[0]
    assert item.get("claim_status") == "available" and not item.get("consumed")


def test_a_committed_config_runs_nothing_until_trusted(env: Env, cli, tmp_path: Path) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    hostile(env, marks)
    commit_config(env, "a config from whoever can push")
    env.queue(entry("work"))
    head = git(env.repo, "rev-parse", "HEAD").strip()

    # The operator's own notify command (their layer) hears of the refusal; the repository's runs nothing.
    heard = tmp_path / "operator-notify.json"
    user = configtrust.user_config_path(env.env())
    user.parent.mkdir(parents=True, exist_ok=True)
    user.write_text("[notify]\ncommand = " + orjson.dumps(
        [sys.executable, "-c", f"import sys; open({str(heard)!r}, 'a').write(sys.stdin.read() + '\\n')"]).decode()
        + "\n")
    r = cli("fire", "--cycles", "1")
    assert r.code == 78, r.stderr
    assert r.error_lines() == [f"evolve: {REFUSAL}: review it, then `evolve trust`"]
    assert sorted(p.name for p in marks.iterdir()) == []  # no gate, no governor, no notify
    assert_untouched(env, head)
    sent = [orjson.loads(line) for line in heard.read_text().splitlines() if line]
    assert [s["event"] for s in sent] == ["preflight.failed"] and REFUSAL in sent[0]["errors"][0]
    assert orjson.loads(env.paths.fires.read_bytes().splitlines()[-1])["reason"] == "preflight:config_trust"
    user.unlink()
    assert not (env.paths.evolve_dir / "worktree").exists()  # refused before the workspace too
    assert cli("fire", "--dry-run").code == 78

    info = status_json(cli)
    assert info["health"] == "degraded" and any(REFUSAL in reason for reason in info["reasons"])
    assert info["trust"]["config"] == {"path": ".agents/evolve/config.toml", "trusted": False}
    assert [u["path"] for u in info["trust"]["untrusted"]] == [".agents/evolve/config.toml"]
    doc = orjson.loads(cli("doctor", "--json").stdout)
    fail = [f for f in doc if f["check"] == "config trust"]
    assert fail and fail[0]["level"] == "FAIL" and REFUSAL in fail[0]["message"] and "evolve trust" in fail[0]["fix"]
    assert sorted(p.name for p in marks.iterdir()) == []  # status and doctor ran none of it either

    shown = cli("trust", "--show")
    assert shown.code == 0 and "gate.commands" in shown.stdout and "notify.command" in shown.stdout
    assert not env.paths.config_trust.exists()  # --show records nothing
    t = cli("trust")
    assert t.code == 0 and "trusted 1 file(s)" in t.stdout, t.stderr
    rec = orjson.loads(env.paths.config_trust.read_bytes())
    got = rec["files"][".agents/evolve/config.toml"]
    assert got["sha256"] == configtrust.sha256_of(env.paths.config) and got["trusted_by"] and got["trusted_at"]
    assert not str(env.paths.config_trust).startswith(str(env.repo))  # the record is out of the repository

    r = cli("fire", "--cycles", "1")
    assert r.code == 0, r.stderr
    assert {"gate", "governor"} <= {p.name for p in marks.iterdir()}
    assert env.ledger()[-1]["result"] == "improved"
    assert status_json(cli)["trust"]["untrusted"] == []


def test_a_commit_changing_a_trusted_config_needs_trust_again(env: Env, cli, tmp_path: Path) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    hostile(env, marks)
    commit_config(env)
    assert cli("trust").code == 0
    env.write_config(gate={"pass_env": ["GITHUB_TOKEN"]})  # what a pushed change could add
    commit_config(env, "widen the gate")
    env.queue(entry("work"))
    head = git(env.repo, "rev-parse", "HEAD").strip()
    r = cli("fire", "--cycles", "1", extra_env={"GITHUB_TOKEN": "ghp_" + "x" * 36})
    assert r.code == 78
    assert "changed since you trusted it" in r.error_lines()[0]
    assert sorted(p.name for p in marks.iterdir()) == []
    assert_untouched(env, head)
    assert any("changed since you trusted it" in x for x in status_json(cli)["reasons"])


def test_a_local_edit_of_a_tracked_config_needs_trust_and_revoke_forgets(env: Env, cli, tmp_path: Path) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    hostile(env, marks)
    commit_config(env)
    assert cli("trust").code == 0
    env.write_config(fire={"max_cycles": 2})  # tracked, modified, not committed: still the repository's file
    env.queue(entry("work"))
    head = git(env.repo, "rev-parse", "HEAD").strip()
    assert cli("fire", "--cycles", "1").code == 78
    assert cli("trust").code == 0
    assert cli("trust", "--revoke").code == 0
    assert cli("fire", "--cycles", "1").code == 78
    assert sorted(p.name for p in marks.iterdir()) == []
    assert_untouched(env, head)


def test_an_untracked_config_is_the_operators_as_before(env: Env, cli, tmp_path: Path) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    hostile(env, marks)  # the same commands, written by the operator (untracked: .agents/.gitignore is "*")
    env.queue(entry("work"))
    r = cli("fire", "--cycles", "1")
    assert r.code == 0, r.stderr
    assert {"gate", "governor"} <= {p.name for p in marks.iterdir()}
    info = status_json(cli)
    assert info["trust"]["config"] is None and info["trust"]["untrusted"] == []
    assert not [f for f in orjson.loads(cli("doctor", "--json").stdout) if f["check"] == "config trust"]
    assert "nothing to trust" in cli("trust").stdout
    assert not env.paths.config_trust.exists()


def test_the_operators_layers_apply_over_the_repositorys(env: Env, cli, tmp_path: Path) -> None:
    """``$XDG_CONFIG_HOME/evolve/config.toml`` over a trusted repository config, ``--config`` over both."""
    marks = tmp_path / "marks"
    marks.mkdir()

    def touch(name: str) -> list[list[str]]:
        return [[sys.executable, "-c", f"open({str(marks / name)!r}, 'a').write('ran\\n')"]]

    env.write_config(gate={"commands": touch("repo-gate"), "timeout_s": 77})
    commit_config(env)
    assert cli("trust").code == 0
    user = configtrust.user_config_path(env.env())
    user.parent.mkdir(parents=True, exist_ok=True)
    user.write_text(f"[gate]\ncommands = {orjson.dumps(touch('user-gate')).decode()}\n")
    explicit = tmp_path / "mine.toml"
    explicit.write_text(f"[gate]\ncommands = {orjson.dumps(touch('flag-gate')).decode()}\n")
    env.queue(entry("one", "two"))

    assert cli("fire", "--cycles", "1").code == 0
    assert sorted(p.name for p in marks.iterdir()) == ["user-gate"]
    assert cli("--config", str(explicit), "fire", "--cycles", "1").code == 0
    assert sorted(p.name for p in marks.iterdir()) == ["flag-gate", "user-gate"]
    e = env.env(EVOLVE_CONFIG=str(explicit))
    loaded = configtrust.load(env.paths, e)
    assert loaded.cfg.gate.timeout_s == 77  # the repository's other keys still apply, key by key
    assert loaded.layers == (str(env.paths.config), str(user), str(explicit))
    assert cli("fire", "--config", str(tmp_path / "missing.toml")).code == 78


def test_an_untrusted_repository_config_is_not_what_other_commands_run(env: Env, tmp_path: Path) -> None:
    """status, doctor, report and the rest load the config without the untrusted layer (pure load)."""
    env.write_config(gate={"commands": [["false"]]}, work={"beads_command": ["evil-tracker"]})
    commit_config(env)
    loaded = configtrust.load(env.paths, env.env())
    assert isinstance(loaded.repo, Owned) and not loaded.repo.trusted
    assert loaded.cfg.gate.commands == [] and loaded.cfg.work.beads_command == ["bd", "ready", "--json"]
    assert loaded.ignored == (str(env.paths.config),) and loaded.refusal and REFUSAL in loaded.refusal


def test_a_daemon_fire_refuses_an_untrusted_repository_config_too(env: Env, cli, tmp_path: Path) -> None:
    """The daemon's job loads the config per fire (scheduler._run_fire): refused (exit 78's ConfigError, which the
    daemon logs as the job's error and survives), nothing of it run; once trusted the next job fires."""
    from evolve import scheduler
    from evolve.cronexpr import parse
    from evolve.errors import ConfigError
    from evolve.sdnotify import Notifier

    marks = tmp_path / "marks"
    marks.mkdir()
    hostile(env, marks)
    commit_config(env)
    env.queue(entry("work"))
    head = git(env.repo, "rev-parse", "HEAD").strip()
    job = scheduler.RepoJob("repo", env.paths, parse("0 0 1 1 *"), "UTC", 0)
    d = scheduler.Daemon([job], grace_s=1, env=env.env(), notifier=Notifier({}))
    with pytest.raises(ConfigError, match="is not trusted"):
        d._run_fire(job)
    assert sorted(p.name for p in marks.iterdir()) == []
    assert_untouched(env, head)
    assert orjson.loads(env.paths.fires.read_bytes().splitlines()[-1])["reason"] == "preflight:config_trust"
    assert cli("trust").code == 0
    assert d._run_fire(job) == 0
    assert "gate" in {p.name for p in marks.iterdir()}


def test_the_operators_config_flag_reaches_the_units_install_renders(env: Env, cli, tmp_path: Path) -> None:
    mine = tmp_path / "mine.toml"
    mine.write_text("[fire]\nmax_cycles = 1\n")
    r = cli("--config", str(mine), "install", "systemd", "--user", "--print")
    assert r.code == 0, r.stderr
    assert f"Environment=EVOLVE_CONFIG={mine}" in r.stdout.splitlines()
    assert "EVOLVE_CONFIG" not in cli("install", "systemd", "--user", "--print").stdout
    env.write_config(notify={"command": ["true"]})
    commit_config(env)
    k8s = cli("install", "kubernetes", "--image", "registry.example/evolve:1", "--print")
    assert k8s.code == 78 and REFUSAL in k8s.stderr  # the pod would write it untracked: the operator's


def test_whether_git_tracks_it_is_read_from_the_index_only_when_that_is_sure(env: Env) -> None:
    """status starts no git for an untracked config (index v2/v3 read directly); everything else asks git."""
    from evolve.configtrust import _surely_untracked, tracked

    rel = ".agents/evolve/config.toml"
    assert _surely_untracked(env.repo, [rel]) and tracked(env.repo, [rel]) == set()
    git(env.repo, "add", "-f", rel)
    assert not _surely_untracked(env.repo, [rel]) and tracked(env.repo, [rel]) == {rel}
    git(env.repo, "update-index", "--index-version", "4")  # compressed paths: not read directly
    git(env.repo, "rm", "-q", "--cached", rel)
    assert not _surely_untracked(env.repo, [rel]) and tracked(env.repo, [rel]) == set()
