"""Record positions (SPEC.md §11): every record is identified by the commit that made it visible and
its index among that commit's records. Files hold runs of positions; bookmarks are positions."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Protocol

from singerlake.format.errors import BadBookmark


class Numbered(Protocol):
    """What a bookmark is checked against: a stream's manifest."""

    stream: str
    generation: str | None
    commits: int


@dataclass(frozen=True)
class Run:
    """Records ``first`` .. ``first + records - 1`` of commit ``commit``, stored consecutively in one file."""

    commit: int
    first: int
    records: int


def entry_runs(files: list[dict]) -> list[tuple[dict, list[Run]]]:
    """Each file with the record positions it holds, in replay order (SPEC.md §11).

    A file as written holds one run: its commit, after the records of earlier files of that commit.
    A file that replaced others (compaction) lists its runs explicitly in its entry's ``runs``.
    ``files`` must hold whole commits (a part, the tail, or all of them: the cut rule).
    """
    before: Counter[int] = Counter()  # records of each commit in the files seen so far
    placed = []
    for entry in files:
        if "runs" in entry:
            runs = [Run(r["commit"], r["first"], r["records"]) for r in entry["runs"]]
        else:
            runs = [Run(entry["commit"], before[entry["commit"]], entry["records"])]
        for run in runs:
            before[run.commit] += run.records
        placed.append((entry, runs))
    placed.sort(key=lambda item: (item[1][0].commit, item[1][0].first))
    return placed


def commit_span(entry: dict) -> tuple[int, int]:
    """The lowest and highest commit of the record positions a file holds."""
    if "runs" in entry:
        return entry["runs"][0]["commit"], entry["runs"][-1]["commit"]
    return entry["commit"], entry["commit"]


@dataclass(frozen=True, order=True)
class Position:
    """All records before this point are replayed: commits < ``commit``, and the first ``records`` of ``commit``.

    ``generation`` names the manifest the numbers belong to (SPEC.md §5); it takes no part in ordering.
    """

    commit: int
    records: int
    generation: str | None = field(default=None, compare=False)

    def to_bookmark(self) -> dict[str, Any]:
        bookmark: dict[str, Any] = {"commit": self.commit, "records": self.records}
        if self.generation:
            bookmark["generation"] = self.generation
        return bookmark

    @classmethod
    def from_bookmark(cls, value: Any, stream: str) -> Position | None:
        if value is None:
            return None
        ok = isinstance(value, dict) and all(type(value.get(k)) is int and value[k] >= 0 for k in ("commit", "records"))
        if not ok or not isinstance(value.get("generation", ""), str):
            raise BadBookmark(f"stream {stream!r}: state bookmark 'position' must be {{'commit': int, 'records': int}}, got {value!r}")
        return cls(value["commit"], value["records"], value.get("generation"))


def end_of(runs: list[Run], generation: str | None = None) -> Position:
    """The position just after a file's last record."""
    return Position(runs[-1].commit, runs[-1].first + runs[-1].records, generation)


def check_bookmark(after: Position | None, manifest: Numbered) -> None:
    """Refuse a bookmark that belongs to another numbering of the stream's commits."""
    stream = manifest.stream
    if after is None:
        return
    if after.generation and manifest.generation and after.generation != manifest.generation:
        raise BadBookmark(
            f"stream {stream!r}: the state bookmark belongs to manifest generation {after.generation}, but the "
            f"manifest is now generation {manifest.generation}: it was rebuilt, so commit numbers changed. "
            "Clear the stream's state to replay it from the start."
        )
    if after.commit > manifest.commits:
        raise BadBookmark(
            f"stream {stream!r}: the state bookmark is at commit {after.commit}, but the lake has only "
            f"{manifest.commits} commits for it. The lake was rebuilt or the state belongs to another lake; "
            "clear the stream's state to replay it from the start."
        )


def already_replayed(runs: list[Run], after: Position | None) -> int:
    """How many records of a file (a prefix, since runs ascend) lie before the bookmark."""
    if after is None:
        return 0
    done = 0
    for run in runs:
        if run.commit < after.commit:
            done += run.records
        elif run.commit == after.commit:
            done += min(max(after.records - run.first, 0), run.records)
    return done
