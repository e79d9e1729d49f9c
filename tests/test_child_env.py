"""Code in the repository never runs with evolve's secrets (issue 13, item 3; docs/DESIGN.md §8, §12.3).

A real fire against a real repository whose ``.git`` an agent could have written: hooks, an
fsmonitor, a clean filter, all dumping their environment. evolve's own git runs none of them (or,
with ``[git] run_hooks = true``, runs the hooks without a secret); gate commands and the agent get
allow-listed environments.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest
from support import Env, entry, git

from evolve import childenv
from evolve.agent.command import child_env as command_env
from evolve.agent.invocation import Invocation
from evolve.agent.prompt import Orientation
from evolve.config import AgentConfig
from evolve.git import change as gitchange
from evolve.git import run as gitrun
from evolve.work.item import WorkItem

SECRETS = {
    "ANTHROPIC_API_KEY": "sk-ant-PLANTED-anthropic-0123456789",
    "GITHUB_TOKEN": "ghp_PLANTEDgithubTOKEN0123456789",
    "AWS_SECRET_ACCESS_KEY": "PLANTED/aws/secret/0123456789",
}
HOOKS = ("pre-commit", "prepare-commit-msg", "commit-msg", "post-commit", "reference-transaction",
         "post-checkout", "post-rewrite", "pre-push")

# The agent: writes (and maybe commits) what its step file says, dumps its environment, reports.
AGENT = r'''
import json, os, subprocess, sys
step = json.load(open(sys.argv[1]))
json.dump(dict(os.environ), open(sys.argv[2], "w"))
for path, text in step.get("write", {}).items():
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    open(path, "a").write(text)
if step.get("commit"):
    # The agent's own commit is the agent's business: keep the planted hooks out of it.
    subprocess.run(["git", "-c", "core.hooksPath=/dev/null", "-c", "core.fsmonitor=false", "add", "--",
                    *step["commit"]], check=True)
    subprocess.run(["git", "-c", "core.hooksPath=/dev/null", "-c", "core.fsmonitor=false", "commit", "-q",
                    "-m", "agent commit"], check=True)
open(os.environ["EVOLVE_REPORT_FILE"], "w").write(json.dumps({"result": "improved", "summary": "ok"}))
'''
DUMP_ENV = "import json, os, sys; json.dump(dict(os.environ), open(sys.argv[1], 'w'))"


def _exe(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


def _plant(env: Env) -> Path:
    """Hooks, an fsmonitor and a clean filter that leave a file (with their env) under ``out`` when run."""
    out = env.root / "ran"
    out.mkdir()
    hooks = env.repo / ".git" / "hooks"
    for name in HOOKS:
        _exe(hooks / name, f'#!/bin/sh\nenv > "{out}/hook-{name}-$$"\ncat >/dev/null 2>&1 </dev/null\nexit 0\n')
    _exe(env.root / "fsmonitor.sh", f'#!/bin/sh\nenv > "{out}/fsmonitor-$$"\nexit 1\n')
    git(env.repo, "config", "core.fsmonitor", str(env.root / "fsmonitor.sh"))
    _exe(env.root / "clean.sh", f'#!/bin/sh\nenv > "{out}/filter-$$"\ncat\n')
    git(env.repo, "config", "filter.leak.clean", str(env.root / "clean.sh"))
    # A smudge filter runs whenever git writes a file into a work tree (a worktree made, a branch
    # fast-forwarded, a tree read back), deterministically, where a clean filter may run only when
    # the index's stat data is racy.
    _exe(env.root / "smudge.sh", f'#!/bin/sh\nenv > "{out}/smudge-$$"\ncat\n')
    git(env.repo, "config", "filter.leak.smudge", str(env.root / "smudge.sh"))
    (env.repo / ".git" / "info").mkdir(exist_ok=True)
    (env.repo / ".git" / "info" / "attributes").write_text("*.txt filter=leak\n")
    return out


def _setup(env: Env, step: dict, gate_ok: bool = True, **config: dict) -> Path:
    out = _plant(env)
    (env.root / "agent.py").write_text(AGENT)
    (env.root / "step.json").write_bytes(orjson.dumps(step))
    gate = [sys.executable, "-c", DUMP_ENV + ("" if gate_ok else "; sys.exit(1)"), str(env.root / "gate-env.json")]
    env.write_config(
        agent={"argv": [sys.executable, str(env.root / "agent.py"), str(env.root / "step.json"),
                        str(env.root / "agent-env.json")]},
        gate={"commands": [gate], "pass_env": ["GATE_EXTRA"]},
        **config,
    )
    return out


def _leaks(text: str) -> list[str]:
    return [name for name, value in SECRETS.items() if value in text]


def _fire(env: Env, cli) -> None:
    env.queue(entry("change a file"))
    r = cli("fire", "--cycles", "1", extra_env={**SECRETS, "GATE_EXTRA": "yes", "GOV_KEY": "g"})
    assert r.code == 0, r.stderr


def test_no_repo_hook_fsmonitor_or_filter_runs_and_children_get_no_secret(env: Env, cli) -> None:
    (env.repo / "tracked.txt").write_text("v1\n")
    git(env.repo, "add", "tracked.txt")
    git(env.repo, "commit", "-q", "-m", "tracked")
    start = git(env.repo, "rev-parse", "HEAD").strip()
    out = _setup(env, {"write": {"src/out.txt": "new\n", "tracked.txt": "v2\n"}})
    _fire(env, cli)
    e = env.ledger()[-1]
    assert (e["result"], e["gate"]) == ("improved", "PASS")
    assert git(env.repo, "log", "-1", "--format=%s").startswith("evolve: cycle 1")
    assert git(env.repo, "rev-parse", "HEAD").strip() != start
    assert sorted(p.name for p in out.iterdir()) == []  # no hook, no fsmonitor, no filter
    gate_env = orjson.loads((env.root / "gate-env.json").read_bytes())
    assert _leaks(orjson.dumps(gate_env).decode()) == []
    assert gate_env["GATE_EXTRA"] == "yes" and gate_env["EVOLVE_FIRE_ID"] == e["fire_id"]
    agent_env = orjson.loads((env.root / "agent-env.json").read_bytes())
    # The command runner passes the agent CLIs' own keys (ANTHROPIC_*...), nothing else evolve holds.
    assert "GITHUB_TOKEN" not in agent_env and "AWS_SECRET_ACCESS_KEY" not in agent_env
    assert agent_env["ANTHROPIC_API_KEY"] == SECRETS["ANTHROPIC_API_KEY"]
    assert "GATE_EXTRA" not in agent_env


def test_undo_runs_no_hook_either(env: Env, cli) -> None:
    """A red gate: evolve checks out the dirtied file and reverts the agent's commit, hooks still off.

    (The agent commits a .md file: its own git add would run the .txt filter, which is the agent's business.)
    """
    (env.repo / "tracked.txt").write_text("v1\n")
    git(env.repo, "add", "tracked.txt")
    git(env.repo, "commit", "-q", "-m", "tracked")
    start = git(env.repo, "rev-parse", "HEAD").strip()
    out = _setup(env, {"write": {"committed.md": "x\n", "tracked.txt": "v2\n"}, "commit": ["committed.md"]},
                 gate_ok=False)
    env.write_config(git={"isolation": "none"})  # the in-place undo (a revert); a worktree is just reset
    _fire(env, cli)
    assert env.ledger()[-1]["result"] == "regressed"
    subjects = git(env.repo, "log", "--format=%s", f"{start}..HEAD").splitlines()
    assert subjects[0].startswith("Revert") and subjects[1] == "agent commit"
    assert (env.repo / "tracked.txt").read_text() == "v1\n"
    assert sorted(p.name for p in out.iterdir()) == []


def test_run_hooks_opt_in_runs_hooks_with_the_minimal_environment(env: Env, cli) -> None:
    out = _setup(env, {"write": {"src/out.txt": "new\n"}}, git={"run_hooks": True})
    _fire(env, cli)
    assert env.ledger()[-1]["result"] == "improved"
    ran = sorted(p.name.rsplit("-", 1)[0] for p in out.iterdir())
    assert "hook-post-commit" in ran and "hook-prepare-commit-msg" in ran
    assert "hook-pre-commit" not in ran  # evolve commits with --no-verify: the gate judges, not a hook
    assert not any(name.startswith(("fsmonitor", "filter")) for name in ran)
    for p in out.iterdir():
        text = p.read_text()
        assert _leaks(text) == [], p.name
        assert "GATE_EXTRA" not in text and "EVOLVE_FIRE_ID" not in text


def test_git_env_is_an_allow_list() -> None:
    source = {**SECRETS, "PATH": "/usr/bin:/bin", "HOME": "/home/op", "LC_TIME": "C", "GIT_AUTHOR_NAME": "op",
              "SSH_AUTH_SOCK": "/run/agent", "GNUPGHOME": "/home/op/.gnupg", "EVOLVE_DIR": "/x"}
    plain = gitrun.git_env(source=source)
    assert set(plain) == {"PATH", "HOME", "LC_TIME", "GIT_AUTHOR_NAME", "GIT_TERMINAL_PROMPT", "GIT_PAGER",
                          "GIT_EDITOR", "GIT_LITERAL_PATHSPECS"}
    signing = gitrun.git_env(gitrun.GitPolicy(sign=True), source=source)
    assert signing["GNUPGHOME"] == "/home/op/.gnupg" and signing["SSH_AUTH_SOCK"] == "/run/agent"
    assert gitrun.git_env(push=True, source=source)["SSH_AUTH_SOCK"] == "/run/agent"
    assert not _leaks(orjson.dumps([plain, signing]).decode())


def test_repo_config_cannot_choose_a_program(env: Env) -> None:
    """gpg.program, core.sshCommand, a merge driver in .git/config: pinned to git's defaults."""
    for key, value in (("gpg.program", "/tmp/evil-gpg"), ("core.sshCommand", "/tmp/evil-ssh"),
                       ("merge.x.driver", "/tmp/evil-merge"), ("filter.Leak.smudge", "/tmp/evil")):
        git(env.repo, "config", key, value)
    pins = gitrun._program_pins(env.repo, gitrun.git_env(), 30.0)
    pairs = dict(p.split("=", 1) for p in pins[1::2])
    assert pairs == {"gpg.program": "gpg", "core.sshcommand": "ssh", "merge.x.driver": "", "filter.Leak.smudge": ""}


def test_repo_config_cannot_choose_a_program_but_the_operator_s_approved_keys_run(env: Env) -> None:
    """An approved key is not pinned while its value is the approved one; a filter runs whole or not at all."""
    from evolve.git import trust

    git(env.repo, "config", "filter.crypt.clean", "/usr/bin/crypt clean")
    git(env.repo, "config", "filter.crypt.smudge", "/usr/bin/crypt smudge")
    git(env.repo, "config", "core.sshCommand", "/tmp/evil-ssh")
    record = env.paths.git_trust
    trust.write(record, {"filter.crypt.clean": ["/usr/bin/crypt clean"],
                         "filter.crypt.smudge": ["/usr/bin/crypt smudge"]}, by="test")
    trust.register(env.repo, record)

    def pairs() -> dict[str, str]:
        pins = gitrun._program_pins(env.repo, gitrun.git_env(), 30.0)
        return dict(p.split("=", 1) for p in pins[1::2])

    assert pairs() == {"core.sshcommand": "ssh"}
    git(env.repo, "config", "filter.crypt.clean", "/tmp/evil clean")  # changed after approval
    assert pairs() == {"core.sshcommand": "ssh", "filter.crypt.clean": "", "filter.crypt.smudge": ""}


def test_writing_an_index_runs_no_planted_clean_filter(env: Env) -> None:
    """``write-tree`` (saving a failed commit's change) writes an index, and git re-reads a racily clean
    entry through the clean filter there: pinned like every other subcommand that touches content."""
    out = _plant(env)
    (env.repo / "a.txt").write_text("x\n")
    future = time.time() + 3600
    os.utime(env.repo / "a.txt", (future, future))  # newer than any index written now: racy, so re-read
    ref = gitchange.save_uncommitted(env.repo, ["a.txt"], 1, "saved")
    assert git(env.repo, "show", f"{ref}:a.txt") == "x\n"
    assert sorted(p.name for p in out.iterdir()) == []


def test_an_approved_filter_runs_with_the_allow_listed_env_and_a_planted_one_still_never_runs(env: Env, cli) -> None:
    """The operator's filter (approved) runs under evolve's git without a secret; the agent's (planted
    after the approval, with its attribute in .git/info/attributes) never runs, and status names it."""
    ran = env.root / "crypt-ran"
    _exe(env.root / "crypt.sh", f'#!/bin/sh\nenv > "{ran}-$$"\ncat\n')
    git(env.repo, "config", "filter.op.clean", str(env.root / "crypt.sh"))
    git(env.repo, "config", "filter.op.smudge", str(env.root / "crypt.sh"))
    (env.repo / ".gitattributes").write_text("*.cfg filter=op\n")
    (env.repo / "app.cfg").write_text("v1\n")
    git(env.repo, "-c", "filter.op.clean=cat", "-c", "filter.op.smudge=cat", "add", ".gitattributes", "app.cfg")
    git(env.repo, "commit", "-q", "-m", "config")
    out = _plant(env)  # the agent's filter `leak` on *.txt, its hooks and fsmonitor
    (env.root / "agent.py").write_text(AGENT)
    (env.root / "step.json").write_bytes(orjson.dumps({"write": {"app.cfg": "v2\n", "src/out.txt": "new\n"}}))
    env.write_config(agent={"argv": [sys.executable, str(env.root / "agent.py"), str(env.root / "step.json"),
                                     str(env.root / "agent-env.json")]})
    approved = cli("doctor", "--trust-git-config").stdout
    assert "approved filter.op.clean" in approved and "approved filter.leak.clean" in approved
    git(env.repo, "config", "filter.leak.clean", str(env.root / "clean.sh") + " --changed")  # after the approval
    git(env.repo, "config", "filter.leak.smudge", str(env.root / "smudge.sh") + " --changed")
    _fire(env, cli)
    assert env.ledger()[-1]["result"] == "improved"
    assert git(env.repo, "show", "HEAD:app.cfg") == "v1\nv2\n" and git(env.repo, "show", "HEAD:src/out.txt") == "new\n"
    assert sorted(p.name for p in out.iterdir()) == []  # the planted filter, hooks, fsmonitor: none ran
    dumps = list(env.root.glob("crypt-ran-*"))
    assert dumps  # the operator's filter ran (checkout of the worktree, the commit)
    for p in dumps:
        text = p.read_text()
        assert _leaks(text) == [] and "EVOLVE_FIRE_ID" not in text, p.name
    warnings = orjson.loads(cli("status", "--json").stdout)["warnings"]
    assert any("filter.leak.clean" in w for w in warnings), warnings


def test_signing_opt_in_signs_with_the_operators_gpg_not_the_repos(env: Env, tmp_path: Path) -> None:
    marker = tmp_path / "evil-gpg-ran"
    _exe(tmp_path / "evil-gpg", f'#!/bin/sh\ntouch "{marker}"\nexit 1\n')
    git(env.repo, "config", "gpg.program", str(tmp_path / "evil-gpg"))
    (env.repo / "a.md").write_text("a\n")
    assert gitchange.commit_paths(env.repo, ["a.md"], "unsigned") is not None
    (env.repo / "b.md").write_text("b\n")
    try:
        gitchange.commit_paths(env.repo, ["b.md"], "signed", gitrun.GitPolicy(sign=True))
    except gitrun.GitError as exc:  # no key here: the operator's gpg fails, which is fine
        assert "gpg" in str(exc)
    assert not marker.exists()


def test_agent_env_per_runner(tmp_path: Path) -> None:
    source = {**SECRETS, "PATH": "/bin", "OPENAI_API_KEY": "sk-o", "GEMINI_API_KEY": "g", "HTTPS_PROXY": "http://p",
              "EVOLVE_FIRE_ID": "abc", "EVOLVE_GATE_COMMANDS": "[]", "CLAUDECODE": "1"}
    inv = Invocation(repo=tmp_path, run_dir=tmp_path / "runs", cycle=1, mode="first", session_id="s", resume=False,
                     work=WorkItem(source="harvested", ref="r1", title="t", type="bug"),
                     orientation=Orientation(static="S", dynamic="D", task="T"))
    got, _ = command_env(source, inv, AgentConfig())
    assert {"ANTHROPIC_API_KEY", "OPENAI_API_KEY", "HTTPS_PROXY", "EVOLVE_FIRE_ID", "EVOLVE_CYCLE"} <= set(got)
    assert not {"GITHUB_TOKEN", "AWS_SECRET_ACCESS_KEY", "GEMINI_API_KEY", "EVOLVE_GATE_COMMANDS",
                "CLAUDECODE"} & set(got)
    listed, _ = command_env(source, inv, AgentConfig(pass_env=["GEMINI_*", "AWS_*"], api_key_env=""))
    assert listed["GEMINI_API_KEY"] == "g" and "AWS_SECRET_ACCESS_KEY" in listed


def test_child_env_names_and_prefixes() -> None:
    env = {"PATH": "/bin", "LC_ALL": "C", "LCX": "no", "FOO": "1", "FOO_BAR": "2"}
    assert childenv.child_env(env, childenv.BASE, ["FOO_*"]) == {"PATH": "/bin", "LC_ALL": "C", "FOO_BAR": "2"}
    assert childenv.child_env({}, childenv.BASE)["PATH"] == os.defpath
    assert childenv.valid_name("AWS_*") and childenv.valid_name("X") and not childenv.valid_name("a b")
    assert not childenv.valid_name("*") and not childenv.valid_name("A*B")


SEAL_PROBE = r'''
import subprocess, sys
sys.path.insert(0, sys.argv[1])
from evolve.childenv import seal_own_environ
if sys.argv[2] == "seal":
    assert seal_own_environ()
r = subprocess.run(["sh", "-c", 'cat /proc/$PPID/environ'], capture_output=True, env={"PATH": "/usr/bin:/bin"})
print("LEAK" if b"PLANTED_SECRET" in r.stdout else "SEALED")
'''


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv") or not Path("/usr/bin/python3").exists(),
                    reason="needs root to drop to an unprivileged user with setpriv")
def test_a_sealed_fire_environ_is_not_readable_by_its_children() -> None:
    """As an ordinary user (root reads every /proc), a child can read its parent's environ unless sealed."""
    root = str(Path(childenv.__file__).parents[1])
    outs = {}
    for mode in ("open", "seal"):
        r = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3",
                            "-c", SEAL_PROBE, root, mode], capture_output=True, text=True,
                           env={"PATH": "/usr/bin:/bin", "PLANTED_SECRET": "x"}, cwd="/")
        if r.returncode != 0:
            pytest.skip(f"cannot run as nobody here: {r.stderr.strip()[:200]}")
        outs[mode] = r.stdout.strip()
    assert outs == {"open": "LEAK", "seal": "SEALED"}


def test_claude_runner_keeps_its_own_keys_only(tmp_path: Path) -> None:
    from evolve.agent.claude import ClaudeRunner

    source = {**SECRETS, "PATH": "/bin", "CLAUDE_CONFIG_DIR": "/c", "OPENAI_API_KEY": "sk-o", "CLAUDECODE": "1"}
    inv = Invocation(repo=tmp_path, run_dir=tmp_path / "runs", cycle=1, mode="first", session_id="s", resume=False,
                     work=WorkItem(source="harvested", ref="r1", title="t", type="bug"),
                     orientation=Orientation(static="S", dynamic="D", task="T"))
    got, _ = ClaudeRunner(AgentConfig(), source).env(inv)
    assert got["ANTHROPIC_API_KEY"] == SECRETS["ANTHROPIC_API_KEY"] and got["CLAUDE_CONFIG_DIR"] == "/c"
    assert not {"GITHUB_TOKEN", "AWS_SECRET_ACCESS_KEY", "OPENAI_API_KEY", "CLAUDECODE"} & set(got)
    bedrock, _ = ClaudeRunner(AgentConfig(pass_env=["AWS_*"]), source).env(inv)
    assert bedrock["AWS_SECRET_ACCESS_KEY"] == SECRETS["AWS_SECRET_ACCESS_KEY"]


def test_notify_command_gets_only_what_notify_pass_env_lists(tmp_path: Path) -> None:
    from evolve.notify import run_notify

    out = tmp_path / "env.json"
    source = {**SECRETS, "PATH": os.environ["PATH"], "WEBHOOK_URL": "https://hooks.example/x"}
    argv = [sys.executable, "-c", DUMP_ENV, str(out)]
    assert run_notify(argv, {"event": "halt"}, timeout_s=10, env=source, pass_env=["WEBHOOK_URL"]).ok
    got = orjson.loads(out.read_bytes())
    assert got["WEBHOOK_URL"] == "https://hooks.example/x" and got["EVOLVE_EVENT"] == "halt"
    assert _leaks(orjson.dumps(got).decode()) == []


def test_governor_and_goal_checks_get_the_allow_listed_env(env: Env, cli) -> None:
    gov = env.root / "governor-env.json"
    env.write_config(halt={"governor_cmd": [sys.executable, "-c", DUMP_ENV, str(gov)], "pass_env": ["GOV_KEY"]},
                     gate={"pass_env": ["GATE_EXTRA"]})
    (env.repo / "GOALS.yaml").write_text(
        "version: 1\ngoals:\n  - id: envdump\n    description: dump the env\n"
        f"    check: env > {env.root}/goal-env.txt\n    weight: 1\n")
    git(env.repo, "add", "GOALS.yaml")  # goals are measured in the agent's worktree: the committed file
    git(env.repo, "commit", "-q", "-m", "goals")
    _fire(env, cli)
    got = orjson.loads(gov.read_bytes())
    assert got["GOV_KEY"] == "g" and "EVOLVE_FIRE_ID" in got and _leaks(orjson.dumps(got).decode()) == []
    goal_env = (env.root / "goal-env.txt").read_text()
    assert "GATE_EXTRA=yes" in goal_env and "EVOLVE_FIRE_ID=" in goal_env and _leaks(goal_env) == []
