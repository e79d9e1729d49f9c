from support import Env, entry, heavy_step, improved_step, results


def test_improved_cycle_commits_and_consumes(env: Env, fire_inproc) -> None:
    env.queue(entry("alpha"))
    out = fire_inproc(cycles=1)
    assert out.exit_code == 0
    assert results(env.ledger()) == ["improved"]
    q = env.paths.nextwork.read_bytes()
    assert b'"claim_status":"consumed"' in q


def test_handoff_after_two_heavy(env: Env, fire_inproc) -> None:
    env.queue(entry("alpha", "beta"))
    env.steps([heavy_step("scout"), heavy_step("harvested"), improved_step()])
    out = fire_inproc()
    assert out.reason == "context-handoff"
    assert results(env.ledger()) == ["scout", "harvested", "context-handoff"]
