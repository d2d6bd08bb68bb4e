"""``singerlake sql ROOT`` without a query: a SQL shell on one Spark session (issue #24).

Statements end with ``;`` (outside quotes and comments) and may span lines; the views are
registered once per session, so only the first statement pays for them. On a terminal the shell
prompts, keeps a readline history (``$XDG_STATE_HOME/singerlake/sql_history``) and completes view
names and commands; piped input runs statement after statement without prompting, like ``psql -f``:
a failed statement is one line on stderr naming its number, the others still run, and the exit
code is 1 if one failed (else 0). Each result prints as the one-shot command prints it (table, JSON
or CSV; ``.mode`` switches), followed on stderr by the time it took.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import TextIO

from singerlake.cli.output import ROWS
from singerlake.errors import SingerlakeError, one_line

PROMPT = "singerlake> "
CONTINUATION = "       ...> "
FORMATS = ROWS  # as the one-shot command prints a query's rows
QUIT = {".quit", ".exit", "\\q", "quit", "exit"}
HELP = """\
End each SQL statement with ; (it may span lines). Each stream of the tap is a view named by the
stream's name, quoted with backticks where needed: SELECT * FROM `public.users`;
  .tables  \\d  \\dt      list the views (the tap's streams)
  .schema NAME  \\d NAME  the columns of one view
  .mode [table|json|csv] show or set the output format
  .help  \\?             this help
  .quit  \\q  Ctrl-D     leave (Ctrl-C cancels the running statement or the line being typed)"""


def quiet(spark) -> None:
    """A failed statement is one line: no Spark log of it (the driver's, the executors' in a local
    master, PySpark's JSON record of the query's context) around it."""
    import logging

    logging.getLogger("SQLQueryContextLogger").disabled = True
    try:
        spark.sparkContext.setLogLevel("FATAL")
    except Exception:  # noqa: BLE001  (Spark Connect has no SparkContext here: its server logs)
        pass


def history_path() -> Path:
    """Where the shell's history is kept: ``$XDG_STATE_HOME/singerlake/sql_history`` (default ``~/.local/state``)."""
    state = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(state) / "singerlake" / "sql_history"


class Statements:
    """Input lines in, whole statements out: a statement ends at a ``;`` outside quotes ('', "", ``)
    and comments (-- to the end of the line, /* */ nested as Spark nests them)."""

    def __init__(self) -> None:
        self.text: list[str] = []
        self.inside: str | None = None  # a quote character, "--" or "/*" while inside one
        self.depth = 0  # of nested /* */ comments
        self.code = False  # whether the pending text holds more than comments and spaces
        self.line = 0  # the input line the pending statement starts on

    @property
    def pending(self) -> bool:
        """Whether a statement has begun and not ended (the shell prompts for its continuation)."""
        return self.code or self.inside in ("'", '"', "`", "/*")

    def reset(self) -> None:
        self.__init__()

    def feed(self, line: str, number: int) -> list[tuple[str, int]]:
        """The statements ``line`` (input line ``number``) ends, with the line each starts on."""
        done = []
        text = line.rstrip("\r\n") + "\n"
        i = 0
        while i < len(text):
            char, pair = text[i], text[i : i + 2]
            if self.inside in ("'", '"'):
                if char == "\\":
                    self.text.append(pair)
                    i += 2
                    continue
                if char == self.inside:
                    self.inside = None
            elif self.inside == "`":
                if char == "`":
                    self.inside = None
            elif self.inside == "--":
                if char == "\n":
                    self.inside = None
            elif self.inside == "/*":
                if pair in ("/*", "*/"):
                    self.depth += 1 if pair == "/*" else -1
                    self.inside = "/*" if self.depth else None
                    self.text.append(pair)
                    i += 2
                    continue
            elif pair in ("--", "/*"):
                self.inside, self.depth = pair, 1
                self.text.append(pair)
                i += 2
                continue
            elif char == ";":
                if self.code:
                    done.append(("".join(self.text).strip(), self.line))
                self.text, self.code = [], False
                i += 1
                continue
            elif not char.isspace():
                if not self.code:
                    self.code, self.line = True, number
                if char in ("'", '"', "`"):
                    self.inside = char
            self.text.append(char)
            i += 1
        if not self.pending:
            self.text = []  # only comments and spaces: nothing to keep
        return done

    def rest(self) -> list[tuple[str, int]]:
        """The last statement, not ended with ``;`` before the input ended (run as psql runs it)."""
        return [("".join(self.text).strip(), self.line)] if self.code else []


class Shell:
    """Statements and dot commands over one ``SqlSession``; results on ``out``, times and errors on ``err``."""

    def __init__(self, session, mode: str = "table", out: TextIO = sys.stdout, err: TextIO = sys.stderr):
        self.session, self.mode, self.out, self.err = session, mode, out, err
        self.statements = 0  # SQL statements run (or tried) so far: errors name them by number
        self.failures = 0
        self.results = 0  # results printed: table and CSV results after the first are set off by an empty line
        self.done = False  # .quit

    def error(self, where: str, message: str) -> bool:
        print(f"singerlake sql: error: {where}: {message}", file=self.err, flush=True)
        self.failures += 1
        return False

    def print_result(self, columns: list[str], rows: list[tuple]) -> None:
        if self.mode == "table" and not columns:
            return  # a statement without a result (SET, CREATE TEMP VIEW...): only its time
        if self.results and self.mode != "json":
            print(file=self.out)
        print(FORMATS[self.mode](columns, rows), file=self.out, flush=True)
        self.results += 1

    def statement(self, text: str, line: int) -> bool:
        """Run one SQL statement and print its result and its time; a failure is one line on ``err``."""
        self.statements += 1
        where = f"statement {self.statements} (line {line})"
        started = time.perf_counter()
        try:
            columns, rows = self.session.run(text)
        except SingerlakeError as exc:
            return self.error(where, one_line(exc))
        except KeyboardInterrupt:  # Spark's SIGINT handler has cancelled the statement's jobs
            return self.error(where, "cancelled (Ctrl-C)")
        elapsed = time.perf_counter() - started
        self.print_result(columns, rows)
        print(f"Time: {elapsed:.3f} s", file=self.err, flush=True)
        return True

    def command(self, text: str) -> bool:
        """A dot (or backslash) command: .tables, .schema, .mode, .help, .quit."""
        name, _, argument = text.strip().partition(" ")
        argument = argument.strip().rstrip(";").strip()
        if name in QUIT:
            self.done = True
        elif name in (".help", "\\?", "\\h", ".h"):
            print(HELP, file=self.out, flush=True)
        elif name in (".tables", "\\dt") or (name == "\\d" and not argument):
            self.print_result(["table", "holds"], self.session.views())
        elif name in (".schema", "\\d", ".describe"):
            return self.describe(argument)
        elif name == ".mode":
            if not argument:
                print(self.mode, file=self.out, flush=True)
            elif argument in FORMATS:
                self.mode = argument
            else:
                return self.error(".mode", f"{argument!r}: expected one of {', '.join(FORMATS)}")
        else:
            return self.error(name, "unknown command: .help lists the commands")
        return True

    def describe(self, argument: str) -> bool:
        from singerlake.tables.sql import view_name

        stream = argument[1:-1].replace("``", "`") if len(argument) > 1 and argument[0] == argument[-1] == "`" else argument
        if stream not in self.session.streams:
            return self.error(".schema", f"no table {argument!r}: .tables lists them" if argument else "name a table: .schema NAME")
        try:
            self.session.register(view_name(stream))
            if not self.session.registered.get(stream):
                return self.error(".schema", f"{stream} has no rows to describe yet (project the tap first)")
            columns, rows = self.session.describe(stream)
        except SingerlakeError as exc:
            return self.error(".schema", one_line(exc))
        self.print_result(columns, rows)
        return True

    def feed(self, statements: Statements, line: str, number: int) -> None:
        """One input line: a command when no statement is open (a backslash command also within one,
        outside quotes and comments: ``\\q`` leaves without it), else SQL that may end statements."""
        command = line.strip()
        backslash = command.startswith("\\") and statements.inside in (None, "--")  # as psql: also within a statement
        if backslash or not statements.pending and (command.startswith(".") or command in QUIT):
            self.command(command)
            return
        for text, start in statements.feed(line, number):
            self.statement(text, start)

    def run_lines(self, lines: Iterable[str]) -> None:
        """Run what the input lines hold, until they end or .quit."""
        statements = Statements()
        for number, line in enumerate(lines, start=1):
            self.feed(statements, line, number)
            if self.done:
                return
        for text, start in statements.rest():
            self.statement(text, start)


def run_piped(shell: Shell, stdin: TextIO) -> int:
    """Statements from a pipe or file: each in turn, no prompts; exit 1 if one failed, else 0."""
    try:
        shell.run_lines(stdin)
    except KeyboardInterrupt:
        print("singerlake sql: interrupted", file=shell.err)
        return 130
    return 1 if shell.failures else 0


def run_interactive(shell: Shell, banner: str) -> int:
    """The shell on a terminal: prompts, readline editing and history, completion of names and commands."""
    import readline

    history = history_path()
    try:
        readline.read_history_file(history)
    except OSError:
        pass  # no history yet
    readline.set_history_length(2000)
    readline.set_auto_history(False)  # a statement of several lines is kept as one entry
    names = sorted({*(view_name_for(s) for s in shell.session.streams), *(s for s in shell.session.streams if s.isidentifier())})
    words = [*names, ".tables", ".schema", ".mode", ".help", ".quit"]

    def complete(text: str, state: int) -> str | None:
        matches = [word for word in words if word.startswith(text)]
        return matches[state] if state < len(matches) else None

    readline.set_completer_delims(" \t\n,()=;")
    readline.set_completer(complete)
    readline.parse_and_bind("tab: complete")
    print(banner, file=shell.err, flush=True)
    statements = Statements()
    typed: list[str] = []
    number = 0
    try:
        while not shell.done:
            try:
                line = input(CONTINUATION if statements.pending else PROMPT)
            except EOFError:
                print(file=shell.out)
                break
            except KeyboardInterrupt:  # Ctrl-C while typing: drop the statement, prompt again (as psql does)
                print(file=shell.out)
                statements.reset()
                typed = []
                continue
            number += 1
            if not line.strip():
                continue
            typed.append(line.strip())
            shell.feed(statements, line, number)
            if not statements.pending:
                entry, typed = " ".join(typed), []
                last = readline.get_current_history_length()
                if not last or readline.get_history_item(last) != entry:  # a statement run again is kept once
                    readline.add_history(entry)
    finally:
        try:
            history.parent.mkdir(parents=True, exist_ok=True)
            readline.write_history_file(history)
        except OSError as exc:
            print(f"singerlake sql: warning: history not saved to {history}: {exc.strerror}", file=shell.err)
    return 0


def view_name_for(stream: str) -> str:
    from singerlake.tables.sql import view_name

    return view_name(stream)
