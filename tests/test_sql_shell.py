"""`singerlake sql ROOT` without a query (issue #24): statements piped on stdin run one after another;
on a terminal, a shell on one Spark session (driven here through a real pseudo-terminal)."""

from __future__ import annotations

import fcntl
import json
import os
import re
import struct
import subprocess
import termios
import threading

import pytest
from support.cli_session import CliSession
from support.lake_cli import CLI
from support.lakes import LakeUnderTest, joined, land, local_lake_at, record_msg, schema_msg

USER = {"type": "object", "properties": {"id": {"type": "integer"}, "name": {"type": "string"}}}
ERROR = "singerlake sql: error:"
TIME = re.compile(r"^Time: (\d+\.\d+) s$", re.M)
GUARD_S = 600  # only so that a hung shell cannot hang the run (as run_cli's timeout): no test is about speed here


@pytest.fixture(scope="module")
def cli():
    """The module's CLI commands that run Spark, in one process on one Spark session (tests/cli_session.py):
    the projection, then each piped `sql` with its own stdin, options, exit code and output."""
    with CliSession() as session:
        yield session


@pytest.fixture(scope="module")
def lake(tmp_path_factory, cli) -> LakeUnderTest:
    """users: 24 rows; public.orders: 3 rows; both projected (by the CLI: no Spark in this process)."""
    lake = local_lake_at(tmp_path_factory.mktemp("shell"))
    users = [record_msg("users", {"id": n, "name": f"user {n}"}) for n in range(24)]
    orders = [record_msg("public.orders", {"id": n, "name": f"order {n}"}) for n in range(3)]
    land(lake.config, joined([schema_msg("users", USER, ["id"]), *users, schema_msg("public.orders", USER, ["id"]), *orders]))
    projected = cli.run("project", lake.config["lake_root"], "--spark-master", "local[2]")
    assert projected.returncode == 0, projected.stderr[-3000:]
    return lake


def piped(lake: LakeUnderTest, text: str, *options: str, cli: CliSession | None = None) -> subprocess.CompletedProcess:
    """`singerlake sql ROOT` with ``text`` on a stdin that is no terminal: in ``cli``, or as a process of its own."""
    args = ["sql", lake.config["lake_root"], "--spark-master", "local[2]", *options]
    if cli is not None:
        return cli.run(*args, input=text)
    return subprocess.run([CLI, *args], input=text, capture_output=True, text=True, timeout=GUARD_S)


def errors(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith(ERROR)]


# -- piped ------------------------------------------------------------------------------------------
def test_piped_statements_run_in_turn_and_a_failed_one_is_one_line_naming_its_number(lake, cli):
    script = (
        "select count(*) as n from users;\nselect nope\n  from users;\nselect name from `public.orders`\n where id = 2 -- the last; one\n;"
    )
    out = piped(lake, script, cli=cli)
    assert out.returncode == 1, out.stderr[-3000:]
    assert out.stdout.splitlines() == ["n", "--", "24", "(1 row)", "", "name", "-------", "order 2", "(1 row)"], out.stdout
    [error] = errors(out.stderr)
    assert error.startswith(f"{ERROR} statement 2 (line 2): the query failed:") and "nope" in error, out.stderr
    assert "Traceback" not in out.stderr and "SQLSTATE" in error
    assert len(TIME.findall(out.stderr)) == 2, out.stderr  # each statement that ran says how long it took
    assert "singerlake>" not in out.stdout + out.stderr  # no prompt when stdin is no terminal


def test_piped_statements_as_json_all_run_exit_0_and_quit_stops_reading(lake, cli):
    script = "select id, name from users where id < 2 order by id;\n\n-- a comment; not one\nselect 'a;b' as `x;y`;\n.quit\nselect 1;"
    out = piped(lake, script, "--json", cli=cli)
    assert out.returncode == 0 and errors(out.stderr) == [], out.stderr[-3000:]
    decoder, results, at = json.JSONDecoder(), [], 0
    while at < len(out.stdout.rstrip()):
        result, at = decoder.raw_decode(out.stdout, at)
        results.append(result)
        at += len(out.stdout[at:]) - len(out.stdout[at:].lstrip())
    assert results == [[{"id": 0, "name": "user 0"}, {"id": 1, "name": "user 1"}], [{"x;y": "a;b"}]], out.stdout


def test_piped_csv_lists_tables_and_describes_one(lake, cli):
    out = piped(lake, ".tables\n\\d public.orders\nselect max(id) as top, count(*) as n from `public.orders`", "--csv", cli=cli)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split("\n\n") == [
        "table,holds\npublic.orders,current rows\nusers,current rows",
        "col_name,data_type,comment\nid,bigint,\nname,string,",
        "top,n\n2,3\n",  # the last statement needs no ; at the end of the input
    ], out.stdout


def test_a_bad_tap_is_one_line_with_exit_2_before_spark_starts(lake):
    out = piped(lake, "select 1;", "--tap", "tap-nope")
    assert out.returncode == 2 and len(errors(out.stderr)) == 1 and "tap-nope" in out.stderr and "Traceback" not in out.stderr


# -- on a terminal ---------------------------------------------------------------------------------
class Terminal:
    """The shell on a pseudo-terminal: what it writes is gathered by a thread; ``expect`` waits for text."""

    def __init__(self, command: list[str], env: dict):
        self.master, slave = os.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 200, 0, 0))
        self.process = subprocess.Popen(command, stdin=slave, stdout=slave, stderr=slave, env=env, start_new_session=True)
        os.close(slave)
        self.output, self.seen, self.ended = "", 0, False
        self.changed = threading.Condition()
        threading.Thread(target=self.gather, daemon=True).start()

    def gather(self) -> None:
        while True:
            try:
                data = os.read(self.master, 4096)
            except OSError:  # EIO: the shell has exited
                data = b""
            with self.changed:
                self.output += data.decode(errors="replace").replace("\r", "")
                self.ended = not data
                self.changed.notify_all()
            if not data:
                return

    def expect(self, text: str) -> str:
        """The output from the last expected text up to and including ``text``; fails if the shell ends first."""
        with self.changed:
            found = self.changed.wait_for(lambda: text in self.output[self.seen :] or self.ended, GUARD_S)
            at = self.output.find(text, self.seen)
            assert found and at >= 0, f"waited for {text!r}; the shell wrote:\n{self.output[self.seen :]}"
            part, self.seen = self.output[self.seen : at + len(text)], at + len(text)
            return part

    def type(self, line: str) -> None:
        os.write(self.master, line.encode())


def test_a_shell_on_a_terminal_keeps_one_spark_session(lake, tmp_path):
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path / "state"), "TERM": "dumb"}
    shell = Terminal([CLI, "sql", lake.config["lake_root"], "--spark-master", "local[2]"], env)
    assert "Spark started in" in shell.expect("singerlake> ")
    for line in ("select", " count(*) as n"):  # one statement over three lines
        shell.type(line + "\r")
        shell.expect("...> ")
    shell.type(" from users;\r")
    first = shell.expect("singerlake> ")
    assert "\nn\n--\n24\n(1 row)\n" in first, first
    [first_s] = TIME.findall(first)

    shell.type(".tables\r")
    tables = shell.expect("singerlake> ")
    assert re.search(r"^public\.orders +\| current rows$", tables, re.M) and re.search(r"^users +\| current rows$", tables, re.M), tables

    shell.type("select nope from users;\r")  # a failed statement is one line, and the shell goes on
    failed = shell.expect("singerlake> ")
    assert len(errors(failed)) == 1 and "nope" in errors(failed)[0] and "Traceback" not in failed, failed

    shell.type("select name from users where id = 7;\r")
    second = shell.expect("singerlake> ")
    assert "\nname\n------\nuser 7\n(1 row)\n" in second, second
    [second_s] = TIME.findall(second)
    print(f"first statement {first_s} s, second {second_s} s")  # shown with pytest -s
    # One session: Spark is not started again, and the views are not registered again (a time limit of
    # its own would fail on a loaded machine: the first statement, which registered them, is the measure)
    assert "Spark started in" not in tables + failed + second, second
    assert float(second_s) < float(first_s) / 2, f"the second query took {second_s} s, the first {first_s} s: views registered again?"

    shell.type("\x1b[A\r")  # up arrow: the last statement again, from the history
    again = shell.expect("singerlake> ")
    assert "\nuser 7\n(1 row)\n" in again, again

    shell.type("\x04")  # Ctrl-D at an empty prompt leaves
    assert shell.process.wait(GUARD_S) == 0
    history = (tmp_path / "state" / "singerlake" / "sql_history").read_text().splitlines()
    assert history[-4:] == [
        "select count(*) as n from users;",
        ".tables",
        "select nope from users;",
        "select name from users where id = 7;",
    ]
