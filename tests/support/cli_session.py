"""Several ``singerlake`` commands in one process: the CLI's ``main()`` once per command, as the ``singerlake``
command runs it, each with its own argv, stdin, return code, stdout and stderr (everything written to the
process's fds 1 and 2 meanwhile, the JVM's output too). The Spark session is not stopped between commands
(``spark_session`` finds it again), so commands in a row pay for one JVM start (and, on local-cluster, one
cluster start) instead of one each. ``python`` runs a driver script there too, as ``python -c`` would, on that
same session."""

from __future__ import annotations

import json
import queue
import shutil
import subprocess
import sys
import tempfile
import threading

# The session's fds 1 and 2 are two files, from before anything starts, so the JVM and the Python workers
# (which inherit them) write there too; a command's output is what was added to them while it ran, as it
# would be all of its process's output. Results go back on a copy of the original stdout.
_SESSION = """
import io, json, os, sys, traceback

commands, results = sys.stdin, os.fdopen(os.dup(1), "w")
outputs = sys.argv[1:3]
for fd, path in zip((1, 2), outputs):
    os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND), fd)

from singerlake.cli.main import main


def since(path, offset):
    with open(path, "rb") as handle:
        handle.seek(offset)
        return handle.read().decode(errors="replace")


for line in commands:
    request = json.loads(line)
    sys.stdout.flush()
    sys.stderr.flush()
    offsets = [os.path.getsize(path) for path in outputs]
    sys.stdin = io.StringIO(request["input"])
    try:
        if "python" in request:  # a script, as python -c would run it, with this process's Spark session
            sys.argv = ["-c", *request["argv"]]
            try:
                exec(compile(request["python"], "<cli-session script>", "exec"), {"__name__": "__main__"})
                code = 0
            except SystemExit:
                raise
            except Exception:  # as python -c: the traceback on stderr, exit 1
                traceback.print_exc()
                code = 1
        else:
            code = main(request["argv"])
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        sys.stdin = commands
        sys.stdout.flush()
        sys.stderr.flush()
    out, err = (since(path, offset) for path, offset in zip(outputs, offsets))
    results.write(json.dumps({"returncode": code, "stdout": out, "stderr": err}) + "\\n")
    results.flush()
"""
GUARD_S = 600  # as run_cli's timeout: a hung command cannot hang the run


class CliSession:
    """``run(*argv)`` is ``subprocess.run(["singerlake", *argv])`` (text, output captured), in one process."""

    def __init__(self, env: dict | None = None):
        self.outputs = tempfile.mkdtemp(prefix="cli-session-")
        command = [sys.executable, "-c", _SESSION, f"{self.outputs}/stdout", f"{self.outputs}/stderr"]
        self.proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        self.results: queue.Queue = queue.Queue()
        self.stderr: list[str] = []  # what the session printed outside any command
        threading.Thread(target=self._gather, daemon=True).start()
        threading.Thread(target=lambda: self.stderr.extend(self.proc.stderr), daemon=True).start()

    def _gather(self) -> None:
        for line in self.proc.stdout:
            self.results.put(json.loads(line))
        self.results.put(None)  # the process ended

    def run(self, *argv: str, input: str = "") -> subprocess.CompletedProcess:
        """One command; ``input`` is its stdin (not a terminal, as a pipe)."""
        return self._request({"argv": list(argv), "input": input}, "singerlake", argv[0])

    def python(self, script: str, *argv: str) -> subprocess.CompletedProcess:
        """``subprocess.run([python, "-c", script, *argv])`` (text, output captured), in the session's process: a
        ``spark_session`` there finds the session (and the executors) the commands before it started."""
        return self._request({"python": script, "argv": list(argv), "input": ""}, "python", "-c")

    def _request(self, request: dict, program: str, name: str) -> subprocess.CompletedProcess:
        argv = request["argv"] if program == "singerlake" else ["-c", *request["argv"]]
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        try:
            result = self.results.get(timeout=GUARD_S)
        except queue.Empty:
            result = None
        if result is None:
            with open(f"{self.outputs}/stderr", errors="replace") as handle:
                raise AssertionError(f"{program} {name}: no answer; stderr:\n{(''.join(self.stderr) + handle.read())[-3000:]}")
        return subprocess.CompletedProcess([program, *argv], result["returncode"], result["stdout"], result["stderr"])

    def close(self) -> None:
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=GUARD_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.outputs, ignore_errors=True)

    def __enter__(self) -> CliSession:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
