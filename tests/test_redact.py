"""Issue 13: one redaction module (evolve/redact.py), every shape it masks, and every sink calling it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from evolve.redact import MASK, Redactor, activate, current, env_literals, secret_name

R = Redactor()

POSITIVE = [
    "sk-ant-api03-AbCdEf0123456789xyzXYZ",
    "sk-proj-AbCdEf0123456789xyzXYZ",
    "ghp_AbCdEf0123456789AbCdEf0123456789abcd",
    "gho_AbCdEf0123456789AbCdEf",
    "ghs_AbCdEf0123456789AbCdEf",
    "ghu_AbCdEf0123456789AbCdEf",
    "ghr_AbCdEf0123456789AbCdEf",
    "github_pat_11AbCdEf0123456789_xyz",
    "xoxb-1234567890-abcdefghij",
    "xoxa-1234567890-abcdefghij",
    "xoxp-1234567890-abcdefghij",
    "xoxr-1234567890-abcdefghij",
    "AKIAIOSFODNN7EXAMPLE",
    "https://hooks.slack.com/services/T000/B000/XXXXXXXXXXXXXXXX",
    "https://discord.com/api/webhooks/123456789012345678/abcDEF_ghi-123",
    "https://discordapp.com/api/webhooks/123456789012345678/abcDEF_ghi-123",
    "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
    "glpat-AbCdEf0123456789xyz",
]


@pytest.mark.parametrize("secret", POSITIVE)
def test_each_token_shape_is_masked_anywhere_in_text(secret: str) -> None:
    out = R.text(f"before {secret} after")
    assert secret not in out and out == f"before {MASK} after"


def test_urls_pem_bearer_and_assignments() -> None:
    assert R.text("db at postgres://app:s3cretPassw0rd@db:5432/x") == "db at postgres://app:***@db:5432/x"
    pem = "x\n-----BEGIN OPENSSH PRIVATE KEY-----\nAAAA\nBBBB\n-----END OPENSSH PRIVATE KEY-----\ny"
    assert R.text(pem) == "x\n[REDACTED PRIVATE KEY]\ny"
    assert R.text("curl -H 'Authorization: Bearer abcdefghijklmnop'") == "curl -H 'Authorization: Bearer ***'"
    assert R.text("use Bearer abcdefghijklmnop now") == "use Bearer *** now"
    assert R.text("password=hunter2hunter2") == "password=***"


NEGATIVE = [
    "the keyboard token budget is fine, max_tokens=4096, input_tokens: 1200",
    "a3f9c2e1b4d5a3f9c2e1b4d5a3f9c2e1b4d5a3f9",  # a git SHA
    "123e4567-e89b-12d3-a456-426614174000",  # a UUID
    "disk-usage-monitor-thing and task-sk-abcdefghijklmnopqrs",
    "see http://localhost:8080/x and https://github.com/o/r",
    "source_epic=e1:item=fix the flaky test",
    "AKIA is a prefix, AKIAshort is not a key",
    "eyJ alone is not a JWT",
]


@pytest.mark.parametrize("text", NEGATIVE)
def test_ordinary_text_shas_and_uuids_are_left_alone(text: str) -> None:
    assert R.text(text) == text


def test_names_decide_literals_and_harmless_names_do_not() -> None:
    for name in ("AWS_SECRET_ACCESS_KEY", "OPENAI_KEY", "GH_TOKEN", "PGPASSWORD", "FTP_PASSWD", "X_CREDENTIALS",
                 "NPM_AUTH", "SLACK_WEBHOOK_URL", "MY_PRIVATE", "SENTRY_DSN", "author_token", "apikey"):
        assert secret_name(name), name
    for name in ("GIT_AUTHOR_NAME", "GIT_AUTHOR_EMAIL", "KEYBOARD_LAYOUT", "KEYMAP", "TOKENIZERS_PARALLELISM",
                 "PATH", "HOME", "DATABASE_URL"):
        assert not secret_name(name), name
    env = {"OPENAI_KEY": "plainValueNoShape1", "AUTH": "1", "GIT_AUTHOR_EMAIL": "test@localhost",
           "DATABASE_URL": "postgres://u:dbPassw0rdValue@h/db"}
    assert env_literals(env) == {"plainValueNoShape1", "dbPassw0rdValue"}  # short values never
    r = Redactor.from_env(env)
    assert r.text("x plainValueNoShape1 dbPassw0rdValue test@localhost 1") == "x *** *** test@localhost 1"
    assert Redactor.from_env(env) is r  # built once per distinct set of secrets


def test_bytes_json_and_filenames() -> None:
    r = Redactor(["literalSecret99"])
    assert r.bytes(b"a literalSecret99 \xff b") == b"a *** \xff b"
    obj = {"literalSecret99": ["x literalSecret99", {"k": "ghp_AbCdEf0123456789AbCdEf"}], "n": 3, "b": None}
    assert r.json(obj) == {"***": ["x ***", {"k": "***"}], "n": 3, "b": None}
    assert r.filename("fix ghp_AbCdEf0123456789AbCdEf/../literalSecret99 now") == "fix-redacted-..-redacted-now"


def test_activate_covers_the_fire_env_and_the_process_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import evolve.redact as mod

    monkeypatch.setattr(mod, "_active", None)
    monkeypatch.setenv("PROCESS_TOKEN", "processTokenValue1")
    assert "processTokenValue1" in current().literals
    activate({"FIRE_SECRET": "fireSecretValue22"})
    assert {"processTokenValue1", "fireSecretValue22"} <= set(current().literals)


def test_the_module_imports_nothing_heavy() -> None:
    tree = ast.parse(Path(mod_path()).read_text())
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert imported <= {"__future__", "os", "re", "collections", "typing"}


def mod_path() -> str:
    import evolve.redact

    return evolve.redact.__file__


# -- every sink calls the redactor ----------------------------------------------------------------

ROOT = Path(mod_path()).parent
# Calls that put bytes somewhere durable or visible: files under .agents/, git, stdout, a child's stdin.
# (Sinks that redact themselves, such as HarvestedQueue.append_entry or Ledger.append, are in SINKS.)
WRITERS = {"write_json", "atomic_write_bytes", "append_bytes", "append_line", "write_textfile",
           "commit_paths", "run_notify", "write", "write_bytes", "write_text"}
# Helpers of harness/handoff that redact (with an operator env of their own); tested above.
HELPERS = {"redactor", "redact_text"}
# Writers that need no redaction of their own, each with the reason. Anything new must pick a side.
EXEMPT = {
    "store/atomic.py": "the primitives; their callers are the sinks",
    "store/jsonl.py": "byte mechanics of the queue; callers redact",
    "store/inplace.py": "in-place line edits of the queue; changed fields were redacted by _update",
    "store/lock.py": "pid and time only",
    "store/markers.py": "marker primitives",
    "procgroup.py:_start": "no content", "procgroup.py:kill_group": "no content",
    "harness/autocompact.py": "the operator's settings.json, keys evolve owns",
    "harness/compaction.py": "the operator's Gemini settings.json: one number evolve owns, other keys as read",
    "harness/hooks.py": "hook output: cycle-state, already redacted at its sink",
    "agent/claude.py": "prompt/system exchange files, deleted after the run; output via run_group's redactor",
    "agent/command.py": "prompt/report exchange files, deleted after the run; output via run_group's redactor",
    "agent/scripted.py": "the test agent itself",
    "work/goals/snapshot.py": "gate check names and numbers",
    "work/generators.py": "generator output queued via HarvestedQueue.append_entry",
    "work/harvested.py:_materialize": "copies the operator's linked queue byte for byte",
    "cycle/door.py:_copy_in": "the operator's own .agents/ files, copied for the agent to read (its writes back are"
                              " redacted in _carry)",
    "cycle/workspace.py:_repair_git_file": "the worktree's gitdir line, evolve's own path",
    "cycle/guard.py:record": "labels, digests, cycle numbers and phases: no content",
    "git/checks.py:trust": "paths and blob ids",
    "cycle/checks.py:goal_checks": "a GOALS blob in a temp dir, read back to parse it, then gone",
    "work/queue_record.py:save": "digests and the fields evolve wrote (redacted by _update)",
    "work/harvested.py:_write_all": "the byte loop under _materialize",
    "metrics.py:ledger_counts": "counts by result",
    "metrics.py:write_textfile": "render() redacts every label (Exposition)",
    "metrics.py:write_repo_textfile": "render() redacts every label (Exposition)",
    "notify.py:_announce": "a halt reason (an evolve.cycle.halt constant) and a timestamp",
    "status/schedule.py": "daemon pid/heartbeat",
    "commands/install.py": "unit files rendered from config",
    "commands/markers.py": "the operator's own STOP/KILL reason, written at their request",
    "commands/setaside.py:_apply_locked": "the set-aside change as a patch for git apply, in a temp dir: masked"
                                          " it would no longer be the change",
    "commands/setup.py": "settings", "commands/init.py": "templates", "init.py": "templates",
    "deploy.py": "unit files", "demo.py": "the demo repo", "doctor.py": "read-only checks",
    "commands/report.py": "render_html redacts every text through t()",
    "commands/hook.py": "hook text comes from harness.hooks over redacted state",
    "commands/demo.py": "the demo",
    "commands/daemon.py": "daemon bookkeeping", "scheduler.py": "daemon bookkeeping",
    "sdnotify.py": "systemd socket", "crashpoint.py": "tests",
    "cycle/side.py:dormant": "counts only",
    "log.py": "structlog renders after the _redact processor",
    "git/change.py:commit_paths": "the message comes from commit_message, which redacts",
    "git/worktree.py:share": "info/exclude lines: fixed names",
    "cycle/door.py:_write": "carry() redacts the bytes before it writes them",
    "git/worktree.py:ensure": "a fixed mark file",
    "cycle/gate.py:_commit": "the message comes from gitchange.commit_message, which redacts",
    "cycle/side.py:idle": "DORMANT: counts and times",
    "metrics.py:update": "render() redacts every label (Exposition)",
    "commands/metrics.py:run": "metrics.render() redacts every label (Exposition)",
    "notify.py:__call__": "run_notify and append_line redact what they write",
    "procgroup.py:write": "CappedLog: the run log's bytes, already through run_group's redactor",
    "cycle/retention.py:trim_lines": "keeps the newest of lines already written through their sinks",
    "git/trust.py:write": "git config values as the repository's .git/config holds them, matched byte for byte",
    "git/trust.py:adopt_legacy": "the operator's own record moved byte for byte (see trust.write)",
    "configtrust.py:write_record": "sha256 hashes, repository paths and user@host: nothing a hashed file holds",
    "git/approve.py:approve": "the approved keys, through trust.write",
    "git/filters.py:_declared": "copies of .gitattributes into a private scratch repository, gone at once",
    "cycle/setup.py:tree_id": "a random id", "cycle/setup.py:add_excludes": "info/exclude lines: paths git listed",
    "cycle/setup.py:_copy_into": "the operator's file copied byte for byte into the worktree, as asked (no log)",
}
# The sinks issue 13 names: each of these functions must itself call the redaction module.
SINKS = [
    ("store/ledger.py", "append"), ("store/session_state.py", "save"), ("log.py", "_redact"),
    ("procgroup.py", "_write_redacted"), ("procgroup.py", "close"), ("report/render.py", "t"),
    ("metrics.py", "__init__"), ("notify.py", "run_notify"), ("notify.py", "append_line"),
    ("harness/handoff.py", "request"), ("harness/handoff.py", "slug"), ("git/change.py", "commit_message"),
    ("commands/status.py", "run_status"), ("commands/status.py", "run_history"), ("commands/fire.py", "run"),
    ("work/harvested.py", "append_entry"), ("work/harvested.py", "_update"),
    ("cycle/context.py", "write_cycle_state"), ("cycle/fire.py", "_handoff"),
    ("cycle/pending.py", "save"), ("cycle/pending.py", "write_intent"), ("cycle/publish.py", "_save"),
    ("cycle/side.py", "blocked"), ("cycle/fire.py", "__init__"), ("agent/report.py", "redacted"),
    ("agent/prompt.py", "build"), ("agent/invocation.py", "values"), ("cli.py", "_error_text"),
    ("commands/doctor.py", "run"), ("agent/http.py", "_redact"), ("agent/http.py", "_save"),
    # Issue 16: a red gate command's output tail, kept in the run log and the ledger entry.
    ("cycle/gate.py", "_keep_output"), ("cycle/gate.py", "run_commands"),
    # Issue 22: the workspace setup's stamp (a failed command and its output tail) and the gate probe's record.
    ("cycle/setup.py", "run_if_due"), ("cycle/setup.py", "_run"), ("cycle/sees.py", "record"),
]


def _functions(tree: ast.AST) -> list[ast.FunctionDef]:
    return [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)]


def _called(fn: ast.FunctionDef) -> set[str]:
    out = set()
    for n in ast.walk(fn):
        if isinstance(n, ast.Call):
            f = n.func
            out.add(f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else "")
    return out


def _redaction_names(tree: ast.AST) -> set[str]:
    """What a module calls the redaction module and its API by: ``redact`` or names imported from it."""
    names = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.ImportFrom) and n.module == "evolve" and any(a.name == "redact" for a in n.names):
            names.add("redact")
        elif isinstance(n, ast.ImportFrom) and n.module == "evolve.redact":
            names |= {a.asname or a.name for a in n.names}
    return names


def _redacts(fn: ast.FunctionDef, names: set[str]) -> bool:
    for n in ast.walk(fn):
        if isinstance(n, ast.Name) and n.id in names | HELPERS:
            return True
        if isinstance(n, ast.Attribute) and n.attr in HELPERS:
            return True
    return False


@pytest.mark.parametrize(("module", "func"), SINKS)
def test_each_named_sink_calls_the_redaction_module(module: str, func: str) -> None:
    tree = ast.parse((ROOT / module).read_text())
    fns = [f for f in _functions(tree) if f.name == func]
    assert fns, f"{module}:{func} is gone: update the sink list"
    assert any(_redacts(f, _redaction_names(tree)) for f in fns), f"{module}:{func} writes without redacting"


def test_every_function_that_writes_redacts_or_says_why_not() -> None:
    offenders = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel in EXEMPT or rel == "redact.py":
            continue
        tree = ast.parse(path.read_text())
        names = _redaction_names(tree)
        for fn in _functions(tree):
            if f"{rel}:{fn.name}" in EXEMPT or not (_called(fn) & WRITERS):
                continue
            if not _redacts(fn, names):
                offenders.append(f"{rel}:{fn.name}")
    assert offenders == []


def test_no_module_keeps_secrets_of_its_own() -> None:
    """One module: no other copy of the secret list, no module-level cache of values (render.py had one)."""
    for path in ROOT.rglob("*.py"):
        text = path.read_text()
        assert "_SECRET_VALUES" not in text and "secret_values" not in text, path
        assert "evolve.secrets" not in text, path


def test_a_cut_literal_is_masked_where_a_cap_left_it() -> None:
    r = Redactor(["tok-PLANTED-ghost-token-42"])
    assert r.text("error: tok-PLANTED-gho…") == "error: ***…"
    assert r.text("error: tok-PLANTED-ghost") == "error: ***"
    assert r.text("tok-PLANTED is mentioned mid-text") == "tok-PLANTED is mentioned mid-text"


def test_run_logs_hold_back_a_private_key_until_its_end_arrives(tmp_path: Path) -> None:
    """Run logs are written line by line; a key block spans lines and reads, and must go as a whole."""
    from evolve.procgroup import _write_redacted

    r = Redactor()
    chunks = [b"before\n-----BEGIN RSA PRIVATE KEY-----\nAAAAsecretline1\n", b"BBBBsecretline2\n",
              b"-----END RSA PRIVATE KEY-----\nafter\n"]
    with open(tmp_path / "log", "wb") as log:
        pending = b""
        for c in chunks:
            pending = _write_redacted(log, pending + c, r)
        log.write(r.bytes(pending))
    assert (tmp_path / "log").read_bytes() == b"before\n[REDACTED PRIVATE KEY]\nafter\n"


def test_a_claim_recorded_redacted_still_finds_its_queue_item(tmp_path: Path) -> None:
    """State and ledger keep a title's secret out of the ref; recovery must still release the claim."""
    import orjson

    from evolve.work.harvested import HarvestedQueue
    from evolve.work.item import WorkItem

    title = "fix ghp_AbCdEf0123456789AbCdEf leak"
    path = tmp_path / "next-work.jsonl"
    path.write_bytes(orjson.dumps({"source_epic": "ep", "items": [{"title": title, "type": "task"}]}) + b"\n")
    q = HarvestedQueue(path)
    (item,) = q.candidates()
    q.claim(item, "evolve:cycle-1", "t1")
    assert q.candidates() == []
    recorded = WorkItem(source=item.source, ref=current().text(item.ref), title=current().text(item.title))
    assert "ghp_" not in recorded.ref
    HarvestedQueue(path).release(recorded, "evolve:cycle-1", "t2", "crashed")
    assert [w.title for w in HarvestedQueue(path).candidates()] == [title]
