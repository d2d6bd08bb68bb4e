"""nox sessions mirroring ./dev: tests, lint, bench, demo."""

from __future__ import annotations

import nox

nox.options.sessions = ["lint", "tests"]
# compat editable installs, as ./dev's: a lake at ./singerlake must not shadow the package (see dev).
PACKAGES = ["--config-settings", "editable_mode=compat", "-e", "shared[spark,test]", "-e", "tap-singerlake", "-e", "target-singerlake"]


def install(session: nox.Session) -> None:
    """Our packages, then meltano, tap-jsonl and target-jsonl as ./dev installs them (own venvs, linked into bin/)."""
    session.install(*PACKAGES)
    session.run("bash", "dev", "tools", env={"SINGERLAKE_VENV": session.virtualenv.location}, external=True)


@nox.session
def tests(session: nox.Session) -> None:
    install(session)
    session.run("python", "-m", "pytest", "tests", "-n", "2", "--dist", "loadfile", *session.posargs)  # as ./dev test


@nox.session
def lint(session: nox.Session) -> None:
    session.install("ruff")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session
def demo(session: nox.Session) -> None:
    install(session)
    session.run("python", "demo/meltano_demo.py", *session.posargs)


@nox.session
def bench(session: nox.Session) -> None:
    session.install(*PACKAGES)
    session.run("python", "bench/run.py", *session.posargs)
