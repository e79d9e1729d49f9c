"""What committing and landing a change costs against the number of paths it names (docs/DESIGN.md §8.1).

A change may name tens of thousands of paths (generated files, a vendored tree). evolve hands git such
lists on stdin, and stages exact paths with ``update-index`` rather than as pathspecs, because git matches
every path it walks against every pathspec: quadratic. This measures, in a temporary directory, for
changes of 10^2, 10^3, 10^4 and 4x10^4 new files (names ~60 bytes, so the largest list is far past an
argv's ARG_MAX):

a. ``evolve.git.change.commit_paths`` (what a cycle's commit runs: stage + commit);
b. the pathspec form it replaced, ``git add -A --pathspec-from-file=- --pathspec-file-nul`` + commit, on
   an identical copy (the old argv form cannot run at all past ARG_MAX, so this is its kindest stand-in);
c. the landing's checks on the committed change: ``landing_paths`` (what it touches), ``in_the_way`` (the
   operator's files in its way) and ``too_large`` (every commit's blobs against ``max_file_mb``).

Prints each median and the per-path cost at the largest size over the smallest (1.0 = linear). Exit 1
when (a)'s or (c)'s per-path ratio reaches 3 (evolve's own cost stopped being linear).

    python bench/many_paths.py [--runs 3] [--sizes 100,1000,10000,40000]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from evolve.git.change import commit_paths
from evolve.git.landing import in_the_way, landing_paths, too_large

MAX_RATIO = 3.0
ENV = {**os.environ, "GIT_AUTHOR_NAME": "b", "GIT_AUTHOR_EMAIL": "b@x", "GIT_COMMITTER_NAME": "b",
       "GIT_COMMITTER_EMAIL": "b@x", "GIT_LITERAL_PATHSPECS": "1"}


def sh(repo: Path, *args: str, data: bytes | None = None) -> str:
    return subprocess.run(["git", *args], cwd=repo, env=ENV, input=data, capture_output=True,
                          check=True).stdout.decode()


def names(n: int) -> list[str]:
    return [f"gen/d{i // 500:04d}/a-generated-module-with-a-long-descriptive-name-{i:06d}.py" for i in range(n)]


def fresh(root: Path, n: int) -> tuple[Path, list[str], str]:
    """A repository with one commit and ``n`` new files in its work tree."""
    repo = root / f"r{n}"
    if repo.exists():
        shutil.rmtree(repo)
    repo.mkdir()
    sh(repo, "init", "-q", "-b", "main")
    sh(repo, "config", "user.name", "b")
    sh(repo, "config", "user.email", "b@x")
    sh(repo, "config", "gc.auto", "0")  # no detached auto-gc repacking under the copy below
    sh(repo, "config", "maintenance.auto", "false")
    (repo / "README").write_text("x\n")
    sh(repo, "add", "README")
    sh(repo, "commit", "-q", "-m", "base")
    paths = names(n)
    for p in paths:
        f = repo / p
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(p + "\n")
    return repo, paths, sh(repo, "rev-parse", "HEAD").strip()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--sizes", default="100,1000,10000,40000")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    ours: dict[int, list[float]] = {n: [] for n in sizes}
    old: dict[int, list[float]] = {n: [] for n in sizes}
    checks: dict[int, list[float]] = {n: [] for n in sizes}
    with tempfile.TemporaryDirectory(prefix="evolve-bench-paths-") as tmp:
        root = Path(tmp)
        for _ in range(args.runs):
            for n in sizes:  # interleaved, so machine noise hits every size alike
                repo, paths, base = fresh(root, n)
                t = time.perf_counter()
                commit_paths(repo, paths, "many")
                ours[n].append(time.perf_counter() - t)
                new = sh(repo, "rev-parse", "HEAD").strip()
                checkout = root / f"c{n}"
                if checkout.exists():
                    shutil.rmtree(checkout)
                shutil.copytree(repo, checkout)
                sh(checkout, "reset", "-q", "--hard", base)
                t = time.perf_counter()
                in_the_way(checkout, landing_paths(checkout, base, new))
                too_large(checkout, base, new, 50.0)
                checks[n].append(time.perf_counter() - t)
                repo, paths, _ = fresh(root, n)
                data = b"".join(p.encode() + b"\0" for p in paths)
                t = time.perf_counter()
                sh(repo, "add", "-A", "--pathspec-from-file=-", "--pathspec-file-nul", data=data)
                sh(repo, "commit", "-q", "-m", "many")
                old[n].append(time.perf_counter() - t)
    lo, hi = sizes[0], sizes[-1]

    def per_path(d: dict[int, list[float]]) -> float:
        return (statistics.median(d[hi]) / hi) / (statistics.median(d[lo]) / lo)

    print(f"{'paths':>7}  {'commit_paths':>13}  {'pathspec add':>13}  {'landing checks':>15}")
    for n in sizes:
        print(f"{n:>7}  {statistics.median(ours[n]) * 1e3:>10.0f} ms  {statistics.median(old[n]) * 1e3:>10.0f} ms"
              f"  {statistics.median(checks[n]) * 1e3:>12.0f} ms")
    r_ours, r_old, r_checks = per_path(ours), per_path(old), per_path(checks)
    print(f"per-path cost {hi}/{lo}: commit_paths {r_ours:.2f}, pathspec add {r_old:.2f}, "
          f"landing checks {r_checks:.2f} (1.0 = linear)")
    print(f"at {hi} paths the pathspec form takes {statistics.median(old[hi]) / statistics.median(ours[hi]):.1f}x "
          "commit_paths")
    bad = r_ours >= MAX_RATIO or r_checks >= MAX_RATIO
    print("FAIL" if bad else "PASS", f"(limit: per-path ratio < {MAX_RATIO})")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
