"""The morning report answers the morning question (issue 16, item 7): a timeline fitted to the data,
integer and nice axis ticks, why each red cycle went red with a link to its run log, stranded and
parked work, a pending hand-off, and a page that holds together in headless Chromium at a desktop and
a phone width.

The fires are real (the scripted agent, a real gate, a fire killed mid-cycle, `evolve handoff`); the
axis test writes ledger lines the way ``tests/ops_fixture.py`` does, with the numbers from the issue.
"""

from __future__ import annotations

import os
import re
import signal
import struct
import subprocess
import sys
import time
import urllib.parse
import zlib
from pathlib import Path
from typing import Any

import orjson
import pytest
from support import Env, entry, git, improved_step, jsonl, results
from test_morning_report import RecordingProxy, chromium, dom_of, run_chromium, static_checks

from evolve.procgroup import group_alive
from evolve.report.render import fit_window, nice_ticks
from evolve.timeutil import utc_iso

# -- pure decisions, as tables -------------------------------------------------------------------------


@pytest.mark.parametrize(("vmax", "integer", "ticks", "decimals"), [
    (2, True, [0, 1, 2], 0),  # the goals axis that read "1, 1, 0, 0, 0" (top down)
    (1, True, [0, 1], 0),
    (7, True, [0, 2, 4, 6, 8], 0),
    (37, True, [0, 10, 20, 30, 40], 0),
    (0.19, False, [0, 0.05, 0.10, 0.15, 0.20], 2),  # the cost axis that read "$0.06, $0.12, $0.19"
    (0.09, False, [0, 0.025, 0.05, 0.075, 0.10], 3),
    (0.6, False, [0, 0.2, 0.4, 0.6], 1),
    (3.7, False, [0, 1, 2, 3, 4], 0),
    (100, False, [0, 25, 50, 75, 100], 0),
    (0, False, [0, 0.25, 0.5, 0.75, 1], 2),  # nothing to show: a unit axis
])
def test_nice_ticks(vmax: float, integer: bool, ticks: list[float], decimals: int) -> None:
    got, dec = nice_ticks(vmax, integer=integer)
    assert got == pytest.approx(ticks) and dec == decimals
    assert got[-1] >= vmax and len(got) <= 6
    labels = [f"{v:.{dec}f}" for v in got]
    assert len(set(labels)) == len(labels)  # every label distinct: no "1, 1, 0, 0"


DAY = 86400.0


@pytest.mark.parametrize(("spans", "want"), [
    ([], (0, DAY)),  # no data: the whole window
    ([(80_000, 82_000)], (79_920, 82_080)),  # an hour-ish of fires: that hour, padded 4 %
    ([(86_390, 86_399)], (DAY - 600, DAY)),  # one short cycle just now: the last ten minutes
    ([(10, 20)], (0, 600)),  # at the window's start: ten minutes from it
    ([(-500, 30_000), (40_000, 50_000)], (0, 52_000)),  # clipped to the window
])
def test_fit_window(spans: list[tuple[float, float]], want: tuple[float, float]) -> None:
    assert fit_window(0, DAY, spans) == pytest.approx(want)


# -- the axes of a real report -----------------------------------------------------------------------------


def texts(d: Any, tag: str, svg: str | None = None, cls: str | None = None, **attrs: str) -> list[str]:
    """The own text of each matching element (``Dom.find`` gives the ``<title>`` child's)."""
    out = []
    for i, (t, a, text) in enumerate(d.elements):
        if t == tag and (svg is None or d.svg_of.get(i) == svg) and (cls is None or cls in a.get("class", "").split()) \
                and all(a.get(k.replace("_", "-")) == v for k, v in attrs.items()):
            out.append("".join(text))
    return out


def tick_labels(html: str, svg: str) -> list[str]:
    """The value axis' labels, bottom up: the right-aligned ticks left of the chart (cycle labels are centred)."""
    return texts(dom_of(html), "text", svg=svg, cls="tick", text_anchor="end")


def test_goal_and_cost_axes_read_as_integers_and_nice_steps(env: Env, cli, tmp_path: Path) -> None:
    now = time.time()
    rows = [(1, 2, 0.06), (1, 2, 0.06), (2, 2, 0.07)]
    env.paths.evolve_dir.mkdir(parents=True, exist_ok=True)
    with open(env.paths.ledger, "wb") as fh:
        for i, (passing, total, cost) in enumerate(rows, 1):
            fh.write(orjson.dumps({"cycle": i, "result": "improved", "timestamp": utc_iso(now - 600 + 60 * i),
                                   "target": f"t{i}", "duration_s": 30, "cost_usd": cost,
                                   "goals_passing": passing, "goals_total": total},
                                  option=orjson.OPT_APPEND_NEWLINE))
    out = tmp_path / "r.html"
    assert cli("report", "-o", str(out)).code == 0
    html = out.read_text()
    assert tick_labels(html, "goals-chart") == ["0", "1", "2"]
    assert tick_labels(html, "cost-chart") == ["$0.00", "$0.05", "$0.10", "$0.15", "$0.20"]
    assert tick_labels(html, "context-chart") == ["0%", "25%", "50%", "75%", "100%"]


# -- the morning question, from real fires --------------------------------------------------------------

GATE = [sys.executable, "-c",
        "import pathlib, sys\n"
        "t = pathlib.Path('src/out.txt')\n"
        "bad = t.exists() and 'BAD' in t.read_text()\n"
        "print('FAILED tests/test_parser.py::test_lookahead - BAD token' if bad else 'ok')\n"
        "sys.exit(1 if bad else 0)\n"]


def night(env: Env, cli) -> dict[str, Any]:
    """An improved cycle, one the gate turned red, one whose agent broke its report, a fire killed
    mid-cycle (its claim and cycle stranded), and an operator's pending hand-off."""
    env.queue(entry("fix the parser", "tighten lookahead", "report errors", "hang forever"))
    env.write_config(gate={"commands": [GATE], "timeout_s": 60}, fire={"max_cycles": 3})
    env.steps([
        improved_step(),
        {"write": [{"path": "src/out.txt", "content": "BAD\n", "append": True}],
         "report": {"result": "improved", "summary": "tried a new token"}},
        {"raw_report": "this is not json"},
        {"hang": True},
    ])
    r = cli("fire")
    assert r.code == 0, r.stderr
    assert results(env.ledger()) == ["improved", "regressed", "failed"]

    fire = subprocess.Popen([sys.executable, "-m", "evolve", "--repo", str(env.repo), "fire", "--cycles", "1"],
                            env=env.env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    deadline = time.monotonic() + 120  # a hang guard: the agent is running once its call is recorded
    while len(env.calls()) < 4:
        assert time.monotonic() < deadline and fire.poll() is None, "the fourth agent run never started"
        time.sleep(0.05)
    agent_pgid = env.calls()[3]["pgid"]
    os.kill(fire.pid, signal.SIGKILL)  # the fire dies mid-cycle: nothing records or releases anything
    fire.wait(timeout=60)
    os.killpg(agent_pgid, signal.SIGKILL)
    deadline = time.monotonic() + 60
    while group_alive(agent_pgid):
        assert time.monotonic() < deadline, "the agent's group outlived SIGKILL"
        time.sleep(0.05)

    cut_off = orjson.loads(env.paths.cycle_state.read_bytes())
    r = cli("handoff", "continue", "--note", "look at the lookahead first")
    assert r.code == 0, r.stderr
    return {"ledger": env.ledger(), "cut_off": cut_off}


def screenshot_rows(path: Path) -> tuple[int, int, list[bytes]]:
    """A PNG as (width, height, rows of RGB bytes): Chromium writes 8-bit RGB(A), not interlaced."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, header = 8, b"", None
    while pos < len(data):
        (length,), kind = struct.unpack(">I", data[pos:pos + 4]), data[pos + 4:pos + 8]
        body = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    assert header is not None
    width, height, depth, ctype, _, _, interlace = header
    assert depth == 8 and ctype in (2, 6) and interlace == 0, header
    bpp = 3 if ctype == 2 else 4
    raw, stride, prev = zlib.decompress(idat), width * bpp, bytearray(width * bpp)
    rows = []
    for y in range(height):
        f, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b, c = prev[i], prev[i - bpp] if i >= bpp else 0
            if f == 1:
                line[i] = (line[i] + a) & 255
            elif f == 2:
                line[i] = (line[i] + b) & 255
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        prev = line
        rows.append(bytes(line) if bpp == 3 else bytes(v for j in range(0, stride, 4) for v in line[j:j + 3]))
    return width, height, rows


def rgb(hex_color: str) -> bytes:
    return bytes.fromhex(hex_color.lstrip("#"))


def test_report_answers_the_morning_question(env: Env, cli, tmp_path: Path) -> None:
    story = night(env, cli)
    ledger = story["ledger"]
    regressed, failed = ledger[1], ledger[2]
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    out = out_dir / "morning.html"
    r = cli("report", "--since", "24h", "-o", str(out))
    assert r.code == 0, r.stderr
    html = out.read_text()
    static_checks(html)
    d = dom_of(html)

    # Why each red cycle went red, in its row of the cycles table.
    text = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html))
    assert regressed["gate_detail"] and failed["error"]
    why = texts(d, "div", cls="why")
    assert any(regressed["gate_detail"].strip() in w for w in why), why
    assert any(failed["error"] in w for w in why), why
    # Each cycle's run log, linked relative to the page, and the link leads to the file.
    links = [a["href"] for a, _ in d.find("a", cls="log")]
    assert len(links) == 3
    for link, e in zip(links, ledger, strict=True):
        target = (out_dir / urllib.parse.unquote(link)).resolve()
        assert target == (env.paths.runs_dir / f"cycle-{e['cycle']}.log").resolve() and target.is_file()

    # The killed fire's claim and cycle are stranded; the operator's hand-off waits for the next fire.
    rows = [ln for ln in re.findall(r"<tr>(.*?)</tr>", html.split('id="stranded"', 1)[1].split("</table>", 1)[0])]
    (row,) = rows[1:]  # one row for the item: its cycle, its claim record and its queue claim together
    assert story["cut_off"]["work_ref"] in row
    for what in (f"cycle {story['cut_off']['cycle']} was cut off in its agent phase",
                 "claimed by a fire that ended without finishing it", "claimed in the queue by evolve:"):
        assert what in row, what
    assert "operator hand-off pending: evolve handoff continue" in text
    assert "stranded work item(s)" in text

    # The timeline is fitted to the night's few minutes, not spread over 24 hours.
    assert "fitted to the data" in text
    labels = [t for t in texts(d, "text", svg="timeline", cls="tick") if re.fullmatch(r"\d\d:\d\d", t)]
    now = time.time()
    minutes = {time.strftime("%H:%M", time.gmtime(now - 60 * k)) for k in range(0, 12)}
    assert len(labels) >= 3 and set(labels) <= minutes, labels

    # The git side of the killed fire: no stray lock, every improved entry's commit exists.
    assert not (env.repo / ".git" / "index.lock").exists()
    for e in ledger:
        if e["result"] == "improved":
            assert git(env.repo, "cat-file", "-t", e["sha"]).strip() == "commit"


@pytest.fixture
def proxy() -> Any:
    p = RecordingProxy()
    yield p
    p.close()


@pytest.mark.parametrize(("width", "height"), [(1280, 2400), (390, 2400)])
def test_report_holds_together_in_chromium_at_two_sizes(env: Env, cli, tmp_path: Path, proxy: RecordingProxy,
                                                         width: int, height: int) -> None:
    """Desktop and phone width: the page never overflows sideways (wide tables scroll in their own box), and
    the answers are on screen: the health, the pending hand-off, the red badges."""
    chromium()
    night(env, cli)
    out = tmp_path / "morning.html"
    assert cli("report", "-o", str(out)).code == 0
    artifacts = Path(os.environ.get("EVOLVE_TEST_ARTIFACTS", tmp_path)) / "evolve-report-artifacts"
    artifacts.mkdir(parents=True, exist_ok=True)
    shot = artifacts / f"report-{width}.png"
    shot.unlink(missing_ok=True)
    run_chromium(out, proxy, tmp_path, f"--screenshot={shot}", f"--window-size={width},{height}",
                 "--hide-scrollbars")
    w, h, rows = screenshot_rows(shot)
    assert (w, h) == (width, height)
    page_bg = rgb("#f6f7f9")
    # Nothing drawn in the page's right margin: no table, chart or text ran past the window.
    for y, row in enumerate(rows):
        assert row[(w - 6) * 3:] == page_bg * 6, f"something overflows the window at y={y}"
    seen = b"".join(rows)

    def shows(color: str) -> bool:
        c = rgb(color)
        return any(seen[i:i + 3] == c for i in range(0, len(seen), 3))

    assert shows("#fff4e0"), "the pending hand-off box is not on screen"
    assert shows("#d98e04") or shows("#2e9e44") or shows("#e03131"), "no health badge"
    assert shows("#e03131"), "no red (regressed) badge or bar"
    assert proxy.page_requests() == []


def test_links_never_reach_out_and_stdout_names_the_log(env: Env, cli) -> None:
    """A link is relative (no scheme, no host): nothing the page could fetch. On stdout the page has no
    place on disk, so each run log is named instead of linked."""
    env.queue(entry("one"))
    env.write_config(fire={"max_cycles": 1})
    assert cli("fire").code == 0
    r = cli("report", "-o", "-")
    assert r.code == 0
    static_checks(r.stdout)
    assert "<a " not in r.stdout
    assert str(env.paths.runs_dir / "cycle-1.log") in r.stdout
    assert jsonl(env.paths.ledger)[0]["result"] == "improved"
