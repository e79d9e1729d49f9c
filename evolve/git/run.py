"""The one way evolve starts git (docs/DESIGN.md §8.1): :func:`run_git`.

Hooks, fsmonitor and signing off unless the operator opts in (``[git] run_hooks``, ``[git] sign``),
program-valued keys of the repository's own config pinned (:mod:`evolve.git.pins`) unless the operator
approved them (:mod:`evolve.git.trust`), an allow-listed environment (:func:`git_env`), its own process
group, bounded. The agent can write ``.git/hooks`` and ``.git/config`` and evolve holds API keys: no git
process evolve starts may run what they name without the operator's say.

``subprocess`` is imported inside the functions that start git: every command (``evolve status``
too) reaches this package for :func:`evolve.git.toplevel.git_toplevel`, which usually needs no git.
"""

from __future__ import annotations

import contextlib
import errno
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from evolve.childenv import GIT_IDENTITY, child_env
from evolve.git import pins

if TYPE_CHECKING:
    import subprocess

class GitError(Exception):
    pass


class GitTimeout(GitError):
    """A git command ran past its limit (``[git] timeout_s`` or the fire's budget); its group was killed."""


DEFAULT_TIMEOUT_S = 300.0  # [git] timeout_s; the limit of every git command that names none


@dataclass(frozen=True)
class GitPolicy:
    """What evolve's own git may run: the operator opts in to hooks and signing (``[git]``).

    Either way git gets :func:`git_env`, never evolve's environment.
    """

    run_hooks: bool = False
    sign: bool = False
    timeout_s: float = DEFAULT_TIMEOUT_S


SAFE = GitPolicy()

# Variables git needs to find the operator's repository, config and identity; none is a secret.
GIT_ALLOW: tuple[str, ...] = (
    "PATH", "HOME", "LANG", "LC_*", "TZ", "TMPDIR", "XDG_CONFIG_HOME",
    "GIT_DIR", "GIT_WORK_TREE", "GIT_COMMON_DIR", "GIT_CEILING_DIRECTORIES", "GIT_DISCOVERY_ACROSS_FILESYSTEM",
    "GIT_CONFIG_GLOBAL", "GIT_CONFIG_SYSTEM", "GIT_CONFIG_NOSYSTEM",
    *GIT_IDENTITY,
)
# Signing needs the operator's keyring and agent (opted in with [git] sign).
SIGN_ALLOW: tuple[str, ...] = ("GNUPGHOME", "GPG_TTY", "GPG_AGENT_INFO", "SSH_AUTH_SOCK")
# A push needs the ssh agent (and the operator's ssh command, which also outranks core.sshCommand).
PUSH_ALLOW: tuple[str, ...] = ("SSH_AUTH_SOCK", "GIT_SSH_COMMAND", "GIT_SSH")
# Always on: no repo hooks directory, no fsmonitor daemon, no gpg run by ``git log``, no ext:: transport.
_FIXED = ("core.fsmonitor=false", "log.showSignature=false", "protocol.ext.allow=never", "diff.external=")
# Keys naming a program that the repository's own config (writable by the agent) must not choose.

def git_env(policy: GitPolicy = SAFE, *, push: bool = False, source: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of evolve's own git: an allow-list, so a hook, filter or gpg program gets no secret."""
    extra = (*(SIGN_ALLOW if policy.sign else ()), *(PUSH_ALLOW if push else ()))
    # No prompt (an unattended loop would hang), no pager, no editor.
    # Literal pathspecs: a path evolve names is that path, never a glob (a file called ``*`` is just that).
    return child_env(source, GIT_ALLOW, extra,
                     set_={"GIT_TERMINAL_PROMPT": "0", "GIT_PAGER": "cat", "GIT_EDITOR": "true",
                           "GIT_LITERAL_PATHSPECS": "1"})


def _config_args(policy: GitPolicy) -> list[str]:
    out = [*_FIXED]
    if not policy.run_hooks:
        out.append("core.hooksPath=/dev/null")
    if policy.sign:
        out += ["commit.gpgSign=true"]
    else:
        out += ["commit.gpgSign=false", "tag.gpgSign=false"]
    return [arg for kv in out for arg in ("-c", kv)]


def run_git(
    repo: Path,
    *args: str,
    policy: GitPolicy = SAFE,
    extra_env: Mapping[str, str] | None = None,
    timeout: float | None = None,
    input: bytes | None = None,
) -> subprocess.CompletedProcess[str]:
    """Every git command evolve runs goes through here (docs/DESIGN.md §8, "What evolve's git runs").

    Hooks and fsmonitor are off unless ``policy.run_hooks``; signing is off unless ``policy.sign``;
    program-valued keys from the repository's own config are pinned unless approved; the environment is
    :func:`git_env`. Git runs in its own process group (a hook's children too) under
    ``min(timeout, policy.timeout_s)``, also capped by the running fire's remaining budget
    (:func:`evolve.procgroup.capped`). Raises OSError when git cannot start, GitError when the argv is
    too long for the kernel (``E2BIG``), and GitTimeout (a GitError) when the limit passes: the group is
    killed and the caller's step fails. ``input``: git's stdin, for the lists of paths an argv cannot
    hold (:mod:`evolve.git.pathargs`).
    """
    from evolve.procgroup import capped

    limit = capped(min(timeout or policy.timeout_s, policy.timeout_s))
    push = bool(args) and args[0] == "push"
    env = git_env(policy, push=push)
    if extra_env:
        env.update(extra_env)
    pinned = _program_pins(repo, env, limit) if args and pins.needed(args[0]) else []
    argv = ["git", "--no-pager", *_config_args(policy), *pinned, *args]
    return _run(argv, repo, env, limit, input)


def stream_git(repo: Path, *args: str, policy: GitPolicy = SAFE) -> Iterator[bytes]:
    """A git command's stdout line by line (bytes, newline kept), never held whole: for output that grows
    with a change (``log -p`` of a large chain). Same environment, pins and limit as :func:`run_git`; the
    limit kills git's group while the caller reads. Raises GitError when git fails (its stderr, cut short),
    GitTimeout when the limit passed; a caller that stops reading early has git's group killed."""
    import tempfile
    import threading

    from evolve.procgroup import capped, kill_group, progressed, spawn

    limit = capped(policy.timeout_s)
    env = git_env(policy)
    pinned = _program_pins(repo, env, limit) if args and pins.needed(args[0]) else []
    argv = ["git", "--no-pager", *_config_args(policy), *pinned, *args]
    with tempfile.TemporaryFile() as err:  # a file, not a pipe: git never blocks on what it says there
        proc = spawn(argv, cwd=repo, env=env, stderr=err)
        timed_out = threading.Event()

        def expire() -> None:
            timed_out.set()
            kill_group(proc.pid, grace_s=1.0)

        timer = threading.Timer(limit, expire) if limit else None
        if timer is not None:
            timer.daemon = True
            timer.start()
        try:
            assert proc.stdout is not None
            yield from proc.stdout
            proc.wait()
        except BaseException:
            kill_group(proc.pid, grace_s=1.0, reap=proc.poll)
            raise
        finally:
            if timer is not None:
                timer.cancel()
            if proc.stdout is not None:
                proc.stdout.close()
            if proc.poll() is None:
                kill_group(proc.pid, grace_s=1.0, reap=proc.poll)
                proc.wait()
        if timed_out.is_set():
            raise GitTimeout(f"git {_verb(argv)} timed out after {limit:g}s; process group killed")
        progressed()
        if proc.returncode != 0:
            err.seek(0)
            said = " ".join(err.read(4000).decode("utf-8", "replace").split())[:300]
            raise GitError(f"git {_verb(argv)} failed: {said}")


def _run(argv: list[str], repo: Path, env: Mapping[str, str], limit: float,
         input: bytes | None = None) -> subprocess.CompletedProcess[str]:
    """One git process in its own group, killed whole (hooks, their children) after ``limit`` seconds.

    ``input``: bytes for git's stdin (``--stdin`` lists that would not fit an argv); none: /dev/null.
    """
    import subprocess

    from evolve.procgroup import kill_group, progressed, spawn

    try:
        proc = spawn(argv, cwd=repo, env=env, stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL)
    except OSError as exc:
        if exc.errno != errno.E2BIG:
            raise  # no git to run (not installed, no PATH): not a step that failed, the set-up is wrong
        # A list of paths on the argv past ARG_MAX (evolve/git/pathargs.py keeps them off it): the step
        # fails like any git step (a failed commit, its change kept), never the whole fire.
        raise GitError(f"git {_verb(argv)} failed: its argument list is too long "
                       f"({sum(len(a) + 1 for a in argv)} bytes)") from None
    try:
        out, err = proc.communicate(input=input, timeout=limit or None)
    except subprocess.TimeoutExpired:
        kill_group(proc.pid, grace_s=1.0, reap=proc.poll)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.communicate(timeout=5)  # a child that left the group may still hold the pipes
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
        raise GitTimeout(f"git {_verb(argv)} timed out after {limit:g}s; process group killed") from None
    except BaseException:
        kill_group(proc.pid, grace_s=1.0, reap=proc.poll)  # interrupted: git must not outlive the fire
        raise
    progressed()  # a finished git command is a step of the fire done (the daemon's watchdog)
    # surrogateescape: a path that is not UTF-8 survives the round trip back into an argv.
    return subprocess.CompletedProcess(argv, proc.returncode, out.decode("utf-8", "surrogateescape"),
                                       err.decode("utf-8", "replace"))


def _verb(argv: list[str]) -> str:
    """The subcommand of a git argv (after ``--no-pager`` and the ``-c`` pins), for an error message."""
    i = 1
    while i < len(argv) and argv[i].startswith("-"):
        i += 2 if argv[i] == "-c" else 1
    return argv[i] if i < len(argv) else "git"


def _program_pins(repo: Path, env: Mapping[str, str], timeout: float) -> list[str]:
    """The ``-c`` pins for what the repository's own config names (:func:`evolve.git.pins.pins_from_config`),
    but for the keys the operator approved (:func:`evolve.git.trust.trusted_for`)."""
    from evolve.git import trust

    proc = _run(["git", "config", "--show-scope", "-z", "--get-regexp", pins.PATTERN], repo, env, timeout)
    return pins.pins_from_config(proc.stdout, trust.trusted_for(repo))


def identity(repo: Path) -> dict[str, str]:
    """A fallback identity: a repo without one must still be committable by an unattended loop."""
    probe = run_git(repo, "config", "user.email")
    if probe.returncode == 0 and probe.stdout.strip():
        return {}
    env = git_env()
    fallback = {"GIT_AUTHOR_NAME": "evolve", "GIT_AUTHOR_EMAIL": "evolve@localhost",
                "GIT_COMMITTER_NAME": "evolve", "GIT_COMMITTER_EMAIL": "evolve@localhost"}
    return {k: v for k, v in fallback.items() if k not in env}


def git(repo: Path, *args: str, check: bool = True, policy: GitPolicy = SAFE,
        extra_env: Mapping[str, str] | None = None, input: bytes | None = None) -> str:
    proc = run_git(repo, *args, policy=policy, extra_env=extra_env, input=input)
    if check and proc.returncode != 0:
        raise GitError(f"git {args[0]} failed: {proc.stderr.strip()[:300]}")
    return proc.stdout

