"""Several ``singerlake`` commands of one test in one process: the CLI's ``main()`` once per command, as the
``singerlake`` command runs it, each with its own argv, return code, stdout and stderr. The Spark session is
not stopped between commands (``spark_session`` finds it again), so commands in a row pay for one JVM start
(and, on local-cluster, one cluster start) instead of one each."""

from __future__ import annotations

import json
import queue
import subprocess
import sys
import threading

_MARK = "@@cli-result@@ "
_SESSION = """
import contextlib, io, json, sys
from singerlake.cli.main import main

for line in sys.stdin:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(json.loads(line))
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    result = {"returncode": code, "stdout": out.getvalue(), "stderr": err.getvalue()}
    sys.__stdout__.write(MARK + json.dumps(result) + "\\n")
    sys.__stdout__.flush()
""".replace("MARK", repr(_MARK))
GUARD_S = 600  # as run_cli's timeout: a hung command cannot hang the run


class CliSession:
    """``run(*argv)`` is ``subprocess.run(["singerlake", *argv])`` (text, output captured), in one process."""

    def __init__(self, env: dict | None = None):
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _SESSION], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
        )
        self.results: queue.Queue = queue.Queue()
        self.stderr: list[str] = []  # what escaped the commands' captures (the JVM's own output)
        threading.Thread(target=self._gather, daemon=True).start()
        threading.Thread(target=lambda: self.stderr.extend(self.proc.stderr), daemon=True).start()

    def _gather(self) -> None:
        for line in self.proc.stdout:
            if line.startswith(_MARK):
                self.results.put(json.loads(line[len(_MARK) :]))
        self.results.put(None)  # the process ended

    def run(self, *argv: str) -> subprocess.CompletedProcess:
        self.proc.stdin.write(json.dumps(list(argv)) + "\n")
        self.proc.stdin.flush()
        try:
            result = self.results.get(timeout=GUARD_S)
        except queue.Empty:
            result = None
        assert result is not None, f"singerlake {argv[0]}: no answer; stderr:\n{''.join(self.stderr)[-3000:]}"
        return subprocess.CompletedProcess(["singerlake", *argv], result["returncode"], result["stdout"], result["stderr"])

    def close(self) -> None:
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=GUARD_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def __enter__(self) -> CliSession:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
