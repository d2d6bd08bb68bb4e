"""What the ``singerlake`` command prints, all through one ``Output`` picked from its options: a result
as text or JSON, failed streams and files on stderr, query results as an aligned table, JSON or CSV,
and the progress of jobs and pushes. Errors are reported by ``singerlake.errors``."""

from __future__ import annotations

import argparse
import csv
import io
import json
import sys
import unicodedata
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, BinaryIO, TextIO

from singerlake.format.exact import json_text, json_value
from singerlake.text import counted


class Output(ABC):
    """Where a command's results go, picked once from its options (``output_for``): ``ConsoleOutput``
    prints text, ``JsonOutput`` JSON documents (``--json``: no progress), ``CsvOutput`` query rows as
    CSV (``sql --csv``). Failed streams and files, notes and progress go to stderr."""

    mode = "table"  # how query rows print (and the sql shell's first .mode)

    def __init__(self, command: str):
        self.command = command  # as the command line named it: lines on stderr start "singerlake <command>: "

    # The streams are looked up when written to: a test, or a session of several commands, swaps them.
    @property
    def out(self) -> TextIO:
        return sys.stdout

    @property
    def err(self) -> TextIO:
        return sys.stderr

    @property
    def data(self) -> BinaryIO:
        """Where bytes go as they are (``fetch --out -``: the files themselves)."""
        return sys.stdout.buffer

    @abstractmethod
    def result(self, doc: Any, text: str) -> None:
        """A command's result: ``doc`` as one JSON document, or ``text``."""

    @abstractmethod
    def records(self, records: list[dict], columns: list[str]) -> None:
        """Records: whole, as a JSON list, or a table of their ``columns``."""

    def rows(self, columns: list[str], rows: list[tuple]) -> None:
        """A query's result: an aligned table, JSON rows or CSV."""
        print(ROWS[self.mode](columns, rows), file=self.out)

    @abstractmethod
    def progress(self, label: str) -> Callable[[int, int, int, int], None] | None:
        """A job's progress drawing (``JobProgress``), or None where none is drawn."""

    @abstractmethod
    def push_progress(self) -> Callable[[int, int], None] | None:
        """A push's count of files stored (``push_progress``), or None where none is drawn."""

    def note(self, text: str) -> None:
        """A line on stderr that is no result (what the command is doing)."""
        print(text, file=self.err, flush=True)

    def finish(self, doc: dict, text: str, failures: list, problems: bool = False) -> int:
        """Print a stream job's result with its failed streams (one line each on stderr, and in the JSON
        document); exit 1 when a stream failed (or ``problems``), else 0."""
        self.result({**doc, "failures": [f.to_dict() for f in failures]}, text)
        for failure in failures:
            print(f"singerlake {self.command}: failed: {failure}", file=self.err)
        if failures:
            print(f"singerlake {self.command}: {counted(len(failures), 'stream')} failed; the others finished", file=self.err)
        return 1 if failures or problems else 0

    def fetched(self, outcomes: list) -> int:
        """Each file that could not be fetched (``files.fetch.Fetched``), one line on stderr naming its id
        and target; exit 1 if any."""
        failed = [o for o in outcomes if o.failed]
        for outcome in failed:
            where = f"{outcome.record['id']} -> {printable(outcome.place)}"
            print(f"singerlake {self.command}: failed: {where}: {printable(outcome.error)}", file=self.err)
        if failed:
            print(
                f"singerlake {self.command}: {len(failed):,} of {counted(len(outcomes), 'file')} not fetched; the others were",
                file=self.err,
            )
        return 1 if failed else 0


class ConsoleOutput(Output):
    """Text for people: results as lines, progress drawn on a terminal."""

    def result(self, doc: Any, text: str) -> None:
        print(text, file=self.out)

    def records(self, records: list[dict], columns: list[str]) -> None:
        print(as_table(columns, [tuple(r[c] for c in columns) for r in records]), file=self.out)

    def progress(self, label: str) -> JobProgress | None:
        return JobProgress(label) if self.err.isatty() else None

    def push_progress(self) -> Callable[[int, int], None]:
        return push_progress()


class CsvOutput(ConsoleOutput):
    """``sql --csv``: query rows as CSV (a header row, then the rows), the rest as text."""

    mode = "csv"


class JsonOutput(Output):
    """``--json``: one JSON document per result, for programs; no progress."""

    mode = "json"

    def result(self, doc: Any, text: str) -> None:
        print(json.dumps(doc, indent=1, ensure_ascii=False), file=self.out)

    def records(self, records: list[dict], columns: list[str]) -> None:
        self.result(records, "")

    def progress(self, label: str) -> None:
        return None

    def push_progress(self) -> None:
        return None


def output_for(args: argparse.Namespace) -> Output:
    """The command's output, from its options: --csv (sql) before --json, else text."""
    if getattr(args, "csv", False):
        return CsvOutput(args.command)
    return JsonOutput(args.command) if args.json else ConsoleOutput(args.command)


def fetched_text(outcomes: list) -> str:
    """A line per file fetched, or found there already (``files.fetch.Fetched``): ``id -> place``."""
    said = {"fetched": "", "already there": " (already there)"}
    return "\n".join(f"{o.record['id']} -> {printable(o.place)}{said[o.outcome]}" for o in outcomes if not o.failed)


# -- text a name may be in ----------------------------------------------------------------------------
ESCAPES = {"\\": "\\\\", "\a": "\\a", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\v": "\\v", "\f": "\\f", "\r": "\\r"}
BIDI_CONTROLS = frozenset(map(chr, [*range(0x202A, 0x202F), *range(0x2066, 0x206A)]))


def printable(text: str) -> str:
    """``text`` as ``ls -b`` shows a file name: control characters (and bidirectional overrides, and
    bytes of a name that were not UTF-8) as escapes, backslashes doubled, so no name moves the cursor,
    rewrites the lines around it or reads as another."""
    if text.isprintable() and "\\" not in text:
        return text
    return "".join(map(_escaped, text))


def _escaped(char: str) -> str:
    if char in ESCAPES:
        return ESCAPES[char]
    if "\udc80" <= char <= "\udcff":  # a byte that was not UTF-8, as os.fsdecode keeps it
        return f"\\{ord(char) - 0xDC00:03o}"
    if unicodedata.category(char) in ("Cc", "Cs") or char in BIDI_CONTROLS:
        return "".join(f"\\{byte:03o}" for byte in char.encode("utf-8", "surrogatepass"))
    return char


# -- query results ----------------------------------------------------------------------------------
def cell(value: Any) -> str:
    """A value as text: strings as they are, nested values as JSON text, null as empty."""
    value = json_value(value)
    if value is None:
        return ""
    return value if isinstance(value, str) else json_text(value)


def as_json(columns: list[str], rows: list[tuple]) -> str:
    return "[" + ",\n".join(json_text(dict(zip(columns, map(json_value, row), strict=True))) for row in rows) + "]"


def as_csv(columns: list[str], rows: list[tuple]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(columns)
    writer.writerows([cell(value) for value in row] for row in rows)
    return out.getvalue().rstrip("\n")


def as_table(columns: list[str], rows: list[tuple]) -> str:
    columns = list(map(printable, columns))
    texts = [[printable(cell(value)) for value in row] for row in rows]
    widths = [max([len(name), *(len(row[i]) for row in texts)]) for i, name in enumerate(columns)]
    line = lambda values: " | ".join(v.ljust(w) for v, w in zip(values, widths, strict=True)).rstrip()  # noqa: E731
    footer = f"({counted(len(rows), 'row')})"
    return "\n".join([line(columns), "-+-".join("-" * w for w in widths), *map(line, texts), footer])


class JobProgress:
    """``verify: files 120/4,000, bytes 12.0/400.0 MiB`` on stderr, rewritten in place (a job's ``progress``)."""

    def __init__(self, label: str):
        self.label = label

    def __call__(self, files: int, total_files: int, done_bytes: int, total_bytes: int) -> None:
        mib = 1 << 20
        end = "\n" if files == total_files else ""
        sys.stderr.write(
            f"\r{self.label}: files {files:,}/{total_files:,}, bytes {done_bytes / mib:,.1f}/{total_bytes / mib:,.1f} MiB {end}"
        )
        sys.stderr.flush()


def push_progress():
    """``singerlake push: 1,200/100,000 files`` on stderr: rewritten in place on a terminal, a line each otherwise."""
    tty = sys.stderr.isatty()

    def show(done: int, total: int) -> None:
        start, end = ("\r", "\n" if done == total else "") if tty else ("", "\n")
        print(f"{start}singerlake push: {done:,}/{counted(total, 'file')}", end=end, file=sys.stderr, flush=True)

    return show


ROWS: dict[str, Callable[[list[str], list[tuple]], str]] = {"table": as_table, "json": as_json, "csv": as_csv}
