"""``evolve report``: one self-contained HTML file, rendered by headless Chromium to a PNG screenshot and a
DOM dump. The dump has the timeline (fires, cycles coloured by result, hand-off and halt markers) and the
charts; no request leaves the page (a recording proxy sees nothing from it, while a control page with
external references is caught by the same proxy).

Chromium is Debian's ``chromium`` package at /usr/bin/chromium (``EVOLVE_CHROMIUM`` overrides). In CI
(``CI`` set) a missing Chromium fails; locally the browser tests skip.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import struct
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from ops_fixture import write_every_kind
from support import Env

from evolve.results import is_idle_poll

CI_INSTALL = "apt-get update && apt-get install -y chromium"
# Chromium's own background traffic (time sync, component updates, sign-in) is not the page's.
BROWSER_HOSTS = re.compile(r"(^|\.)(google\.com|googleapis\.com|gstatic\.com|gvt1\.com|googleusercontent\.com)$")
ARTIFACTS = Path(os.environ.get("EVOLVE_TEST_ARTIFACTS", tempfile.gettempdir())) / "evolve-report-artifacts"


def chromium() -> str:
    for cand in (os.environ.get("EVOLVE_CHROMIUM"), "/usr/bin/chromium", shutil.which("chromium"),
                 shutil.which("chromium-browser")):
        if cand and os.path.isfile(cand) and os.access(cand, os.X_OK):
            return cand
    msg = f"headless Chromium not found at /usr/bin/chromium; install it with: {CI_INSTALL}"
    if os.environ.get("CI"):
        pytest.fail(msg)
    pytest.skip(msg)


class RecordingProxy:
    """An HTTP proxy that answers nothing and records the request line of every connection."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.requests: list[str] = []
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            conn.settimeout(2)
            try:
                data = conn.recv(4096)
                self.requests.append(data.split(b"\r\n", 1)[0].decode("latin-1"))
            except OSError:
                pass
            finally:
                conn.close()

    def page_requests(self) -> list[str]:
        out = []
        for line in self.requests:
            parts = line.split()
            target = parts[1] if len(parts) > 1 else ""
            host = re.sub(r"^[a-z]+://", "", target).split("/")[0].split(":")[0]
            if not BROWSER_HOSTS.search(host):
                out.append(line)
        return out

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def proxy() -> Iterator[RecordingProxy]:
    p = RecordingProxy()
    yield p
    p.close()


def run_chromium(page: Path, proxy: RecordingProxy, tmp: Path, *extra: str) -> subprocess.CompletedProcess[bytes]:
    argv = [
        chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        "--disable-default-apps", "--disable-extensions", "--no-default-browser-check",
        f"--user-data-dir={tmp / 'chromium-profile'}",
        f"--proxy-server=http://127.0.0.1:{proxy.port}", "--proxy-bypass-list=<-loopback>",
        "--hide-scrollbars", *extra, page.as_uri(),
    ]
    out = subprocess.run(argv, capture_output=True, timeout=120)
    assert out.returncode == 0, out.stderr.decode(errors="replace")[-2000:]
    return out


VOID = frozenset({"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track",
                  "wbr"})


class Dom(HTMLParser):
    """Elements with their attributes and the text inside ``<title>`` children, in document order."""

    def __init__(self) -> None:
        super().__init__()
        self.elements: list[tuple[str, dict[str, str], list[str]]] = []
        self.stack: list[int] = []
        self.svg_of: dict[int, str] = {}
        self._svg: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if tag == "svg":
            self._svg.append(a.get("id", ""))
        self.elements.append((tag, a, []))
        self.svg_of[len(self.elements) - 1] = self._svg[-1] if self._svg else ""
        if tag not in VOID:  # HTML void elements never get an end tag
            self.stack.append(len(self.elements) - 1)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.handle_starttag(tag, attrs)
        if tag not in VOID:
            self.handle_endtag(tag)

    def handle_endtag(self, tag: str) -> None:
        while self.stack:
            i = self.stack.pop()
            if self.elements[i][0] == tag:
                break
        if tag == "svg" and self._svg:
            self._svg.pop()

    def handle_data(self, data: str) -> None:
        for i in reversed(self.stack):
            self.elements[i][2].append(data)
            break

    def find(self, tag: str, svg: str | None = None, cls: str | None = None) -> list[tuple[dict[str, str], str]]:
        out = []
        for i, (t, a, _text) in enumerate(self.elements):
            if t != tag or (svg is not None and self.svg_of.get(i) != svg):
                continue
            if cls is not None and cls not in a.get("class", "").split():
                continue
            # the <title> child's text follows the element
            title = ""
            if i + 1 < len(self.elements) and self.elements[i + 1][0] == "title":
                title = "".join(self.elements[i + 1][2])
            out.append((a, title))
        return out


def dom_of(html: str) -> Dom:
    d = Dom()
    d.feed(html)
    return d


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    return struct.unpack(">II", data[16:24])


def static_checks(html: str) -> None:
    """Self-contained: no URL, no external reference, no script of any kind."""
    low = html.lower()
    assert "http:" not in low and "https:" not in low and "ftp:" not in low
    for bad in ("<script", "<link", "<iframe", "<object", "<embed", "<img", "@import", "url(", "src=",
                "javascript:", "xlink:href"):
        assert bad not in low, bad
    # The only links are to run logs beside the page: relative, no scheme, no host (nothing is fetched).
    for href in re.findall(r"href=\"([^\"]*)\"", low):
        assert ":" not in href and not href.startswith("/") and href.endswith(".log"), href
    assert low.count("href=") == len(re.findall(r"<a class=\"log\" href=", low))
    assert "default-src 'none'" in html  # CSP: even an injected reference would not load


@pytest.fixture
def report(env: Env, cli, tmp_path: Path) -> dict[str, Any]:
    entries = write_every_kind(env)
    env.paths.handoff.write_text("2026-11-29T00:00:00Z\ncontext_streak=2 (x)\nparked_work: []\nnext-action: y\n")
    out = tmp_path / "report.html"
    r = cli("report", "--since", "24h", "-o", str(out))
    assert r.code == 0, r.stderr
    assert r.stdout.strip() == f"wrote {out}"
    return {"path": out, "html": out.read_text(encoding="utf-8"), "entries": entries}


def test_report_is_self_contained_and_complete(report: dict[str, Any]) -> None:
    html = report["html"]
    static_checks(html)
    d = dom_of(html)
    cycles = d.find("rect", svg="timeline", cls="cycle")
    work = [e for e in report["entries"] if not is_idle_poll(e)]  # an idle poll is counted, not drawn
    assert len(work) == len(report["entries"]) - 1 and '<b>1</b><span>idle polls</span>' in html
    assert [a["data-cycle"] for a, _ in cycles] == [str(e["cycle"]) for e in work]
    assert [a["data-result"] for a, _ in cycles] == [e["result"] for e in work]
    assert {a["fill"] for a, _ in cycles if a["data-result"] == "improved"} == {"#2e9e44"}
    assert {a["fill"] for a, _ in cycles if a["data-result"] == "regressed"} == {"#e03131"}
    assert len(d.find("rect", svg="timeline", cls="fire")) == 10
    assert len(d.find("path", svg="timeline", cls="handoff")) == 1
    halts = d.find("rect", svg="timeline", cls="halt")
    assert [t for _, t in halts if t.startswith("halt:")] == [
        "halt: user_halt — operator at lunch", "halt: breaker_open — open for 600s more"]


def test_report_renders_in_headless_chromium(report: dict[str, Any], proxy: RecordingProxy, tmp_path: Path) -> None:
    page = report["path"]
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    dump = run_chromium(page, proxy, tmp_path, "--dump-dom").stdout.decode("utf-8")
    (ARTIFACTS / "report-dom.html").write_text(dump, encoding="utf-8")
    shot = ARTIFACTS / "report.png"
    shot.unlink(missing_ok=True)
    run_chromium(page, proxy, tmp_path, f"--screenshot={shot}", "--window-size=1200,3000")
    shutil.copy(page, ARTIFACTS / "report.html")

    # The DOM Chromium built has the timeline and the three charts, drawn.
    d = dom_of(dump)
    assert len(d.find("rect", svg="timeline", cls="cycle")) == 15  # 16 entries, one an idle poll
    assert len(d.find("rect", svg="timeline", cls="fire")) == 10
    assert len(d.find("path", svg="timeline", cls="handoff")) == 1
    assert len(d.find("rect", svg="timeline", cls="halt")) == 2
    with_cost = [e for e in report["entries"] if e.get("cost_usd", 0) > 0]
    assert len(d.find("rect", svg="cost-chart", cls="bar")) == len(with_cost)
    assert len(d.find("polyline", svg="cost-chart", cls="cum")) == 1
    with_pct = [e for e in report["entries"] if "context_pct" in e]
    assert len(d.find("circle", svg="context-chart", cls="pt")) == len(with_pct)
    heavy = d.find("circle", svg="context-chart", cls="heavy")
    assert len(heavy) == sum(1 for e in with_pct if e["context_heavy"]) and "heavy" in heavy[0][1]
    assert len(d.find("line", svg="context-chart", cls="threshold")) == 1
    goals = d.find("circle", svg="goals-chart", cls="goal")
    assert [t for _, t in goals] == [f"cycle {e['cycle']}: {e['goals_passing']}/{e['goals_total']} passing"
                                     for e in report["entries"] if "goals_passing" in e]
    text = re.sub(r"<[^>]+>", " ", dump)
    for needle in ("Work done", "fix the parser", "a1b2c3d4e5f6", "parked and deferred", "scope too big",
                   "defer:waiting for upstream", "context hand-off (resumes in a fresh session)", "HANDOFF",
                   "context hand-off pending: the next fire starts a fresh session (next-action: y)"):
        assert needle in text, needle
    assert "<script" not in dump.lower()

    # The screenshot is a real, non-blank page of the requested size.
    assert png_size(shot) == (1200, 3000)
    assert shot.stat().st_size > 50_000

    # Nothing left the page.
    assert proxy.page_requests() == []


def test_the_proxy_catches_a_page_that_does_reach_out(proxy: RecordingProxy, tmp_path: Path) -> None:
    """The control: the same harness sees requests from a page with external references."""
    page = tmp_path / "control.html"
    page.write_text('<html><body><img src="http://evolve-test.invalid/pixel.png">'
                    '<link rel="stylesheet" href="http://evolve-test.invalid/a.css"></body></html>')
    run_chromium(page, proxy, tmp_path, "--dump-dom")
    assert any("evolve-test.invalid" in r for r in proxy.page_requests()), proxy.requests


def test_hostile_titles_are_text_not_requests(env: Env, cli, proxy: RecordingProxy, tmp_path: Path) -> None:
    import orjson

    env.paths.evolve_dir.mkdir(parents=True, exist_ok=True)
    from evolve.timeutil import utc_iso

    evil = ('<img src="http://evolve-test.invalid/x.png"><script>fetch("http://evolve-test.invalid/")</script>'
            '<style>@import url(http://evolve-test.invalid/s.css)</style>')
    with open(env.paths.ledger, "wb") as fh:
        fh.write(orjson.dumps({"cycle": 1, "result": "improved", "timestamp": utc_iso(), "target": evil,
                               "summary": evil, "cost_usd": 0.1, "context_pct": 10},
                              option=orjson.OPT_APPEND_NEWLINE))
    out = tmp_path / "r.html"
    assert cli("report", "-o", str(out)).code == 0
    html = out.read_text()
    assert "<script>" not in html and "<img" not in html and "&lt;script&gt;" in html
    dump = run_chromium(out, proxy, tmp_path, "--dump-dom").stdout.decode()
    assert "<script>" not in dump
    assert proxy.page_requests() == []


def test_secrets_never_reach_the_report(env: Env, cli, tmp_path: Path) -> None:
    import orjson

    from evolve.timeutil import utc_iso

    env.paths.evolve_dir.mkdir(parents=True, exist_ok=True)
    with open(env.paths.ledger, "wb") as fh:
        fh.write(orjson.dumps({"cycle": 1, "result": "failed", "timestamp": utc_iso(), "target": "deploy",
                               "summary": "used sk-ant-abcdefghijklmnop and hunter2-secret-value",
                               "error_class": "fatal"}, option=orjson.OPT_APPEND_NEWLINE))
    out = tmp_path / "r.html"
    r = cli("report", "-o", str(out), extra_env={"DEPLOY_TOKEN": "hunter2-secret-value"})
    assert r.code == 0
    html = out.read_text()
    assert "sk-ant-abcdefghijklmnop" not in html and "hunter2-secret-value" not in html


def test_empty_repo_report_and_options(env: Env, cli, tmp_path: Path) -> None:
    r = cli("report", "-o", "-")
    assert r.code == 0
    static_checks(r.stdout)
    d = dom_of(r.stdout)
    for svg in ("timeline", "cost-chart", "context-chart", "goals-chart"):
        assert d.find("svg", cls="chart") and any(a.get("id") == svg for a, _ in d.find("svg")), svg
    assert "no fires or cycles in this window" in r.stdout
    r = cli("report")
    assert r.code == 0 and (env.paths.evolve_dir / "report.html").exists()
    assert cli("report", "--since", "whenever").code == 2


def test_since_window_limits_the_report(env: Env, cli, tmp_path: Path) -> None:
    write_every_kind(env)
    out = tmp_path / "r.html"
    assert cli("report", "--since", "3h", "-o", str(out)).code == 0
    d = dom_of(out.read_text())
    assert [a["data-cycle"] for a, _ in d.find("rect", svg="timeline", cls="cycle")] == ["16"]
