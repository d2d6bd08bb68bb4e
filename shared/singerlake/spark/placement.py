"""Whether a Spark session's executors can reach what it works on, checked before it starts, and the
Spark settings it is given: one rule for the ``singerlake`` command and target-singerlake alike.

A lake root or pushed files on this machine's disk are out of reach of executors that may run
elsewhere (a cluster, Spark Connect: ``runs_on_this_machine``), unless every executor mounts them at
the same path (shared). S3 lake roots are in everyone's reach. Each caller refuses in its own words:
the command names its options, the target its settings.
"""

from __future__ import annotations

from typing import Any

from singerlake.errors import ConfigError
from singerlake.spark.masters import runs_on_this_machine
from singerlake.storage import LocalStorage, Storage

LAKE_OUT_OF_REACH = {
    "option": "lake root {root} is on this machine's disk, but the Spark executors of {where} may run elsewhere and would not see it: "
    "use an s3:// lake root, or add --lake-root-shared if every executor mounts it at the same path",
    "setting": "setting 'lake_root': {root} is on this machine's disk, but the executors of {where} may run elsewhere and would "
    "write to their own disks: use an s3:// lake_root, or set lake_root_shared: true if every executor mounts it at the same path",
}
FILES_OUT_OF_REACH = (
    "the files to push are on this machine's disk, but the Spark executors of {where} may run elsewhere and would not read them: "
    "push with --spark never, or add --source-shared if every executor mounts them at the same path"
)


def out_of_reach(storage: Storage | None, shared: bool, master: str | None, remote: str | None) -> bool:
    """Whether the executors of ``master``/``remote`` may not see ``storage`` (None: files on this machine's
    disk): it is on this machine's disk, not mounted by every executor (``shared``), and they may run elsewhere."""
    on_disk = storage is None or isinstance(storage, LocalStorage)
    return on_disk and not shared and not runs_on_this_machine(master, remote)


def where(master: str | None, remote: str | None) -> str:
    """The executors' place as a refusal names it (neither given: Spark Connect by ``$SPARK_REMOTE``)."""
    return remote or master or "$SPARK_REMOTE"


def check_lake_reachable(
    storage: Storage, root: str | None = None, *, shared: bool, master: str | None, remote: str | None, words: str = "option"
) -> None:
    """Refuse a lake root the executors would not see, named ``root`` (default: the local path); ``words``:
    "option" for the command, "setting" for the target."""
    if out_of_reach(storage, shared, master, remote):
        raise ConfigError(LAKE_OUT_OF_REACH[words].format(root=root or storage.root, where=where(master, remote)))


def check_files_reachable(*, shared: bool, master: str | None, remote: str | None) -> None:
    """Refuse to push files from this machine's disk on executors that would not read them."""
    if out_of_reach(None, shared, master, remote):
        raise ConfigError(FILES_OUT_OF_REACH.format(where=where(master, remote)))


def conf_of_options(texts: list[str]) -> dict[str, str]:
    """The command's ``--spark-conf KEY=VALUE`` options as Spark settings."""
    conf = {}
    for text in texts:
        key, sep, value = text.partition("=")
        if not sep or not key.startswith("spark."):
            raise ConfigError(f"--spark-conf {text!r}: expected KEY=VALUE with a key starting with 'spark.'")
        conf[key] = value
    return conf


def conf_of_setting(conf: Any) -> dict:
    """The target's ``spark_conf`` setting (None: none), checked: Spark keys, scalar values."""
    conf = conf or {}
    if not isinstance(conf, dict) or not all(isinstance(k, str) and k.startswith("spark.") for k in conf):
        raise ConfigError("setting 'spark_conf' must be an object of Spark settings (keys starting with 'spark.')")
    bad = [k for k, v in conf.items() if isinstance(v, (dict, list)) or v is None]
    if bad:
        raise ConfigError(f"setting 'spark_conf': values must be strings, numbers or booleans (see {bad})")
    return conf
