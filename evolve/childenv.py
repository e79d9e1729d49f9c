"""The environment each child of evolve gets: an explicit allow-list, never evolve's own environment.

evolve runs next to API keys and tokens (``ANTHROPIC_API_KEY``, ``GITHUB_TOKEN``, ``AWS_*``...), and
much of what it starts is code the agent can write: gate commands and goal checks run the repo's
tests, git runs the repo's hooks and filters. So every child gets :data:`BASE` (locale, identity,
PATH) plus the names its role needs plus what the operator lists in a ``pass_env`` config key.

A name ending in ``*`` is a prefix (``LC_*``, ``ANTHROPIC_*``); any other name is exact.
Base layer: imports nothing from evolve.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
from collections.abc import Iterable, Mapping

# What any program needs to behave like it does in the operator's shell, and nothing secret.
BASE: tuple[str, ...] = (
    "PATH", "HOME", "LANG", "LC_*", "TZ", "TMPDIR", "USER", "LOGNAME", "SHELL", "TERM",
)
# The non-secret variables a fire itself sets for its children: the id that finds orphans (§12.4).
FIRE: tuple[str, ...] = ("EVOLVE_FIRE_ID",)
# Who a commit is by: not secret, and an agent or hook that commits needs it.
GIT_IDENTITY: tuple[str, ...] = (
    "GIT_AUTHOR_NAME", "GIT_AUTHOR_EMAIL", "GIT_AUTHOR_DATE",
    "GIT_COMMITTER_NAME", "GIT_COMMITTER_EMAIL", "GIT_COMMITTER_DATE",
)
# Reaching an API from behind a proxy or a private CA: the agent CLIs need these to work at all.
NETWORK: tuple[str, ...] = (
    "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "no_proxy", "all_proxy",
    "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "NODE_EXTRA_CA_CERTS",
    "XDG_CONFIG_HOME", "XDG_CACHE_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME", "XDG_RUNTIME_DIR",
)

# What the agent gets besides its runner's own names (agent_env): evolve's harness hook runs inside
# the agent and must find the same state directory.
AGENT: tuple[str, ...] = (
    *BASE, *FIRE, *GIT_IDENTITY, *NETWORK,
    "EVOLVE_DIR", "EVOLVE_NEXTWORK", "EVOLVE_AUTOCOMPACT_NUDGE", "EVOLVE_LOG_LEVEL",
)
# The work tracker's own settings (bd / br: database, actor, server): the tracker needs them to answer.
TRACKER: tuple[str, ...] = ("BEADS_*", "BD_*", "BR_*")

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\*?")


def valid_name(name: str) -> bool:
    """An environment variable name, or a prefix ending in ``*`` (for config validation)."""
    return _NAME.fullmatch(name) is not None


def matches(name: str, allow: Iterable[str]) -> bool:
    for pattern in allow:
        if pattern.endswith("*"):
            if name.startswith(pattern[:-1]):
                return True
        elif name == pattern:
            return True
    return False


def agent_env(env: Mapping[str, str] | None, runner_names: Iterable[str], pass_env: Iterable[str]) -> dict[str, str]:
    """The agent's environment: :data:`AGENT`, its runner's API variables, ``[agent] pass_env``.

    Nothing else evolve holds (``GITHUB_TOKEN``, ``AWS_*``...) reaches the agent, nor the tools it runs.
    """
    return child_env(env, AGENT, (*runner_names, *pass_env))


def work_env(env: Mapping[str, str] | None, pass_env: Iterable[str] = ()) -> dict[str, str]:
    """The tracker's and the generators' environment: base, the fire's id, the tracker's own, ``[work] pass_env``."""
    return child_env(env, (*BASE, *FIRE, *TRACKER), pass_env)


def child_env(
    env: Mapping[str, str] | None,
    allow: Iterable[str] = BASE,
    extra: Iterable[str] = (),
    *,
    set_: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The variables of ``env`` (default: the process environment) named by ``allow`` or ``extra``.

    ``set_`` is added last (the values evolve itself gives the child). PATH falls back to the
    system default, so an empty environment still finds ``sh`` and ``git``.
    """
    source = os.environ if env is None else env
    names = (*allow, *extra)
    out = {k: v for k, v in source.items() if matches(k, names)}
    out.setdefault("PATH", os.defpath)
    if set_:
        out.update(set_)
    return out


def with_path(env: dict[str, str], dirs: Iterable[str]) -> dict[str, str]:
    """``env`` with ``dirs`` first on its PATH (``[workspace] path``: the worktree's venv before the
    operator's), each once; ``env`` itself is returned when there is nothing to add."""
    dirs = [d for d in dirs if d]
    if not dirs:
        return env
    rest = [p for p in env.get("PATH", os.defpath).split(os.pathsep) if p not in dirs]
    return {**env, "PATH": os.pathsep.join([*dirs, *rest])}


def seal_own_environ() -> bool:
    """Make this process's ``/proc/<pid>/environ`` (and memory) unreadable to the user's other processes.

    An allow-listed child env is worth little if the child can read the fire's own environment from
    ``/proc``: any process of the same user may, unless the fire is not "dumpable"
    (``prctl(PR_SET_DUMPABLE, 0)``). Children get their own dumpable flag back at exec, so
    reconcile still finds them by their ``EVOLVE_FIRE_ID``. Linux only; no core dumps of evolve
    after this. Returns whether it took effect.
    """
    if not sys.platform.startswith("linux"):
        return False
    with contextlib.suppress(OSError, AttributeError):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(4, 0, 0, 0, 0)) == 0  # PR_SET_DUMPABLE = 4
    return False
