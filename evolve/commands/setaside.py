"""``evolve setaside [list|show|apply|drop]``: the work evolve set aside under ``refs/evolve/`` (docs/DESIGN.md §8.3).

``list`` (the default) shows every ref: its kind, cycle, age, the paths it changes, its item and whether a
later cycle finalized that item (*superseded*). ``show REF`` prints one ref's commit and its change, bounded
and redacted. ``apply REF`` brings the change into the operator's checkout as uncommitted edits to review,
never a commit, and only when none of the paths it touches is the operator's (modified, staged, untracked
or ignored) and no rebase, merge or bisect is in progress; it runs under the fire lock, so no landing moves
the checkout meanwhile. The applied ref is kept as ``refs/evolve/applied/<kind>/<name>`` until retention
drops it. ``drop REF...`` (or ``--superseded``) deletes refs by compare-and-swap and logs each.
``pending/<branch>`` refs are listed only: the fire lands them.

Exit 0 done, 1 refused (nothing changed; the one line says why), 2 usage, 75 a fire holds the lock (apply).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from evolve.commands._common import repo_of
from evolve.errors import UsageError

SHOW_LINES = 400  # `show` prints at most this many lines of the change unless --lines says otherwise


def add_arguments(p: argparse.ArgumentParser, name: str) -> None:
    p.description = ("Work evolve set aside under refs/evolve/ (stranded, interrupted, uncommitted, unlanded, "
                     "pending, applied): list it, show one, apply one into your checkout as uncommitted changes, "
                     "or drop refs. Exit 0 done, 1 refused (nothing changed), 2 usage, 75 a fire is running.")
    sub = p.add_subparsers(dest="action", metavar="ACTION")
    ls = sub.add_parser("list", help="every set-aside ref: kind, cycle, age, paths, item, superseded (the default)")
    ls.add_argument("--json", action="store_true", help="one JSON object for machines")
    sh = sub.add_parser("show", help="one ref's commit and its change (bounded, redacted)")
    sh.add_argument("ref", help="e.g. unlanded/12, stranded/9-2 or refs/evolve/uncommitted/4")
    sh.add_argument("--lines", type=int, default=SHOW_LINES, metavar="N",
                    help=f"at most N lines of the change (default {SHOW_LINES}; 0: all of it)")
    ap = sub.add_parser("apply", help="bring a ref's change into your checkout as uncommitted changes to review")
    ap.add_argument("ref", help="e.g. unlanded/12")
    ap.add_argument("--3way", dest="three_way", action="store_true",
                    help="when it does not apply cleanly onto your HEAD, merge it (conflict markers to resolve)")
    ap.add_argument("--wait", type=float, default=0.0, metavar="SECONDS",
                    help="wait this long for a running fire to release the lock (default: do not wait)")
    dr = sub.add_parser("drop", help="delete set-aside refs (never pending ones); each is logged with its commit")
    dr.add_argument("refs", nargs="*", metavar="REF", help="e.g. stranded/9 unlanded/12")
    dr.add_argument("--superseded", action="store_true",
                    help="every ref whose item a later cycle finalized")


def run(args: argparse.Namespace) -> int:
    from evolve.paths import Paths

    paths = Paths.for_repo(repo_of(args))
    action = args.action or "list"
    if action == "list":
        return _list(paths, bool(getattr(args, "json", False)))
    if action == "show":
        if args.lines < 0:
            raise UsageError("--lines must be 0 (all) or more")
        return _show(paths, _ref(args.ref), args.lines)
    if action == "apply":
        return _apply(paths, _ref(args.ref), args.three_way, max(args.wait, 0.0))
    if not args.refs and not args.superseded:
        raise UsageError("drop needs one or more REF (e.g. stranded/12) or --superseded")
    return _drop(paths, [_ref(r) for r in args.refs], args.superseded)


def _ref(arg: str) -> str:
    from evolve.status import setaside

    try:
        return setaside.full_ref(arg)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def _refuse(what: str) -> int:
    from evolve import exitcodes
    from evolve.redact import current
    from evolve.status.views import term_safe

    print("evolve: " + term_safe(current().text(" ".join(what.split()))), file=sys.stderr)
    return exitcodes.ERROR


def _out(text: str) -> None:
    from evolve.redact import current
    from evolve.status.views import term_safe

    sys.stdout.write(term_safe(current().text(text)))
    sys.stdout.flush()


def _log() -> Any:
    from evolve import log

    return log.get()


# -- what there is -----------------------------------------------------------------------------------


def _items(paths: Any) -> tuple[list[Any], float]:
    """Every set-aside ref assessed against the ledger, and ``[git] setaside_keep_days``."""
    from evolve.status import setaside
    from evolve.status.snapshot import load_config
    from evolve.store.ledger import Ledger

    refs = setaside.evolve_refs(paths.repo)
    items = setaside.assess(refs, setaside.entries_for(Ledger(paths.ledger), refs)) if refs else []
    cfg, _ = load_config(paths, os.environ)
    return items, float(cfg.git.setaside_keep_days)


def _rows(paths: Any, items: list[Any], now: float) -> list[dict[str, Any]]:
    from evolve.git.run import GitError
    from evolve.status import setaside

    info = setaside.commits(paths.repo)
    rows = []
    for a in items:
        c = info.get(a.ref)
        row: dict[str, Any] = {**a.as_json(), "short": a.short, "sha": c.sha if c else None,
                               "committed_at": c.committed_at if c else None,
                               "age_s": round(now - c.committed_at) if c and c.committed_at else None,
                               "subject": c.subject if c else "", "paths": [], "base": None}
        if c is not None:
            try:
                if a.kind == "pending":
                    branch = "refs/heads/" + a.short.removeprefix("pending/")
                    row["base"] = setaside.base_of(paths.repo, c.sha, None, branch)
                    row["waiting"] = setaside.waiting_commits(paths.repo, a.ref)
                else:
                    row["base"] = setaside.base_of(paths.repo, c.sha, a.start_sha)
                row["paths"] = sorted(setaside.changed(paths.repo, row["base"], c.sha)[0])
            except GitError:
                pass
        row["next"] = _next(a, row)
        rows.append(row)
    return rows


def _next(a: Any, row: dict[str, Any]) -> str:
    """What to do about one ref, as the command that does it."""
    if a.kind == "pending":
        return "lands by itself at the next fire once your checkout's paths allow"
    if a.kind == "applied":
        return f"in your checkout already; `evolve setaside drop {a.short}` once you kept what you want"
    if row.get("sha") and not row.get("paths"):
        return f"already on your branch: `evolve setaside drop {a.short}`"
    if a.superseded_by is not None:
        return f"superseded by cycle {a.superseded_by}: `evolve setaside drop {a.short}`"
    if a.needs_operator:
        return f"needs you: `evolve setaside apply {a.short}` or `evolve setaside drop {a.short}`"
    return f"item retried; `evolve setaside show {a.short}`, then apply or drop"


def _list(paths: Any, as_json: bool) -> int:
    import time

    from evolve import exitcodes
    from evolve.timeutil import human_s

    items, keep_days = _items(paths)
    rows = _rows(paths, items, time.time())
    if as_json:
        import orjson

        from evolve import jsonsafe
        from evolve.redact import current

        doc = {"repo": str(paths.repo), "keep_days": keep_days, "refs": rows,
               "needs_operator": sum(1 for r in rows if r["needs_operator"])}
        sys.stdout.buffer.write(jsonsafe.dumps(current().json(doc), option=orjson.OPT_INDENT_2) + b"\n")
        sys.stdout.flush()
        return exitcodes.OK
    if not rows:
        _out("no set-aside refs under refs/evolve/\n")
        return exitcodes.OK
    out = [f"{'kind':<12} {'ref':<22} {'cycle':>5} {'age':>6} {'paths':>5}  {'item':<28} next\n"]
    for r in rows:
        shown = ", ".join(r["paths"][:3]) + (f" (+{len(r['paths']) - 3})" if len(r["paths"]) > 3 else "")
        out.append(f"{r['kind']:<12} {r['short']:<22} {r['origin_cycle'] or r['cycle'] or '-'!s:>5} "
                   f"{human_s(r['age_s']) if r['age_s'] is not None else '?':>6} {len(r['paths']):>5}  "
                   f"{str(r['work_ref'] or '-')[:28]:<28} {r['next']}\n")
        if shown:
            out.append(f"{'':<12} {'':<22} {'':>5} {'':>6} {'':>5}  {shown}\n")
    need = sum(1 for r in rows if r["needs_operator"])
    kept = f"refs older than {keep_days:g} day(s) are dropped at a fire's end" if keep_days > 0 else \
        "refs are kept until dropped ([git] setaside_keep_days = 0)"
    out.append(f"{len(rows)} ref(s), {need} need you; {kept}\n")
    _out("".join(out))
    return exitcodes.OK


# -- one ref -----------------------------------------------------------------------------------------


def _one(paths: Any, ref: str) -> tuple[Any, str] | int:
    """The ref's assessment and commit; a refusal's exit code when it does not exist."""
    from evolve.git import refs as gitrefs
    from evolve.status import setaside

    sha = gitrefs.rev(paths.repo, ref)
    if sha is None:
        return _refuse(f"no such set-aside ref: {ref} (`evolve setaside` lists them)")
    items, _ = _items(paths)
    found = next((a for a in items if a.ref == ref), None)
    if found is None:
        name = setaside.parse(ref)
        found = setaside.Aside(ref, name.kind if name else "?", name.cycle if name else None)
    return found, sha


def _show(paths: Any, ref: str, lines: int) -> int:
    from evolve import exitcodes
    from evolve.git.run import git
    from evolve.status import setaside

    got = _one(paths, ref)
    if isinstance(got, int):
        return got
    a, sha = got
    base = (setaside.base_of(paths.repo, sha, None, "refs/heads/" + a.short.removeprefix("pending/"))
            if a.kind == "pending" else setaside.base_of(paths.repo, sha, a.start_sha))
    why = ("the cycle's start" if base and base == a.start_sha else "its fork point with your branch" if base
           else "nothing (a root commit)")
    sha_, date, author, subject = ([*git(paths.repo, "show", "-s", "--format=%H%n%ci%n%an <%ae>%n%s", sha)
                                     .splitlines(), "", "", "", ""])[:4]
    item = f"item {a.work_ref}" if a.work_ref else "item unknown (no ledger entry names it)"
    state = (f"superseded by cycle {a.superseded_by}" if a.superseded_by is not None
             else "needs you (apply or drop)" if a.needs_operator else "not superseded")
    diff_args = ["--no-ext-diff", "--no-textconv", "--no-color", "--stat", "--patch"]
    diff = (git(paths.repo, "diff", *diff_args, base, sha) if base
            else git(paths.repo, "show", "--format=", *diff_args, sha))
    body = diff.splitlines(keepends=True)
    cut = ""
    if lines and len(body) > lines:
        rest = len(body) - lines
        body = body[:lines]
        more = f"git diff {base} {sha}" if base else f"git show {sha}"
        cut = f"... {rest} more line(s) cut; `evolve setaside show {a.short} --lines 0` or `{more}` for all\n"
    head = [
        f"ref       {ref} ({a.kind}: {setaside.WHAT.get(a.kind, a.kind)})\n",
        f"commit    {sha_}  {date}  {author}\n",
        f"message   {subject}\n",
        f"cycle     {a.origin_cycle or a.cycle or '?'}, {item}; {state}\n",
        f"base      {base or '-'} ({why})\n",
        "\n",
    ]
    _out("".join(head) + "".join(body) + cut)
    return exitcodes.OK


# -- apply -------------------------------------------------------------------------------------------


def _in_progress(repo: Path) -> list[str]:
    from evolve.git.run import git
    from evolve.status import setaside

    gitdir = Path(git(repo, "rev-parse", "--absolute-git-dir").strip())
    return [what for name, what in setaside.IN_PROGRESS if (gitdir / name).exists()]


def _apply(paths: Any, ref: str, three_way: bool, wait_s: float) -> int:
    from evolve import exitcodes
    from evolve.store.dirfd import ensure_dir
    from evolve.store.lock import FireLock

    ensure_dir(paths.evolve_dir)
    lock = FireLock(paths.lock)
    if not lock.acquire(wait_s):
        print("evolve: a fire is running (it holds the fire lock and may be landing in your checkout); "
              "run this again when it ends, or add --wait 600", file=sys.stderr)
        return exitcodes.TEMPFAIL
    with lock:
        return _apply_locked(paths, ref, three_way)


def _apply_locked(paths: Any, ref: str, three_way: bool) -> int:
    import tempfile

    from evolve import exitcodes
    from evolve.git import change as gitchange
    from evolve.git import pathargs
    from evolve.git.run import git, run_git
    from evolve.status import setaside

    got = _one(paths, ref)
    if isinstance(got, int):
        return got
    a, sha = got
    repo = paths.repo
    in_progress = _in_progress(repo)
    base = setaside.base_of(repo, sha, a.start_sha) if a.kind != "pending" else None
    touched, added = setaside.changed(repo, base, sha) if a.kind != "pending" and not in_progress else (set(), set())
    dirty = gitchange.dirty_paths(repo) if touched else set()
    # A path it touches that is in the checkout but not tracked there is the operator's (ignored files too,
    # which `status` does not list). Literal pathspecs: a file named `*` is that file, not a glob.
    tracked = pathargs.ls_files(repo, sorted(touched), extra_env={"GIT_LITERAL_PATHSPECS": "1"})
    present = {p for p in touched if p not in tracked and os.path.lexists(repo / p)}
    why = setaside.apply_refusal(a.kind, in_progress=in_progress, touched=touched, dirty=dirty, present=present)
    if why:
        return _refuse(f"refusing to apply {ref}: {why}")
    patch_args = ["--binary", "--full-index", "--no-renames", "--no-ext-diff", "--no-textconv", "--no-color"]
    patch = (git(repo, "diff", *patch_args, base, sha) if base
             else git(repo, "diff-tree", "-p", "--root", *patch_args, sha))
    with tempfile.TemporaryDirectory(prefix="evolve-apply-") as tmp:
        pfile = Path(tmp) / "change.patch"
        pfile.write_bytes(patch.encode("utf-8", "surrogateescape"))
        # The change as it is: the repository's own apply.whitespace=error must not refuse or rewrite it.
        check = run_git(repo, "apply", "--whitespace=nowarn", "--check", str(pfile))
        conflicts: list[str] = []
        if check.returncode != 0:
            if not three_way:
                first = (check.stderr.strip().splitlines() or ["git apply refused"])[0][:200]
                return _refuse(f"refusing to apply {ref}: it does not apply cleanly onto your HEAD ({first}); "
                               f"`evolve setaside apply {a.short} --3way` merges it, leaving conflict markers")
            done = run_git(repo, "apply", "--whitespace=nowarn", "--3way", str(pfile))
            conflicts = sorted(p for p in git(repo, "diff", "--name-only", "-z", "--diff-filter=U").split("\0") if p)
            if done.returncode != 0 and not conflicts:
                first = (done.stderr.strip().splitlines() or ["git apply refused"])[0][:200]
                return _refuse(f"refusing to apply {ref}: git apply --3way could not merge it ({first})")
        else:
            done = run_git(repo, "apply", "--whitespace=nowarn", str(pfile))
            if done.returncode != 0:
                first = (done.stderr.strip().splitlines() or ["git apply refused"])[0][:200]
                return _refuse(f"refusing to apply {ref}: {first}")
    kept = _keep_applied(repo, a, sha)
    _log().info("setaside.applied", ref=ref, sha=sha, base=base, paths=len(touched), kept=kept,
                conflicts=len(conflicts))
    new = sorted(added)
    lines = [f"applied {ref} to {repo} as uncommitted changes ({len(touched)} path(s): "
             f"{', '.join(sorted(touched)[:8])}{' ...' if len(touched) > 8 else ''}); nothing was committed\n"]
    if conflicts:
        lines.append(f"conflicts to resolve (markers in the files, unmerged in the index): {', '.join(conflicts)}\n")
    elif new:
        lines.append(f"new files (untracked): {', '.join(new[:8])}{' ...' if len(new) > 8 else ''}\n")
    lines.append(f"review with `git diff` (and `git status`), commit what you keep; the ref is kept as {kept}"
                 f" (`evolve setaside drop {kept.removeprefix(setaside.PREFIX)}` once done)\n")
    _out("".join(lines))
    return exitcodes.ERROR if conflicts else exitcodes.OK


def _keep_applied(repo: Path, a: Any, sha: str) -> str:
    """``refs/evolve/applied/<kind>/<name>`` now names the commit, then the original ref goes (both by
    compare-and-swap, in that order: a death in between leaves two names, never none)."""
    from evolve.git import refs as gitrefs
    from evolve.git.run import run_git
    from evolve.status import setaside

    if a.kind == "applied":
        return a.ref
    target, n = f"{setaside.PREFIX}applied/{a.short}", 1
    while (have := gitrefs.rev(repo, target)) and have != sha:
        n += 1
        target = f"{setaside.PREFIX}applied/{a.short}-{n}"
    if have != sha:
        gitrefs.update_ref(repo, target, sha, None)
    run_git(repo, "update-ref", "-d", a.ref, sha)
    return target


# -- drop --------------------------------------------------------------------------------------------


def _drop(paths: Any, refs: list[str], superseded: bool) -> int:
    from evolve import exitcodes
    from evolve.git import refs as gitrefs
    from evolve.git.run import run_git
    from evolve.status import setaside

    targets = list(dict.fromkeys(refs))
    if superseded:
        items, _ = _items(paths)
        targets += [a.ref for a in items if a.superseded_by is not None and setaside.drop_refusal(a.kind) is None
                    and a.ref not in targets]
    found: list[tuple[str, str]] = []
    for ref in targets:
        name = setaside.parse(ref)
        why = setaside.drop_refusal(name.kind if name else "")
        if why:
            return _refuse(f"refusing to drop {ref}: {why}")
        sha = gitrefs.rev(paths.repo, ref)
        if sha is None:
            return _refuse(f"no such set-aside ref: {ref} (`evolve setaside` lists them); nothing dropped")
        found.append((ref, sha))
    if not found:
        _out("nothing to drop: no set-aside ref is superseded\n")
        return exitcodes.OK
    failed = False
    out = []
    for ref, sha in found:
        # Compare-and-swap: a ref that moved since it was read (a fire re-used the name) is not dropped.
        if run_git(paths.repo, "update-ref", "-d", ref, sha).returncode != 0:
            failed = True
            _refuse(f"could not drop {ref}: it changed or went while this ran")
            continue
        _log().info("setaside.dropped", ref=ref, sha=sha, by="operator")
        out.append(f"dropped {ref} (was {sha}; `git update-ref {ref} {sha}` restores it until git gc prunes it)\n")
    _out("".join(out))
    return exitcodes.ERROR if failed else exitcodes.OK
