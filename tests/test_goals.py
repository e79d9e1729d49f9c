"""Goals (docs/DESIGN.md §6.3): GOALS.md / GOALS.yaml parsing, measuring real checks in bash, snapshots, work items."""

from __future__ import annotations

import subprocess
import textwrap
import time
from pathlib import Path

import orjson
import pytest

from evolve.work.goals import (
    Directive,
    Goal,
    GoalsError,
    GoalsFile,
    MeasureError,
    capture_baseline,
    directive_item,
    failing_goals,
    goal_item,
    load_goals,
    measure,
    read_snapshot,
    snapshot_path,
    write_snapshot,
)
from evolve.work.item import SourceError

FAST = {"goal_timeout_s": 5.0, "total_timeout_s": 20.0}


def _write(repo: Path, name: str, text: str) -> Path:
    path = repo / name
    path.write_text(textwrap.dedent(text).lstrip("\n"))
    return path


def _yaml(repo: Path, goals: list[dict], version: int = 2, name: str = "GOALS.yaml") -> Path:
    path = repo / name
    path.write_bytes(orjson.dumps({"version": version, "mission": "m", "goals": goals}))  # JSON is YAML
    return path


def _gf(repo: Path, *goals: Goal) -> GoalsFile:
    return GoalsFile(path=repo / "GOALS.yaml", era="0123456789ab", goals=goals, directives=(), version="2")


def _goal(gid: str, check: str, weight: int = 5, **kw) -> Goal:
    return Goal(id=gid, description=f"desc {gid}", check=check, weight=weight, **kw)


def _by_id(snap: dict) -> dict[str, dict]:
    return {e["goal_id"]: e for e in snap["goals"]}


def _gone(pid: int) -> bool:
    """Dead or a zombie waiting for init: either way it runs no more."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat[stat.rfind(")") + 2] in "ZX"


# --------------------------------------------------------------------------------------------------------------
# Parsing

MD = """
    # Goals

    Keep the widget factory healthy. Mission text is free.

    ## North Stars

    - fast builds

    ## Anti Stars

    - flaky tests

    ## Directives

    ### 1. Harden the parser
    Handle every malformed input
    without crashing.
    **Steer:** increase
    **Directive ID:** `harden-parser`
    **Scenarios:** S1, S2

    ### 2. Trim dependencies
    **Steer:** decrease

    ## Gates

    | ID | Check | Weight | Description | Tags |
    |----|-------|-------:|-------------|------|
    | tests-pass | `python -m pytest -q` | 8 | Tests pass | ci, core |
    | pipe-in-code | `grep -c x file | wc -l` | 3 | Pipe inside backticks | |
    | escaped | echo a \\| tr a b | 2 | Escaped pipe | |
    | `lint` | ``ruff check . `x` `` | 10 | | lint |

    ```
    | ID | Check | Weight | Description | Tags |
    |---|---|---|---|---|
    | fenced | false | 1 | ignored: inside a code fence | |
    ```
    """


def test_markdown_v4_directives_and_gates_table(tmp_path: Path) -> None:
    _write(tmp_path, "GOALS.md", MD)
    gf = load_goals(tmp_path)
    assert gf is not None and gf.version == "4" and gf.path == tmp_path / "GOALS.md"
    assert gf.directives == (
        Directive(number=1, title="Harden the parser", description="Handle every malformed input\nwithout crashing.",
                  steer="increase", directive_id="harden-parser", scenarios="S1, S2"),
        Directive(number=2, title="Trim dependencies", steer="decrease"),
    )
    assert [g.id for g in gf.goals] == ["tests-pass", "pipe-in-code", "escaped", "lint"]
    tests, pipe, escaped, lint = gf.goals
    assert tests == Goal(id="tests-pass", description="Tests pass", check="python -m pytest -q", weight=8,
                         type="health", tags=("ci", "core"))
    assert pipe.check == "grep -c x file | wc -l" and pipe.tags == ()
    assert escaped.check == "echo a | tr a b"
    assert lint.check == "ruff check . `x`" and lint.description == "lint" and lint.weight == 10


def test_markdown_gates_header_is_case_insensitive(tmp_path: Path) -> None:
    _write(tmp_path, "GOALS.md", """
        Mission only.

        ## Gates
        The table follows.
        | id | CHECK | weight | description | tags |
        | --- | --- | --- | --- | --- |
        | a | true | 1 | A | |
        """)
    gf = load_goals(tmp_path)
    assert gf is not None and [(g.id, g.check, g.weight) for g in gf.goals] == [("a", "true", 1)]
    assert gf.directives == ()


@pytest.mark.parametrize("text", ["", "# Goals\n\nJust a mission.\n\n## North Stars\n\n- x\n"])
def test_markdown_without_table_or_directives_is_valid_and_empty(tmp_path: Path, text: str) -> None:
    (tmp_path / "GOALS.md").write_text(text)
    gf = load_goals(tmp_path)
    assert gf is not None and gf.goals == () and gf.directives == ()


def test_yaml_v2_fields_and_defaults(tmp_path: Path) -> None:
    _write(tmp_path, "GOALS.yaml", """
        version: 2
        mission: Keep it green
        goals:
          - id: unit-tests
            description: Unit tests pass
            check: pytest -q
            weight: 9
            type: quality
            pillar: testing
            tags: [ci, fast]
          - id: coverage
            description: Coverage
            check: ./coverage.sh
            weight: 4
            continuous: {metric: coverage_pct, threshold: 80}
          - id: meta-gate
            description: Meta
            check: "true"
            weight: 1
            type: meta
        """)
    gf = load_goals(tmp_path)
    assert gf is not None and gf.version == "2" and gf.directives == ()
    unit, cov, meta = gf.goals
    assert unit == Goal(id="unit-tests", description="Unit tests pass", check="pytest -q", weight=9, type="quality",
                        tags=("ci", "fast"))
    assert cov.type == "health" and cov.continuous == {"metric": "coverage_pct", "threshold": 80}
    assert meta.type == "meta"


@pytest.mark.parametrize("version", [1, 3])
def test_yaml_versions_1_and_3_accepted(tmp_path: Path, version: int) -> None:
    _yaml(tmp_path, [{"id": "a", "description": "A", "check": "true", "weight": 1}], version=version)
    gf = load_goals(tmp_path)
    assert gf is not None and gf.version == str(version) and [g.id for g in gf.goals] == ["a"]


def test_precedence_md_then_yaml_then_yml(tmp_path: Path) -> None:
    assert load_goals(tmp_path) is None
    _yaml(tmp_path, [{"id": "from-yml", "description": "d", "check": "true", "weight": 1}], name="GOALS.yml")
    assert [g.id for g in load_goals(tmp_path).goals] == ["from-yml"]  # type: ignore[union-attr]
    _yaml(tmp_path, [{"id": "from-yaml", "description": "d", "check": "true", "weight": 1}])
    assert [g.id for g in load_goals(tmp_path).goals] == ["from-yaml"]  # type: ignore[union-attr]
    _write(tmp_path, "GOALS.md", _HDR + "| from-md | true | 1 | d | |\n")
    gf = load_goals(tmp_path)
    assert gf is not None and gf.path.name == "GOALS.md" and [g.id for g in gf.goals] == ["from-md"]


def test_md_wins_even_when_the_yaml_is_malformed(tmp_path: Path) -> None:
    (tmp_path / "GOALS.yaml").write_text("goals: [unclosed\n")
    (tmp_path / "GOALS.md").write_text("mission\n")
    assert load_goals(tmp_path) is not None


GOOD = {"id": "a", "description": "A", "check": "true", "weight": 5}

BAD_YAML = {
    "invalid yaml": b"version: 2\ngoals: [unclosed\n  - {\n",
    "not utf-8": b"version: 2\ngoals: []\n# \xff\xfe\n",
    "top level list": b"- id: a\n",
    "missing version": b"goals: []\n",
    "version 4": b"version: 4\ngoals: []\n",
    "goals not a list": b"version: 2\ngoals: {a: 1}\n",
    "goal not a mapping": orjson.dumps({"version": 2, "goals": ["a"]}),
    "missing id": orjson.dumps({"version": 2, "goals": [{**GOOD, "id": ""}]}),
    "duplicate ids": orjson.dumps({"version": 2, "goals": [GOOD, {**GOOD, "check": "false"}]}),
    "missing check": orjson.dumps({"version": 2, "goals": [{k: v for k, v in GOOD.items() if k != "check"}]}),
    "blank check": orjson.dumps({"version": 2, "goals": [{**GOOD, "check": "  "}]}),
    "weight 0": orjson.dumps({"version": 2, "goals": [{**GOOD, "weight": 0}]}),
    "weight 11": orjson.dumps({"version": 2, "goals": [{**GOOD, "weight": 11}]}),
    "weight float": orjson.dumps({"version": 2, "goals": [{**GOOD, "weight": 5.5}]}),
    "weight bool": orjson.dumps({"version": 2, "goals": [{**GOOD, "weight": True}]}),
    "weight word": orjson.dumps({"version": 2, "goals": [{**GOOD, "weight": "high"}]}),
    "weight missing": orjson.dumps({"version": 2, "goals": [{k: v for k, v in GOOD.items() if k != "weight"}]}),
    "bad type": orjson.dumps({"version": 2, "goals": [{**GOOD, "type": "vibes"}]}),
    "tags mapping": orjson.dumps({"version": 2, "goals": [{**GOOD, "tags": {"a": 1}}]}),
    "continuous list": orjson.dumps({"version": 2, "goals": [{**GOOD, "continuous": [1]}]}),
    "threshold word": orjson.dumps({"version": 2, "goals": [{**GOOD, "continuous": {"metric": "m",
                                                                                    "threshold": "x"}}]}),
}

_HDR = "## Gates\n\n| ID | Check | Weight | Description | Tags |\n|---|---|---|---|---|\n"
# A bad row costs that row only (upstream's leniency): (goals kept as (id, check, weight), warning or None).
BAD_MD: dict[str, tuple[str, list[tuple[str, str, int]], str | None]] = {
    "too few columns": (_HDR + "| a | true | 7 | A |\n", [("a", "true", 7)], None),
    "too many columns": (_HDR + "| a | true | 5 | A | t | extra |\n", [], "row has 6 cells, the header 5; skipped"),
    "weight not int": (_HDR + "| a | true | five | A | |\n", [("a", "true", 5)], "default weight 5 used"),
    "weight out of range": (_HDR + "| a | true | 0 | A | |\n", [("a", "true", 5)], "default weight 5 used"),
    "duplicate ids": (_HDR + "| a | true | 6 | A | |\n| a | false | 5 | A2 | |\n", [("a", "true", 6)],
                      "goal 'a' already defined; row skipped"),
    "missing check": (_HDR + "| a |  | 5 | A | |\n", [], "missing check; row skipped"),
    "blank code check": (_HDR + "| a | ` ` | 5 | A | |\n", [], "missing check; row skipped"),
    "missing id": (_HDR + "|  | true | 5 | A | |\n", [], "missing id; row skipped"),
}


@pytest.mark.parametrize("case", sorted(BAD_YAML))
def test_malformed_yaml_is_a_goals_error_naming_the_file(tmp_path: Path, case: str) -> None:
    (tmp_path / "GOALS.yaml").write_bytes(BAD_YAML[case])
    with pytest.raises(GoalsError) as exc:
        load_goals(tmp_path)
    assert isinstance(exc.value, SourceError)
    msg = str(exc.value)
    assert str(tmp_path / "GOALS.yaml") in msg and "\n" not in msg


@pytest.mark.parametrize("case", sorted(BAD_MD))
def test_a_bad_markdown_row_costs_that_row_only(tmp_path: Path, case: str) -> None:
    text, kept, warning = BAD_MD[case]
    good = "| z | exit 1 | 9 | Z | |\n"  # a healthy row after the bad one is still a goal
    (tmp_path / "GOALS.md").write_text("# Goals\n\n" + text + good)
    gf = load_goals(tmp_path)
    assert gf is not None
    assert [(g.id, g.check, g.weight) for g in gf.goals] == [*kept, ("z", "exit 1", 9)]
    if warning is None:
        assert gf.warnings == ()
    else:
        (w,) = gf.warnings
        assert w.startswith(f"{tmp_path / 'GOALS.md'}: line ") and warning in w and "\n" not in w


def test_yml_error_names_the_yml_file(tmp_path: Path) -> None:
    (tmp_path / "GOALS.yml").write_text("version: 2\ngoals: 3\n")
    with pytest.raises(GoalsError, match=r"GOALS\.yml: goals must be a list"):
        load_goals(tmp_path)


def test_era_is_sha256_prefix_and_changes_with_the_file(tmp_path: Path) -> None:
    import hashlib

    path = _yaml(tmp_path, [GOOD])
    era1 = load_goals(tmp_path).era  # type: ignore[union-attr]
    assert era1 == hashlib.sha256(path.read_bytes()).hexdigest()[:12]
    assert load_goals(tmp_path).era == era1  # type: ignore[union-attr]
    _yaml(tmp_path, [{**GOOD, "weight": 6}])
    era2 = load_goals(tmp_path).era  # type: ignore[union-attr]
    assert era2 != era1 and len(era2) == 12


# --------------------------------------------------------------------------------------------------------------
# Measuring


def test_pass_fail_skip_and_summary(tmp_path: Path) -> None:
    gf = _gf(tmp_path, _goal("ok", "echo fine", 8), _goal("bad", "echo broken >&2; exit 3", 2),
             _goal("skipped", "exit 77", 10))
    snap = measure(tmp_path, gf, now=0.0, **FAST)
    assert snap["timestamp"] == "1970-01-01T00:00:00Z" and snap["goals_era"] == gf.era
    assert snap["git_sha"] is None  # not a git repo
    res = _by_id(snap)
    assert [e["goal_id"] for e in snap["goals"]] == ["ok", "bad", "skipped"]
    assert (res["ok"]["result"], res["bad"]["result"], res["skipped"]["result"]) == ("pass", "fail", "skip")
    assert res["ok"]["output"] == "fine" and res["bad"]["output"] == "broken"
    assert res["ok"]["weight"] == 8 and res["ok"]["tags"] == [] and res["ok"]["duration_s"] >= 0
    assert "value" not in res["ok"]
    assert snap["summary"] == {"total": 3, "passing": 1, "failing": 1, "skipped": 1, "score": 80.0}


def test_score_is_100_when_nothing_was_scored(tmp_path: Path) -> None:
    assert measure(tmp_path, _gf(tmp_path), **FAST)["summary"] == {
        "total": 0, "passing": 0, "failing": 0, "skipped": 0, "score": 100.0}
    snap = measure(tmp_path, _gf(tmp_path, _goal("s", "exit 77")), **FAST)
    assert snap["summary"]["score"] == 100.0 and snap["summary"]["skipped"] == 1


def test_git_sha_is_head_in_a_git_repo(tmp_path: Path) -> None:
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@x", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@x",
           "PATH": "/usr/bin:/bin"}
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    subprocess.run(["git", "commit", "-q", "--allow-empty", "-m", "x"], cwd=tmp_path, check=True, env=env)
    sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=tmp_path, capture_output=True, text=True).stdout.strip()
    assert measure(tmp_path, _gf(tmp_path), **FAST)["git_sha"] == sha


def test_checks_run_in_the_repo(tmp_path: Path) -> None:
    (tmp_path / "marker").write_text("here")
    snap = measure(tmp_path, _gf(tmp_path, _goal("cwd", "cat marker")), **FAST)
    assert _by_id(snap)["cwd"] == {**_by_id(snap)["cwd"], "result": "pass", "output": "here"}


def test_timeout_is_skip_and_kills_the_whole_process_group(tmp_path: Path) -> None:
    check = "sleep 300 & echo $! > child.pid; echo started; wait"
    start = time.monotonic()
    snap = measure(tmp_path, _gf(tmp_path, _goal("hang", check)), goal_timeout_s=0.5, total_timeout_s=20)
    assert time.monotonic() - start < 5
    entry = _by_id(snap)["hang"]
    assert entry["result"] == "skip" and entry["output"].startswith("started") and "timed out" in entry["output"]
    assert _gone(int((tmp_path / "child.pid").read_text()))


def test_background_child_left_by_a_finished_check_is_killed(tmp_path: Path) -> None:
    check = "sleep 300 & echo $! > child.pid; echo done"
    snap = measure(tmp_path, _gf(tmp_path, _goal("leaky", check)), goal_timeout_s=5, total_timeout_s=20)
    assert _by_id(snap)["leaky"]["result"] == "pass"
    assert _gone(int((tmp_path / "child.pid").read_text()))


def test_checks_get_a_sanitized_environment(tmp_path: Path) -> None:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "LANG": "C.UTF-8", "USER": "op",
           "ANTHROPIC_API_KEY": "sk-secret", "EVOLVE_DIR": "/secret/evolve", "OPENAI_API_KEY": "sk-2",
           "BASH_ENV": str(tmp_path / "rc.sh")}
    (tmp_path / "rc.sh").write_text("echo BASH_ENV-was-sourced\n")
    check = 'echo "key=[$ANTHROPIC_API_KEY] dir=[$EVOLVE_DIR] oa=[$OPENAI_API_KEY] home=[$HOME] user=[$USER]"; env'
    snap = measure(tmp_path, _gf(tmp_path, _goal("env", check)), env=env, **FAST)
    out = _by_id(snap)["env"]["output"]
    assert f"key=[] dir=[] oa=[] home=[{tmp_path}] user=[op]" in out
    assert "sk-secret" not in out and "/secret/evolve" not in out and "BASH_ENV-was-sourced" not in out
    names = {line.split("=", 1)[0] for line in out.splitlines()[1:] if "=" in line}
    assert names <= {"PATH", "HOME", "LANG", "LC_ALL", "USER", "TMPDIR", "TERM", "PWD", "SHLVL", "_"}


def test_output_capped_with_head_and_tail_and_controls_stripped(tmp_path: Path) -> None:
    check = ("echo HEAD-MARK; for i in $(seq 1 2000); do echo line-$i; done; "
             "printf '\\033[31mred\\033[0m\\a\\n'; echo TAIL")
    snap = measure(tmp_path, _gf(tmp_path, _goal("loud", check)), **FAST)
    out = _by_id(snap)["loud"]["output"]
    assert len(out) <= 500 and out.startswith("HEAD-MARK\nline-1\n") and out.endswith("line-2000\nred\nTAIL")
    assert "…" in out and "\x1b" not in out and "\a" not in out


def test_continuous_value_parsed_from_last_stdout_line(tmp_path: Path) -> None:
    cont = {"metric": "coverage", "threshold": 80}
    gf = _gf(tmp_path,
             _goal("num", "echo computing; echo 87.5; echo; echo warn >&2", continuous=cont),
             _goal("junk", "echo not-a-number", continuous=cont),
             _goal("nan", "echo nan", continuous=cont),
             _goal("silent", "echo 12 >&2", continuous=cont))
    res = _by_id(measure(tmp_path, gf, **FAST))
    assert res["num"]["value"] == 87.5 and res["num"]["threshold"] == 80
    assert res["junk"]["value"] is None and res["nan"]["value"] is None and res["silent"]["value"] is None


def test_meta_goals_run_first_one_at_a_time(tmp_path: Path) -> None:
    log = tmp_path / "log"

    def logged(name: str) -> str:
        return f"echo {name}-start >> log; sleep 0.2; echo {name}-end >> log"

    gf = _gf(tmp_path, _goal("o1", logged("o1")), _goal("m1", logged("m1"), type="meta"),
             _goal("o2", logged("o2")), _goal("m2", logged("m2"), type="meta"))
    snap = measure(tmp_path, gf, parallel=2, **FAST)
    assert [e["goal_id"] for e in snap["goals"]] == ["o1", "m1", "o2", "m2"]  # entries keep file order
    events = log.read_text().split()
    assert events[:4] == ["m1-start", "m1-end", "m2-start", "m2-end"]
    assert sorted(events[4:]) == ["o1-end", "o1-start", "o2-end", "o2-start"]


def test_at_most_parallel_checks_at_once(tmp_path: Path) -> None:
    goals = [_goal(f"g{i}", "echo + >> log; sleep 0.3; echo - >> log") for i in range(4)]
    measure(tmp_path, _gf(tmp_path, *goals), parallel=2, **FAST)
    running = peak = 0
    for ev in (tmp_path / "log").read_text().split():
        running += 1 if ev == "+" else -1
        peak = max(peak, running)
    assert 1 <= peak <= 2


def test_total_timeout_raises_and_keeps_the_last_good_snapshot(tmp_path: Path) -> None:
    evolve_dir = tmp_path / ".agents" / "evolve"
    path = snapshot_path(evolve_dir)
    good = measure(tmp_path, _gf(tmp_path, _goal("ok", "true")), **FAST)
    write_snapshot(path, good)
    before = path.read_bytes()
    gf = _gf(tmp_path, _goal("slow", "sleep 300 & echo $! > child.pid; wait"),
             _goal("never", "touch started-late"))
    start = time.monotonic()
    with pytest.raises(MeasureError, match="total timeout"):
        snap = measure(tmp_path, gf, goal_timeout_s=30, total_timeout_s=0.5, parallel=1)
        write_snapshot(path, snap)  # what a caller does on success; never reached
    assert time.monotonic() - start < 5
    assert path.read_bytes() == before
    assert _gone(int((tmp_path / "child.pid").read_text()))
    assert not (tmp_path / "started-late").exists()


def test_unstartable_checks_are_a_measure_error(tmp_path: Path) -> None:
    with pytest.raises(MeasureError, match="cannot start"):
        measure(tmp_path / "missing", _gf(tmp_path, _goal("ok", "true")), **FAST)


def test_check_string_is_one_bash_argument(tmp_path: Path) -> None:
    check = """printf '%s' "$BASH_EXECUTION_STRING" > seen; echo 'a;b' "$(echo c)" """
    snap = measure(tmp_path, _gf(tmp_path, _goal("argv", check)), **FAST)
    assert (tmp_path / "seen").read_text() == check
    assert _by_id(snap)["argv"]["output"] == "a;b c"


@pytest.mark.parametrize("fmt", ["yaml", "md"])
def test_hostile_ids_and_descriptions_never_execute(tmp_path: Path, fmt: str) -> None:
    pwn = tmp_path / "pwned"
    hostile = f"x$(touch {pwn})`touch {pwn}`;touch {pwn}&&touch {pwn}"
    if fmt == "yaml":
        _yaml(tmp_path, [{"id": hostile, "description": hostile, "check": "exit 1", "weight": 7, "tags": [hostile]}])
    else:
        (tmp_path / "GOALS.md").write_text(_HDR + f"| {hostile} | exit 1 | 7 | {hostile} | t |\n")
    gf = load_goals(tmp_path)
    assert gf is not None and gf.goals[0].id == hostile and gf.goals[0].description == hostile
    snap = measure(tmp_path, gf, **FAST)
    (goal,) = failing_goals(snap, gf)
    item = goal_item(goal, _by_id(snap)[hostile])
    assert item.ref == f"goal:{hostile}" and item.title.startswith(f"Fix failing goal {hostile}"[:190])
    assert not pwn.exists()


# --------------------------------------------------------------------------------------------------------------
# Snapshots and baselines


def test_snapshot_round_trip_and_path(tmp_path: Path) -> None:
    evolve_dir = tmp_path / ".agents" / "evolve"
    path = snapshot_path(evolve_dir)
    assert path == evolve_dir / "fitness-latest.json"
    snap = measure(tmp_path, _gf(tmp_path, _goal("ok", "echo hi"), _goal("s", "exit 77")), **FAST)
    write_snapshot(path, snap)
    assert read_snapshot(path) == snap
    assert [p.name for p in evolve_dir.iterdir()] == ["fitness-latest.json"]  # no temp files left


@pytest.mark.parametrize("content", [b"", b"{not json", b"[]", b'"x"', b'{"goals": {}}', b'{"timestamp": "t"}'])
def test_read_snapshot_rejects_corrupt_input(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "fitness-latest.json"
    path.write_bytes(content)
    assert read_snapshot(path) is None


def test_read_snapshot_missing_file(tmp_path: Path) -> None:
    assert read_snapshot(tmp_path / "nope.json") is None


def test_capture_baseline_once_per_era(tmp_path: Path) -> None:
    evolve_dir = tmp_path / "evolve"
    gf = _gf(tmp_path, _goal("ok", "true"))
    snap = measure(tmp_path, gf, **FAST)
    first = capture_baseline(evolve_dir, gf, snap)
    assert first is not None and first.parent == evolve_dir / "fitness-baselines" / f"goals-{gf.era}"
    assert first.suffix == ".json" and orjson.loads(first.read_bytes()) == snap
    assert capture_baseline(evolve_dir, gf, {**snap, "timestamp": "later"}) is None
    assert list(first.parent.iterdir()) == [first]
    other = GoalsFile(path=gf.path, era="ffffffffffff", goals=gf.goals, directives=(), version="2")
    second = capture_baseline(evolve_dir, other, snap)
    assert second is not None and second.parent.name == "goals-ffffffffffff"


# --------------------------------------------------------------------------------------------------------------
# Work items


def test_failing_goals_by_weight_desc_then_id(tmp_path: Path) -> None:
    gf = _gf(tmp_path, _goal("b", "x", 5), _goal("a", "x", 5), _goal("heavy", "x", 9), _goal("skip", "x", 10),
             _goal("pass", "x", 10), _goal("unmeasured", "x", 10))
    snap = {"goals": [{"goal_id": "b", "result": "fail"}, {"goal_id": "a", "result": "fail"},
                      {"goal_id": "heavy", "result": "fail"}, {"goal_id": "skip", "result": "skip"},
                      {"goal_id": "pass", "result": "pass"}, {"goal_id": "removed", "result": "fail"}, "junk"]}
    assert [g.id for g in failing_goals(snap, gf)] == ["heavy", "a", "b"]
    assert failing_goals({"goals": "nope"}, gf) == []


@pytest.mark.parametrize(("weight", "severity"), [(10, "high"), (7, "high"), (6, "medium"), (4, "medium"),
                                                  (3, "low"), (1, "low")])
def test_goal_item_fields(weight: int, severity: str) -> None:
    goal = Goal(id="unit-tests", description="Unit\ttests\x1b[31m pass\n", check="pytest -q", weight=weight)
    item = goal_item(goal, {"goal_id": "unit-tests", "result": "fail", "output": "E assert 1 == 2\x07"})
    assert item.source == "goal" and item.ref == "goal:unit-tests" and item.type == "goal"
    assert item.title == "Fix failing goal unit-tests: Unit tests [31m pass"
    assert item.severity == severity
    assert "pytest -q" in item.description and "E assert 1 == 2" in item.description
    assert "\x07" not in item.description
    assert dict(item.data) == {"goal_id": "unit-tests", "weight": weight, "check": "pytest -q"}
    assert item.is_red_reducing
    assert goal_item(goal, None).description.count("pytest -q") == 1


def test_directive_item_fields() -> None:
    d = Directive(number=3, title="Harden\nparser", description="Handle input.", steer="increase",
                  directive_id="harden", scenarios="S1")
    item = directive_item(d, "0123456789ab")
    assert item.source == "directive" and item.ref == "directive:harden" and item.type == "directive"
    assert item.title == "Directive 3: Harden parser"
    assert item.description == "Handle input.\n\nSteer: increase\n\nScenarios: S1"
    assert item.data["number"] == 3 and item.data["era"] == "0123456789ab"
    assert directive_item(Directive(number=4, title="t"), "e").ref == "directive:4"
