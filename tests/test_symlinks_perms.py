"""Directory symlinks inside evolve's state are refused, never followed; files evolve creates honour
the umask; a rewrite keeps the file's mode, owner and group (docs/DESIGN.md §2.0, issue 13 item 4)."""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from support import Env, entry, live

from evolve.errors import UnsafePathError
from evolve.metrics import textfile_name
from evolve.paths import Paths
from evolve.store.atomic import adopt, atomic_write_bytes, open_append, open_artifact, write_new
from evolve.store.dirfd import ensure_dir

ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not ROOT, reason="chown to another uid needs root")


def _link_dir(tmp_path: Path, at: Path) -> Path:
    """Plant ``at`` as a symlink to a fresh, empty directory outside the repository."""
    outside = tmp_path / f"outside-{at.name}"
    outside.mkdir()
    at.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(outside, at, target_is_directory=True)
    return outside


def _listing(d: Path) -> list[str]:
    return sorted(str(p.relative_to(d)) for p in d.rglob("*"))


def _one_line_refusal(stderr: str, path: Path) -> None:
    lines = [ln for ln in stderr.strip().splitlines() if not ln.startswith("{")]  # the logs aside
    assert len(lines) == 1, stderr
    assert "symlink" in lines[0] and str(path) in lines[0], stderr


@contextlib.contextmanager
def umask(mask: int) -> Iterator[None]:
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


# -- directory symlinks: refused, nothing written outside --------------------------------------


def test_linked_evolve_dir_fails_the_fire_with_one_line(env: Env, cli, tmp_path: Path) -> None:
    env.queue(entry("a"))
    evolve_dir = env.paths.evolve_dir
    for p in evolve_dir.iterdir():
        p.unlink()
    evolve_dir.rmdir()
    outside = _link_dir(tmp_path, evolve_dir)
    r = cli("fire", "--cycles", "1")
    assert r.code == 1
    _one_line_refusal(r.stderr, evolve_dir)
    assert _listing(outside) == []
    assert env.calls() == []  # no agent ran


def test_linked_runs_dir_fails_the_fire_and_nothing_lands_outside(env: Env, cli, tmp_path: Path) -> None:
    env.queue(entry("a"))
    outside = _link_dir(tmp_path, env.paths.runs_dir)
    r = cli("fire", "--cycles", "1")
    assert r.code == 1
    _one_line_refusal(r.stderr, env.paths.runs_dir)
    assert _listing(outside) == []
    assert env.calls() == []  # the prompt could not be written safely, so no agent ran
    # The next fire reconciles the interrupted one and refuses again: never a write outside.
    r = cli("fire", "--cycles", "1")
    assert r.code == 1 and _listing(outside) == []


def test_linked_rpi_dir_refuses_the_claim_rewrite(env: Env, cli, tmp_path: Path) -> None:
    rpi = env.paths.nextwork.parent
    outside = _link_dir(tmp_path, rpi)
    queue = outside / env.paths.nextwork.name
    queue.write_bytes(orjson.dumps(entry("a")) + b"\n")
    before = queue.read_bytes()
    r = cli("fire", "--cycles", "1")
    assert r.code == 1
    _one_line_refusal(r.stderr, rpi)
    assert _listing(outside) == [queue.name] and queue.read_bytes() == before
    with pytest.raises(UnsafePathError):
        open_append(env.paths.nextwork)
    assert queue.read_bytes() == before


def test_linked_handoffs_dir_refuses_a_handoff_request(env: Env, cli, tmp_path: Path) -> None:
    outside = _link_dir(tmp_path, env.paths.handoffs_dir)
    r = cli("handoff", "continue", "--note", "n")
    assert r.code == 1
    _one_line_refusal(r.stderr, env.paths.handoffs_dir)
    assert _listing(outside) == []


def test_linked_fitness_baselines_dir_is_refused(env: Env, tmp_path: Path) -> None:
    from evolve.work.goals.model import GoalsFile
    from evolve.work.goals.snapshot import capture_baseline

    outside = _link_dir(tmp_path, env.paths.fitness_baselines)
    gf = GoalsFile(path=env.repo / "GOALS.md", era="abc", goals=(), directives=(), version="1")
    with pytest.raises(UnsafePathError):
        capture_baseline(env.paths.evolve_dir, gf, {"goals": []})
    assert _listing(outside) == []


def test_linked_metrics_textfile_dir_under_the_repo(env: Env, cli, tmp_path: Path) -> None:
    prom = env.repo / ".agents" / "prom"
    outside = _link_dir(tmp_path, prom)
    r = cli("metrics", "--textfile", str(prom))
    assert r.code == 1
    _one_line_refusal(r.stderr, prom)
    # As [metrics] textfile_dir it is a non-essential writer: the fire logs it and goes on.
    env.write_config(metrics={"textfile_dir": ".agents/prom"})
    env.queue(entry("a"))
    r = cli("fire", "--cycles", "1")
    assert r.code == 0, r.stderr
    assert "metrics.failed" in r.stdout + r.stderr
    assert _listing(outside) == []


@pytest.mark.parametrize("sub", ["evolve", "rpi", "evolve/runs", "evolve/handoffs", "evolve/fitness-baselines"])
def test_every_writer_refuses_a_linked_directory(env: Env, tmp_path: Path, sub: str) -> None:
    """The store's writers one by one, each under each linked directory: nothing lands outside."""
    d = env.repo / ".agents" / sub
    if d.exists():
        for p in sorted(d.rglob("*"), reverse=True):
            p.rmdir() if p.is_dir() else p.unlink()
        d.rmdir()
    outside = _link_dir(tmp_path, d)
    for write in (
        lambda p: atomic_write_bytes(p, b"x"),
        lambda p: write_new(p, b"x"),
        lambda p: os.close(open_append(p)),
        lambda p: os.close(open_artifact(p)),
        lambda p: ensure_dir(p),
    ):
        with pytest.raises(UnsafePathError):
            write(d / "deeper" / "f")
        with pytest.raises(UnsafePathError):
            write(d / "f")
    assert _listing(outside) == []


def test_operator_evolve_dir_that_is_a_link_is_honoured_but_not_links_below_it(env: Env, cli,
                                                                                 tmp_path: Path) -> None:
    """EVOLVE_DIR outside the repository is the operator's choice, resolved once: a link there is
    followed; a link inside it (one evolve did not create) is refused."""
    real = tmp_path / "state-real"
    real.mkdir()
    link = tmp_path / "state-link"
    os.symlink(real, link)
    (real / "config.toml").write_bytes(env.paths.config.read_bytes())
    env.queue(entry("a", "b"))
    r = cli("fire", "--cycles", "1", extra_env={"EVOLVE_DIR": str(link)})
    assert r.code == 0, r.stderr
    assert (real / "cycle-history.jsonl").is_file() and (real / "runs").is_dir()
    assert Paths.for_repo(env.repo, {"EVOLVE_DIR": str(link)}).evolve_dir == real
    (real / "runs" / "cycle-1.log").unlink()
    (real / "runs").rmdir()
    outside = _link_dir(tmp_path, real / "runs")
    r = cli("fire", "--cycles", "1", extra_env={"EVOLVE_DIR": str(link)})
    assert r.code == 1
    _one_line_refusal(r.stderr, real / "runs")
    assert _listing(outside) == []


def test_operator_path_under_the_repo_is_not_resolved(env: Env) -> None:
    inside = env.repo / ".agents" / "elsewhere"
    os.symlink("/tmp", inside)
    p = Paths.for_repo(env.repo, {"EVOLVE_DIR": str(inside)})
    assert p.evolve_dir == inside  # kept, so the writers see (and refuse) the link
    with pytest.raises(UnsafePathError):
        ensure_dir(p.runs_dir)


# -- the umask ---------------------------------------------------------------------------------


def test_files_a_fire_creates_honour_the_umask(env: Env, cli) -> None:
    env.queue(entry("a"))
    with umask(0o027):
        r = cli("fire", "--cycles", "1")
    assert r.code == 0, r.stderr
    paths = env.paths
    for p in (paths.ledger, paths.state, paths.fires, paths.lock):
        assert stat.S_IMODE(p.stat().st_mode) == 0o640, p
    assert stat.S_IMODE(paths.runs_dir.stat().st_mode) == 0o750
    assert stat.S_IMODE((paths.runs_dir / "cycle-1.log").stat().st_mode) == 0o600  # private, as before


def test_store_writers_create_with_0666_less_the_umask(tmp_path: Path) -> None:
    with umask(0o027):
        atomic_write_bytes(tmp_path / "a", b"x")
        os.close(open_append(tmp_path / "b"))
        atomic_write_bytes(tmp_path / "c", b"x", mode=0o600)
        ensure_dir(tmp_path / "d" / "e")
    assert stat.S_IMODE((tmp_path / "a").stat().st_mode) == 0o640
    assert stat.S_IMODE((tmp_path / "b").stat().st_mode) == 0o640
    assert stat.S_IMODE((tmp_path / "c").stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "d" / "e").stat().st_mode) == 0o750


def test_metrics_textfile_and_report_honour_the_umask(env: Env, cli, tmp_path: Path) -> None:
    with umask(0o027):
        assert cli("metrics", "--textfile", str(tmp_path / "prom")).code == 0
        assert cli("report", "-o", str(tmp_path / "r.html")).code == 0
    assert stat.S_IMODE((tmp_path / "prom" / textfile_name(env.repo.resolve())).stat().st_mode) == 0o640
    assert stat.S_IMODE((tmp_path / "r.html").stat().st_mode) == 0o640


# -- a rewrite keeps mode, owner and group -----------------------------------------------------


def _shared(p: Path, mode: int = 0o660) -> None:
    os.chmod(p, mode)
    os.chown(p, 1234, 5678)


def _meta(p: Path) -> tuple[int, int, int]:
    st = p.stat()
    return stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid


@needs_root
def test_claim_rewrite_keeps_the_queue_mode_owner_and_group(env: Env, cli) -> None:
    env.queue(entry("a", "b"))
    _shared(env.paths.nextwork)
    with umask(0o077):  # the rewrite must not take the umask's narrower mode either
        r = cli("fire", "--cycles", "1")
    assert r.code == 0, r.stderr
    lines = live(env.paths.nextwork)
    assert lines[0]["items"][0].get("consumed") is True or lines[0]["items"][0].get("claim_status") != "available"
    assert _meta(env.paths.nextwork) == (0o660, 1234, 5678)


@needs_root
def test_state_rewrites_keep_mode_owner_and_group(env: Env, cli, tmp_path: Path) -> None:
    env.queue(entry("a"))
    assert cli("fire", "--cycles", "1").code == 0
    _shared(env.paths.state)
    settings = env.repo / ".claude" / "settings.json"
    settings.parent.mkdir()
    settings.write_text("{}\n")
    _shared(settings, 0o640)
    prom = tmp_path / "prom"
    assert cli("metrics", "--textfile", str(prom)).code == 0
    _shared(prom / textfile_name(env.repo.resolve()), 0o640)
    env.queue(entry("b"))
    assert cli("fire", "--cycles", "1").code == 0
    assert cli("setup", "--yes").code == 0
    assert cli("metrics", "--textfile", str(prom)).code == 0
    assert b"AUTOCOMPACT" in settings.read_bytes()
    assert _meta(env.paths.state) == (0o660, 1234, 5678)
    assert _meta(settings) == (0o640, 1234, 5678)
    assert _meta(prom / textfile_name(env.repo.resolve())) == (0o640, 1234, 5678)
    fitness = env.paths.fitness_latest
    fitness.write_text("{}\n")
    _shared(fitness, 0o664)
    atomic_write_bytes(fitness, b'{"goals": []}\n')
    assert _meta(fitness) == (0o664, 1234, 5678)


def test_adopt_keeps_the_mode_when_chown_is_not_permitted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    old = tmp_path / "old"
    old.write_bytes(b"")
    os.chmod(old, 0o664)
    new = tmp_path / "new"
    fd = os.open(new, os.O_WRONLY | os.O_CREAT, 0o600)
    calls: list[tuple[int, int]] = []

    def denied(fd: int, uid: int, gid: int) -> None:
        calls.append((uid, gid))
        raise PermissionError(1, "Operation not permitted")

    st = old.stat()
    fake = os.stat_result((st.st_mode, st.st_ino, st.st_dev, st.st_nlink, 4321, 8765, *tuple(st)[6:]))
    monkeypatch.setattr(os, "fchown", denied)
    try:
        adopt(fd, fake)
    finally:
        os.close(fd)
    assert calls == [(4321, 8765), (-1, 8765)]  # owner and group, then the group alone
    assert stat.S_IMODE(new.stat().st_mode) == 0o664


def test_private_temp_dirs_under_a_linked_tmpdir_still_work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """evolve's own temp dirs (probes, gate output, notify) are made canonical before the
    no-symlink writers see them: a TMPDIR that is a link is the operator's, not a planted one."""
    import tempfile

    from evolve.procgroup import run_capture

    real = tmp_path / "real-tmp"
    real.mkdir()
    os.symlink(real, tmp_path / "tmp-link")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp-link"))
    assert run_capture(["echo", "hi"], cwd=tmp_path, env=dict(os.environ), timeout_s=30) == b"hi\n"


def test_markers_are_removed_by_name_never_through_a_linked_directory(env: Env, tmp_path: Path) -> None:
    from evolve.store.markers import remove_marker

    outside = _link_dir(tmp_path, env.repo / ".agents" / "linked")
    (outside / "STOP").write_text("keep\n")
    with pytest.raises(UnsafePathError):
        remove_marker(env.repo / ".agents" / "linked" / "STOP")
    assert (outside / "STOP").read_text() == "keep\n"
    env.paths.stop.write_text("x\n")
    assert remove_marker(env.paths.stop) and not remove_marker(env.paths.stop)
