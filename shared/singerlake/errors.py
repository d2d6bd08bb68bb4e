"""Singerlake's expected errors, and the one handler that reports them.

Every error a user can cause or meet in normal operation (a bad setting or argument, bad input, an
unreachable or damaged lake, a busy lock) is a ``SingerlakeError`` whose message names the thing at
fault. The commands (``singerlake``, ``target-singerlake``, ``tap-singerlake``) report it as one line
on stderr and exit 2; anything else is a bug and keeps its traceback. ``--debug`` (or
``SINGERLAKE_DEBUG=1``) shows tracebacks for expected errors too.
"""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Callable

USAGE_EXIT = 2  # usage, configuration or input errors: the run did not do what was asked
INTERRUPTED_EXIT = 130  # 128 + SIGINT, as shells report Ctrl-C


class SingerlakeError(Exception):
    """An expected error: its message names the thing at fault and is all a user needs."""


class ConfigError(SingerlakeError, ValueError):
    """A setting or command-line argument is wrong; the message names it."""


class BadArgument(ConfigError):
    """An argument of a call is wrong: ``name`` is the parameter (``start``, ``work_id``), ``problem``
    what is wrong with it. The message names the API's parameter; the CLI names its flag instead."""

    def __init__(self, name: str, problem: str):
        super().__init__(f"{name}: {problem}")
        self.name, self.problem = name, problem


class UnsafeName(SingerlakeError, ValueError):
    """A name or key that cannot be stored in the lake (it could leave the lake root)."""


class Interrupted(SingerlakeError):
    """Stopped by a second Ctrl-C, without waiting for what was being committed."""

    exit_code = INTERRUPTED_EXIT


def debug_enabled() -> bool:
    return os.environ.get("SINGERLAKE_DEBUG", "").lower() in ("1", "true", "yes")


def one_line(exc: BaseException, expected: bool | None = None) -> str:
    """An error on one line, its continuation lines joined. An expected error's message is all a user
    needs; any other exception also says what it is (``OSError: ...``)."""
    text = " ".join(str(exc).split())
    if expected is None:
        expected = isinstance(exc, SingerlakeError)
    if expected and text:
        return text
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def report(prog: str, exc: BaseException) -> int:
    """Print an expected error as ``prog: error: ...``; return the exit code."""
    print(f"{prog}: error: {one_line(exc, expected=True)}", file=sys.stderr)
    return getattr(exc, "exit_code", USAGE_EXIT)


def run_command(prog: str, run: Callable[[], int | None], expected: tuple[type[BaseException], ...] = ()) -> int:
    """Run a command's body: expected errors (``SingerlakeError`` and ``expected``) become one line
    and exit 2, unless debugging is on; any other exception is a bug and propagates with its traceback."""
    try:
        return run() or 0
    except (SingerlakeError, *expected) as exc:
        if debug_enabled():
            traceback.print_exc()
        return report(prog, exc)


def sdk_cli_exit_code(cli: Callable[[], object]) -> int:
    """Run a Singer SDK command line (which ends with SystemExit) and return its exit code."""
    try:
        cli()
    except SystemExit as exit_:
        if isinstance(exit_.code, str):
            print(exit_.code, file=sys.stderr)
        return exit_.code if isinstance(exit_.code, int) else 0 if exit_.code is None else 1
    return 0
