"""Issue 13 item 1: nothing interpolated into a rendered deploy file can start a line of its own."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from support import Env

HOSTILE_NAME = "repo\n* * * * * root touch /tmp/pwned"


def hostile_repo(tmp_path: Path, name: str = HOSTILE_NAME) -> Path:
    # The slashes make it nested directories; the full path still holds the crontab line.
    repo = tmp_path / "hostile" / name
    repo.mkdir(parents=True)
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    return repo


@pytest.mark.parametrize("kind", [("cron",), ("cron", "--user"), ("systemd",), ("systemd", "--daemon"),
                                  ("kubernetes",)])
def test_a_newline_in_the_repository_path_is_refused(env: Env, cli, tmp_path: Path, kind: tuple[str, ...]) -> None:
    repo = hostile_repo(tmp_path)
    r = cli("install", *kind, "--print", repo=repo)
    assert r.code == 2, (r.stdout, r.stderr)
    assert r.stdout == ""
    (line,) = r.stderr.splitlines()
    assert "repository path" in line and "\\n" in line and "control character" in line
