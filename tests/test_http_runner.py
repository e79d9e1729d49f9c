"""The HTTP runner against a scripted OpenAI-compatible server: what the server receives, the session
file, trimming, the diff, the error taxonomy, and secrets (docs/DESIGN.md §5.1, §5.4: the local-provider path)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from fake_openai import FakeOpenAI, Scripted, completion
from hypothesis import given, settings
from hypothesis import strategies as st
from support import Env, entry, git, live

from evolve.agent import prompt
from evolve.agent.http import (
    ANSWER_FORMAT,
    HttpRunner,
    assemble,
    load_session,
    report_from_reply,
    retry_after_s,
    session_path,
    total_chars,
    trim_history,
)
from evolve.agent.invocation import Invocation
from evolve.config import AgentConfig
from evolve.work.item import WorkItem

SECRET = "sk-test-9f8e7d6c5b4a-DO-NOT-LEAK"
ITEM_A = WorkItem(source="harvested", ref="source_epic=e1:item=alpha", title="alpha", description="do alpha")
ITEM_B = WorkItem(source="harvested", ref="source_epic=e1:item=beta", title="beta", description="do beta")

NEW_FILE_DIFF = """\
diff --git a/src/hello.txt b/src/hello.txt
new file mode 100644
--- /dev/null
+++ b/src/hello.txt
@@ -0,0 +1,2 @@
+hello
+world
"""

BAD_DIFF = """\
--- a/README.md
+++ b/README.md
@@ -1 +1 @@
-# this line is not in the file
+# replaced
"""


def reply(diff: str | None = None, result: str = "improved", summary: str = "did it", pad: str = "") -> str:
    parts = [f"Here is my change. {pad}".rstrip()]
    if diff is not None:
        parts.append(f"```diff\n{diff}```")
    parts.append("```evolve-report\n" + orjson.dumps({"result": result, "summary": summary}).decode() + "\n```")
    return "\n\n".join(parts) + "\n"


@pytest.fixture
def server() -> Iterator[FakeOpenAI]:
    with FakeOpenAI() as s:
        yield s


def status(repo: Path) -> str:
    return git(repo, "status", "--porcelain", "--untracked-files=all")


def head(repo: Path) -> str:
    return git(repo, "rev-parse", "HEAD").strip()


class Harness:
    """A runner wired to the fake server and a throwaway repo, plus invocations built like the fire's."""

    def __init__(self, repo: Path, server: FakeOpenAI, **cfg: Any) -> None:
        self.repo = repo
        self.server = server
        self.sessions = repo / ".agents" / "evolve" / "sessions"
        self.env = cfg.pop("env", {})
        args = {"runner": "http", "base_url": server.url, "model": "m", "timeout_s": 10, "heartbeat_s": 0.1, **cfg}
        self.cfg = AgentConfig(**args)
        self.runner = HttpRunner(self.cfg, self.env, self.sessions)

    def inv(
        self, cycle: int, sid: str, *, resume: bool, work: WorkItem = ITEM_A, mode: str | None = None
    ) -> Invocation:
        mode = mode or ("continuation" if resume else "first")
        orientation = prompt.build(cycle=cycle, mode=mode, work=work, facts=["tests live in tests/"])
        return Invocation(
            repo=self.repo,
            run_dir=self.repo / ".agents" / "evolve" / "runs",
            cycle=cycle,
            mode=mode,
            session_id=sid,
            resume=resume,
            work=work,
            orientation=orientation,
        )

    def run(self, inv: Invocation, **kw: Any):
        return self.runner.run(inv, **kw)

    def session(self, sid: str) -> dict[str, Any]:
        return orjson.loads(session_path(self.sessions, sid).read_bytes())


# -- trimming: a pure function, tested exhaustively ---------------------------------------------------------

roles = st.sampled_from(["user", "assistant", "tool"])
message = st.builds(lambda r, c: {"role": r, "content": c}, roles, st.text(max_size=60))
system = st.builds(lambda c: {"role": "system", "content": c}, st.text(max_size=80))


@settings(max_examples=400, deadline=None)
@given(st.lists(system, max_size=3), st.lists(message, max_size=14), st.integers(0, 900))
def test_trim_properties(pinned: list[dict], history: list[dict], budget: int) -> None:
    out = assemble(pinned, history, budget)
    # pinned survive, first and unchanged
    assert out[: len(pinned)] == pinned
    rest = out[len(pinned) :]
    # order preserved: what is kept is a contiguous suffix of the history
    assert rest == history[len(history) - len(rest) :]
    # never an orphaned assistant/tool message at the head
    assert not rest or rest[0]["role"] == "user"
    users = [i for i, m in enumerate(history) if m["role"] == "user"]
    if not users:
        assert rest == []
        return
    last_user = users[-1]
    start = len(history) - len(rest)
    # the newest user message (and whatever follows it) is never trimmed
    assert start <= last_user
    limit = max(0, budget - total_chars(pinned))
    # the budget is respected whenever it can be
    if total_chars(pinned) + total_chars(history[last_user:]) <= budget:
        assert total_chars(out) <= budget
    # oldest first, and no more than needed: no longer user-led suffix would have fitted
    for i in users:
        if i < start:
            assert total_chars(history[i:]) > limit


@given(st.lists(message, max_size=14), st.integers(0, 900))
def test_trim_history_is_pure(history: list[dict], limit: int) -> None:
    before = [dict(m) for m in history]
    trim_history(history, limit)
    assert history == before


def _m(role: str, n: int) -> dict[str, str]:
    return {"role": role, "content": role[0] * n}


def test_pinned_size_is_subtracted_exactly_once() -> None:
    pinned = [_m("system", 100), _m("system", 50)]
    history = [_m("user", 100), _m("assistant", 100), _m("user", 100)]
    assert assemble(pinned, history, 450) == [*pinned, *history]  # exact fit: nothing dropped
    assert assemble(pinned, history, 449) == [*pinned, history[2]]  # one char over: the whole oldest turn goes


def test_orphaned_head_is_dropped_even_within_budget() -> None:
    history = [_m("assistant", 1), _m("tool", 1), _m("user", 1), _m("assistant", 1), _m("user", 1)]
    assert trim_history(history, 10_000) == history[2:]


def test_newest_user_message_survives_an_impossible_budget() -> None:
    history = [_m("user", 10), _m("assistant", 10), _m("user", 500)]
    assert trim_history(history, 0) == [history[2]]
    assert assemble([_m("system", 1000)], history, 10) == [_m("system", 1000), history[2]]


def test_milk_head_trim_pitfall_pinned_orientation_is_never_dropped() -> None:
    """The old trimmer dropped the head first: the orientation sat there and went first."""
    pinned = [{"role": "system", "content": "[Identity] ..." * 50}, {"role": "system", "content": "[Cycle brief]"}]
    history = [_m("user", 300), _m("assistant", 300)] * 5 + [_m("user", 10)]
    out = assemble(pinned, history, total_chars(pinned) + 700)
    assert out[:2] == pinned and out[2]["role"] == "user" and total_chars(out) <= total_chars(pinned) + 700


# -- reply parsing -----------------------------------------------------------------------------------------


def test_the_last_report_block_and_the_last_diff_block_win() -> None:
    text = (
        'first try:\n```evolve-report\n{"result": "failed"}\n```\n'
        "```diff\nold\n```\nbetter:\n```diff\nnew\n```\n"
        '```evolve-report\n{"result": "harvested", "summary": "s", "disposition": "d"}\n```\n'
    )
    r = report_from_reply(text)
    assert (r.result, r.summary, r.disposition) == ("harvested", "s", "d")


def test_missing_or_invalid_report_block_is_improved_and_the_gate_decides() -> None:
    r = report_from_reply("I changed things.\n```diff\nx\n```\n")
    assert r.result == "improved" and r.disposition == "no report block" and r.summary == "I changed things."
    r = report_from_reply("```evolve-report\n{not json\n```\n")
    assert r.result == "improved" and r.disposition.startswith("invalid report block")
    r = report_from_reply('```evolve-report\n{"result": "done"}\n```\n')
    assert r.result == "improved" and "invalid report block" in r.disposition
    r = report_from_reply('```evolve-report\n{"result": "failed", "error": "cannot"}\n```\n')
    assert r.result == "failed" and r.error == "cannot"


def test_a_fence_inside_a_diff_does_not_end_the_block(tmp_path: Path) -> None:
    from evolve.agent.http import _DIFF_BLOCK, last_block

    diff = "--- a/doc.md\n+++ b/doc.md\n@@ -1,3 +1,3 @@\n ```\n-x\n+y\n ```\n"
    assert last_block(_DIFF_BLOCK, f"text\n```diff\n{diff}```\nafter\n") == diff


def test_retry_after_parsing() -> None:
    assert retry_after_s("30") == 30
    assert retry_after_s(" 1.5 ") == 1.5
    assert retry_after_s("Wed, 21 Oct 2015 07:28:00 GMT", now=1445412480 - 60) == pytest.approx(60)
    assert retry_after_s("Wed, 21 Oct 2015 07:28:00 GMT", now=1445412480 + 60) == 0
    assert retry_after_s("soon") is None and retry_after_s(None) is None and retry_after_s("inf") is None


def test_session_ids_never_choose_the_path(tmp_path: Path) -> None:
    assert session_path(tmp_path, "0b6e-uuid").name == "0b6e-uuid.json"
    for hostile in ("../../etc/passwd", "/abs", ".hidden", "a/b", "", "x" * 300):
        p = session_path(tmp_path, hostile)
        assert p.parent == tmp_path and "/" not in p.name and not p.name.startswith(".")


# -- (1) pinned system messages survive trimming over several continuation cycles ----------------------------


def test_pinned_survive_trimming_across_continuation_cycles(env: Env, server: FakeOpenAI) -> None:
    probe = Harness(env.repo, server)
    pinned_chars = total_chars(probe.runner.messages(probe.inv(1, "s1", resume=False), None)[0][:2])
    budget = pinned_chars + 5000
    h = Harness(env.repo, server, message_budget_chars=budget)
    for cycle in range(1, 7):
        server.reply(reply(result="unchanged", summary=f"cycle {cycle}", pad=f"c{cycle}-" + "x" * 1200))
        r = h.run(h.inv(cycle, "s1", resume=cycle > 1))
        assert r.result == "unchanged" and r.session_id == "s1", r
    assert len(server.requests) == 6
    for n, req in enumerate(server.requests, start=1):
        inv = h.inv(n, "s1", resume=n > 1)
        assert req.path == "/v1/chat/completions"
        assert req.body["model"] == "m" and req.body["stream"] is False
        assert req.messages[0] == {"role": "system", "content": inv.orientation.static}
        assert req.messages[1] == {"role": "system", "content": inv.orientation.dynamic}
        assert req.roles()[2:].count("system") == 0
        hist = req.history()
        assert hist[0]["role"] == "user" and hist[-1]["role"] == "user"
        assert hist[-1]["content"].startswith(inv.orientation.task) and ANSWER_FORMAT in hist[-1]["content"]
        assert total_chars(req.messages) <= budget
    # early requests carry the whole conversation; late ones have dropped the oldest turns
    assert len(server.requests[1].history()) == 3
    last = server.requests[-1].history()
    texts = " ".join(m["content"] for m in last)
    assert "c5-" in texts and "c1-" not in texts
    assert [m["role"] for m in last] == ["user", "assistant"] * ((len(last) - 1) // 2) + ["user"]
    stored = h.session("s1")
    assert stored["messages"][-1]["role"] == "assistant" and "c6-" in stored["messages"][-1]["content"]
    assert (
        stored["boundaries"] == sorted(stored["boundaries"]) and stored["boundaries"][-1] == len(stored["messages"]) - 2
    )
    assert all(stored["messages"][b]["role"] == "user" for b in stored["boundaries"])
    assert stored["rebuilt"] is False


# -- (2) a stale return sends no prior turns; a continuation does -------------------------------------------


def test_stale_return_sends_no_prior_turns_while_continuation_does(env: Env, server: FakeOpenAI) -> None:
    h = Harness(env.repo, server)
    for _ in range(3):
        server.reply(reply(result="unchanged", pad="remember me"))
    h.run(h.inv(1, "sess-a", resume=False))
    h.run(h.inv(2, "sess-a", resume=True))
    # switching the work item: the mode decision makes it First with a new session id
    h.run(h.inv(3, "sess-b", resume=False, work=ITEM_B))
    first, cont, stale = server.requests
    assert first.roles() == ["system", "system", "user"]
    assert cont.roles() == ["system", "system", "user", "assistant", "user"]
    assert "remember me" in cont.messages[3]["content"]
    assert stale.roles() == ["system", "system", "user"]
    assert "remember me" not in orjson.dumps(stale.body).decode()
    assert "beta" in stale.messages[1]["content"]
    assert h.session("sess-b")["boundaries"] == [0]
    assert h.session("sess-a")["boundaries"] == [0, 2]


def test_resume_with_a_missing_session_file_starts_fresh_and_says_so(env: Env, server: FakeOpenAI) -> None:
    h = Harness(env.repo, server)
    server.reply(reply(result="unchanged"))
    r = h.run(h.inv(4, "gone", resume=True, mode="returning"))
    assert r.result == "unchanged" and r.session_id == "gone"
    assert server.requests[0].roles() == ["system", "system", "user"]
    assert h.session("gone")["rebuilt"] is True


def test_a_corrupt_session_file_is_rebuilt(env: Env, server: FakeOpenAI) -> None:
    h = Harness(env.repo, server)
    p = session_path(h.sessions, "bad")
    p.parent.mkdir(parents=True)
    p.write_text("{torn")
    assert load_session(p, "bad") is None
    server.reply(reply(result="unchanged"))
    h.run(h.inv(2, "bad", resume=True))
    assert server.requests[0].roles() == ["system", "system", "user"] and h.session("bad")["rebuilt"] is True


def test_fire_continuation_then_stale_return(env: Env, server: FakeOpenAI, fire_inproc) -> None:
    """Through the real mode decision: a failed cycle is continued on the same item; a new item starts fresh."""
    env.write_config(agent={"runner": "http", "base_url": server.url, "model": "m"})
    queued = entry("alpha", "beta")
    # beta failed before: alpha's retry then still comes first (a fresh item would: docs/DESIGN.md §6.1)
    queued["items"][1]["failed_at"] = "2026-01-01T00:00:00Z"
    env.queue(queued)
    server.reply(reply(BAD_DIFF, pad="attempt one"))
    server.reply(reply(NEW_FILE_DIFF))
    server.reply(reply(result="unchanged"))
    out = fire_inproc(cycles=3)
    assert [e["result"] for e in out.entries] == ["failed", "improved", "unchanged"], out.entries
    assert [e["agent_mode"] for e in out.entries] == ["first", "continuation", "first"]
    one, two, three = server.requests
    assert one.roles() == ["system", "system", "user"]
    assert two.roles() == ["system", "system", "user", "assistant", "user"]
    assert "attempt one" in two.messages[3]["content"]
    assert "was not applied" in two.messages[4]["content"]  # the model is told its diff was rejected
    assert three.roles() == ["system", "system", "user"] and "attempt one" not in orjson.dumps(three.body).decode()
    assert out.entries[0]["session_id"] == out.entries[1]["session_id"] != out.entries[2]["session_id"]


# -- (3) end to end: the server's diff is applied, gated and committed ---------------------------------------


def test_fire_applies_the_diff_and_commits_it(env: Env, server: FakeOpenAI, fire_inproc) -> None:
    env.write_config(agent={"runner": "http", "base_url": server.url, "model": "m"})
    env.queue(entry("alpha"))
    server.reply(reply(NEW_FILE_DIFF, summary="added hello"), prompt_tokens=1234, completion_tokens=56)
    before = head(env.repo)
    out = fire_inproc(cycles=1)
    assert out.exit_code == 0
    (e,) = env.ledger()
    assert e["result"] == "improved" and e["agent_mode"] == "first" and e["summary"] == "added hello"
    assert e["usage"]["input_tokens"] == 1234 and e["usage"]["output_tokens"] == 56
    assert e["sha"] == head(env.repo) != before
    assert git(env.repo, "log", "-1", "--format=%s").startswith("evolve: cycle 1 -- alpha improved")
    assert git(env.repo, "show", "HEAD:src/hello.txt") == "hello\nworld\n"
    assert status(env.repo) == ""
    (req,) = server.requests
    assert "alpha" in req.messages[1]["content"]
    q = live(env.paths.nextwork)[0]
    assert q["items"][0]["claim_status"] == "consumed"
    assert env.state()["agent_session"]["runner"] == "http"


def test_dry_run_plans_a_post_and_sends_nothing(env: Env, server: FakeOpenAI, fire_inproc) -> None:
    env.write_config(agent={"runner": "http", "base_url": server.url + "/", "model": "m"})
    env.queue(entry("alpha"))
    out = fire_inproc(dry_run=True, extra_env={"OPENAI_API_KEY": SECRET})
    agent = out.entries[0]["agent"]
    assert agent["argv"] == ["POST", server.url + "/chat/completions"] and agent["env"] == {}
    assert SECRET not in orjson.dumps(out.entries).decode()
    assert server.requests == []


def test_usage_and_context_window(env: Env, server: FakeOpenAI) -> None:
    h = Harness(env.repo, server)
    h.runner.context_window = 8192
    server.reply(reply(result="unchanged"), prompt_tokens=4000, completion_tokens=10)
    started: list[int] = []
    r = h.run(h.inv(1, "s", resume=False), on_start=started.append)
    assert (r.usage.input_tokens, r.usage.output_tokens, r.context_window, r.num_turns) == (4000, 10, 8192, 1)
    assert started == []  # no child process, no process group to record
    assert h.runner.plan(h.inv(1, "s", resume=False)) == (["POST", f"{server.url}/chat/completions"], {})


# -- (4) a diff that does not apply fails the cycle and leaves the tree exactly as it was -------------------


def test_fire_bad_diff_is_failed_and_the_tree_is_untouched(env: Env, server: FakeOpenAI, fire_inproc) -> None:
    env.write_config(agent={"runner": "http", "base_url": server.url, "model": "m"})
    env.queue(entry("alpha"))
    server.reply(reply(BAD_DIFF))
    before = head(env.repo)
    out = fire_inproc(cycles=1)
    (e,) = out.entries
    assert e["result"] == "failed" and e["error_class"] == "transient"
    assert "diff rejected" in e["error"]
    assert head(env.repo) == before and status(env.repo) == ""
    assert (env.repo / "README.md").read_text() == "# test repo\n"
    q = live(env.paths.nextwork)[0]
    assert q["items"][0]["claim_status"] == "available"


@pytest.mark.parametrize(
    "diff, why",
    [
        (BAD_DIFF, "patch does not apply"),
        (NEW_FILE_DIFF + BAD_DIFF, "patch does not apply"),  # one good file, one bad: nothing at all is applied
        ("this is not a diff\n", "no valid patches"),
        ("", "empty diff"),
        (NEW_FILE_DIFF.replace("src/hello.txt", ".agents/evolve/STOP"), ".agents/ or .git/"),
        (NEW_FILE_DIFF.replace("src/hello.txt", "../outside.txt"), "outside the repository"),
        (NEW_FILE_DIFF.replace("src/hello.txt", ".git/hooks/post-commit"), ".agents/ or .git/"),
    ],
)
def test_rejected_diffs_leave_the_tree_exactly_as_it_was(env: Env, server: FakeOpenAI, diff: str, why: str) -> None:
    (env.repo / "notes.txt").write_text("operator's untracked work\n")
    git(env.repo, "add", "-N", "notes.txt")  # even an intent-to-add entry in the index stays as it was
    h = Harness(env.repo, server)
    server.reply(reply(diff))
    before_status, before_head = status(env.repo), head(env.repo)
    before_index = git(env.repo, "ls-files", "-s")
    r = h.run(h.inv(1, "s", resume=False))
    assert r.result == "failed" and r.error_class == "transient" and "diff rejected" in r.error
    assert why.lower() in r.error.lower()
    assert not r.retryable
    assert status(env.repo) == before_status and head(env.repo) == before_head
    assert git(env.repo, "ls-files", "-s") == before_index
    assert not (env.repo / ".agents" / "evolve" / "STOP").exists()
    assert not (env.root / "outside.txt").exists()


def test_a_diff_touching_a_dirty_path_is_rejected(env: Env, server: FakeOpenAI) -> None:
    (env.repo / "README.md").write_text("# test repo\noperator edit\n")
    diff = "--- a/README.md\n+++ b/README.md\n@@ -1 +1,2 @@\n # test repo\n+agent line\n"
    h = Harness(env.repo, server)
    server.reply(reply(diff))
    before = status(env.repo)
    r = h.run(h.inv(1, "s", resume=False))
    assert r.result == "failed" and "uncommitted changes" in r.error and "README.md" in r.error
    assert status(env.repo) == before and (env.repo / "README.md").read_text() == "# test repo\noperator edit\n"


def test_a_good_diff_edits_renames_and_leaves_the_index_alone(env: Env, server: FakeOpenAI) -> None:
    (env.repo / "a.txt").write_text("one\ntwo\n")
    git(env.repo, "add", "a.txt")
    git(env.repo, "commit", "-q", "-m", "a")
    diff = (
        "diff --git a/a.txt b/b.txt\nsimilarity index 50%\nrename from a.txt\nrename to b.txt\n"
        "--- a/a.txt\n+++ b/b.txt\n@@ -1,2 +1,2 @@\n one\n-two\n+three\n"
        "diff --git a/README.md b/README.md\n--- a/README.md\n+++ b/README.md\n@@ -1 +1,2 @@\n # test repo\n+more\n"
    )
    h = Harness(env.repo, server)
    server.reply(reply(diff))
    r = h.run(h.inv(1, "s", resume=False))
    assert r.result == "improved", r.error
    assert (env.repo / "b.txt").read_text() == "one\nthree\n" and not (env.repo / "a.txt").exists()
    assert (env.repo / "README.md").read_text() == "# test repo\nmore\n"
    assert git(env.repo, "diff", "--cached", "--name-only") == ""  # nothing staged: the gate stages by path
    assert sorted(status(env.repo).splitlines()) == [" D a.txt", " M README.md", "?? b.txt"]


def test_a_scout_or_failed_report_never_applies_its_diff(env: Env, server: FakeOpenAI) -> None:
    h = Harness(env.repo, server)
    server.reply(reply(NEW_FILE_DIFF, result="scout"))
    server.reply(reply(NEW_FILE_DIFF, result="failed"))
    assert h.run(h.inv(1, "s", resume=False)).result == "scout"
    assert h.run(h.inv(2, "s", resume=True)).result == "failed"
    assert status(env.repo) == ""


def test_no_diff_block_changes_nothing(env: Env, server: FakeOpenAI) -> None:
    h = Harness(env.repo, server)
    server.reply("All done, nothing to change.")
    r = h.run(h.inv(1, "s", resume=False))
    assert r.result == "improved" and r.disposition == "no report block" and status(env.repo) == ""


# -- (5) the error taxonomy -----------------------------------------------------------------------------------


def test_fire_rate_limit_exits_75_and_keeps_the_item(env: Env, server: FakeOpenAI, fire_inproc) -> None:
    env.write_config(agent={"runner": "http", "base_url": server.url, "model": "m"})
    env.queue(entry("alpha"))
    # a reset beyond the fire's remaining budget: no waiting inside the fire
    server.push(Scripted(429, {"error": {"message": "slow down"}}, headers={"Retry-After": "7200"}))
    out = fire_inproc(cycles=1)
    assert out.exit_code == 75
    (e,) = env.ledger()
    assert e["result"] == "failed" and e["error_class"] == "limit" and "retry_after=7200" in e["error"]
    q = live(env.paths.nextwork)[0]
    assert q["items"][0]["claim_status"] == "available" and q["items"][0]["consumed"] is False
    assert env.state()["consecutive_failures"] == 0


@pytest.mark.parametrize(
    "step, error_class, text",
    [
        (Scripted(429, {"error": "rate"}, headers={"Retry-After": "30"}), "limit", "retry_after=30"),
        (Scripted(500, {"error": "boom"}), "transient", "HTTP 500"),
        (Scripted(503, "overloaded"), "transient", "HTTP 503"),
        (Scripted(401, {"error": "bad key"}), "fatal", "HTTP 401"),
        (Scripted(403, {"error": "forbidden"}), "fatal", "HTTP 403"),
        (Scripted(404, {"error": "model m not found"}), "fatal", "model m not found"),
        (Scripted(200, b"<html>proxy error</html>"), "transient", "malformed"),
        (Scripted(200, {"choices": []}), "transient", "malformed"),
        (Scripted(200, {"choices": [{"message": {"content": None}}]}), "transient", "malformed"),
        (Scripted(302, b"", headers={"Location": "http://example.invalid/"}), "fatal", "HTTP 302"),
    ],
)
def test_error_taxonomy(env: Env, server: FakeOpenAI, step: Scripted, error_class: str, text: str) -> None:
    h = Harness(env.repo, server)
    server.push(step)
    r = h.run(h.inv(1, "s", resume=False))
    assert (r.result, r.error_class) == ("failed", error_class), r
    assert text in r.error and r.session_id == "s"
    assert r.retryable == (error_class == "transient")
    assert not session_path(h.sessions, "s").exists()  # no reply, no turn recorded
    assert len(server.requests) == 1


def test_context_overflow_from_the_server_is_a_heavy_signal(env: Env, server: FakeOpenAI) -> None:
    h = Harness(env.repo, server)
    server.push(Scripted(400, {"error": {"message": "This model's maximum context length is 8192 tokens"}}))
    r = h.run(h.inv(1, "s", resume=False))
    assert r.result == "failed" and r.context_overflow and not r.retryable


def test_a_slow_response_past_the_fires_budget_is_a_timeout(
    env: Env, server: FakeOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    from evolve import procgroup

    monkeypatch.setattr(procgroup, "STEP_GRACE_S", 0.5)
    h = Harness(env.repo, server, timeout_s=3600)  # its own limit would wait an hour
    server.push(Scripted(200, completion(reply()), delay=5))
    with procgroup.fire_budget(lambda: 0.0):  # the fire is out of time
        r = h.run(h.inv(1, "s", resume=False))
    assert (r.result, r.error_class) == ("failed", "timeout")


def test_slow_response_beyond_timeout_is_timeout(env: Env, server: FakeOpenAI) -> None:
    h = Harness(env.repo, server, timeout_s=0.5)
    server.push(Scripted(200, completion(reply()), delay=3))
    beats: list[float] = []
    t0 = time.monotonic()
    r = h.run(h.inv(1, "s", resume=False), on_heartbeat=beats.append)
    assert time.monotonic() - t0 < 2.5
    assert (r.result, r.error_class) == ("failed", "timeout") and "0.5s" in r.error
    assert len(beats) >= 2 and beats == sorted(beats)
    assert status(env.repo) == ""


def test_stop_event_interrupts_the_wait(env: Env, server: FakeOpenAI) -> None:
    h = Harness(env.repo, server)
    server.push(Scripted(200, completion(reply(NEW_FILE_DIFF)), delay=3))
    stop = threading.Event()
    threading.Timer(0.3, stop.set).start()
    t0 = time.monotonic()
    r = h.run(h.inv(1, "s", resume=False), stop=stop)
    assert time.monotonic() - t0 < 2.5
    assert (r.result, r.error_class) == ("failed", "interrupted")
    assert status(env.repo) == ""


def test_connection_refused_is_transient(env: Env, server: FakeOpenAI) -> None:
    port = server.httpd.server_address[1]
    server.close()
    h = Harness(env.repo, server, base_url=f"http://127.0.0.1:{port}/v1")
    r = h.run(h.inv(1, "s", resume=False))
    assert (r.result, r.error_class, r.retryable) == ("failed", "transient", True) and "cannot reach" in r.error


@pytest.mark.parametrize("url", ["", "file:///etc/passwd", "ftp://x/v1"])
def test_a_non_http_base_url_is_fatal_and_sends_nothing(env: Env, server: FakeOpenAI, url: str) -> None:
    h = Harness(env.repo, server, base_url=url)
    r = h.run(h.inv(1, "s", resume=False))
    assert (r.result, r.error_class) == ("failed", "fatal") and "base_url" in r.error
    assert server.requests == []


# -- (6) the API key goes in the header and nowhere else -----------------------------------------------------


def test_api_key_is_sent_as_bearer_and_written_nowhere(env: Env, server: FakeOpenAI, fire_inproc) -> None:
    env.write_config(agent={"runner": "http", "base_url": server.url, "model": "m"})
    env.queue(entry("alpha", "beta", "gamma"))
    server.reply(reply(NEW_FILE_DIFF))
    server.reply(reply(BAD_DIFF))
    # an error body echoing the key back must not carry it into the ledger
    server.push(Scripted(401, {"error": f"invalid key {SECRET}"}))
    out = fire_inproc(cycles=3, extra_env={"OPENAI_API_KEY": SECRET})
    assert [e["result"] for e in out.entries] == ["improved", "failed", "failed"]
    assert out.entries[-1]["error_class"] == "fatal" and "[redacted]" in out.entries[-1]["error"]
    assert [r.headers.get("Authorization") for r in server.requests] == [f"Bearer {SECRET}"] * 3
    for req in server.requests:
        assert SECRET not in orjson.dumps(req.body).decode()
    leaks = [p for p in (env.repo / ".agents").rglob("*") if p.is_file() and SECRET.encode() in p.read_bytes()]
    assert leaks == []
    assert SECRET.encode() not in env.paths.ledger.read_bytes()
    assert SECRET.encode() not in (env.root / "inproc-log.jsonl").read_bytes()
    assert SECRET not in git(env.repo, "log", "-p", "--all")


def test_no_authorization_header_without_the_key(env: Env, server: FakeOpenAI) -> None:
    h = Harness(env.repo, server, env={"OTHER": "x"})
    server.reply(reply(result="unchanged"))
    h.run(h.inv(1, "s", resume=False))
    assert "Authorization" not in server.requests[0].headers


def test_custom_key_env_name(env: Env, server: FakeOpenAI) -> None:
    h = Harness(env.repo, server, api_key_env="LLAMA_KEY", env={"LLAMA_KEY": "k-123", "OPENAI_API_KEY": "nope"})
    server.reply(reply(result="unchanged"))
    h.run(h.inv(1, "s", resume=False))
    assert server.requests[0].headers["Authorization"] == "Bearer k-123"
