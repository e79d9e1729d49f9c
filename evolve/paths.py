"""Where every on-disk file lives (docs/DESIGN.md §2); one place so no module spells a path twice.

Imported by every command, ``evolve status`` and the session-start hook included: standard library
only, and no subprocess (``git_toplevel`` lives in :mod:`evolve.git.toplevel`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from evolve import trusted

# Names of files that modules holding only the state directory (not a ``Paths``) build themselves.
FITNESS_LATEST = "fitness-latest.json"
FITNESS_LATEST_POST = "fitness-latest-post.json"
FITNESS_BASELINES = "fitness-baselines"
PROBE_FILE = "workspace-probe.json"  # the gate probe's last answer (cycle/probe.py; status reads it)
SETUP_FILE = "workspace-setup.json"  # the last workspace setup's stamp (cycle/setup.py)


def operator_root(path: Path, repo: Path) -> Path:
    """A directory the operator configured (``EVOLVE_DIR``, the queue's, the metrics textfile dir),
    made canonical once, here, for the writers' symlink check (``store/dirfd.py``).

    Outside the repository it is resolved: a symlink the operator made there
    (``EVOLVE_DIR=/var/lib/evolve`` -> ``/srv/evolve``) is the operator's choice and honoured, and
    after this no link is followed below it. Under the repository (relative, or absolute inside
    ``repo``) it is only made absolute, never resolved: an agent can plant links there, and the
    writers refuse every one of them. (A link outside the repository that points into it is still
    followed here, once: that, too, is the operator's own configuration.)
    """
    path = Path(os.path.abspath(repo / path))  # lexical: "..", "." gone, nothing followed
    if path == repo or path.is_relative_to(repo):
        return path
    return path.resolve()


@dataclass(frozen=True)
class Paths:
    repo: Path
    evolve_dir: Path
    nextwork: Path
    global_kill: Path
    # ``~/.config/evolve/KILL`` when XDG_CONFIG_HOME points elsewhere: upstream tooling and operators
    # write the global KILL there whatever XDG says, so both halt (SPEC §2); None when it is the same file.
    home_kill: Path | None = None
    # The operator's records for this repository, out of the agent's worktree and the state directory
    # (evolve/trusted.py); None only for a Paths built by hand.
    trust_dir: Path | None = None

    @property
    def global_kills(self) -> tuple[Path, ...]:
        """Every global KILL path, the XDG one first."""
        return (self.global_kill,) if self.home_kill is None else (self.global_kill, self.home_kill)

    @classmethod
    def for_repo(cls, repo: Path, env: Mapping[str, str] | None = None) -> Paths:
        env = os.environ if env is None else env
        repo = repo.resolve()
        evolve_dir = Path(env.get("EVOLVE_DIR") or ".agents/evolve")
        nextwork = Path(env.get("EVOLVE_NEXTWORK") or ".agents/rpi/next-work.jsonl")
        xdg = env.get("XDG_CONFIG_HOME") or str(Path(env.get("HOME") or Path.home()) / ".config")
        nextwork = operator_root(nextwork.parent, repo) / nextwork.name
        global_kill = operator_root(Path(xdg) / "evolve", repo) / "KILL"  # ~/.config may be a link
        home = Path(env.get("HOME") or Path.home()) / ".config" / "evolve"
        home_kill = operator_root(home, repo) / "KILL"
        return cls(
            repo=repo,
            evolve_dir=operator_root(evolve_dir, repo),
            nextwork=nextwork,
            global_kill=global_kill,
            home_kill=home_kill if home_kill != global_kill else None,
            trust_dir=trusted.repo_dir(repo, env),
        )

    def _e(self, name: str) -> Path:
        return self.evolve_dir / name

    @property
    def ledger(self) -> Path:
        return self._e("cycle-history.jsonl")

    @property
    def state(self) -> Path:
        return self._e("session-state.json")

    @property
    def landing_intent(self) -> Path:
        """A landing in progress, resolved against the branch if the fire dies (docs/DESIGN.md §8.3)."""
        return self._e("landing.json")

    @property
    def pending(self) -> Path:
        """Green commits waiting to land, per branch, and the cycles whose items they hold (§8.3)."""
        return self._e("pending.json")

    @property
    def push_state(self) -> Path:
        """The last landing of each branch and whether ``[git] push`` has published it (§8.3)."""
        return self._e("push.json")

    @property
    def git_trust(self) -> Path:
        """The operator's approved program-valued keys of the repository's own git config (§8.1), kept
        with the operator's other records, out of the agent's reach (§8.5)."""
        return self._t(trusted.GIT_TRUST)

    @property
    def git_trust_legacy(self) -> Path:
        """Where evolve before issue 23 kept that record: in the state directory, which the agent can write."""
        return self._e(trusted.GIT_TRUST)

    @property
    def config_trust(self) -> Path:
        """The repository-tracked config and agent settings the operator trusted, by hash (§8.5)."""
        return self._t(trusted.CONFIG_TRUST)

    @property
    def checks_trust(self) -> Path:
        """The gate scripts and GOALS checks a chain rewrote that the operator trusted, by blob (§8.5)."""
        return self._t(trusted.CHECKS_TRUST)

    @property
    def pins(self) -> Path:
        """The push remote's URL as first configured (§8.5)."""
        return self._t(trusted.PINS)

    @property
    def guard(self) -> Path:
        """The loosening changes the guard refused (§8.5): every fire stops on them until the operator looks."""
        return self._t(trusted.GUARD)

    def _t(self, name: str) -> Path:
        return (self.trust_dir or self.evolve_dir / "trust") / name

    @property
    def workspace_health(self) -> Path:
        """Why the last fire could not make its workspace, and the git keys it left pinned (§8.3)."""
        return self._e("workspace-health.json")

    @property
    def lock(self) -> Path:
        return self._e("fire.lock")

    @property
    def kill(self) -> Path:
        return self._e("KILL")

    @property
    def stop(self) -> Path:
        return self._e("STOP")

    @property
    def dormant(self) -> Path:
        return self._e("DORMANT")

    @property
    def handoff(self) -> Path:
        return self._e("HANDOFF")

    @property
    def rescope(self) -> Path:
        return self._e("RESCOPE")

    @property
    def ack_regression(self) -> Path:
        return self._e("ACK-REGRESSION")

    @property
    def cycle_state(self) -> Path:
        return self._e("cycle-state.json")

    @property
    def blocked(self) -> Path:
        return self._e("blocked.jsonl")

    @property
    def config(self) -> Path:
        return self._e("config.toml")

    @property
    def runs_dir(self) -> Path:
        """Per-cycle agent prompt, report and output files."""
        return self._e("runs")

    @property
    def sandbox_state(self) -> Path:
        """Which sandbox the last fire ran its children in (docs/DESIGN.md §8.6): ``status`` reads it, never probes."""
        return self._e("sandbox.json")

    @property
    def exchange_dir(self) -> Path:
        """What an agent hands back (the command runner's report file): the one place in the state directory a
        sandboxed agent may write (docs/DESIGN.md §8.6)."""
        return self._e("exchange")

    @property
    def handoffs_dir(self) -> Path:
        return self._e("handoffs")

    @property
    def handoff_pending(self) -> Path:
        """The operator's pending hand-off request (``evolve handoff continue|fork``)."""
        return self.handoffs_dir / "pending.json"

    @property
    def notify_state(self) -> Path:
        """The halt the notifier last announced, so a halt is notified when it starts and ends only."""
        return self._e("notify-state.json")

    @property
    def metrics_cache(self) -> Path:
        """The metrics' per-result counts up to a ledger offset, so a scrape reads only new lines."""
        return self._e("metrics-cache.json")

    @property
    def sessions_dir(self) -> Path:
        """The http runner's conversations, one file per agent session."""
        return self._e("sessions")

    @property
    def daemon(self) -> Path:
        """``evolve daemon``'s pid and next fire time, for ``evolve status``."""
        return self._e("daemon.json")

    @property
    def fires(self) -> Path:
        """One line per fire (the fire journal), for the morning report."""
        return self._e("fires.jsonl")

    @property
    def report_html(self) -> Path:
        """Where ``evolve report`` writes the morning report by default."""
        return self._e("report.html")

    @property
    def fitness_latest(self) -> Path:
        return self._e(FITNESS_LATEST)

    @property
    def fitness_latest_post(self) -> Path:
        return self._e(FITNESS_LATEST_POST)

    @property
    def fitness_baselines(self) -> Path:
        return self._e(FITNESS_BASELINES)

