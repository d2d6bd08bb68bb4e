"""Keys of the files area (SPEC.md §14). Labels are checked before they reach a key (``record.check_labels``)."""

from __future__ import annotations

FILES = "files"
SEGMENT_FORMAT = "singerlake-files-segment"
FILES_SPEC_VERSION = "2.1"
SEGMENT_SUFFIX = ".json.gz"
LONG_SPAN_DAYS = 31  # a file over more days goes into its what's long/ bucket instead of each day's


def data_dir(what: str) -> str:
    return f"{FILES}/data/{what}/"


def data_key(what: str, where: str, file_id: str) -> str:
    return f"{data_dir(what)}{where}/{file_id}"


def record_key(file_id: str) -> str:
    return f"{FILES}/ids/{file_id[:2]}/{file_id}.json"


def index_dir(what: str) -> str:
    return f"{FILES}/index/{what}"


def segment_key(what: str, txn: str) -> str:
    return f"{index_dir(what)}/segments/{txn}{SEGMENT_SUFFIX}"


def day_dir(what: str, day: str) -> str:
    return f"{index_dir(what)}/day/{day}/"


def long_dir(what: str) -> str:
    return f"{index_dir(what)}/long/"


def work_dir(what: str, work_id: str) -> str:
    return f"{index_dir(what)}/work/{work_id}/"


def pending_dir(what: str) -> str:
    return f"{index_dir(what)}/pending/"


def pending_key(what: str, txn: str) -> str:
    """The lease of a push under way (SPEC.md §15)."""
    return f"{pending_dir(what)}{txn}"


def vacuum_lock_key(what: str) -> str:
    """The lock of a vacuum pass over ``what`` (SPEC.md §15)."""
    return f"{index_dir(what)}/vacuum.lock"
