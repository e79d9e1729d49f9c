"""Bad input never stops the loop and is never silently dropped (torn, corrupt, malformed, hostile)."""

from __future__ import annotations

import orjson
from support import Env, entry, git, improved_step, live, results

HOSTILE = "x'; rm -rf / #$(touch PWNED)`touch PWNED2`|&;<>\n\x1b[31mred\x00\u202e"


def test_torn_ledger_line_is_moved_aside_and_the_fire_continues(env: Env, cli) -> None:
    env.queue(entry("a"))
    env.paths.evolve_dir.mkdir(parents=True, exist_ok=True)
    good = orjson.dumps({"cycle": 1, "result": "improved", "timestamp": "2026-01-01T00:00:00Z"}) + b"\n"
    torn = b'{"cycle": 2, "result": "impr'
    env.paths.ledger.write_bytes(good + torn)
    r = cli("fire", "--cycles", "1")
    assert r.code == 0, r.stderr
    assert "ledger.torn_line" in r.names()
    asides = list(env.paths.evolve_dir.glob("cycle-history.jsonl.torn-*"))
    assert len(asides) == 1 and asides[0].read_bytes() == torn
    ledger = env.ledger()
    assert [e["cycle"] for e in ledger] == [1, 2] and ledger[1]["result"] == "improved"


def test_malformed_ledger_lines_are_skipped_and_kept(env: Env, cli) -> None:
    env.queue(entry("a"))
    env.paths.evolve_dir.mkdir(parents=True, exist_ok=True)
    raw = (orjson.dumps({"cycle": 4, "result": "improved"}) + b"\nnot json at all\n[1,2]\n\xff\xfe\n")
    env.paths.ledger.write_bytes(raw)
    r = cli("fire", "--cycles", "1")
    assert r.code == 0, r.stderr
    data = env.paths.ledger.read_bytes()
    assert data.startswith(raw)  # the bad lines are still there, untouched
    last = orjson.loads(data.splitlines()[-1])
    assert last["cycle"] == 5
    h = cli("history", "--limit", "10")
    assert "3 malformed line(s) skipped" in h.stdout


def test_corrupt_session_state_is_moved_aside_and_rebuilt(env: Env, cli) -> None:
    env.queue(entry("a", "b"))
    assert cli("fire", "--cycles", "1").code == 0
    bad = b'{"context_streak": 1, "parked_work": [tru'
    env.paths.state.write_bytes(bad)
    r = cli("fire", "--cycles", "1")
    assert r.code == 0, r.stderr
    assert "state.repaired" in r.names()
    asides = list(env.paths.evolve_dir.glob("session-state.json.corrupt-*"))
    assert len(asides) == 1 and asides[0].read_bytes() == bad
    st = env.state()
    assert st["last_logged_cycle"] == 2 and st["last_result"] == "improved"
    assert results(env.ledger()) == ["improved", "improved"]


def test_session_state_keeps_unknown_keys(env: Env, cli) -> None:
    env.queue(entry("a"))
    env.paths.evolve_dir.mkdir(parents=True, exist_ok=True)
    env.paths.state.write_bytes(orjson.dumps({"queue_refresh_count": 7, "repo_profile_path": "x.md",
                                              "context_streak": 1}))
    assert cli("fire", "--cycles", "1").code == 0
    st = env.state()
    assert st["queue_refresh_count"] == 7 and st["repo_profile_path"] == "x.md"
    assert st["context_streak"] == 0  # improved reset it


def test_malformed_queue_lines_are_skipped_and_preserved(env: Env, cli) -> None:
    env.paths.nextwork.parent.mkdir(parents=True, exist_ok=True)
    good = orjson.dumps(entry("a", extra_field={"keep": [1, 2]})) + b"\n"
    junk = b"{broken json\n\x00\x01binary\n"
    legacy = orjson.dumps({"title": "legacy flat row", "severity": "low", "type": "chore", "mystery": 1}) + b"\n"
    env.paths.nextwork.write_bytes(junk + good + legacy)
    r = cli("fire", "--cycles", "2")
    assert r.code == 0, r.stderr
    data = env.paths.nextwork.read_bytes()
    assert data.startswith(junk)
    # (both lines outgrew their places on the claim: moved to the end, tombstones left)
    e = next(x for x in live(env.paths.nextwork) if x.get("source_epic") == "e1")
    assert e["items"][0]["extra_field"] == {"keep": [1, 2]}
    assert e["items"][0]["claim_status"] == "consumed" and e["consumed"] is True
    flat = next(x for x in live(env.paths.nextwork) if "mystery" in x)
    assert flat["mystery"] == 1 and flat["claim_status"] == "consumed"
    assert [x["title"] for x in env.ledger()] == ["a", "legacy flat row"]


def test_hostile_title_never_reaches_a_shell(env: Env, cli) -> None:
    env.queue(entry(HOSTILE))
    r = cli("fire", "--cycles", "1")
    assert r.code == 0, r.stderr
    assert not (env.repo / "PWNED").exists() and not (env.repo / "PWNED2").exists()
    assert not (env.root / "PWNED").exists()
    call = env.calls()[0]
    work = orjson.loads(call["env"]["EVOLVE_WORK_JSON"])
    # The agent got the title verbatim through env (data), cleaned of control characters.
    assert "rm -rf" in work["title"] and "\x00" not in work["title"] and "\x1b" not in work["title"]
    e = env.ledger()[0]
    assert e["result"] == "improved" and e["work_ref"].endswith(HOSTILE)
    subject = git(env.repo, "log", "-1", "--format=%s").strip()
    assert subject.startswith("evolve: cycle 1 -- x'; rm -rf /")
    assert "\x1b" not in subject and "\n" not in subject
    # The claim was finalized on the exact hostile item.
    item = live(env.paths.nextwork)[0]["items"][0]
    assert item["title"] == HOSTILE and item["claim_status"] == "consumed"


def test_hostile_title_as_argv_element_is_one_argument(env: Env, cli) -> None:
    import sys

    env.write_config(agent={"argv": [sys.executable, "-m", "evolve.agent.scripted", "--script", str(env.script),
                                     "--work={work_json}", "{session_id}"]})
    env.steps([improved_step()])
    env.queue(entry("a b; echo $(id) > PWNED"))
    assert cli("fire", "--cycles", "1").code == 0
    argv = env.calls()[0]["argv"]
    assert len(argv) == 4  # --script FILE --work=... <session id>
    assert argv[2].startswith("--work=") and "a b; echo $(id) > PWNED" in argv[2]
    assert not (env.repo / "PWNED").exists()


def test_wrong_config_type_is_a_one_line_error(env: Env, cli) -> None:
    env.write_config(fire={"max_cycles": "five"})
    r = cli("fire")
    assert r.code == 78
    assert len(r.stderr.strip().splitlines()) == 1
    assert "fire.max_cycles" in r.stderr and "config.toml" in r.stderr
    assert not env.paths.ledger.exists()
