"""nox sessions mirroring ./dev: tests, lint, bench, demo."""

from __future__ import annotations

import nox

nox.options.sessions = ["lint", "tests"]
PACKAGES = ["-e", "shared[spark,test]", "-e", "tap-singerlake", "-e", "target-singerlake"]


@nox.session
def tests(session: nox.Session) -> None:
    session.install(*PACKAGES)
    session.run("python", "-m", "pytest", "tests", *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    session.install("ruff")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session
def demo(session: nox.Session) -> None:
    session.install(*PACKAGES)
    session.run("python", "demo/land_sample.py", "demo/sample.singer.jsonl", *(session.posargs or ["singerlake"]))


@nox.session
def bench(session: nox.Session) -> None:
    session.install(*PACKAGES)
    session.run("python", "bench/run.py", *session.posargs)
