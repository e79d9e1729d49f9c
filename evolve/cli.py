"""The ``evolve`` command line: the parser built from the table in ``evolve.commands``, errors mapped to exit codes.

Only the module of the command being run is imported (and it imports anything heavy inside its
``run``), so ``evolve status`` starts fast.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from evolve import __version__, commands, exitcodes
from evolve.errors import EvolveError


class _Parser(argparse.ArgumentParser):
    """argparse with "did you mean" on a mistyped command or option (difflib, as git does)."""

    def error(self, message: str) -> Any:
        super().error(message + _suggestion(message, self))


def _suggestion(message: str, parser: argparse.ArgumentParser) -> str:
    import difflib
    import re

    m = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
    if m:
        known = re.findall(r"'([^']*)'", m.group(2))
        close = difflib.get_close_matches(m.group(1), known, n=1, cutoff=0.6)
        return f"; did you mean {close[0]!r}?" if close else ""
    m = re.search(r"unrecognized arguments: (.*)", message)
    if not m:
        return ""
    known = [o for o in (*parser._option_string_actions, *_LOADED_OPTIONS) if o.startswith("--")]
    out = []
    for word in m.group(1).split():
        close = difflib.get_close_matches(word.split("=")[0], known, n=1, cutoff=0.6) if word.startswith("-") else []
        if close:
            out.append(f"{word} -> {close[0]}")
    return f"; did you mean: {', '.join(out)}?" if out else ""


# The options of the subcommand argparse picked, for the top-level parser's "unrecognized arguments".
_LOADED_OPTIONS: list[str] = []


class _CommandParser(_Parser):
    """A subcommand's parser that takes its options from the command's module only once argparse picks it.

    So ``evolve status`` imports no other command's module, and ``evolve --help`` none at all: the
    top-level help lists each command with the summary from the static table.
    """

    def __init__(self, *args: Any, command: str | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._command = command  # None: a nested parser (e.g. `hook session-start`), nothing to load

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> tuple[argparse.Namespace, list[str]]:
        # argparse's sub-parser action calls this with the rest of the command line: load the options first.
        if self._command is not None:
            name, self._command = self._command, None
            commands.load(name).add_arguments(self, name)
        if "--repo" not in self._option_string_actions:
            # `evolve status --repo X` as well as `evolve --repo X status` (and after a nested command,
            # `evolve handoff continue --repo X`); SUPPRESS: absent, it leaves the top-level value alone.
            self.add_argument("--repo", type=Path, default=argparse.SUPPRESS,
                              help="repository (default: git top level of the cwd); also before the command")
            self.add_argument("--config", type=Path, default=argparse.SUPPRESS, metavar="PATH",
                              help="the operator's config file, over the others (docs/DESIGN.md §8.5); also "
                                   "before the command")
            _LOADED_OPTIONS[:] = list(self._option_string_actions)
        return super().parse_known_args(args, namespace)


def _parser() -> argparse.ArgumentParser:
    ap = _Parser(
        prog="evolve",
        description="Run a coding agent unattended against a git repository, across its context limits.",
    )
    ap.add_argument("--repo", type=Path, default=None, help="repository (default: git top level of the cwd)")
    ap.add_argument("--config", type=Path, default=None, metavar="PATH",
                    help="the operator's config file, over the repository's and the user's ($EVOLVE_CONFIG)")
    ap.add_argument("--version", action="version", version=f"evolve {__version__}")
    sub = ap.add_subparsers(dest="command", metavar="COMMAND", parser_class=_CommandParser)
    for name, info in commands.COMMANDS.items():
        sub.add_parser(name, help=info.summary, command=name)
    return ap


def entry() -> None:
    """The ``evolve`` console script and ``python -m evolve``: :func:`main`, tuned for a short-lived process.

    ``evolve hook session-start`` runs at every agent session start, so it goes straight to the hook
    without building the parser. Before exit the objects still alive are frozen out of the cyclic
    collector: the process ends now, and interpreter shutdown otherwise walks them all once more
    (measured in docs/PERFORMANCE.md). Tests call :func:`main` in-process and get neither.
    """
    import gc

    if sys.argv[1:] == ["hook", "session-start"]:
        from evolve.harness.hooks import main_hook

        code = main_hook(sys.stdin, sys.stdout)
    else:
        code = main()
    gc.freeze()
    raise SystemExit(code)


def _error_text(text: str) -> str:
    """The sink for error lines: a config value or a URL quoted in an exception loses its secret."""
    from evolve.redact import current

    return current().text(text)


def _state_dir(args: argparse.Namespace) -> Path | None:
    """The repository's state directory, for an error naming a file relative to it; None when unknown."""
    try:
        from evolve.commands._common import repo_of
        from evolve.paths import Paths

        return Paths.for_repo(repo_of(args)).evolve_dir
    except Exception:
        return None


@contextlib.contextmanager
def _config_flag(path: Path | None) -> Iterator[None]:
    """``--config PATH`` is ``$EVOLVE_CONFIG`` for this command (evolve/configtrust.py reads it), restored after."""
    if path is None:
        yield
        return
    from evolve.configtrust import CONFIG_ENV

    old = os.environ.get(CONFIG_ENV)
    os.environ[CONFIG_ENV] = os.path.abspath(path)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(CONFIG_ENV, None)
        else:
            os.environ[CONFIG_ENV] = old


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse exits 2 on usage errors, 0 on --help
        return int(exc.code or 0)
    if not args.command:
        parser.print_help()
        return exitcodes.USAGE
    try:
        with _config_flag(args.config):
            return int(commands.load(args.command).run(args))
    except EvolveError as exc:
        # One line, whatever a hostile key or path contains.
        print("evolve: " + _error_text(" ".join(str(exc).split("\n"))), file=sys.stderr)
        return exc.exit_code
    except PermissionError as exc:
        # Not "unexpected": an unreadable ledger or an unwritable state directory, said with its fix.
        from evolve.errors import permission_text

        print("evolve: " + _error_text(" ".join(permission_text(exc, _state_dir(args)).split("\n"))),
              file=sys.stderr)
        return exitcodes.CONFIG
    except KeyboardInterrupt:
        return exitcodes.SIGINT
    except BrokenPipeError:
        return exitcodes.OK
    except Exception as exc:
        # The fire has already logged ``fire.error`` with the traceback; one line here.
        print(f"evolve: unexpected error: {type(exc).__name__}: {_error_text(str(exc))[:300]}", file=sys.stderr)
        if os.environ.get("EVOLVE_LOG_LEVEL", "").lower() == "debug":
            import traceback

            traceback.print_exc()
        return exitcodes.ERROR
